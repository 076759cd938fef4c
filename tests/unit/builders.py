"""Small builders for policy inputs, so a test table reads as the cluster it describes.

Owns: defaults that keep test rows short (a node is a healthy 8-GPU cluster node, a job is one
medium-priority worker of 1 GPU in the `default` queue). Must not: decide anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from policies.snapshot import (
    ClusterSnapshot,
    NodeView,
    Pool,
    QueuedJob,
    ReplicaState,
    RunningGang,
    ServeReplica,
)


def node(
    node_id: str,
    gpus_free: int | None = None,
    *,
    gpus_total: int = 8,
    pool: Pool = Pool.CLUSTER,
    healthy: bool = True,
    labels: Mapping[str, str] | None = None,
) -> NodeView:
    """A node; `gpus_free` defaults to all of it."""
    return NodeView(
        node_id=node_id,
        pool=pool,
        gpus_total=gpus_total,
        gpus_free=gpus_total if gpus_free is None else gpus_free,
        healthy=healthy,
        labels=dict(labels or {"pool": pool.value}),
    )


def job(
    job_id: str,
    workers: int = 1,
    gpus: int = 1,
    *,
    priority: str = "medium",
    queue: str = "default",
    submitted_s: float = 0.0,
    max_runtime_s: float | None = None,
    not_before_s: float | None = None,
    lost_s: float | None = None,
) -> QueuedJob:
    """A queued gang of `workers` workers with `gpus` GPUs each."""
    return QueuedJob(
        job_id=job_id,
        queue=queue,
        priority_class=priority,
        num_workers=workers,
        gpus_per_worker=gpus,
        submitted_s=submitted_s,
        max_runtime_s=max_runtime_s,
        not_before_s=not_before_s,
        lost_s=lost_s,
    )


def gang(
    job_id: str,
    placement: Mapping[str, int],
    *,
    gpus_per_worker: int = 1,
    priority: str = "medium",
    queue: str = "default",
    started_s: float = 0.0,
    max_runtime_s: float | None = None,
    last_checkpoint_s: float | None = None,
    preempting: bool = False,
) -> RunningGang:
    """A running gang holding `placement` (node -> GPUs)."""
    workers = sum(placement.values()) // max(1, gpus_per_worker)
    return RunningGang(
        job_id=job_id,
        queue=queue,
        priority_class=priority,
        num_workers=workers,
        gpus_per_worker=gpus_per_worker,
        gpus_by_node=dict(placement),
        started_s=started_s,
        max_runtime_s=max_runtime_s,
        last_checkpoint_s=last_checkpoint_s,
        preempting=preempting,
    )


def replica(
    replica_id: str,
    node_id: str,
    *,
    model: str = "m",
    gpus: int = 1,
    pool: Pool = Pool.CLUSTER,
    state: ReplicaState = ReplicaState.RUNNING,
) -> ServeReplica:
    return ServeReplica(
        replica_id=replica_id, model=model, pool=pool, node_id=node_id, gpus=gpus, state=state
    )


def snapshot(
    nodes: Iterable[NodeView] = (),
    *,
    queued: Iterable[QueuedJob] = (),
    running: Iterable[RunningGang] = (),
    replicas: Iterable[ServeReplica] = (),
    now_s: float = 100.0,
    derive_free: bool = True,
    pinned: Mapping[str, Pool] | None = None,
) -> ClusterSnapshot:
    """A snapshot; with `derive_free` each node's free GPUs are its total minus what the
    running gangs and replicas hold there (so tables only say who holds what)."""
    running_t, replicas_t = tuple(running), tuple(replicas)
    nodes_t = tuple(nodes)
    if derive_free:
        held: dict[str, int] = {}
        for g in running_t:
            for n, k in g.gpus_by_node.items():
                held[n] = held.get(n, 0) + k
        for r in replicas_t:
            held[r.node_id] = held.get(r.node_id, 0) + r.gpus
        nodes_t = tuple(
            replace(n, gpus_free=n.gpus_total - held.get(n.node_id, 0)) for n in nodes_t
        )
    return ClusterSnapshot(
        now_s=now_s,
        nodes=nodes_t,
        serve_replicas=replicas_t,
        queued=tuple(queued),
        running=running_t,
        pinned=dict(pinned or {}),
    )
