"""Reading scenario and trace files: size-bounded, and the checks a scenario's fields declare.

Owns: `ScenarioError` (a `policies.validation.InvalidInput`: one ``field.path: reason`` per
problem), `read_bounded` (a YAML or JSON file of at most `MAX_SCENARIO_BYTES`, nesting at most
`MAX_SCENARIO_DEPTH` levels, JSON's NaN and Infinity refused; the depth is checked before
anything recursive runs: JSON by `serve.inputs.loads_json`'s scan of the bytes, YAML as each
node is composed) and the checks of one field (``Annotated``, run by pydantic): `within`
(a field's bounds), `Number` and `Whole` (no booleans or strings; a whole float is a whole
number), and `Overrides` (the control plane's config overrides: plain values, finite).

Must not: know what a scenario means (`controlplane.simulate.scenario` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BeforeValidator, StrictFloat, StrictInt

from policies.validation import FieldError, InvalidInput, bound, finite_everywhere, raise_problems
from serve.inputs import JsonBodyError, loads_json

__all__ = [
    "MAX_SCENARIO_BYTES",
    "MAX_SCENARIO_DEPTH",
    "Number",
    "Overrides",
    "ScenarioError",
    "Whole",
    "read_bounded",
    "within",
]

MAX_SCENARIO_BYTES = 1_048_576
"""A scenario (or trace) file larger than this is refused before it is parsed."""
MAX_SCENARIO_DEPTH = 32
"""Mappings and lists nested deeper than this are refused while parsing (a scenario needs 4:
``serving.models[i].name``); Python's parsers recurse and would end in RecursionError."""


class ScenarioError(InvalidInput):
    """A scenario that cannot be simulated; the message names every offending field."""

    heading = "invalid scenario"


def within(low: float, high: float) -> AfterValidator:
    return bound(lambda v: low <= v <= high, f"must be in [{low:g}, {high:g}]")


Number = StrictFloat
"""A finite int or float (never a boolean or a string)."""
Whole = Annotated[
    StrictInt, BeforeValidator(lambda v: int(v) if isinstance(v, float) and v.is_integer() else v)
]
"""A whole number (``2.0`` is 2; never a boolean or a string)."""


def _overrides(config: dict[str, Any]) -> dict[str, Any]:
    """A control plane config override (a scenario's ``config`` value): a plain value, or a
    list (given whole, e.g. ``pools.external.providers``) of plain values or of mappings of
    plain values; numbers finite. The config's loader checks the rest by key."""
    values = [(key, value) for key, value in config.items() if not isinstance(value, list)]
    for key, items in config.items():
        for i, item in enumerate(items if isinstance(items, list) else []):
            pairs = item.items() if isinstance(item, dict) else [("", item)]
            values += [(f"{key}[{i}]" + (f".{k}" if k else ""), v) for k, v in pairs]
    raise_problems(
        [
            FieldError(
                where,
                f"must be a plain value or a list of plain values or mappings, "
                f"got {type(value).__name__}",
            )
            for where, value in values
            if isinstance(value, dict | list)
        ]
    )
    finite_everywhere(config)
    return config


Overrides = Annotated[dict[str, Any], AfterValidator(_overrides)]


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
