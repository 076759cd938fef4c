"""Loading a `Config`: packaged defaults, a user YAML file, ``key=value`` overrides; and its
round trip through plain data (`to_dict` / `from_dict` / `to_yaml`).

Owns: the merge order (omegaconf: unknown keys and wrong types are rejected with the key's
full path) and checking the result (`controlplane.config.validation`).

Must not: start or write anything.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from controlplane.config.schema import Config
from controlplane.config.validation import CONFIG, ConfigError

__all__ = ["ConfigError", "from_dict", "load_config", "to_dict", "to_yaml"]


def _list_keys(layer: Any) -> str:
    """The top-level keys of a merge layer, for an error message."""
    try:
        return ", ".join(str(k) for k in layer) or "<empty>"
    except AttributeError:
        return "<config>"


def _describe(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None) or "<config>"
    msg = getattr(exc, "msg", None) or str(exc)
    # omegaconf appends a "full_key: ..., object_type=..." trailer; the first line is the reason.
    reason = msg.splitlines()[0].strip()
    return f"{key}: {reason}"


def _parse_overrides(overrides: list[str]) -> DictConfig:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(
                f"override {item!r}: expected key=value, e.g. pools.cluster.num_nodes=3"
            )
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"overrides: {_describe(exc)}") from exc


MOVED_EXTERNAL_KEYS = (
    "min_nodes",
    "max_nodes",
    "gpus_per_node",
    "cpus_per_node",
    "delivery_deadline_s",
    "backoff_s",
)
"""Keys of ``pools.external`` that became each provider's (``pools.external.providers``)."""


def _refuse_moved_keys(layer: Any) -> None:
    """A config written for one external pool names what to write instead."""
    external = OmegaConf.select(layer, "pools.external", default=None)
    if not isinstance(external, DictConfig):
        return
    moved = [k for k in MOVED_EXTERNAL_KEYS if k in external]
    if moved:
        raise ConfigError(
            "pools.external." + ", pools.external.".join(moved) + ": the external pool is "
            "now a list of providers; set these per provider, e.g. "
            "pools.external.providers=[{name: rent-a, price_per_gpu_hour: 2.0, max_nodes: "
            '4, gpus_per_node: 2}] (docs/operations.md, "External providers")'
        )


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> Config:
    """Merge packaged defaults, the YAML file at `path` (if any) and `overrides`; validate.
    Raises ConfigError naming every offending key."""
    schema = OmegaConf.structured(Config)
    layers: list[Any] = [schema]
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r}: no such file")
        try:
            user = OmegaConf.load(p)
        except Exception as exc:  # yaml errors come in several types
            raise ConfigError(f"config file {str(p)!r}: not valid YAML: {exc}") from exc
        if not isinstance(user, DictConfig):
            raise ConfigError(f"config file {str(p)!r}: must be a mapping of keys to values")
        layers.append(user)
    if overrides:
        layers.append(_parse_overrides(list(overrides)))
    merged = schema
    for layer in layers[1:]:
        _refuse_moved_keys(layer)
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as exc:
            raise ConfigError(_describe(exc)) from exc
        except (TypeError, ValueError) as exc:
            # omegaconf raises these when a mapping meets a list, e.g. `models.0.x=1`
            # on the command line: list entries are set in the YAML file.
            raise ConfigError(
                f"cannot merge {_list_keys(layer)}: a list and a mapping met ({exc}); set list "
                "entries (e.g. serving.models) in the YAML file, not as key=value overrides"
            ) from exc
    try:
        data = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(_describe(exc)) from exc
    return CONFIG.load(data)


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a Config saved with `to_dict` (e.g. in the local cluster's state file)."""
    merged = OmegaConf.merge(OmegaConf.structured(Config), data)
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, Config)
    return cfg
