"""Reading scenario and trace files: size-bounded, typed, finite, by full field path.

Owns: `ScenarioError`, `read_bounded` (a YAML or JSON file of at most `MAX_SCENARIO_BYTES`,
nesting at most `MAX_SCENARIO_DEPTH` levels, JSON's NaN and Infinity refused; the depth is
checked before anything recursive runs: JSON by `serve.inputs.loads_json`'s scan of the
bytes, YAML as each node is composed), and the typed reading of a dataclass section from parsed
data (`read_section`, `read_value`): unknown keys, wrong types, non-finite numbers and values
outside `LIMITS` each give one message naming the field's full path, as
`controlplane.config.validation` does for the control plane's config.

Must not: know what a scenario means (`controlplane.simulate.scenario` does).
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from serve.inputs import JsonBodyError, loads_json

__all__ = [
    "LIMITS",
    "MAX_SCENARIO_BYTES",
    "MAX_SCENARIO_DEPTH",
    "ScenarioError",
    "read_bounded",
    "read_section",
    "read_value",
    "shown",
]

MAX_SCENARIO_BYTES = 1_048_576
"""A scenario (or trace) file larger than this is refused before it is parsed."""
MAX_SCENARIO_DEPTH = 32
"""Mappings and lists nested deeper than this are refused while parsing (a scenario needs 4:
``serving.models[i].name``); Python's parsers recurse and would end in RecursionError."""


class ScenarioError(ValueError):
    """A scenario that cannot be simulated; the message names every offending field."""


LIMITS: dict[str, tuple[float, float]] = {
    "nodes": (1, 100_000),
    "gpus_per_node": (1, 64),
    "days": (0.001, 366),
    "seed": (0, 2**32 - 1),
    "external.provision_s": (0, 86400),
    "external.stockout_hours": (0.01, 8760),
    "external.spot_reclaims_per_node_day": (0, 24),
    "external.reclaim_notice_s": (0, 3600),
    "failures.gpu_mttf_hours": (1, 1e9),
    "failures.repair_hours": (0, 8760),
    "failures.hot_faults_per_node_year": (0, 365),
    "failures.fabric_faults_per_node_year": (0, 365),
    "failures.fault_escalation_probability": (0, 1),
    "failures.fault_escalation_s": (0, 86400),
    "failures.fault_clear_s": (0, 86400),
    "training.jobs": (0, 1_000_000),
    "training.offered_load": (0, 100),
    "training.median_hours": (0.01, 8760),
    "training.sigma": (0, 5),
    "training.max_hours": (0.01, 8760),
    "training.runtime_limit_factor": (1, 100),
    "training.checkpoint_stall_s": (0, 86400),
    "training.checkpoint_persist_s": (0, 86400),
    "training.restore_s": (0, 86400),
    "training.baseline_checkpoint_interval_s": (1, 1e7),
    "serving.demand_step_s": (10, 86400),
    "serving.noise": (0, 1),
    "serving.replica_start_s": (0, 86400),
    "serving.replica_stop_s": (0, 86400),
    "schemes.static_serving_share": (0, 1),
    "schemes.night_serving_share": (0, 1),
    "schemes.night_start_hour": (0, 24),
    "schemes.night_end_hour": (0, 24),
    "gpus_per_replica": (1, 64),
    "replica_rps": (1e-9, 1e9),
    "peak_rps": (0, 1e12),
    "trough_fraction": (0, 1),
    "peak_hour": (0, 24),
    "min_replicas": (0, 100_000),
    "max_replicas": (0, 100_000),
    "target_utilisation": (0.05, 1),
}


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict = 3, 4, 4
_SHOWN.maxstring = _SHOWN.maxother = _SHOWN.maxlong = 60


def shown(raw: Any) -> str:
    """`raw` for an error message, bounded: a YAML file can alias one list into another level
    after level (a few hundred bytes that mean billions of items), and ``repr`` would walk
    them all."""
    return _SHOWN.repr(raw)


def _hint_args(hint: Any) -> tuple[Any, bool]:
    """(the type, whether None is allowed) of a field hint such as ``float | None``."""
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        return args[0], True
    return hint, False


