"""Tracked operations: work that spans ticks, advanced one step per tick by the act phase.

Owns: `MoveOperation`, a make-before-break move of replicas of one model from one pool to
another, as a record (persisted in the store under ``serving.operations`` after every step,
so a restarted controller resumes it) and `advance`, which takes it one step further without
waiting for anything:

1. MAKE: the target pool's target is ``to_target`` (raised by n when the move started); done
   once that many replicas there are RUNNING. Then the route table is set by readiness with
   the source's planned target (``from_target``), and
2. SHIFT: done once every ingress replica applied that route table and the edges' table age
   passed (`serve.control.waiting.route_applied`: no new request goes to a replica about to
   stop). Then what the source keeps is worked out again (`kept`): its target now less the
   moved count, never below what demand wants now (``wanted``, read every tick) less what
   RUNS in the target pool. If that differs from ``from_target``, the route table is set
   again with it and the step waits for that one; else the source pool's target is lowered
   to ``from_target``, and
3. BREAK: done once the source pool settled there (Serve drained the stopping replicas,
   finishing their in-flight requests). The operation ends (`MoveOutcome.DONE`).

So a replica stops only after its replacement is RUNNING and routed to, and only while the
replicas left RUNNING cover demand. Each step re-asserts its own write (level-triggered), so
a controller that died between a write and the record of it repeats the write harmlessly. A
step that does not finish within ``timeout_s`` unwinds: in MAKE the target pool goes back to
its old target; later the move is finished as far as it got and the policies settle the rest.

Worked example: 2 replicas of ``m`` on cluster, 0 external, move 2 cluster -> external.
Tick 1: external target 0 -> 2 (MAKE). Ticks 2-5: external replicas start. Tick 6: both
RUNNING -> route weights cluster 0, external 1 (SHIFT). Tick 7: the ingress applied them ->
cluster target 2 -> 0 (BREAK). Tick 9: cluster settled at 0 -> DONE. Had demand risen to 3
meanwhile, tick 7 would keep 1 on cluster (3 wanted - 2 running on external): route weights
by readiness with cluster 1, external 2; tick 8: applied -> cluster target 2 -> 1 (BREAK).

Must not: decide what to move (the policies do), or block: every call returns at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from enum import Enum

from controlplane.adapters.serve import ServePlane, ServeView
from controlplane.loop.types import JsonValue
from policies.plan import MoveServeReplicas
from policies.snapshot import Pool

__all__ = ["MoveOperation", "MoveOutcome", "MovePhase", "advance", "kept", "start"]


class MovePhase(str, Enum):
    MAKE = "make"
    SHIFT = "shift"
    BREAK = "break"


class MoveOutcome(str, Enum):
    """How a call to `advance` left the operation."""

    WAITING = "waiting"
    """Still in the same step."""
    STEPPED = "stepped"
    """Moved on to the next step (its write is done)."""
    DONE = "done"
    UNWOUND = "unwound"
    """A step timed out: the operation ended where it was (see the module doc)."""


@dataclass(frozen=True)
class MoveOperation:
    """One make-before-break move in flight (see the module doc)."""

    model: str
    from_pool: Pool
    to_pool: Pool
    num_replicas: int
    node_ids: tuple[str, ...]
    """The nodes the policy chose to free (admission's claim, health's node), if any."""
    reason: str
    for_job_id: str | None
    from_target: int
    to_target: int
    phase: MovePhase
    started_s: float
    phase_since_s: float
    generation: int | None = None
    """The route table the SHIFT step waits for."""

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            **asdict(self),
            "node_ids": list(self.node_ids),
            "from_pool": self.from_pool.value,
            "to_pool": self.to_pool.value,
            "phase": self.phase.value,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> MoveOperation:
        def num(key: str) -> float:
            value = data[key]
            assert isinstance(value, int | float), f"{key}: {value!r}"
            return float(value)

        generation = data.get("generation")
        node_ids = data.get("node_ids") or []
        assert isinstance(node_ids, list)
        for_job_id = data.get("for_job_id")
        return cls(
            model=str(data["model"]),
            from_pool=Pool(str(data["from_pool"])),
            to_pool=Pool(str(data["to_pool"])),
            num_replicas=int(num("num_replicas")),
            node_ids=tuple(str(n) for n in node_ids),
            reason=str(data.get("reason", "")),
            for_job_id=None if for_job_id is None else str(for_job_id),
            from_target=int(num("from_target")),
            to_target=int(num("to_target")),
            phase=MovePhase(str(data["phase"])),
            started_s=num("started_s"),
            phase_since_s=num("phase_since_s"),
            generation=None if generation is None else int(str(generation)),
        )

    def describe(self) -> str:
        """``m: 2 cluster -> external`` (the form the event log has always used)."""
        return f"{self.model}: {self.num_replicas} {self.from_pool.value} -> {self.to_pool.value}"


def start(action: MoveServeReplicas, view: ServeView, now_s: float) -> MoveOperation | None:
    """The operation for `action` (at most what the source pool has), in MAKE, before any
    write: the caller stores it, then `advance` raises the target pool. None when the source
    pool has nothing to move."""
    have = view.target(action.model, action.from_pool)
    n = min(action.num_replicas, have)
    if n <= 0:
        return None
    return MoveOperation(
        model=action.model,
        from_pool=action.from_pool,
        to_pool=action.to_pool,
        num_replicas=n,
        node_ids=action.node_ids,
        reason=action.reason,
        for_job_id=action.for_job_id,
        from_target=have - n,
        to_target=view.target(action.model, action.to_pool) + n,
        phase=MovePhase.MAKE,
        started_s=now_s,
        phase_since_s=now_s,
    )


def kept(op: MoveOperation, view: ServeView, wanted: int | None) -> int:
    """How many replicas the source pool keeps when the move breaks (see the module doc):
    its target now less the moved count, raised to ``wanted`` less what RUNS in the target
    pool (never above the source's target now). ``wanted`` None: demand is not known."""
    source = view.target(op.model, op.from_pool)
    keep = max(0, source - op.num_replicas)
    if wanted is None:
        return keep
    return max(keep, min(source, wanted - view.pool(op.model, op.to_pool).running))


def advance(
    op: MoveOperation, serve: ServePlane, now_s: float, timeout_s: float, wanted: int | None = None
) -> tuple[MoveOperation, MoveOutcome]:
    """Take `op` one step further if its current step is done (see the module doc);
    ``wanted`` is what demand wants of the model now (None: not known)."""
    timed_out = now_s - op.phase_since_s > timeout_s
    if op.phase is MovePhase.MAKE:
        serve.set_pool_target(op.model, op.to_pool, op.to_target)
        if serve.pool_running(op.model, op.to_pool, op.to_target):
            planned = {op.to_pool: op.to_target, op.from_pool: op.from_target}
            generation = serve.route_for_targets(op.model, planned)
            return replace(
                op, phase=MovePhase.SHIFT, phase_since_s=now_s, generation=generation
            ), MoveOutcome.STEPPED
        if timed_out:
            serve.set_pool_target(op.model, op.to_pool, op.to_target - op.num_replicas)
    elif op.phase is MovePhase.SHIFT:
        if op.generation is not None and serve.route_applied(op.generation):
            keep = kept(op, serve.view(), wanted)
            if keep != op.from_target:  # demand moved meanwhile: route for what stays first
                planned = {op.to_pool: op.to_target, op.from_pool: keep}
                generation = serve.route_for_targets(op.model, planned)
                return replace(
                    op, from_target=keep, generation=generation, phase_since_s=now_s
                ), MoveOutcome.WAITING
            serve.set_pool_target(op.model, op.from_pool, op.from_target)
            return replace(op, phase=MovePhase.BREAK, phase_since_s=now_s), MoveOutcome.STEPPED
    else:
        serve.set_pool_target(op.model, op.from_pool, op.from_target)
        if serve.pool_settled(op.model, op.from_pool, op.from_target):
            return op, MoveOutcome.DONE
    return op, MoveOutcome.UNWOUND if timed_out else MoveOutcome.WAITING
