"""Fakes of every adapter the control loop uses, and a builder for a `Loop` on them.

Owns: `FakeServe` (a serving plane that starts a replica in `start_ticks` steps, stops one
in one step, applies a route table one step after it is written, and checks on every step
that no traffic is routed to a pool with no RUNNING replica: the unit-test form of "zero
failed requests"), `FakeCluster` (nodes with GPUs, the gangs the loop admits, Ray's drains),
`FakeJobs` (the job runner: admit/preempt/observe/apply through the store), `FakeTelemetry`
(agents and hand-set samples), `FakeMetrics`, and `make_loop`.

Must not: start Ray, or sleep. Time is a number the test moves (`Clock`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from controlplane.adapters.serve import PoolView, ServeView
from controlplane.config import Config, load_config
from controlplane.inventory import NodeRow
from controlplane.loop import Adapters, Loop
from controlplane.loop.act.serving import ScaleExternal
from controlplane.loop.decide import policies_of
from controlplane.store import JobState, Store
from jobs.spec import JobSpec
from policies.attempts import GangStatus, GangView, JobAction, JobsView, MarkRunning
from policies.ingress import IngressTraffic
from policies.plan import AdmitJob, PreemptJob
from policies.snapshot import Pool, ReplicaState, ServeReplica


@dataclass
class Clock:
    now_s: float = 1000.0

    def __call__(self) -> float:
        return self.now_s


@dataclass
class _Replica:
    replica_id: str
    model: str
    pool: Pool
    node_id: str
    state: ReplicaState
    age: int = 0


class FakeServe:
    """A serving plane for one or more 1-GPU models (see the module doc)."""

    def __init__(self, cluster: FakeCluster, start_ticks: int = 2) -> None:
        self.cluster = cluster
        self.start_ticks = start_ticks
        self.targets: dict[tuple[str, Pool], int] = {}
        self.weights: dict[str, dict[Pool, float]] = {}
        self.generation = 0
        self.applied_generation = 0
        self.applied_weights: dict[str, dict[Pool, float]] = {}
        self.replicas: list[_Replica] = []
        self.requests_external: list[list[dict[str, float]]] = []
        self.writes: list[tuple[str, str, Pool, int]] = []
        self.failed_requests = 0
        self.load: dict[str, float] = {}
        """Requests in flight per model, as the load board reports them (the test sets it)."""
        self.ingress = IngressTraffic()
        """The ingress's traffic as the load board reports it (the test sets it)."""
        self.ingress_target = 0
        """The ingress's replica target (0: not deployed, the loop leaves it)."""
        self.ingress_scales: list[int] = []
        self._ids = 0

    # -- the test's side -----------------------------------------------------------------------
    def deploy(self, model: str, cluster: int, external: int = 0) -> None:
        """Replicas already RUNNING (the state before the test), routed by readiness."""
        for pool, n in ((Pool.CLUSTER, cluster), (Pool.EXTERNAL, external)):
            self.targets[(model, pool)] = n
            for _ in range(n):
                self._add(model, pool, ReplicaState.RUNNING)
        total = cluster + external
        w = {Pool.CLUSTER: cluster / total, Pool.EXTERNAL: external / total}
        self.weights[model] = dict(w)
        self.applied_weights[model] = dict(w)

    def step(self) -> None:
        """Serve's controller and the ingress, one step: apply routes, start, stop."""
        self.applied_generation = self.generation
        self.applied_weights = {m: dict(w) for m, w in self.weights.items()}
        self.replicas = [r for r in self.replicas if r.state is not ReplicaState.STOPPING]
        for r in self.replicas:
            r.age += 1
            if r.state is ReplicaState.STARTING and r.age >= self.start_ticks:
                r.state = ReplicaState.RUNNING
        for (model, pool), target in sorted(self.targets.items(), key=lambda kv: str(kv[0])):
            live = [r for r in self.replicas if (r.model, r.pool) == (model, pool)]
            for _ in range(target - len(live)):
                self._add(model, pool, ReplicaState.STARTING)
            extra = len(live) - target
            # Serve stops STARTING replicas first, then the newest RUNNING ones.
            order = sorted(live, key=lambda r: (r.state is ReplicaState.RUNNING, -r.age))
            for r in order[: max(0, extra)]:
                r.state = ReplicaState.STOPPING
        self._check_traffic()

    def _check_traffic(self) -> None:
        for model, w in self.applied_weights.items():
            for pool, share in w.items():
                running = self.running(model, pool)
                if share > 0 and running == 0:
                    self.failed_requests += 1

    def _add(self, model: str, pool: Pool, state: ReplicaState) -> None:
        self._ids += 1
        node_id = self.cluster.place_replica(pool, self.replicas)
        self.replicas.append(_Replica(f"r{self._ids}", model, pool, node_id, state))

    def running(self, model: str, pool: Pool) -> int:
        return sum(
            1
            for r in self.replicas
            if (r.model, r.pool, r.state) == (model, pool, ReplicaState.RUNNING)
        )

    def nodes_of(self, model: str, pool: Pool) -> list[str]:
        return sorted(
            r.node_id
            for r in self.replicas
            if (r.model, r.pool) == (model, pool) and r.state is not ReplicaState.STOPPING
        )

    # -- ServePlane ----------------------------------------------------------------------------
    def view(self) -> ServeView:
        pools: dict[tuple[str, Pool], PoolView] = {}
        for model, pool in self.targets:
            mine = [r for r in self.replicas if (r.model, r.pool) == (model, pool)]
            pools[(model, pool)] = PoolView(
                target=self.targets[(model, pool)],
                running=sum(r.state is ReplicaState.RUNNING for r in mine),
                starting=sum(r.state is ReplicaState.STARTING for r in mine),
                stopping=sum(r.state is ReplicaState.STOPPING for r in mine),
                weight=self.weights.get(model, {}).get(pool, 0.0),
            )
        rows = tuple(
            ServeReplica(r.replica_id, r.model, r.pool, r.node_id, 1, r.state)
            for r in self.replicas
            if r.node_id
        )
        return ServeView(
            deployed=True, pools=pools, replicas=rows, ingress_target=self.ingress_target
        )

    def loads(self) -> Mapping[str, float]:
        return dict(self.load)

    def ingress_traffic(self) -> IngressTraffic:
        return self.ingress

    def scale_ingress(self, num_replicas: int) -> None:
        self.ingress_scales.append(num_replicas)
        self.ingress_target = num_replicas

    def request_external(self, bundles: list[dict[str, float]]) -> None:
        self.requests_external.append(bundles)

    def _route_by_readiness(self, model: str, planned: Mapping[Pool, int]) -> int:
        running = {
            p: min(self.running(model, p), planned[p]) for p in (Pool.CLUSTER, Pool.EXTERNAL)
        }
        total = sum(running.values())
        if total:
            self.weights[model] = {p: n / total for p, n in running.items()}
            self.generation += 1
        return self.generation

    def scale_pool(self, model: str, pool: Pool, num_replicas: int) -> None:
        self.writes.append(("scale", model, pool, num_replicas))
        if num_replicas < self.targets.get((model, pool), 0):
            planned = {p: self.targets.get((model, p), 0) for p in (Pool.CLUSTER, Pool.EXTERNAL)}
            planned[pool] = num_replicas
            self._route_by_readiness(model, planned)
            self.applied_generation = self.generation  # scale_pool waits for the ingress
            self.applied_weights = {m: dict(w) for m, w in self.weights.items()}
        self.targets[(model, pool)] = num_replicas

    def set_route_weights(self, model: str, weights: Mapping[Pool, float]) -> None:
        self.weights[model] = dict(weights)
        self.generation += 1

    def set_pool_target(self, model: str, pool: Pool, num_replicas: int) -> None:
        if self.targets.get((model, pool)) != num_replicas:
            self.writes.append(("target", model, pool, num_replicas))
            self.targets[(model, pool)] = num_replicas

    def pool_running(self, model: str, pool: Pool, target: int) -> bool:
        return self.targets.get((model, pool)) == target and self.running(model, pool) >= target

    def pool_settled(self, model: str, pool: Pool, target: int) -> bool:
        mine = [r for r in self.replicas if (r.model, r.pool) == (model, pool)]
        return self.targets.get((model, pool)) == target and all(
            r.state is ReplicaState.RUNNING for r in mine
        )

    def route_for_targets(self, model: str, planned: Mapping[Pool, int]) -> int:
        return self._route_by_readiness(model, planned)

    def route_applied(self, generation: int) -> bool:
        return self.applied_generation >= generation