def read_value(hint: Any, raw: Any, path: str, errors: list[str]) -> Any:
    kind, optional = _hint_args(hint)
    if raw is None:
        if not optional:
            errors.append(f"{path}: must be set, got null")
        return None
    if dataclasses.is_dataclass(kind):
        return read_section(kind, raw, path, errors)
    if get_origin(kind) is list:
        (item,) = get_args(kind)
        if not isinstance(raw, list):
            errors.append(f"{path}: must be a list, got {type(raw).__name__}")
            return []
        return [read_value(item, v, f"{path}[{i}]", errors) for i, v in enumerate(raw)]
    if get_origin(kind) is dict:
        _, vtype = get_args(kind)
        if not isinstance(raw, dict):
            errors.append(f"{path}: must be a mapping, got {type(raw).__name__}")
            return {}
        return {str(k): read_value(vtype, v, f"{path}.{k}", errors) for k, v in raw.items()}
    if kind is Any:
        _read_override(raw, path, errors)
        return raw
    if kind is bool:
        if not isinstance(raw, bool):
            errors.append(f"{path}: must be true or false, got {shown(raw)}")
        return raw
    if kind is str:
        if not isinstance(raw, str):
            errors.append(f"{path}: must be a string, got {shown(raw)}")
            return ""
        return raw
    if kind in (int, float):
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            errors.append(f"{path}: must be a number, got {shown(raw)}")
            return 0
        if not math.isfinite(raw):
            errors.append(f"{path}: must be a finite number, got {shown(raw)}")
            return 0
        if kind is int and raw != int(raw):
            errors.append(f"{path}: must be a whole number, got {shown(raw)}")
        value = int(raw) if kind is int else float(raw)
        limits = LIMITS.get(path) or LIMITS.get(path.rsplit(".", 1)[-1])
        if limits is not None and not limits[0] <= value <= limits[1]:
            errors.append(f"{path}: must be in [{limits[0]:g}, {limits[1]:g}], got {shown(raw)}")
        return value
    raise AssertionError(f"unhandled field type {kind!r} at {path}")


def _read_override(raw: Any, path: str, errors: list[str], depth: int = 0) -> None:
    """A control plane config override (a scenario's ``config`` value): a plain value, or a
    list (given whole, e.g. ``pools.external.providers``) of plain values or of mappings of
    plain values; numbers finite. The loader checks the rest by key."""
    if isinstance(raw, float) and not math.isfinite(raw):
        errors.append(f"{path}: must be a finite number, got {shown(raw)}")
    elif isinstance(raw, list) and depth == 0:
        for i, item in enumerate(raw):
            if isinstance(item, dict):
                for k, v in item.items():
                    _read_override(v, f"{path}[{i}].{k}", errors, depth + 2)
            else:
                _read_override(item, f"{path}[{i}]", errors, depth + 1)
    elif isinstance(raw, dict | list):
        errors.append(
            f"{path}: must be a plain value or a list of plain values or mappings, "
            f"got {type(raw).__name__}"
        )


def read_section(cls: Any, raw: Any, path: str, errors: list[str]) -> Any:
    if not isinstance(raw, dict):
        errors.append(f"{path or 'scenario'}: must be a mapping, got {type(raw).__name__}")
        return cls()
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.name != "source"}
    for key in sorted(set(raw) - names, key=str):
        where = f"{path}.{key}" if path else str(key)
        errors.append(f"{where}: unknown key (known: {', '.join(sorted(names))})")
    values = {}
    for name in names & set(raw):
        where = f"{path}.{name}" if path else name
        values[name] = read_value(hints[name], raw[name], where, errors)
    return cls(**values)


class _DepthBoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing nodes nested deeper than `MAX_SCENARIO_DEPTH`. Its
    scanner and parser are iterative; composing is the recursive step, so it counts there,
    before the recursion goes deeper (and the constructor then only sees bounded trees)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_SCENARIO_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise ScenarioError(
                    f"nests mappings/lists deeper than {MAX_SCENARIO_DEPTH} levels (line "
                    f"{mark.line + 1}, column {mark.column + 1})"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def read_bounded(path: str | Path, what: str) -> Any:
    """Parse a YAML or JSON file of at most `MAX_SCENARIO_BYTES` and `MAX_SCENARIO_DEPTH`
    levels (JSON is YAML; a ``.json`` file is read by the strict JSON reader)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ScenarioError(f"{what} {str(p)!r}: no such file")
    size = p.stat().st_size
    if size > MAX_SCENARIO_BYTES:
        raise ScenarioError(f"{what} {str(p)!r}: {size} bytes, more than {MAX_SCENARIO_BYTES}")
    raw = p.read_bytes()[: MAX_SCENARIO_BYTES + 1]
    if len(raw) > MAX_SCENARIO_BYTES:  # grew since the stat
        raise ScenarioError(f"{what} {str(p)!r}: more than {MAX_SCENARIO_BYTES} bytes")
    try:
        if p.suffix == ".json":
            return loads_json(raw, max_depth=MAX_SCENARIO_DEPTH)
        return yaml.load(raw.decode("utf-8", errors="replace"), Loader=_DepthBoundedLoader)
    except JsonBodyError as exc:
        raise ScenarioError(f"{what} {str(p)!r}: not acceptable JSON: {exc.message}") from None
    except ScenarioError as exc:
        raise ScenarioError(f"{what} {str(p)!r}: {exc}") from None
    except (yaml.YAMLError, ValueError) as exc:
        raise ScenarioError(f"{what} {str(p)!r}: not valid YAML/JSON: {exc}") from exc
