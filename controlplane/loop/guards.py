"""The on-call engineer's guard rails on the loop: pause, pins and hand cordons.

Owns: `Guards`, what an operator has set and what every tick obeys, kept in the store's kv so
a restarted controller finds it:

* the pause (``policy.pause``: who, why, since when): while paused, `hold` keeps every new
  move out of the tick's decision and the record phase writes what waits as ``policy.held``
  events. Moves already in flight still advance to their end: stopping one halfway would
  leave traffic on a pool about to lose its replicas;
* pins (``serving.pins``: model -> pool, who, when), handed to the policies in the snapshot
  (`ClusterSnapshot.pinned`);
* nodes cordoned by hand (``nodes.cordoned``: node id -> who, why, when): no capacity any
  more (``healthy=False`` in the snapshot), so placement moves serving replicas off it; gangs
  there keep running. Nothing is drained: undoing a Ray drain is not possible.

`GuardStore` reads them (once per tick, and for the API) and writes them (under one lock).

Must not: decide (the policies do, from the snapshot) or touch Ray.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from controlplane.loop.types import Decision, JsonValue, Observation
from controlplane.store import Store
from policies.admission import AdmissionState
from policies.health import RemediationAction
from policies.plan import Action, RejectJob, WaitJob
from policies.snapshot import Pool

__all__ = [
    "CORDONS_KEY",
    "PAUSE_KEY",
    "PINS_KEY",
    "Cordon",
    "GuardStore",
    "Guards",
    "Note",
    "Pause",
    "Pin",
    "hold",
    "with_guards",
]

PAUSE_KEY = "policy.pause"
PINS_KEY = "serving.pins"
CORDONS_KEY = "nodes.cordoned"


@dataclass(frozen=True)
class Note:
    """Who set a guard, why, and since when: a pause, or a hand cordon of one node."""

    by: str
    reason: str
    since_s: float

    def to_json(self) -> dict[str, JsonValue]:
        return {"by": self.by, "reason": self.reason, "since_s": self.since_s}


Pause = Note
Cordon = Note


@dataclass(frozen=True)
class Pin:
    pool: Pool
    by: str
    since_s: float

    def to_json(self) -> dict[str, JsonValue]:
        return {"pool": self.pool.value, "by": self.by, "since_s": self.since_s}


@dataclass(frozen=True)
class Guards:
    """What the operators have set, as of one read."""

    pause: Pause | None = None
    pins: Mapping[str, Pin] = field(default_factory=dict)
    cordons: Mapping[str, Cordon] = field(default_factory=dict)

    @property
    def paused(self) -> bool:
        return self.pause is not None

    def pinned(self) -> dict[str, Pool]:
        return {model: pin.pool for model, pin in self.pins.items()}


def _entry(raw: object) -> Mapping[str, object] | None:
    return raw if isinstance(raw, Mapping) else None


def _text(raw: Mapping[str, object], key: str) -> str:
    return str(raw.get(key) or "")


def _time(raw: Mapping[str, object]) -> float:
    value = raw.get("since_s")
    return float(value) if isinstance(value, int | float) else 0.0


def _parse(pause: object, pins: object, cordons: object) -> Guards:
    """Guards from the stored values; an entry that no longer reads is skipped."""
    p = _entry(pause)
    pools = {pool.value for pool in Pool}
    return Guards(
        pause=None if p is None else Pause(_text(p, "by"), _text(p, "reason"), _time(p)),
        pins={
            str(model): Pin(Pool(str(entry["pool"])), _text(entry, "by"), _time(entry))
            for model, raw in (_entry(pins) or {}).items()
            if (entry := _entry(raw)) is not None and entry.get("pool") in pools
        },
        cordons={
            str(node): Cordon(_text(entry, "by"), _text(entry, "reason"), _time(entry))
            for node, raw in (_entry(cordons) or {}).items()
            if (entry := _entry(raw)) is not None
        },
    )


class GuardStore:
    def __init__(self, store: Store, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self._lock = threading.Lock()

    def load(self) -> Guards:
        get = self.store.get_value
        return _parse(get(PAUSE_KEY, None), get(PINS_KEY, None), get(CORDONS_KEY, None))

    def pause(self, by: str, reason: str) -> tuple[Pause, bool]:
        """Pause (or keep paused: the first pause's who, why and since stay). Returns the
        pause in force and whether this call started it."""
        with self._lock:
            current = self.load().pause
            if current is not None:
                return current, False
            pause = Pause(by, reason, self.clock())
            self.store.put(PAUSE_KEY, pause.to_json())
            return pause, True

    def resume(self) -> Pause | None:
        """End the pause; returns the pause that ended (None: it was not paused)."""
        with self._lock:
            current = self.load().pause
            self.store.delete(PAUSE_KEY)
            return current

    def pin(self, model: str, pool: Pool, by: str) -> tuple[Pin, Pin | None]:
        """Pin `model` to `pool`; returns the pin and the one it replaced (or None)."""
        with self._lock:
            pins = dict(self.load().pins)
            before = pins.get(model)
            pins[model] = pin = Pin(pool, by, self.clock())
            self.store.put(PINS_KEY, {m: p.to_json() for m, p in pins.items()})
            return pin, before

    def unpin(self, model: str) -> Pin | None:
        """Remove `model`'s pin; returns it (None: it was not pinned)."""
        with self._lock:
            pins = dict(self.load().pins)
            before = pins.pop(model, None)
            self.store.put(PINS_KEY, {m: p.to_json() for m, p in pins.items()})
            return before

    def cordon(self, node_id: str, by: str, reason: str) -> tuple[Cordon, bool]:
        """Cordon `node_id` (kept if already cordoned); returns it and whether this call did."""
        with self._lock:
            cordons = dict(self.load().cordons)
            current = cordons.get(node_id)
            if current is not None:
                return current, False
            cordons[node_id] = cordon = Cordon(by, reason, self.clock())
            self.store.put(CORDONS_KEY, {n: c.to_json() for n, c in cordons.items()})
            return cordon, True

    def uncordon(self, node_id: str) -> Cordon | None:
        """Give `node_id` back; returns the cordon that ended (None: it was not cordoned)."""
        with self._lock:
            cordons = dict(self.load().cordons)
            before = cordons.pop(node_id, None)
            self.store.put(CORDONS_KEY, {n: c.to_json() for n, c in cordons.items()})
            return before


def with_guards(observation: Observation, guards: Guards) -> Observation:
    """`observation` with the pins in its snapshot and hand-cordoned nodes out of capacity."""
    snap = observation.snapshot
    nodes = tuple(
        replace(n, healthy=False) if n.node_id in guards.cordons else n for n in snap.nodes
    )
    return replace(observation, snapshot=replace(snap, nodes=nodes, pinned=guards.pinned()))


def hold(decision: Decision, previous: AdmissionState) -> Decision:
    """While paused: the decision to apply (rejections, `WaitJob`s and the jobs' lifecycle
    plan, which follows what already happened; the admission state as it was, so no preemption
    is counted that was not made) and the actions held back in ``held``."""
    applies = RejectJob | WaitJob
    held: Iterable[Action | RemediationAction] = (
        *(a for a in decision.admission if not isinstance(a, applies)),
        *decision.remediation,
        *(decision.serving or ()),
    )
    kept = replace(
        decision,
        admission=tuple(a for a in decision.admission if isinstance(a, applies)),
        admission_state=previous,
        remediation=(),
        claims=(),
        serving=None,
        serving_state=None,
        targets=(),
    )
    return replace(kept, held=tuple(held))
