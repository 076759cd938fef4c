"""Admission and preemption of training gangs: which queued jobs start, what must make room.

A package of pure steps behind one entry point, ``decide(snapshot, config, state) -> (plan,
state)`` over the `cluster` pool. Its config is `AdmissionConfig`, its memory
`AdmissionState` (recent preemptions for the cap, and the current head-of-queue reservation,
for display). The rooms, by concern:

- `config`: `AdmissionConfig` and its parts (`PreemptionConfig`, `QueueShare`, `QueueConfig`),
  whose fields and defaults the ``jobs`` config section embeds;
- `state`: `AdmissionState`, `PreemptionRecord`, `Reservation`;
- `shares`: ordering and shares (the queue order, the `Ledger` of who holds what);
- `fit`: gang fit (`gang_fits`, the free-GPU index);
- `preemption`: the minimal set that makes room for the head, and the plan that asks it;
- `reservation`: the head's reservation and what it protects from backfill;
- `borrow`: whether a gang that lost a node borrows one from serving or waits for the
  replacement (`BorrowConfig`, embedded by the ``pools.cluster`` config section);
- `forecast`: what serving's forecast leaves training, slot by slot (`ForecastRoom`);
- `decision`: `decide`, the batch over the queue;
- `reasons`: `Why`, the code at the start of every reason.

Every public name is re-exported here, so callers import from `policies.admission`.

Must not: import Ray, read a clock, do I/O or draw random numbers. Everything it knows comes
from the snapshot (time is ``snapshot.now_s``); everything it wants is in the returned plan.
Actions are level-triggered: a wanted admission, replica move or reservation is recomputed
every tick; only preemptions are remembered, so the same victim is never asked twice.

The rules
---------
Capacity
    The healthy nodes of the `cluster` pool in this snapshot, nothing else. A node that turns
    unhealthy shrinks capacity, the queue shares and every fit check on the next tick. A
    serving-only node (``NodeView.serving_only``: fabric faults, GPUs fine) is left out the
    same way: no gang worker is placed there and its replicas are never claimed (moving them
    frees nothing a gang may use); its GPUs are usable by replicas only. A job that could
    never fit on the other nodes but would with the serving-only ones gets a `WaitJob`
    naming them (``serving-only-nodes``).
Order
    Queued jobs are considered by priority class value (high first), then FIFO by
    ``submitted_s``, then ``job_id``; a job backing off (``not_before_s`` in the future) is
    skipped. Every training job outranks serving's *placement*: GPUs held by Serve replicas in
    the `cluster` pool count as reclaimable, and taking them produces a `MoveServeReplicas`
    request (make-before-break, done by the placement policy and the Serve actuator), never a
    preemption. But serving's *demand* is a guarantee (issue 28): with ``external_room_gpus``
    given, replicas count as reclaimable only as far as the external pool can host them, in
    yield order (a model that is ``on_shortfall: yield`` always counts); a gang that needs the
    rest waits with a ``serving-demand`` reason naming each model and the room.
Serving first
    ``serving_need_gpus``: cluster GPUs serving's demand needs that placement could place
    nowhere (the loop passes what it could not place the tick before). They are held before
    any gang is considered: the free GPUs of serving-only nodes, then free and releasing
    gang-node GPUs (most free node first); what
    is still missing is reclaimed from training, checkpoint first: the lowest-priority gang
    whose GPUs suffice (the smallest such), else gangs in victim order until they do, with
    those the rest cover spared again (reason ``serving-reclaims``), within the preemption
    caps. A reclaimed job is re-queued like any preempted one, no restart spent.
Serving's forecast
    With a ``forecast`` (`policies.forecast.ServingForecast`: per slot ahead, the cluster GPUs
    serving's daily profile needs that the providers cannot host), a gang whose run (now to
    ``now_s + max_runtime_s``; none: the whole horizon) overlaps a slot where the capacity,
    less that need, less the gangs still running then, has no room for it waits with a
    ``serving-forecast`` reason saying when it is expected to start; it blocks no one, so
    shorter work that ends before the peak is admitted meanwhile. A gang that no start could
    keep clear of the peak is not held: serving reclaims from it at the peak, as before
    (`policies.admission.forecast`).
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
    enough. In-cluster Serve replicas yield first (one `MoveServeReplicas` per model), the
    lowest-priority model's first (`decide`'s ``models``: `policies.model_classes`), never a
    model's ``min_cluster_replicas``; then training victims: lower-priority gangs of the head's
    queue, and (reclaim) gangs of queues over their share. Victims are taken in order (lowest
    priority value, then least work at risk, i.e. most recently checkpointed, then most recently
    started, then job_id) until the head fits; then every replica or victim that the fit does
    not need is spared again, most expensive first, so the set is minimal (none can be dropped;
    not a global minimum). Caps: a job preempted ``max_preemptions_per_job_per_hour`` times in
    the rolling hour is not a candidate; if the victims would exceed
    ``max_preemptions_per_hour`` in the rolling hour, nobody is preempted (never a partial
    preemption) and the head waits. A victim is asked once: gangs with ``preempting`` set, or
    preempted (per the state) after they started, count as releasing and are never chosen again.
Serving as the spare pool
    A head that lost a node (``QueuedJob.lost_s``: it died, or health took it out) and fits
    only once Serve replicas move borrows them (``serving-lends-a-node``) unless the cluster
    pool's replacement node is due soon enough that waiting costs fewer GPU-seconds
    (`policies.admission.borrow`); then it waits (``waits-for-replacement-node``) with T the
    replacement's due time and every GPU free now protected. The replicas come back to the
    cluster pool by placement's way back once nothing waits for the room.
Pins
    Replicas of a model an operator pinned to the `cluster` pool (``snapshot.pinned``) are
    never claimable: their GPUs count as held. When only they keep the first job that does
    not fit out (it would fit on the free, releasing and claimable GPUs plus theirs), the
    plan says so with a `WaitJob` naming the pinned models and their GPUs. The same for
    models' floors (``min_cluster_replicas``): a ``serving-floor`` `WaitJob` names each model
    and the replicas it keeps on the cluster pool; no replica moves for that gang.
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

from policies.admission.borrow import BorrowConfig
from policies.admission.config import (
    DEFAULT_PRIORITY_CLASSES,
    DEFAULT_QUEUE,
    AdmissionConfig,
    PreemptionConfig,
    QueueConfig,
    QueueShare,
)
from policies.admission.decision import decide
from policies.admission.fit import gang_fits
from policies.admission.reasons import Why
from policies.admission.state import (
    PREEMPTION_WINDOW_S,
    AdmissionState,
    PreemptionRecord,
    Reservation,
)

__all__ = [
    "DEFAULT_PRIORITY_CLASSES",
    "DEFAULT_QUEUE",
    "PREEMPTION_WINDOW_S",
    "AdmissionConfig",
    "AdmissionState",
    "BorrowConfig",
    "PreemptionConfig",
    "PreemptionRecord",
    "QueueConfig",
    "QueueShare",
    "Reservation",
    "Why",
    "decide",
    "gang_fits",
]