@dataclass
class FakeCluster:
    """Nodes (GPUs per node and pool), Ray's drains, and the nodes the loop stopped."""

    nodes: dict[str, tuple[Pool, int]] = field(default_factory=dict)
    providers: dict[str, str] = field(default_factory=dict)
    draining_nodes: dict[str, int] = field(default_factory=dict)
    stopped: list[str] = field(default_factory=list)
    gangs: dict[str, Mapping[str, int]] = field(default_factory=dict)
    serve: FakeServe | None = None

    def add(
        self, node_id: str, pool: Pool = Pool.CLUSTER, gpus: int = 4, provider: str | None = None
    ) -> None:
        self.nodes[node_id] = (pool, gpus)
        if provider is not None:
            self.providers[node_id] = provider

    def _used(self, node_id: str) -> int:
        used = sum(p.get(node_id, 0) for p in self.gangs.values())
        if self.serve is not None:
            used += sum(1 for r in self.serve.replicas if r.node_id == node_id)
        return used

    def place_replica(self, pool: Pool, replicas: Sequence[_Replica]) -> str:
        """Ray's scheduler: the first node of `pool` (in id order) with a free GPU, not
        draining; "" (pending) when none."""
        for node_id, (p, gpus) in sorted(self.nodes.items()):
            if p is not pool or node_id in self.draining_nodes or node_id in self.stopped:
                continue
            if self._used(node_id) < gpus:
                return node_id
        return ""

    # NodeInventory
    def list_nodes(self) -> list[NodeRow]:
        return [
            NodeRow(
                node_id=n,
                pool=pool.value,
                address="127.0.0.1",
                state="ALIVE",
                gpus_total=float(gpus),
                gpus_free=float(max(0, gpus - self._used(n))),
                cpus_total=8.0,
                cpus_free=8.0,
                labels={"provider": self.providers[n]} if n in self.providers else {},
            )
            for n, (pool, gpus) in sorted(self.nodes.items())
            if n not in self.stopped
        ]

    # NodeActions
    def draining(self) -> Mapping[str, int]:
        return dict(self.draining_nodes)

    def drain(self, node_id: str, reason: str, deadline_s: float) -> bool:
        self.draining_nodes[node_id] = 0
        return True

    def stop(self, node_id: str) -> bool:
        self.stopped.append(node_id)
        self.draining_nodes.pop(node_id, None)
        return True

    def hostname(self, node_id: str) -> str | None:
        return node_id

    def holds_gpus(self, node_id: str) -> bool:
        return self._used(node_id) > 0


