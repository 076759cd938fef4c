"""The observe phase: one frozen `ClusterSnapshot` from Ray's node inventory and the store.

Owns: turning node rows (`controlplane.inventory.list_nodes`) and job records into the
snapshot's plain values, keeping the snapshot's contract:

* ``gpus_free`` of a node = min(what Ray reports available, gpus_total - GPUs that gangs
  ADMITTED or RUNNING hold there per the store). Ray's figure already excludes Serve replicas
  and gangs it has placed; the store's covers gangs admitted but not yet visible to Ray.
* every ADMITTED or RUNNING job is a `RunningGang`, with ``preempting`` set while a
  preemption is in progress (until its GPUs are released and it goes back to QUEUED);
* queued jobs carry ``not_before_s`` (gang-start backoff) from the store.

Serve replicas are left out of the snapshot here (the serving plane builds its own part); the
GPUs they hold are still excluded from ``gpus_free`` through Ray's availability.

Must not: change anything. `build_snapshot` is pure given its inputs, so tests can feed rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from controlplane.inventory import NodeRow
from controlplane.store import JobRecord, JobState
from policies.snapshot import ClusterSnapshot, NodeView, Pool, QueuedJob, RunningGang

__all__ = ["HOLDING_STATES", "build_snapshot"]

HOLDING_STATES = (JobState.ADMITTED, JobState.RUNNING)


def _pool(name: str) -> Pool | None:
    try:
        return Pool(name)
    except ValueError:
        return None


def _placement(job: JobRecord) -> Mapping[str, int]:
    raw = job.info.get("placement") or {}
    return {str(k): int(v) for k, v in raw.items()}


def build_snapshot(
    now_s: float, nodes: Iterable[NodeRow], jobs: Iterable[JobRecord]
) -> ClusterSnapshot:
    """The snapshot for one tick (see the module doc for the rules)."""
    jobs = list(jobs)
    held: dict[str, int] = {}
    running: list[RunningGang] = []
    queued: list[QueuedJob] = []
    for job in jobs:
        s = job.spec
        if job.state in HOLDING_STATES:
            placement = _placement(job)
            for node_id, gpus in placement.items():
                held[node_id] = held.get(node_id, 0) + gpus
            ckpt: Mapping[str, Any] = job.info.get("checkpoint") or {}
            running.append(
                RunningGang(
                    job_id=job.job_id,
                    queue=s.queue,
                    priority_class=s.priority_class,
                    num_workers=s.num_workers,
                    gpus_per_worker=s.gpus_per_worker,
                    gpus_by_node=placement,
                    started_s=float(job.info.get("admitted_s", job.updated_s)),
                    max_runtime_s=s.max_runtime_s,
                    last_checkpoint_s=ckpt.get("at_s"),
                    preempting=bool(job.info.get("preempting")),
                )
            )
        elif job.state is JobState.QUEUED:
            nb = job.info.get("not_before_s")
            queued.append(
                QueuedJob(
                    job_id=job.job_id,
                    queue=s.queue,
                    priority_class=s.priority_class,
                    num_workers=s.num_workers,
                    gpus_per_worker=s.gpus_per_worker,
                    submitted_s=job.queued_s,
                    max_runtime_s=s.max_runtime_s,
                    not_before_s=None if nb is None else float(nb),
                )
            )
    views: list[NodeView] = []
    for row in nodes:
        pool = _pool(row.pool)
        if pool is None:
            continue
        total = int(row.gpus_total)
        free = min(int(row.gpus_free), total - held.get(row.node_id, 0))
        views.append(
            NodeView(
                node_id=row.node_id,
                pool=pool,
                gpus_total=total,
                gpus_free=max(0, free),
                healthy=row.state == "ALIVE",
                labels=dict(row.labels),
            )
        )
    return ClusterSnapshot(
        now_s=now_s, nodes=tuple(views), queued=tuple(queued), running=tuple(running)
    )
