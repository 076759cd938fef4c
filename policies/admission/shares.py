"""Ordering and shares: the queue in the order the policy considers it, and who holds what.

Owns: `queue_order` (rejections for unknown queues and priority classes; the rest by priority
value, high first, then FIFO by ``submitted_s``, then ``job_id``; jobs backing off skipped)
and the `Ledger`, one tick's accounting of the `cluster` pool: live capacity, free GPUs,
GPUs coming back (releasing), holding gangs, Serve replicas that could yield (all but pinned
models' and each model's ``min_cluster_replicas`` floor, `policies.model_classes`), and each
queue's use, with the share rules: a queue's nominal GPUs (``share x capacity``), whether a
job stays within its share, is entitled (within share once lower-priority gangs of its own
queue are set aside), may borrow, or whether a queue is over its share.

Worked example: capacity 16, queues ``a`` (share 0.5, borrowing limit 0.25) and ``b``
(0.5); ``a`` holds 6 GPUs. A 2-GPU job of ``a``: 6 + 2 = 8 <= 0.5 x 16, within its share.
A 4-GPU job: 10 > 8, it borrows, and may (10 <= (0.5 + 0.25) x 16 = 12); a 8-GPU job may
not (14 > 12): it waits, and blocks no one.

Must not: choose victims (`policies.admission.preemption`) or reserve
(`policies.admission.reservation`). The ledger is local, mutable scratch for one `decide`
call and never escapes it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from policies.admission.config import AdmissionConfig
from policies.admission.fit import FreeGpus
from policies.admission.reasons import Why
from policies.admission.state import PREEMPTION_WINDOW_S, AdmissionState
from policies.model_classes import ModelClass, yield_key
from policies.plan import RejectJob
from policies.snapshot import (
    ClusterSnapshot,
    Pool,
    QueuedJob,
    ReplicaState,
    RunningGang,
    ServeReplica,
)

__all__ = ["EPS", "Ledger", "live_gpus", "queue_order"]

EPS = 1e-9
"""Slack in share comparisons (shares are fractions of an integer capacity)."""


def queue_order(
    queued: Sequence[QueuedJob], config: AdmissionConfig, now_s: float
) -> tuple[list[RejectJob], list[tuple[int, float, str, QueuedJob]]]:
    """Rejections (unknown queue or priority class), and the jobs to consider in order, as
    ``(-priority value, submitted_s, job_id, job)`` (the sort key kept: no second list of
    10,000 on the hot path). A job backing off (``not_before_s`` in the future) is left out:
    it blocks no one."""
    classes = config.priority_classes
    queue_names = {q.name for q in config.queues}
    rejections: list[RejectJob] = []
    valid: list[tuple[int, float, str, QueuedJob]] = []
    for job in queued:
        if job.queue not in queue_names:
            why = (
                f"{Why.UNKNOWN_QUEUE.value}: queue {job.queue!r} is not configured "
                f"(known: {', '.join(sorted(queue_names))})"
            )
            rejections.append(RejectJob(job.job_id, why))
            continue
        value = classes.get(job.priority_class)
        if value is None:
            why = (
                f"{Why.UNKNOWN_PRIORITY_CLASS.value}: priority class {job.priority_class!r} "
                f"is not configured (known: {', '.join(sorted(classes))})"
            )
            rejections.append(RejectJob(job.job_id, why))
            continue
        if job.not_before_s is not None and job.not_before_s > now_s:
            continue  # backing off after a failed start; blocks no one
        valid.append((-value, job.submitted_s, job.job_id, job))
    valid.sort(key=lambda t: (t[0], t[1], t[2]))
    return rejections, valid


def live_gpus(gang: RunningGang, live_ids: set[str]) -> int:
    """GPUs `gang` holds on live nodes."""
    return sum(k for n, k in gang.gpus_by_node.items() if n in live_ids)


class Ledger:
    """One tick's accounting of the `cluster` pool and the queues' use of it (see the module
    doc). Local, mutable scratch for one `decide` call."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        config: AdmissionConfig,
        state: AdmissionState,
        models: Mapping[str, ModelClass] | None = None,
        external_room_gpus: int | None = None,
    ) -> None:
        self.cfg = config
        self.models: Mapping[str, ModelClass] = models or {}
        self.queue_cfg = {q.name: q for q in config.queues}
        self.now_s = snapshot.now_s
        horizon = self.now_s - PREEMPTION_WINDOW_S
        self.preemptions = [p for p in state.preemptions if p.at_s > horizon]
        self.preempted_count: dict[str, int] = {}
        last_preempted: dict[str, float] = {}
        for p in self.preemptions:
            self.preempted_count[p.job_id] = self.preempted_count.get(p.job_id, 0) + 1
            last_preempted[p.job_id] = max(p.at_s, last_preempted.get(p.job_id, -math.inf))
        self.admitted: list[tuple[float | None, str, str, Mapping[str, int]]] = []
        """Gangs admitted this tick: (expected end, job_id, queue, GPUs by node)."""

        # Serving-only nodes (fabric faults) are no gang's: their GPUs are not capacity here.
        live = snapshot.gang_nodes(Pool.CLUSTER)
        self.cluster_nodes_seen = sum(1 for n in snapshot.nodes if n.pool is Pool.CLUSTER)
        """Cluster nodes Ray still lists, healthy or not (fewer than the pool should have: a
        replacement is on its way, `policies.admission.borrow`)."""
        self.live_ids = {n.node_id for n in live}
        self.capacity = sum(n.gpus_total for n in live)
        self.free = FreeGpus({n.node_id: n.gpus_free for n in live})

        # Releasing GPUs: coming back without any new action.
        self.releasing: dict[str, int] = {}
        self.gangs: list[RunningGang] = []  # holding, not releasing
        self.used_by_queue: dict[str, int] = {}
        self.used_by_queue_value: dict[str, dict[int, int]] = {}
        """Per queue: GPUs held by running gangs per priority value (for entitlement)."""
        self.admitted_by_queue: dict[str, int] = {}
        self.lowest_value = min(config.priority_classes.values())
        for g in snapshot.running:
            held_gpus = {n: k for n, k in g.gpus_by_node.items() if n in self.live_ids and k > 0}
            asked = last_preempted.get(g.job_id)
            if g.preempting or (asked is not None and asked >= g.started_s):
                for n, k in held_gpus.items():
                    self.releasing[n] = self.releasing.get(n, 0) + k
                continue
            self.gangs.append(g)
            held = sum(held_gpus.values())
            self.used_by_queue[g.queue] = self.used_by_queue.get(g.queue, 0) + held
            by_value = self.used_by_queue_value.setdefault(g.queue, {})
            value = config.priority_classes.get(g.priority_class, self.lowest_value)
            by_value[value] = by_value.get(value, 0) + held
        self.replicas: list[ServeReplica] = []
        self.pinned: list[ServeReplica] = []
        """Replicas of models pinned to the cluster pool: never claimable."""
        self.floors: list[ServeReplica] = []
        """Each model's ``min_cluster_replicas`` of its cluster replicas: never claimable.
        They are the ones a claim would take last: running, on the nodes with least free."""
        by_model: dict[str, list[ServeReplica]] = {}
        for r in snapshot.serve_replicas:
            if r.pool is not Pool.CLUSTER or r.node_id not in self.live_ids or r.gpus <= 0:
                continue
            if r.state is ReplicaState.STOPPING:
                self.releasing[r.node_id] = self.releasing.get(r.node_id, 0) + r.gpus
            elif snapshot.pinned.get(r.model) is Pool.CLUSTER:
                self.pinned.append(r)
            else:
                by_model.setdefault(r.model, []).append(r)
        self.unhosted: list[ServeReplica] = []
        """Replicas a claim may not take this tick: no rented GPU can host them (beyond
        ``external_room_gpus``, in yield order), and their model's demand is a guarantee
        (``on_shortfall: reclaim``, the default). A gang that needs them waits."""
        self.external_room_gpus = external_room_gpus
        room = math.inf if external_room_gpus is None else external_room_gpus
        # Models in yield order, each model's replicas in claim order: the order a claim
        # takes them (`preemption._serve_candidates`), so the room goes to those first.
        for model in sorted(by_model, key=lambda m: yield_key(m, self.models)):
            replicas = by_model[model]
            replicas.sort(key=self.claim_order)
            cls = self.models.get(model)
            floor = cls.min_cluster_replicas if cls is not None else 0
            keep = min(floor, len(replicas))
            self.floors += replicas[len(replicas) - keep :]
            yields = cls is not None and cls.yields_on_shortfall  # claimable whatever the room
            for r in replicas[: len(replicas) - keep]:
                if yields:
                    self.replicas.append(r)
                elif r.gpus <= room:
                    room -= r.gpus
                    self.replicas.append(r)
                else:
                    self.unhosted.append(r)

    def claim_order(self, r: ServeReplica) -> tuple[int, bool, str]:
        """Within one model, the replica a claim takes first: on the node with most free
        GPUs, starting before running, then by id."""
        return (-self.free.free.get(r.node_id, 0), r.state is ReplicaState.RUNNING, r.replica_id)

    def nominal_gpus(self, queue: str) -> float:
        q = self.queue_cfg.get(queue)
        return 0.0 if q is None else q.share * self.capacity

    def within_share(self, queue: str, extra_gpus: int) -> bool:
        used = self.used_by_queue.get(queue, 0)
        return used + extra_gpus <= self.nominal_gpus(queue) + EPS

    def entitled(self, queue: str, value: int, need_gpus: int) -> bool:
        """Within share once lower-priority gangs of its own queue are set aside."""
        held = self.admitted_by_queue.get(queue, 0)
        for v, gpus in self.used_by_queue_value.get(queue, {}).items():
            if v >= value:
                held += gpus
        return held + need_gpus <= self.nominal_gpus(queue) + EPS

    def may_borrow(self, queue: str, extra_gpus: int) -> bool:
        q = self.queue_cfg.get(queue)
        if q is None:
            return False
        if q.borrowing_limit is None:
            return True
        limit = (q.share + q.borrowing_limit) * self.capacity
        return self.used_by_queue.get(queue, 0) + extra_gpus <= limit + EPS

    def over_share(self, queue: str) -> bool:
        return self.used_by_queue.get(queue, 0) > self.nominal_gpus(queue) + EPS
