"""A dry run of a submission: what the control loop would decide if the job were queued now.

Owns: `what_if(observation, policies, admission_state, serving_state, job)` -> `WhatIf`: the
loop's own decide phase (`controlplane.loop.decide.decide`, the real policies) on the last
tick's observation with `job` added to the queue, read back for that job:

- admitted now: the admission's reason (``fits``, ``backfill``);
- the head of the queue: the reservation's time as the estimated start (`Reservation.start_by_s`:
  now when moves or preemptions make room now, which the answer lists; the time enough holders
  must have ended by their ``max_runtime_s``; None when one has none), with the wait's reason
  when admission gives one (a serving floor, a pin, serving's forecast, a replacement node);
- otherwise it waits behind the jobs ahead of it in queue order (how many), with no estimate.

Nothing is written: the decision is thrown away. A second scheduler it is not: an estimate is
the admission policy's own reservation, so it is as good as the jobs' ``max_runtime_s``.

Must not: act, write the store, or read a clock (the observation's ``now_s`` is the time).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from controlplane.loop.decide import Policies, decide
from controlplane.loop.types import Observation, ServingPolicyState
from policies.admission import AdmissionState
from policies.admission.shares import queue_order
from policies.plan import AdmitJob, MoveServeReplicas, PreemptJob, RejectJob, WaitJob
from policies.snapshot import QueuedJob

__all__ = ["WhatIf", "what_if"]


@dataclass(frozen=True)
class WhatIf:
    """What admission would do with the job this tick."""

    admitted: bool
    code: str
    """The reason's code: ``fits``, ``backfill``, ``head`` (reserved for), a `WaitJob`'s
    code, ``queued-behind``, or ``rejected``."""
    reason: str
    start_by_s: float | None
    """When it is expected to start (Unix seconds): now if admitted, the reservation's time
    if it heads the queue, else None (unknown)."""
    ahead: int
    """Queued jobs admission considers before it."""
    makes_room: tuple[str, ...] = ()
    """What would move or be preempted for it now (each action's reason)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def what_if(
    observation: Observation,
    policies: Policies,
    admission_state: AdmissionState,
    serving_state: ServingPolicyState,
    job: QueuedJob,
) -> WhatIf:
    """The decision for `job` were it queued in `observation` (see the module doc)."""
    snap = observation.snapshot
    now = snap.now_s
    job = replace(job, submitted_s=now, not_before_s=None)  # as if submitted at this tick
    snapshot = replace(snap, queued=(*snap.queued, job))
    decided = decide(
        replace(observation, snapshot=snapshot),
        policies,
        admission_state,
        serving_state,
        serving_busy=True,  # admission only: the serving plan is not needed
    )
    _, ordered = queue_order(snapshot.queued, policies.admission, now)
    ahead = next((i for i, row in enumerate(ordered) if row[3].job_id == job.job_id), len(ordered))
    mine = [a for a in decided.admission if getattr(a, "job_id", None) == job.job_id]
    for a in mine:
        if isinstance(a, RejectJob):
            return WhatIf(False, "rejected", a.reason, None, ahead)
        if isinstance(a, AdmitJob):
            return WhatIf(True, a.reason.split(":", 1)[0], a.reason, now, ahead)
    room = tuple(
        a.reason
        for a in decided.admission
        if isinstance(a, MoveServeReplicas | PreemptJob) and a.for_job_id == job.job_id
    )
    waits = [a for a in mine if isinstance(a, WaitJob)]
    reservation = decided.admission_state.reservation
    if reservation is not None and reservation.job_id == job.job_id:
        reason = waits[0].reason if waits else _head_reason(reservation.start_by_s, now, room)
        code = waits[0].code if waits else "head"
        return WhatIf(False, code, reason, reservation.start_by_s, ahead, room)
    if waits:
        return WhatIf(False, waits[0].code, waits[0].reason, None, ahead)
    reason = (
        f"queued-behind: {ahead} job(s) come first in queue order (priority, then submission)"
        if ahead
        else "queued-behind: it does not fit on the GPUs free now and is not the queue's head"
    )
    return WhatIf(False, "queued-behind", reason, None, ahead)


def _head_reason(start_by_s: float | None, now_s: float, room: tuple[str, ...]) -> str:
    if room:
        return f"head of the queue: room is made for it now ({len(room)} action(s))"
    if start_by_s is None:
        return (
            "head of the queue: it starts once enough running jobs end (some have no max runtime)"
        )
    return f"head of the queue: reserved, expected to start in {max(0.0, start_by_s - now_s):.0f}s"