class FakeJobs:
    """The job runner: admit puts the gang on its nodes, preempt re-queues it at once."""

    def __init__(self, store: Store, cluster: FakeCluster) -> None:
        self.store = store
        self.cluster = cluster
        self.admitted: list[AdmitJob] = []
        self.preempted: list[PreemptJob] = []

    def submit(
        self,
        name: str,
        workers: int,
        gpus: int = 1,
        priority: str = "high",
        max_runtime_s: float | None = None,
    ) -> str:
        spec = JobSpec(
            name=name,
            entrypoint="python train.py",
            num_workers=workers,
            gpus_per_worker=gpus,
            priority_class=priority,
            max_runtime_s=max_runtime_s,
        )
        return self.store.submit(spec).job.job_id

    def observe(self) -> JobsView:
        """Every admitted gang's workers started at once (the loop's policy marks it RUNNING)."""
        return JobsView(
            tuple(
                GangView(
                    job_id=job.job_id,
                    running=False,
                    status=GangStatus.RUNNING,
                    now_s=0.0,
                    admitted_s=0.0,
                    num_workers=job.spec.num_workers,
                    started_ranks=job.spec.num_workers,
                )
                for job in self.store.list_jobs(states=[JobState.ADMITTED])
            )
        )

    def apply(self, plan: Sequence[JobAction], failed: Callable[[], None]) -> None:
        for action in plan:
            assert isinstance(action, MarkRunning), action
            self.store.transition(action.job_id, JobState.RUNNING, action.reason)

    def admit(self, action: AdmitJob) -> None:
        self.admitted.append(action)
        placement = {p.node_id: p.num_workers * action.gpus_per_worker for p in action.placement}
        self.cluster.gangs[action.job_id] = placement
        self.store.transition(
            action.job_id,
            JobState.ADMITTED,
            action.reason,
            info={"placement": placement, "admitted_s": 0.0},
        )

    def preempt(self, action: PreemptJob) -> None:
        self.preempted.append(action)
        self.cluster.gangs.pop(action.job_id, None)
        self.store.requeue(
            action.job_id, f"preempted: {action.reason}", "re-queued", info={"placement": {}}
        )


