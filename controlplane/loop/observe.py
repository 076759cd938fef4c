"""The observe phase: one frozen snapshot of nodes, jobs and Serve replicas per tick.

Owns: `observe`, which reads what the job runner sees of every gang, the active jobs from the
store (by index), the node inventory, the nodes Ray drains (no capacity: ``healthy=False``)
and the serving plane (`ServeView`, the load board, each model's p99: `serve_loads`) into one
`Observation`; node health is applied on top in the same phase (`with_health`), and each
gang learns which of its nodes the cluster no longer has alive (`with_lost_nodes`:
`policies.attempts` re-queues it at once).

The snapshot's rules (`build_snapshot`, pure given its inputs, so tests can feed rows):

* ``gpus_free`` of a node = min(what Ray reports available, gpus_total - GPUs that gangs
  ADMITTED or RUNNING hold there per the store). Ray's figure already excludes Serve replicas
  and gangs it has placed; the store's covers gangs admitted but not yet visible to Ray.
* every ADMITTED or RUNNING job is a `RunningGang`, with ``preempting`` set while a
  preemption is in progress (until its GPUs are released and it goes back to QUEUED);
* queued jobs carry ``not_before_s`` (gang-start backoff) from the store;
* Serve replicas come from the `ServeView` (`observe`), not from `build_snapshot`.

Must not: change anything (the runner records what it read in the act phase:
`JobRunner.apply`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace

from controlplane.adapters.serve import ServePlane, ServeView
from controlplane.inventory import NodeRow
from controlplane.loop.types import JobActions, NodeInventory, Observation
from controlplane.store import JobRecord, JobState, Store
from controlplane.store.job_info import as_finite, as_mapping
from policies.attempts import AttemptEnd, JobsView
from policies.health import NodeVerdict, with_verdicts
from policies.ingress import IngressTraffic
from policies.snapshot import ClusterSnapshot, NodeView, Pool, QueuedJob, RunningGang, ServeLoad

__all__ = ["build_snapshot", "observe", "serve_loads", "with_health", "with_lost_nodes"]


def observe(
    now_s: float,
    jobs: JobActions,
    store: Store,
    nodes: NodeInventory,
    draining: frozenset[str],
    serve: ServePlane | None,
    latency: Callable[[], Mapping[str, float]] | None = None,
) -> Observation:
    jobs_view = jobs.observe()
    records = tuple(store.list_jobs(states=[JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING]))
    rows = nodes.list_nodes()
    jobs_view = with_lost_nodes(jobs_view, records, {r.node_id for r in rows if r.state == "ALIVE"})
    snapshot = build_snapshot(now_s, rows, records)
    view = serve.view() if serve is not None else ServeView()
    loads: Mapping[str, float] = dict(serve.loads()) if serve is not None and view.deployed else {}
    ingress = (
        serve.ingress_traffic()
        if serve is not None and view.deployed and view.ingress_target
        else IngressTraffic()
    )
    snapshot = replace(
        snapshot,
        nodes=tuple(
            replace(n, healthy=False) if n.node_id in draining else n for n in snapshot.nodes
        ),
        serve_replicas=view.replicas,
        serve_load=serve_loads(loads, latency() if latency is not None and view.deployed else {}),
    )
    return Observation(
        snapshot=snapshot,
        jobs=records,
        draining=draining,
        serve=view,
        loads=loads,
        ingress=ingress,
        jobs_view=jobs_view,
    )


def serve_loads(ongoing: Mapping[str, float], p99_ms: Mapping[str, float]) -> tuple[ServeLoad, ...]:
    """The snapshot's per-model `ServeLoad` rows: ongoing requests (the load board) and p99
    (`controlplane.adapters.latency`); a non-finite or negative p99 is no reading."""
    rows = []
    for model in sorted(set(ongoing) | set(p99_ms)):
        p99 = p99_ms.get(model)
        ok = p99 is not None and math.isfinite(p99) and p99 >= 0
        rows.append(ServeLoad(model, float(ongoing.get(model, 0.0)), p99 if ok else None))
    return tuple(rows)


def with_health(observation: Observation, verdicts: Mapping[str, NodeVerdict]) -> Observation:
    """`observation` with its verdicts, unhealthy nodes out of the snapshot's capacity."""
    return replace(
        observation, snapshot=with_verdicts(observation.snapshot, verdicts), verdicts=dict(verdicts)
    )


def _pool(name: str) -> Pool | None:
    try:
        return Pool(name)
    except ValueError:
        return None


def with_lost_nodes(
    view: JobsView, records: Iterable[JobRecord], alive: Collection[str]
) -> JobsView:
    """`view` with each gang's nodes that are not in `alive` (Ray's list of live nodes, read
    this tick: a node it reports dead, or no longer reports) as its ``lost_nodes``. A read
    with no node alive at all says nothing about any gang (Ray between heads, say): `view`."""
    if not alive:
        return view
    placed = {r.job_id: as_mapping(r.info.get("placement")) for r in records}
    gangs = []
    for g in view.gangs:
        lost = tuple(sorted(n for n in placed.get(g.job_id, {}) if n not in alive))
        gangs.append(replace(g, lost_nodes=lost) if lost else g)
    return replace(view, gangs=tuple(gangs))


_LOST_NODE_ENDS = frozenset({AttemptEnd.LOST.value, AttemptEnd.HEALTH.value})


def _lost_s(job: JobRecord) -> float | None:
    """When the queued job's last attempt lost its node (died, or health took it out)."""
    attempts = job.info.get("attempts")
    if not isinstance(attempts, list) or not attempts:
        return None
    last = as_mapping(attempts[-1])
    return as_finite(last.get("ended_s")) if last.get("kind") in _LOST_NODE_ENDS else None


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
        if job.state in (JobState.ADMITTED, JobState.RUNNING):
            placement = {str(k): int(v) for k, v in (job.info.get("placement") or {}).items()}
            for node_id, gpus in placement.items():
                held[node_id] = held.get(node_id, 0) + gpus
            ckpt = job.info.get("checkpoint") or {}
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
                    lost_s=_lost_s(job),
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
