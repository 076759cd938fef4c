"""Admission and preemption of training gangs: which queued jobs start, what must make room.

Owns: the pure decision ``decide(snapshot, config, state) -> (plan, state)`` over the
`cluster` pool, its config (`AdmissionConfig`) and its memory (`AdmissionState`: recent
preemptions for the cap, and the current head-of-queue reservation, for display).

Must not: import Ray, read a clock, do I/O or draw random numbers. Everything it knows comes
from the snapshot (time is ``snapshot.now_s``); everything it wants is in the returned plan.
Actions are level-triggered: a wanted admission, replica move or reservation is recomputed
every tick; only preemptions are remembered, so the same victim is never asked twice.

The rules
---------
Capacity
    The healthy nodes of the `cluster` pool in this snapshot, nothing else. A node that turns
    unhealthy shrinks capacity, the queue shares and every fit check on the next tick.
Order
    Queued jobs are considered by priority class value (high first), then FIFO by
    ``submitted_s``, then ``job_id``; a job backing off (``not_before_s`` in the future) is
    skipped. Every training job outranks serving: GPUs held by Serve
    replicas in the `cluster` pool count as reclaimable, and taking them produces a
    `MoveServeReplicas` request (make-before-break, done by the placement policy and the Serve
    actuator), never a preemption.
Gang
    A job is admitted only when all ``num_workers`` fit at once, each worker's
    ``gpus_per_worker`` on a single node. Nothing is held partially, so two gangs can never each
    hold half of what both need. Placement takes whole nodes from the emptiest first (fewest
    nodes), and puts the remainder on the smallest node that still fits it (best fit).
Shares
    Each queue (team) owns ``share`` x live capacity (fractions summing to at most 1; the
    default is one queue, ``default``, owning all of it). A job that would take its queue past
    its share *borrows*: it is admitted only into GPUs free now, up to ``borrowing_limit`` x
    capacity beyond the share (None: any idle GPUs), and its reason says it borrows.
    A job is *entitled* when the GPUs its queue holds in gangs of the same or higher priority,
    plus its own, fit within the share (lower-priority gangs of its own queue do not count:
    it may preempt them). Reclaim: an entitled head may preempt gangs of *other* queues that are
    over their share, whatever their priority, while that queue is still over its share. It
    never preempts another queue's gangs that are within their share.
Reservation and backfill
    The first job in order that does not fit now and whose gang fits within its queue's share
    (``need <= share x capacity``) becomes the head and gets a reservation: a placement on the
    GPUs that will be free at time T.

    - T = ``now_s`` if the head is entitled and releasing GPUs (gangs being preempted, replicas
      stopping) suffice, or if moving Serve replicas and preempting victims makes it fit;
    - otherwise T is the earliest time by which enough holders must have ended, holders taken
      by ``started_s + max_runtime_s`` (jobs admitted this tick included, Serve GPUs counted as
      movable), such that the gang fits on the nodes *and* within its queue's share. If that
      needs a holder without a max runtime, T is unknown.

    The GPUs that placement needs from those free now are protected. The backfill rule: a later
    job may use protected GPUs only if T is known and ``now_s + max_runtime_s <= T`` (it ends
    before the reservation could be met); any other later job may use only unprotected GPUs.
    Either way the head is never delayed past T. A head that cannot fit even once every holder
    has ended (capacity shrank) gets no reservation and blocks no one.
Preemption
    Only for the head, only if it is entitled, and only when free and releasing GPUs are not
    enough. In-cluster Serve replicas yield first (one `MoveServeReplicas` per model); then
    training victims: lower-priority gangs of the head's queue, and (reclaim) gangs of queues
    over their share. Victims are taken in order (lowest priority value, then least work at
    risk, i.e. most recently checkpointed, then most recently started, then job_id) until the
    head fits; then every replica or victim that the fit does not need is spared again, most
    expensive first, so the set is minimal (none can be dropped; not a global minimum). Caps:
    a job preempted ``max_preemptions_per_job_per_hour`` times in the rolling hour is not a
    candidate; if the victims would exceed ``max_preemptions_per_hour`` in the rolling hour,
    nobody is preempted (never a partial preemption) and the head waits. A victim is asked
    once: gangs with ``preempting`` set, or preempted (per the state) after they started, count
    as releasing and are never chosen again.
Not considered
    CPUs and memory (the gang fit is on GPUs only), fractional GPUs, more than one reservation,
    topology beyond "one worker on one node". Jobs of an unknown queue or priority class get a
    `RejectJob`; a job bigger than the pool is left queued (the service rejects it at submit
    time with `gang_fits` and the live pool).

Worked example
--------------
Two healthy cluster nodes ``a`` and ``b`` with 8 GPUs each (capacity 16); queue ``default``
with share 1.0; priority classes low=0, medium=50, high=100. Running: ``old`` (low, 4 GPUs on
``a``, checkpointed 10 s ago) and ``big`` (medium, 8 GPUs on ``b``, ends at t=1000). Free:
4 GPUs on ``a``; no Serve replicas. Queue at now_s=100: ``h`` (high, 2 workers x 4 GPUs),
``s`` (low, 1 worker x 2 GPUs, max runtime 60 s).

1. ``h`` needs 2 slots of 4 GPUs; free gives 1 slot (``a``: 4). It is the head, and entitled:
   its queue holds 0 GPUs in gangs of priority >= high, 0 + 8 <= 16. Nothing is releasing;
   the candidates are ``old`` (low) and ``big`` (medium), in that order. Taking ``old`` gives
   ``a`` 8 GPUs = 2 slots: ``h`` fits, and ``big`` is never needed.
   Plan: ``PreemptJob(old, for_job_id=h)``; reservation for ``h`` on ``a`` with T=100.
2. ``s`` (2 GPUs): the 4 free GPUs on ``a`` are protected (``h`` needs them), and T=now leaves
   no room for backfill, so ``s`` waits. ``b`` has no free GPU.

Next tick ``old`` is releasing; once its GPUs are free ``h`` is admitted on ``a``
(2 workers), and ``s`` waits for ``big``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from policies.plan import (
    Action,
    AdmitJob,
    MoveServeReplicas,
    Plan,
    PreemptJob,
    RejectJob,
    WorkerPlacement,
)
from policies.snapshot import (
    ClusterSnapshot,
    Pool,
    QueuedJob,
    ReplicaState,
    RunningGang,
    ServeReplica,
)

__all__ = [
    "DEFAULT_PRIORITY_CLASSES",
    "AdmissionConfig",
    "AdmissionState",
    "DEFAULT_QUEUE",
    "PreemptionConfig",
    "PreemptionRecord",
    "QueueConfig",
    "QueueShare",
    "Reservation",
    "Why",
    "decide",
    "gang_fits",
]

PREEMPTION_WINDOW_S = 3600.0
"""The rolling window of the preemption caps."""

DEFAULT_PRIORITY_CLASSES: Mapping[str, int] = {"low": 0, "medium": 50, "high": 100}

_EPS = 1e-9


class Why(str, Enum):
    """The code at the start of every reason this policy writes."""

    FITS = "fits"
    BACKFILL = "backfill"
    PREEMPT_PRIORITY = "preempt-for-priority"
    RECLAIM_SHARE = "reclaim-share"
    SERVE_YIELDS = "serve-yields-to-training"
    UNKNOWN_QUEUE = "unknown-queue"
    UNKNOWN_PRIORITY_CLASS = "unknown-priority-class"


@dataclass
class QueueShare:
    """A team queue's share of live `cluster` capacity. The ``jobs.queues.<name>`` config
    entries are this class (the name is the key); `QueueConfig` adds the name."""

    share: float = 1.0
    """Fraction of live capacity the queue owns, in (0, 1]; shares sum to at most 1."""
    borrowing_limit: float | None = None
    """Fraction of live capacity it may borrow beyond its share; None means any idle GPUs."""


@dataclass
class _QueueName:
    name: str


@dataclass
class QueueConfig(QueueShare, _QueueName):
    """A named team queue: ``QueueConfig(name, share=1.0, borrowing_limit=None)``.

    (`_QueueName` is the last base so that `name` is the first field.)"""


DEFAULT_QUEUE = "default"
"""The one queue of a cluster that configures none; it owns all of the capacity."""


def _default_queues() -> tuple[QueueConfig, ...]:
    return (QueueConfig(DEFAULT_QUEUE),)


def _default_priority_classes() -> dict[str, int]:
    return dict(DEFAULT_PRIORITY_CLASSES)


@dataclass(kw_only=True)
class PreemptionConfig:
    """Priority classes and the preemption between them. The ``jobs`` config section embeds
    this class (`controlplane.config.JobsConfig`), so each field and default is defined here
    only; `AdmissionConfig` adds the queues. The config classes here are not frozen because
    omegaconf makes a frozen dataclass a read-only node; the policy never changes them."""

    priority_classes: dict[str, int] = field(default_factory=_default_priority_classes)
    """Priority class name -> integer value; higher runs first and may preempt lower."""
    preemption_enabled: bool = True
    """Whether a higher-priority gang may preempt (checkpoint, stop, re-queue) a lower one."""
    max_preemptions_per_hour: int = 20
    """Preemptions allowed in any rolling hour, all jobs together."""
    max_preemptions_per_job_per_hour: int = 2
    """Times one job may be preempted in a rolling hour."""


@dataclass
class AdmissionConfig(PreemptionConfig):
    """Knobs of the admission policy. Invalid values raise ValueError naming the field."""

    queues: tuple[QueueConfig, ...] = field(default_factory=_default_queues)
    """Team queues with their shares of live capacity."""
    move_serve_replicas: bool = True
    """Count in-cluster Serve GPUs as reclaimable and ask for replicas to move."""

    def __post_init__(self) -> None:
        errors: list[str] = []
        if not self.priority_classes:
            errors.append("priority_classes: at least one class is required")
        for name, value in self.priority_classes.items():
            if not name or isinstance(value, bool) or not isinstance(value, int):
                errors.append(f"priority_classes.{name}: must be an integer, got {value!r}")
        if not self.queues:
            errors.append("queues: at least one queue is required")
        seen: set[str] = set()
        for q in self.queues:
            if q.name in seen:
                errors.append(f"queues.{q.name}: defined twice")
            seen.add(q.name)
            if not 0.0 < q.share <= 1.0:
                errors.append(f"queues.{q.name}.share: must be in (0, 1], got {q.share!r}")
            if q.borrowing_limit is not None and q.borrowing_limit < 0:
                errors.append(
                    f"queues.{q.name}.borrowing_limit: must be >= 0 or None, "
                    f"got {q.borrowing_limit!r}"
                )
        total_share = sum(q.share for q in self.queues)
        if total_share > 1.0 + 1e-6:
            errors.append(f"queues: shares must sum to at most 1, got {total_share:g}")
        for name in ("max_preemptions_per_hour", "max_preemptions_per_job_per_hour"):
            if getattr(self, name) < 0:
                errors.append(f"{name}: must be >= 0, got {getattr(self, name)!r}")
        if errors:
            raise ValueError("invalid admission config: " + "; ".join(errors))
        object.__setattr__(self, "priority_classes", dict(self.priority_classes))

    def queue(self, name: str) -> QueueConfig | None:
        for q in self.queues:
            if q.name == name:
                return q
        return None


@dataclass(frozen=True)
class PreemptionRecord:
    job_id: str
    at_s: float


@dataclass(frozen=True)
class Reservation:
    """The head of the queue's claim on future capacity (for `rcp queue` and events)."""

    job_id: str
    start_by_s: float | None
    """When the reservation is guaranteed to be met; None if a needed gang has no max runtime."""
    gpus_by_node: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class AdmissionState:
    """The policy's memory between ticks; the caller persists it (see `to_dict`)."""

    preemptions: tuple[PreemptionRecord, ...] = ()
    """Preemptions decided in the last `PREEMPTION_WINDOW_S`, oldest first."""
    reservation: Reservation | None = None

    def to_dict(self) -> dict[str, Any]:
        r = self.reservation
        return {
            "preemptions": [{"job_id": p.job_id, "at_s": p.at_s} for p in self.preemptions],
            "reservation": None
            if r is None
            else {
                "job_id": r.job_id,
                "start_by_s": r.start_by_s,
                "gpus_by_node": [[n, g] for n, g in r.gpus_by_node],
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdmissionState:
        preemptions = tuple(
            PreemptionRecord(str(p["job_id"]), float(p["at_s"]))
            for p in data.get("preemptions", ())
        )
        raw = data.get("reservation")
        reservation = None
        if raw is not None:
            start = raw.get("start_by_s")
            reservation = Reservation(
                job_id=str(raw["job_id"]),
                start_by_s=None if start is None else float(start),
                gpus_by_node=tuple((str(n), int(g)) for n, g in raw.get("gpus_by_node", ())),
            )
        return cls(preemptions=preemptions, reservation=reservation)


def gang_fits(num_workers: int, gpus_per_worker: int, node_gpus: Iterable[int]) -> bool:
    """Whether `num_workers` workers of `gpus_per_worker` GPUs each fit on nodes with these GPUs.

    The service uses it at submit time with every cluster node's ``gpus_total`` to reject a job
    bigger than the pool could ever hold.
    """
    if num_workers <= 0 or gpus_per_worker <= 0:
        return True
    return sum(g // gpus_per_worker for g in node_gpus) >= num_workers


class _Gpus:
    """Free GPUs per node, indexed by free count so a gang fit costs O(distinct counts).

    Local scratch for one decision; mutable on purpose and never escapes `decide`.
    """

    __slots__ = ("failed", "free", "levels", "total")

    def __init__(self, free: Mapping[str, int]) -> None:
        self.free: dict[str, int] = {}
        self.levels: dict[int, dict[str, None]] = {}
        self.total = 0
        self.failed: dict[int, int] = {}
        for node_id, gpus in free.items():
            self.free[node_id] = 0
            self.add(node_id, gpus)

    def copy(self) -> _Gpus:
        return _Gpus(self.free)

    def add(self, node_id: str, delta: int) -> None:
        """Change a node's free GPUs by `delta` (negative to take)."""
        if delta == 0:
            return
        old = self.free.get(node_id, 0)
        new = old + delta
        assert new >= 0, f"node {node_id}: free GPUs would go negative"
        if old > 0:
            level = self.levels[old]
            del level[node_id]
            if not level:
                del self.levels[old]
        if new > 0:
            self.levels.setdefault(new, {})[node_id] = None
        self.free[node_id] = new
        self.total += delta
        if delta > 0:
            self.failed.clear()

    def fits(self, gpus_per_worker: int, num_workers: int) -> bool:
        if num_workers <= 0 or gpus_per_worker <= 0:
            return True
        if gpus_per_worker * num_workers > self.total:
            return False
        failed_at = self.failed.get(gpus_per_worker)
        if failed_at is not None and num_workers >= failed_at:
            return False
        slots = 0
        for level, nodes in self.levels.items():
            if level >= gpus_per_worker:
                slots += (level // gpus_per_worker) * len(nodes)
                if slots >= num_workers:
                    return True
        self.failed[gpus_per_worker] = num_workers
        return False

    def place(self, gpus_per_worker: int, num_workers: int) -> list[tuple[str, int]] | None:
        """Workers per node for the gang, or None if it does not fit. Does not take the GPUs."""
        if not self.fits(gpus_per_worker, num_workers):
            return None
        if num_workers <= 0 or gpus_per_worker <= 0:
            return []
        remaining = num_workers
        chosen: list[tuple[str, int]] = []
        used: set[str] = set()
        usable = sorted((lv for lv in self.levels if lv >= gpus_per_worker), reverse=True)
        for level in usable:
            per_node = level // gpus_per_worker
            if per_node > remaining:
                continue
            for node_id in self.levels[level]:
                if per_node > remaining:
                    break
                chosen.append((node_id, per_node))
                used.add(node_id)
                remaining -= per_node
            if remaining == 0:
                return chosen
        # Best fit for the remainder: the smallest node that still takes it whole.
        for level in reversed(usable):
            if level // gpus_per_worker >= remaining:
                for node_id in self.levels[level]:
                    if node_id not in used:
                        chosen.append((node_id, remaining))
                        return chosen
        raise AssertionError("fits() said yes but no placement was found")


@dataclass
class _Candidate:
    """Something that can give the head GPUs now: a Serve replica or a gang to preempt."""

    gpus_by_node: Mapping[str, int]
    replica: ServeReplica | None = None
    gang: RunningGang | None = None


class _Decision:
    """One call of `decide`: local, mutable scratch for the batch. Never escapes."""

    def __init__(
        self, snapshot: ClusterSnapshot, config: AdmissionConfig, state: AdmissionState
    ) -> None:
        self.snap = snapshot
        self.cfg = config
        self.queue_cfg = {q.name: q for q in config.queues}
        self.now_s = snapshot.now_s
        self.plan: list[Action] = []
        horizon = self.now_s - PREEMPTION_WINDOW_S
        self.preemptions = [p for p in state.preemptions if p.at_s > horizon]
        self.preempted_count: dict[str, int] = {}
        last_preempted: dict[str, float] = {}
        for p in self.preemptions:
            self.preempted_count[p.job_id] = self.preempted_count.get(p.job_id, 0) + 1
            last_preempted[p.job_id] = max(p.at_s, last_preempted.get(p.job_id, -math.inf))
        self.reservation: Reservation | None = None
        self.admitted: list[tuple[float | None, str, str, Mapping[str, int]]] = []
        """Gangs admitted this tick: (expected end, job_id, queue, GPUs by node)."""

        live = [n for n in snapshot.nodes if n.pool is Pool.CLUSTER and n.healthy]
        self.live_ids = {n.node_id for n in live}
        self.capacity = sum(n.gpus_total for n in live)
        self.free = _Gpus({n.node_id: n.gpus_free for n in live})
        self.unprotected = self.free  # becomes a separate copy once a reservation exists
        self.start_by_s: float | None = None
        self.never_fits: dict[int, float] = {}
        """gpus_per_worker -> fewest workers that cannot fit even once everything ends."""

        # Releasing GPUs: coming back without any new action.
        self.releasing: dict[str, int] = {}
        self.gangs: list[RunningGang] = []  # holding, not releasing
        self.used_by_queue: dict[str, int] = {}
        self.used_by_queue_value: dict[str, dict[int, int]] = {}
        """Per queue: GPUs held by running gangs per priority value (for entitlement)."""
        self.admitted_by_queue: dict[str, int] = {}
        self.lowest_value = min(config.priority_classes.values())
        for g in snapshot.running:
            live_gpus = {n: k for n, k in g.gpus_by_node.items() if n in self.live_ids and k > 0}
            asked = last_preempted.get(g.job_id)
            if g.preempting or (asked is not None and asked >= g.started_s):
                for n, k in live_gpus.items():
                    self.releasing[n] = self.releasing.get(n, 0) + k
                continue
            self.gangs.append(g)
            held = sum(live_gpus.values())
            self.used_by_queue[g.queue] = self.used_by_queue.get(g.queue, 0) + held
            by_value = self.used_by_queue_value.setdefault(g.queue, {})
            value = config.priority_classes.get(g.priority_class, self.lowest_value)
            by_value[value] = by_value.get(value, 0) + held
        self.replicas: list[ServeReplica] = []
        for r in snapshot.serve_replicas:
            if r.pool is not Pool.CLUSTER or r.node_id not in self.live_ids or r.gpus <= 0:
                continue
            if r.state is ReplicaState.STOPPING:
                self.releasing[r.node_id] = self.releasing.get(r.node_id, 0) + r.gpus
            else:
                self.replicas.append(r)

    # -- shares -------------------------------------------------------------------------

    def nominal_gpus(self, queue: str) -> float:
        q = self.queue_cfg.get(queue)
        return 0.0 if q is None else q.share * self.capacity

    def within_share(self, queue: str, extra_gpus: int) -> bool:
        used = self.used_by_queue.get(queue, 0)
        return used + extra_gpus <= self.nominal_gpus(queue) + _EPS

    def entitled(self, queue: str, value: int, need_gpus: int) -> bool:
        """Within share once lower-priority gangs of its own queue are set aside."""
        held = self.admitted_by_queue.get(queue, 0)
        for v, gpus in self.used_by_queue_value.get(queue, {}).items():
            if v >= value:
                held += gpus
        return held + need_gpus <= self.nominal_gpus(queue) + _EPS

    def may_borrow(self, queue: str, extra_gpus: int) -> bool:
        q = self.queue_cfg.get(queue)
        if q is None:
            return False
        if q.borrowing_limit is None:
            return True
        limit = (q.share + q.borrowing_limit) * self.capacity
        return self.used_by_queue.get(queue, 0) + extra_gpus <= limit + _EPS

    def over_share(self, queue: str) -> bool:
        return self.used_by_queue.get(queue, 0) > self.nominal_gpus(queue) + _EPS

    # -- the batch ----------------------------------------------------------------------

    def run(self) -> None:
        classes = self.cfg.priority_classes
        queue_names = self.queue_cfg.keys()
        valid: list[tuple[int, float, str, QueuedJob]] = []
        for job in self.snap.queued:
            if job.queue not in queue_names:
                self.plan.append(
                    RejectJob(
                        job.job_id,
                        f"{Why.UNKNOWN_QUEUE.value}: queue {job.queue!r} is not configured "
                        f"(known: {', '.join(sorted(queue_names))})",
                    )
                )
                continue
            value = classes.get(job.priority_class)
            if value is None:
                self.plan.append(
                    RejectJob(
                        job.job_id,
                        f"{Why.UNKNOWN_PRIORITY_CLASS.value}: priority class "
                        f"{job.priority_class!r} is not configured "
                        f"(known: {', '.join(sorted(classes))})",
                    )
                )
                continue
            if job.not_before_s is not None and job.not_before_s > self.now_s:
                continue  # backing off after a failed start; blocks no one
            valid.append((-value, job.submitted_s, job.job_id, job))
        valid.sort(key=lambda t: (t[0], t[1], t[2]))
        head_decided = False
        free = self.free
        for neg_value, _, _, job in valid:
            need = job.num_workers * job.gpus_per_worker
            if head_decided and need > free.total:
                if free.total == 0:
                    break  # nothing left to admit and the head is decided
                continue  # cannot fit anywhere this tick
            within = self.within_share(job.queue, need)
            if not within and not self.may_borrow(job.queue, need):
                continue  # its queue may not borrow this much: waits, blocks no one
            if self.try_admit(job, within):
                continue
            if (
                not head_decided
                and need <= self.nominal_gpus(job.queue) + _EPS
                and job.num_workers < self.never_fits.get(job.gpus_per_worker, math.inf)
            ):
                head_decided = self.try_reserve(job, -neg_value)
                if not head_decided:
                    self.never_fits[job.gpus_per_worker] = min(
                        job.num_workers, self.never_fits.get(job.gpus_per_worker, math.inf)
                    )

    def try_admit(self, job: QueuedJob, within_share: bool) -> bool:
        g, w = job.gpus_per_worker, job.num_workers
        short = (
            self.reservation is not None
            and self.start_by_s is not None
            and job.max_runtime_s is not None
            and self.now_s + job.max_runtime_s <= self.start_by_s
        )
        pool = self.free if short or self.reservation is None else self.unprotected
        placement = pool.place(g, w)
        if placement is None:
            return False
        separate = self.unprotected is not self.free
        for node_id, workers in placement:
            gpus = workers * g
            if separate:
                protected = self.free.free[node_id] - self.unprotected.free[node_id]
                take_unprotected = gpus if not short else max(0, gpus - protected)
                self.unprotected.add(node_id, -take_unprotected)
            self.free.add(node_id, -gpus)
        self.used_by_queue[job.queue] = self.used_by_queue.get(job.queue, 0) + job.gpus_total
        self.admitted_by_queue[job.queue] = (
            self.admitted_by_queue.get(job.queue, 0) + job.gpus_total
        )
        end_s = None if job.max_runtime_s is None else self.now_s + job.max_runtime_s
        self.admitted.append((end_s, job.job_id, job.queue, {n: k * g for n, k in placement}))
        if self.reservation is None:
            why = f"{Why.FITS.value}: all {w} workers x {g} GPUs fit now"
        elif short:
            why = (
                f"{Why.BACKFILL.value}: ends by {self.now_s + (job.max_runtime_s or 0):g}s, "
                f"before the reservation for {self.reservation.job_id} can be met at "
                f"{self.start_by_s:g}s"
            )
        else:
            why = (
                f"{Why.BACKFILL.value}: fits on GPUs the reservation for "
                f"{self.reservation.job_id} does not need"
            )
        if not within_share:
            why += f"; borrows idle GPUs beyond queue {job.queue!r}'s share"
        self.plan.append(
            AdmitJob(
                job_id=job.job_id,
                placement=tuple(WorkerPlacement(n, k) for n, k in placement),
                gpus_per_worker=g,
                num_workers=w,
                reason=why,
            )
        )
        return True

    def try_reserve(self, head: QueuedJob, head_value: int) -> bool:
        """Reserve for `head`, making room now if allowed. True once a head is decided."""
        g, w = head.gpus_per_worker, head.num_workers
        future = self.free.copy()
        extra: dict[str, int] = {}

        def give(gpus_by_node: Mapping[str, int], sign: int = 1) -> None:
            for n, k in gpus_by_node.items():
                if n in self.live_ids and k > 0:
                    future.add(n, sign * k)
                    extra[n] = extra.get(n, 0) + sign * k

        give(self.releasing)
        entitled = self.entitled(head.queue, head_value, head.gpus_total)
        if entitled and future.fits(g, w):
            return self.reserve(head, future, extra, self.now_s)
        if entitled and self.make_room_now(head, head_value, future, give):
            return self.reserve(head, future, extra, self.now_s)
        future = self.free.copy()
        extra = {}
        give(self.releasing)

        # Wait for running gangs to end: the earliest T by which the head is guaranteed to fit,
        # both on the nodes and within its queue's share.
        if self.cfg.move_serve_replicas:
            for r in self.replicas:
                give({r.node_id: r.gpus})
        nominal = self.nominal_gpus(head.queue) + _EPS
        queue_held = self.used_by_queue.get(head.queue, 0)
        holders = [
            (g.expected_end_s, g.job_id, g.queue, g.gpus_by_node) for g in self.gangs
        ] + self.admitted
        holders.sort(key=lambda h: (math.inf if h[0] is None else h[0], h[1]))
        for end_s, _, queue, gpus_by_node in holders:
            give(gpus_by_node)
            if queue == head.queue:
                queue_held -= sum(k for n, k in gpus_by_node.items() if n in self.live_ids)
            if queue_held + head.gpus_total <= nominal and future.fits(g, w):
                return self.reserve(head, future, extra, end_s)
        return False  # cannot fit even on an empty pool: no reservation, blocks no one

    def make_room_now(
        self,
        head: QueuedJob,
        head_value: int,
        future: _Gpus,
        give: Callable[..., None],
    ) -> bool:
        """Serve replicas first (training outranks serving), then victims; minimal set."""
        g, w = head.gpus_per_worker, head.num_workers
        serve = self.serve_candidates(future) if self.cfg.move_serve_replicas else []
        victims = self.victim_candidates(head, head_value)
        chosen: list[_Candidate] = []
        queue_used = dict(self.used_by_queue)
        fitted = False
        for cand in serve + victims:
            if cand.gang is not None and not self.still_eligible(head, cand.gang):
                continue
            chosen.append(cand)
            give(cand.gpus_by_node)
            if cand.gang is not None:
                self.used_by_queue[cand.gang.queue] -= _live_gpus(cand.gang, self.live_ids)
            if future.fits(g, w):
                fitted = True
                break
        self.used_by_queue = queue_used
        if not fitted:
            return False
        for cand in reversed(list(chosen)):
            give(cand.gpus_by_node, -1)
            if future.fits(g, w):
                chosen.remove(cand)
            else:
                give(cand.gpus_by_node)
        num_victims = sum(1 for c in chosen if c.gang is not None)
        if num_victims > self.cfg.max_preemptions_per_hour - len(self.preemptions):
            return False  # over the cap: nobody is preempted, the head waits
        self.make_room(head, chosen)
        return True

    def reserve(
        self, head: QueuedJob, future: _Gpus, extra: Mapping[str, int], start_by_s: float | None
    ) -> bool:
        placement = future.place(head.gpus_per_worker, head.num_workers)
        assert placement is not None
        self.unprotected = self.free.copy()
        held: list[tuple[str, int]] = []
        for node_id, workers in placement:
            gpus = workers * head.gpus_per_worker
            held.append((node_id, gpus))
            protected = min(self.free.free.get(node_id, 0), max(0, gpus - extra.get(node_id, 0)))
            self.unprotected.add(node_id, -protected)
        self.start_by_s = start_by_s
        self.reservation = Reservation(head.job_id, start_by_s, tuple(held))
        return True

    def serve_candidates(self, future: _Gpus) -> list[_Candidate]:
        ordered = sorted(
            self.replicas,
            key=lambda r: (
                -future.free.get(r.node_id, 0),
                r.state is ReplicaState.RUNNING,
                r.replica_id,
            ),
        )
        return [_Candidate({r.node_id: r.gpus}, replica=r) for r in ordered]

    def victim_candidates(self, head: QueuedJob, head_value: int) -> list[_Candidate]:
        if not self.cfg.preemption_enabled:
            return []
        if len(self.preemptions) >= self.cfg.max_preemptions_per_hour:
            return []
        cap = self.cfg.max_preemptions_per_job_per_hour
        classes = self.cfg.priority_classes
        out: list[tuple[tuple[float, float, float, str], _Candidate]] = []
        for gang in self.gangs:
            if self.preempted_count.get(gang.job_id, 0) >= cap:
                continue
            if _live_gpus(gang, self.live_ids) == 0:
                continue
            value = classes.get(gang.priority_class, min(classes.values()))
            same_queue = gang.queue == head.queue
            if same_queue and value >= head_value:
                continue
            key = (float(value), gang.work_at_risk_s(self.now_s), -gang.started_s, gang.job_id)
            out.append((key, _Candidate(gang.gpus_by_node, gang=gang)))
        out.sort(key=lambda t: t[0])
        return [c for _, c in out]

    def still_eligible(self, head: QueuedJob, gang: RunningGang) -> bool:
        """Same queue: lower priority (checked already). Other queue: it is over its share."""
        return gang.queue == head.queue or self.over_share(gang.queue)

    def make_room(self, head: QueuedJob, chosen: list[_Candidate]) -> None:
        moves: dict[str, list[str]] = {}
        for cand in chosen:
            if cand.replica is not None:
                moves.setdefault(cand.replica.model, []).append(cand.replica.node_id)
        for model, node_ids in moves.items():
            self.plan.append(
                MoveServeReplicas(
                    model=model,
                    from_pool=Pool.CLUSTER,
                    to_pool=Pool.EXTERNAL,
                    num_replicas=len(node_ids),
                    node_ids=tuple(sorted(node_ids)),
                    reason=(
                        f"{Why.SERVE_YIELDS.value}: training job {head.job_id} needs "
                        f"{head.num_workers} x {head.gpus_per_worker} GPUs"
                    ),
                    for_job_id=head.job_id,
                )
            )
        for cand in chosen:
            gang = cand.gang
            if gang is None:
                continue
            if gang.queue == head.queue:
                why = (
                    f"{Why.PREEMPT_PRIORITY.value}: {head.job_id} ({head.priority_class}) "
                    f"outranks {gang.job_id} ({gang.priority_class})"
                )
            else:
                why = (
                    f"{Why.RECLAIM_SHARE.value}: queue {gang.queue!r} is over its share and "
                    f"{head.job_id} is within queue {head.queue!r}'s share"
                )
            self.plan.append(PreemptJob(gang.job_id, why, for_job_id=head.job_id))
            self.preemptions.append(PreemptionRecord(gang.job_id, self.now_s))
            self.used_by_queue[gang.queue] -= _live_gpus(gang, self.live_ids)


def _live_gpus(gang: RunningGang, live_ids: set[str]) -> int:
    return sum(k for n, k in gang.gpus_by_node.items() if n in live_ids)


def decide(
    snapshot: ClusterSnapshot, config: AdmissionConfig, state: AdmissionState
) -> tuple[Plan, AdmissionState]:
    """Decide admissions, replica moves and preemptions for one tick (see the module doc).

    Returns the plan (rejections, then in queue order: admissions, and for the head any
    `MoveServeReplicas` and `PreemptJob` actions) and the new state.
    """
    d = _Decision(snapshot, config, state)
    d.run()
    new_state = AdmissionState(preemptions=tuple(d.preemptions), reservation=d.reservation)
    return tuple(d.plan), new_state
