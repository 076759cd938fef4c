"""Move times from what a real cluster measured: its own event log (issue 17).

Owns: `calibrate(events)` -> `Calibration` and `load_events(path)`. The control plane records
every make-before-break move as ``serve.move.start`` then ``serve.move.done`` (or
``serve.move.unwound``) with the time of each (`controlplane.loop.record`), and every
external capacity request as ``serve.external_capacity``. From them:

* **replica start** (the scenario's ``serving.replica_start_s``): the median duration of the
  moves INTO the cluster pool (a migrate-back), whose nodes are always up: a replica's start
  to RUNNING plus the route shift and the old replica's drain. An upper bound of the start
  alone (the drain is the model's graceful shutdown; the sample model's is short);
* **external node start** (``external.provision_s``): the first move into the external pool
  in the log (the pool empty before it, as on a cluster that just started: the autoscaler
  adds a node) less the replica start above: what a move waits for the node.

The events come as the API and `rcp events --json` give them: a JSON list of objects with
``kind``, ``message`` and ``at_s`` (or ``{"events": [...]}``). A file that is not that, or
has no move to measure, is a `CalibrationError` naming the field or the missing event.

`calibrated(scenario, calibration)` is the scenario with those two figures in place.

Must not: read a cluster itself (the caller fetches the events).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from controlplane.simulate.checks import MAX_SCENARIO_DEPTH
from controlplane.simulate.scenario import Scenario
from serve.inputs import JsonBodyError, loads_json

__all__ = [
    "MAX_EVENTS_FILE_BYTES",
    "Calibration",
    "CalibrationError",
    "Move",
    "calibrate",
    "calibrated",
    "load_events",
    "moves",
]


class CalibrationError(ValueError):
    """The events cannot calibrate the move times (the message says which field or event)."""


@dataclass(frozen=True)
class Move:
    """One finished move as the events recorded it."""

    model: str
    from_pool: str
    to_pool: str
    started_s: float
    done_s: float

    @property
    def seconds(self) -> float:
        return self.done_s - self.started_s


@dataclass(frozen=True)
class Calibration:
    replica_start_s: float
    """Median of the moves into the cluster pool (start to done)."""
    node_start_s: float
    """The first move into an empty external pool, less `replica_start_s` (at least 0)."""
    warm_moves: tuple[float, ...]
    cold_move_s: float

    def describe(self) -> str:
        warm = ", ".join(f"{s:.1f}" for s in self.warm_moves)
        return (
            f"replica start {self.replica_start_s:.1f} s (median of {len(self.warm_moves)} "
            f"move(s) into the cluster pool: {warm} s); external node start "
            f"{self.node_start_s:.1f} s (a move into the empty external pool took "
            f"{self.cold_move_s:.1f} s)"
        )


MAX_EVENTS_FILE_BYTES = 64 * 1024 * 1024
"""An events file larger than this is refused unread (10,000 events are a few MB)."""


def load_events(path: str | Path) -> list[Mapping[str, Any]]:
    """The events in `path` (a JSON list, or an object with an ``events`` list): at most
    `MAX_EVENTS_FILE_BYTES`, nested at most ``MAX_SCENARIO_DEPTH`` levels (the strict JSON
    reader checks the depth before it parses, so a deep file is an error, not a crash)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_EVENTS_FILE_BYTES + 1)
    except OSError as exc:
        raise CalibrationError(f"{path}: not a readable JSON file: {exc}") from exc
    if len(data) > MAX_EVENTS_FILE_BYTES:
        raise CalibrationError(
            f"{path}: more than {MAX_EVENTS_FILE_BYTES} bytes; save fewer events "
            "(`rcp events --json --limit 10000`)"
        )
    try:
        raw = loads_json(data, max_depth=MAX_SCENARIO_DEPTH)
    except JsonBodyError as exc:
        raise CalibrationError(f"{path}: not a readable JSON file: {exc.message}") from None
    if isinstance(raw, Mapping):
        raw = raw.get("events")
    if not isinstance(raw, list):
        raise CalibrationError(f"{path}: events: expected a list of events")
    return raw


def _field(event: Any, i: int, name: str, kind: type) -> Any:
    if not isinstance(event, Mapping):
        raise CalibrationError(f"events[{i}]: expected an object, got {type(event).__name__}")
    value = event.get(name)
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind):
        raise CalibrationError(f"events[{i}].{name}: expected a {kind.__name__}, got {value!r}")
    return value


def moves(events: Sequence[Mapping[str, Any]]) -> list[Move]:
    """Every finished move, oldest first (a start paired with its model's next done)."""
    started: dict[str, tuple[str, str, float]] = {}
    done: list[Move] = []
    ordered = sorted(
        ((_field(e, i, "at_s", float), i, e) for i, e in enumerate(events)),
        key=lambda t: (t[0], t[1]),
    )
    for at_s, i, e in ordered:
        kind = _field(e, i, "kind", str)
        if not kind.startswith("serve.move."):
            continue
        message = _field(e, i, "message", str)
        model, _, rest = message.partition(": ")
        if kind == "serve.move.start":
            words = rest.split(":", 1)[0].split()
            if len(words) != 4 or words[2] != "->":
                raise CalibrationError(
                    f"events[{i}].message: expected 'MODEL: N FROM -> TO: reason', got {message!r}"
                )
            started[model] = (words[1], words[3], at_s)
        elif kind == "serve.move.done" and model in started:
            from_pool, to_pool, t0 = started.pop(model)
            done.append(Move(model, from_pool, to_pool, t0, at_s))
        elif kind == "serve.move.unwound":
            started.pop(model, None)
    return done


def calibrate(events: Sequence[Mapping[str, Any]]) -> Calibration:
    """Replica start and external node start from `events` (see the module doc)."""
    found = moves(events)
    warm = tuple(m.seconds for m in found if m.to_pool == "cluster")
    if not warm:
        raise CalibrationError(
            "events: no finished move into the cluster pool (serve.move.start '... external -> "
            "cluster' then serve.move.done): the replica start cannot be measured"
        )
    into_external = [m for m in found if m.to_pool == "external"]
    if not into_external:
        raise CalibrationError(
            "events: no finished move into the external pool (serve.move.start '... cluster -> "
            "external' then serve.move.done): the external node start cannot be measured"
        )
    replica_start_s = statistics.median(warm)
    cold = into_external[0].seconds
    return Calibration(replica_start_s, max(0.0, cold - replica_start_s), warm, cold)


def calibrated(scenario: Scenario, calibration: Calibration) -> Scenario:
    """`scenario` with the measured replica start and external node start."""
    return replace(
        scenario,
        external=replace(scenario.external, provision_s=calibration.node_start_s),
        serving=replace(scenario.serving, replica_start_s=calibration.replica_start_s),
    )