@dataclass
class _Agent:
    node_id: str
    started: bool = True
    idle_external: bool = False
    actor_id: str | None = None
    impostor: str | None = None


class FakeTelemetry:
    """Agents on every node; `samples` are what the next collection returns, by node."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.samples: dict[str, list[Mapping[str, object]]] = {}

    def ensure_agents(self, exclude: Collection[str], trusted: Mapping[str, str]) -> list[_Agent]:
        return [
            _Agent(n, started=n not in trusted, actor_id=f"agent-{n}")
            for n in self.cluster.nodes
            if n not in exclude and n not in self.cluster.stopped
        ]

    def collect_samples(
        self,
        max_samples: int,
        timeout_s: float,
        seen_until: Mapping[str, float | None],
        trusted: Mapping[str, str],
    ) -> Mapping[str, Sequence[Mapping[str, object]]]:
        out = {n: list(s) for n, s in self.samples.items()}
        self.samples = {}
        return out

    def stop_agent(self, node_id: str) -> bool:
        return True


class FakeMetrics:
    def __init__(self) -> None:
        self.gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.counters: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}

    def set(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self.gauges[(name, tuple(sorted((tags or {}).items())))] = value

    def inc(self, name: str, tags: Mapping[str, str] | None = None) -> None:
        key = (name, tuple(sorted((tags or {}).items())))
        self.counters[key] = self.counters.get(key, 0) + 1


@dataclass
class World:
    """Everything a loop test drives: the loop, its fakes, the store and the clock."""

    cfg: Config
    store: Store
    clock: Clock
    cluster: FakeCluster
    serve: FakeServe
    jobs: FakeJobs
    telemetry: FakeTelemetry
    metrics: FakeMetrics
    loop: Loop

    def tick(self, n: int = 1, dt_s: float = 1.0) -> None:
        """`n` rounds of: Serve steps, the loop ticks, time moves on."""
        for _ in range(n):
            self.serve.step()
            self.loop.tick()
            self.clock.now_s += dt_s

    def events(self, kind: str) -> list[str]:
        return [e.message for e in self.store.events(kind_prefix=kind, limit=10_000)]

    def restart(self) -> World:
        """A new controller (a new Loop) on the same store and the same world."""
        loop = build_loop(
            self.cfg,
            self.store,
            self.clock,
            self.cluster,
            self.serve,
            self.jobs,
            self.telemetry,
            self.metrics,
        )
        return replace(self, loop=loop)


def build_loop(
    cfg: Config,
    store: Store,
    clock: Clock,
    cluster: FakeCluster,
    serve: FakeServe,
    jobs: FakeJobs,
    telemetry: FakeTelemetry,
    metrics: FakeMetrics,
    kube_scale_external: Callable[[], ScaleExternal | None] | None = None,
) -> Loop:
    """The loop on these fakes; `kube_scale_external` as `Adapters` takes it (Kubernetes
    with the in-tree autoscaler off)."""
    adapters = Adapters(
        jobs=jobs,
        nodes=cluster,
        node_actions=cluster,
        telemetry=telemetry,
        metrics=metrics,
        serve=serve,
        kube_scale_external=kube_scale_external,
    )
    return Loop(cfg, store, adapters, policies_of(cfg), clock=clock)


def make_world(
    tmp_path: Path, *overrides: str, config_text: str = "", start_ticks: int = 2
) -> World:
    """A loop on fakes, configured by `overrides` and the YAML `config_text` (lists)."""
    conf = tmp_path / "rcp.yaml"
    conf.write_text(config_text or "{}\n")
    cfg = load_config(conf, [f"state_dir={tmp_path}", *overrides])
    store = Store(cfg.jobs_db_path)
    clock = Clock()
    cluster = FakeCluster()
    serve = FakeServe(cluster, start_ticks=start_ticks)
    cluster.serve = serve
    jobs = FakeJobs(store, cluster)
    telemetry = FakeTelemetry(cluster)
    metrics = FakeMetrics()
    loop = build_loop(cfg, store, clock, cluster, serve, jobs, telemetry, metrics)
    return World(cfg, store, clock, cluster, serve, jobs, telemetry, metrics, loop)
