"""Our scheme: the control loop's decide phase on the simulated world, and its act stand-in.

Owns: `OurScheme`. At every instant something changed it does what one tick of
`controlplane.loop.tick.Loop` does, with the simulated world in place of the adapters:

1. observe: a `ClusterSnapshot` at the simulated ``now_s`` by the observe phase's rules
   (`controlplane.loop.observe`): down nodes not healthy, every holding gang a `RunningGang`
   (``preempting`` while it checkpoints out), queued jobs with their backoff, Serve's
   replicas; the load board is ongoing requests (sized replicas x the model's
   ``target_ongoing_requests``); health verdicts from `policies.health.evaluate` on
   telemetry-like samples of the faults, applied with `with_health`;
2. decide: `controlplane.loop.decide.decide` itself, with the policies' configs built from
   the control plane's `Config` and their state handed back each time;
3. act: admission's plan on the world's jobs, remediation (cordon; preempt checkpoint-first;
   drain: the node leaves for repair), and the serving plan as the Serve actuator
   (`controlplane.loop.act.serving.ServeActuator.apply`) applies it: the real
   make-before-break operations advanced on `SimServe`, scale-downs that wait for the other
   pool, route weights, external capacity per provider (none named: all of it from the
   first), and a `DrainNode` of an external node (`World.drain_external`);
4. record: the plan items and the Serve actuator's events, in the order the real loop
   writes them (`controlplane.loop.record.PlanEvents`).

A failure under a gang is recovered as the scheme's `Recovery` says
(`controlplane.simulate.recovery`: restart in place after a crash, a free or borrowed node
after a node loss); without one (``ours-requeue``, our scheme before issue 30) every failed
gang is re-queued.

A spot reclaim's notice (`on_reclaim`) is what Ray's drain of the node is to the real loop:
the node is out of service from then on (not healthy in the snapshot, so placement asks for
its provider's capacity again), and Serve starts the node's replicas elsewhere before it
stops them there; what has not moved when the notice runs out is lost with the node.

It asks to be woken at the policies' own timers (demand delays, placement's migrate-back
idle and interval, backoffs, a move's next step or timeout). A run's checkpoint interval is
`policies.checkpointing`'s, with the fleet MTBF estimated as the controller does.

Must not: decide anything itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from controlplane.adapters.serve import ServeView
from controlplane.config import Config
from controlplane.loop.act import operations
from controlplane.loop.act.operations import MoveOperation, MoveOutcome, MovePhase
from controlplane.loop.decide import decide, policies_of
from controlplane.loop.observe import with_health
from controlplane.loop.record import EventKind as LoopEvent
from controlplane.loop.record import PlanEvents
from controlplane.loop.types import Observation, ServingPolicyState
from controlplane.simulate.engine import EventKind, EventQueue
from controlplane.simulate.recovery import Recovery
from controlplane.simulate.serving import SimServe
from controlplane.simulate.training import JobPhase, JobRun
from controlplane.simulate.world import Replace, World
from policies import checkpointing
from policies.admission import AdmissionState
from policies.health import (
    CordonNode,
    GpuSample,
    HealthState,
    NodeSample,
    NodeVerdict,
    PortSample,
    evaluate,
)
from policies.plan import (
    AdmitJob,
    DrainNode,
    MoveServeReplicas,
    PreemptJob,
    RejectJob,
    RequestExternalCapacity,
    ScaleServePool,
    SetRouteWeights,
)
from policies.snapshot import ClusterSnapshot, NodeView, QueuedJob, RunningGang

__all__ = ["OurScheme"]


@dataclass
class DecideCost:
    decide_s: list[float] = field(default_factory=list)
    decide_cpu_s: list[float] = field(default_factory=list)
    """The same calls in this process's CPU time (what a shared machine's neighbours do not
    inflate)."""
    observe_s: float = 0.0


class OurScheme:
    name = "ours"

    def __init__(
        self,
        cfg: Config,
        world: World,
        serve: SimServe,
        queue: EventQueue,
        repair_s: float,
        persist_s: float = 60.0,
        recovery: Recovery | None = None,
    ) -> None:
        self.recovery = recovery
        self.cfg = cfg
        self.policies = policies_of(cfg)
        self.world = world
        self.serve = serve
        self.events = queue
        self.targets_ongoing = {m.name: m.target_ongoing_requests for m in cfg.serving.models}
        self.repair_s = repair_s
        self.persist_s = persist_s
        """A checkpoint's background upload (`policies.checkpointing`'s ``persist_s``)."""
        self.admission = AdmissionState()
        self.serving = ServingPolicyState()
        self.health = HealthState()
        self.verdicts: dict[str, NodeVerdict] = {}
        self.ops: list[MoveOperation] = []
        self.timeout_s = float(cfg.serving.ready_timeout_s)
        self.cost = DecideCost()
        self.recorded: list[tuple[str, str]] = []
        self.plan_events = PlanEvents(self._record)
        self._queued_views: dict[str, tuple[int, QueuedJob]] = {}
        self._gang_views: dict[str, tuple[int, float | None, RunningGang]] = {}
        self.failures_seen = 0
        self.breaks_short = 0
        """Moves whose BREAK step stopped replicas and left their model short of demand."""
        self._nodes: tuple[NodeView, ...] = ()
        self._nodes_at = -1
        self._wake_at = -1.0

    def _record(self, kind: LoopEvent, message: str, job_id: str | None) -> None:
        self.recorded.append((kind.value, message))

    # -- the world's hooks ---------------------------------------------------------------------

    def checkpoint_interval_s(self, run: JobRun) -> float:
        """`policies.checkpointing` with the fleet's MTBF as the controller estimates it."""
        gpu_mtbf = checkpointing.estimate_mtbf_s(
            self.failures_seen,
            self.world.tally.owned_gpu_s,
            prior_mtbf_s=self.cfg.jobs.gpu_mtbf_prior_hours * 3600.0,
        )
        inputs = checkpointing.IntervalInputs(
            stall_s=run.stall_s,
            mtbf_s=checkpointing.job_mtbf_s(gpu_mtbf, max(1, run.gpus)),
            persist_s=self.persist_s,
            restart_s=run.restore_s,
        )
        return checkpointing.checkpoint_interval(inputs, checkpointing.IntervalConfig()).interval_s

    def on_failure(self, node_id: str) -> None:
        self.failures_seen += 1

    @property
    def in_place_s(self) -> float | None:
        """A crashed gang restarts in place after this long (None: it is re-queued)."""
        return self.recovery.in_place_s if self.recovery else None

    @property
    def replace(self) -> Replace | None:
        """Where a gang restarts after a node loss (`World.fail_node`; None: re-queued)."""
        return self.recovery.replace if self.recovery else None

    def node_back(self, node_id: str) -> None:
        if self.recovery is not None:
            self.recovery.node_back(node_id)

    def on_reclaim(self, node_id: str) -> None:
        """A spot reclaim's notice on external node `node_id`: Ray drains it (see the module
        doc)."""
        self._drain_external(node_id)

    def on_fault(self, node_id: str, kind: str | None) -> None:
        """Telemetry for a fault starting (`kind`) or a node back clean (None), fed to the
        health policy as the agents' samples would be."""
        t = self.cfg.health
        now = self.world.now_s
        n = self.world.node(node_id)
        count = t.hot_samples if kind else t.recover_after_samples
        gpus = tuple(
            GpuSample(g, temp_c=(t.gpu_temp_c + 12 if kind == "hot" and g == 0 else 60.0))
            for g in range(n.gpus)
        )
        ib_errors_per_s = t.ib_errors_per_s * 100 if kind == "fabric" else 0.0
        ports = (PortSample("mlx5_0/1", errors_per_s=ib_errors_per_s),)
        samples = [
            NodeSample(node_id, now + i * 1e-3, gpus, ports, n.gpus) for i in range(max(1, count))
        ]
        verdicts, self.health = evaluate({node_id: samples}, t, self.health, now)
        v = verdicts[node_id]
        if v.verdict.value == "healthy":
            self.verdicts.pop(node_id, None)
        else:
            self.verdicts[node_id] = v

    # -- observe -------------------------------------------------------------------------------

    def _snapshot(self, now: float) -> Observation:
        w = self.world
        if self._nodes_at != w.node_generation:
            views = [w.nodes[i].view() for i in w.cluster_ids]
            views += [n.view() for n in w.external.values() if n.up]
            self._nodes = tuple(views)
            self._nodes_at = w.node_generation
        queued = []
        for run in w.queued.values():
            cached = self._queued_views.get(run.spec.job_id)
            if cached is None or cached[0] != run.version:
                cached = self._queued_views[run.spec.job_id] = (run.version, QueuedJob(
                    run.spec.job_id, "default", run.spec.priority, run.spec.num_workers,
                    run.spec.gpus_per_worker, run.queued_s, run.spec.work_s * 1.5,
                    run.not_before_s,
                ))  # fmt: skip
            queued.append(cached[1])
        running = []
        for run in w.running.values():
            last = run.last_commit_s(now)
            cached_g = self._gang_views.get(run.spec.job_id)
            if cached_g is None or cached_g[0] != run.version or cached_g[1] != last:
                cached_g = self._gang_views[run.spec.job_id] = (run.version, last, RunningGang(
                    run.spec.job_id, "default", run.spec.priority, run.spec.num_workers,
                    run.spec.gpus_per_worker, run.placement, run.admitted_s,
                    run.spec.work_s * 1.5, last, run.phase is JobPhase.CHECKPOINTING_OUT,
                ))  # fmt: skip
            running.append(cached_g[2])
        view = self.serve.view()
        snapshot = ClusterSnapshot(
            now_s=now,
            nodes=self._nodes,
            serve_replicas=view.replicas,
            queued=tuple(queued),
            running=tuple(running),
        )
        loads = {m: self.serve.sized(m) * self.targets_ongoing[m] for m in self.serve.rps}
        observed = Observation(snapshot=snapshot, serve=view, loads=loads)
        if not self.verdicts:
            return observed  # what `with_health` returns when no node has a verdict
        return with_health(observed, self.verdicts)

    # -- one tick ------------------------------------------------------------------------------

    def step(self, now: float) -> None:
        t0 = time.perf_counter()
        observed = self._snapshot(now)
        t1 = time.perf_counter()
        c1 = time.process_time()
        decided = decide(
            observed, self.policies, self.admission, self.serving, serving_busy=bool(self.ops)
        )
        t2 = time.perf_counter()
        self.cost.decide_cpu_s.append(time.process_time() - c1)
        self.cost.observe_s += t1 - t0
        self.cost.decide_s.append(t2 - t1)
        self.admission = decided.admission_state
        self._act_jobs(decided.admission)
        self._act_health(decided.remediation)
        self._advance_moves(now, dict(decided.wanted))
        if decided.serving is not None and decided.serving_state is not None:
            self.serving = decided.serving_state
            self._act_serve(decided.serving, observed.serve, now)
        self.plan_events.record(decided.admission + decided.remediation)
        self._wake(now)

    def _act_jobs(self, plan: tuple[object, ...]) -> None:
        w = self.world
        for a in plan:
            if isinstance(a, AdmitJob):
                placement: dict[str, int] = {}
                for p in a.placement:
                    gpus = p.num_workers * a.gpus_per_worker
                    placement[p.node_id] = placement.get(p.node_id, 0) + gpus
                run = w.queued[a.job_id]
                run.interval_s = self.checkpoint_interval_s(run)
                w.admit(a.job_id, placement)
            elif isinstance(a, PreemptJob):
                w.preempt(a.job_id, checkpoint_first=a.checkpoint_first)
            elif isinstance(a, RejectJob):
                w.reject(a.job_id)

    def _act_health(self, plan: tuple[object, ...]) -> None:
        w = self.world
        for a in plan:
            if isinstance(a, CordonNode):
                n = w.node(a.node_id)
                if not n.out and n.up:
                    n.out = True
                    w.touch(n)
            elif isinstance(a, PreemptJob):
                w.preempt(a.job_id, checkpoint_first=True)
            elif isinstance(a, DrainNode) and a.node_id in w.external:
                self._drain_external(a.node_id)
            elif isinstance(a, DrainNode):
                n = w.node(a.node_id)
                if n.up and n.used == 0 and n.pool.value == "cluster":
                    n.up = False
                    w.touch(n)
                    self.events.push(
                        w.now_s + self.repair_s, EventKind.NODE_BACK, a.node_id, n.version
                    )

    def _drain_external(self, node_id: str) -> None:
        """An external node drained (placement's migrate-back to a cheaper provider, or a
        health drain): Serve starts its replicas elsewhere before it stops them there."""
        if self.world.drain_external(node_id):
            self.serve.writer = "moves"
            self.serve.reconcile()

    def _advance_moves(self, now: float, wanted: dict[str, int]) -> None:
        left = []
        for op in self.ops:
            self.serve.prefer_stop = set(op.node_ids)
            self.serve.writer = "moves"  # a stop here is the move's BREAK step
            source = self.serve.targets.get((op.model, op.from_pool), 0)
            new, outcome = operations.advance(
                op, self.serve, now, self.timeout_s, wanted.get(op.model)
            )
            if (
                op.phase is MovePhase.SHIFT
                and new.phase is MovePhase.BREAK
                and self.serve.targets.get((op.model, op.from_pool), 0) < source
                and self.serve.short(op.model)
            ):
                self.breaks_short += 1  # the BREAK stopped replicas and left serving short
            if outcome is MoveOutcome.DONE:
                self._record(LoopEvent.SERVE_MOVE_DONE, op.describe(), op.for_job_id)
            elif outcome is MoveOutcome.UNWOUND:
                self._record(
                    LoopEvent.SERVE_MOVE_UNWOUND, f"{op.describe()} ({op.phase.value})", None
                )
            else:
                left.append(new)
        self.ops = left
        self.serve.prefer_stop = {n for op in self.ops for n in op.node_ids}

    def _act_serve(self, plan: tuple[object, ...], view: ServeView, now: float) -> None:
        moving = {op.model for op in self.ops}
        drains: list[DrainNode] = []
        for a in plan:
            if isinstance(a, RequestExternalCapacity):
                self._record(LoopEvent.SERVE_EXTERNAL_CAPACITY, a.reason, None)
                first = next(iter(self.world.providers), "")
                self.world.want_external(
                    dict(a.by_provider) or ({first: a.num_gpus} if first else {})
                )
            elif isinstance(a, DrainNode):
                drains.append(a)
            elif isinstance(a, MoveServeReplicas):
                if a.num_replicas <= 0 or a.model in moving:
                    continue
                op = operations.start(a, view, now)
                if op is None:
                    continue
                self._record(
                    LoopEvent.SERVE_MOVE_START, f"{op.describe()}: {a.reason}", a.for_job_id
                )
                self.serve.prefer_stop |= set(op.node_ids)
                op, _ = operations.advance(op, self.serve, now, self.timeout_s)
                self.ops.append(op)
                moving.add(a.model)
            elif isinstance(a, ScaleServePool):
                if a.model in moving:
                    continue
                have = view.target(a.model, a.pool)
                if a.num_replicas < have and not view.others_ready(a.model, a.pool):
                    self._record(LoopEvent.SERVE_SCALE_WAIT, f"{a.model}/{a.pool.value}", None)
                    continue  # the other pool is not ready yet
                self._record(LoopEvent.SERVE_SCALE, f"{a.model}/{a.pool.value}: {a.reason}", None)
                self.serve.writer = "policy"  # a stop here is placement's or demand's choice
                try:
                    self.serve.scale_pool(a.model, a.pool, a.num_replicas)
                finally:
                    self.serve.writer = "moves"
            elif (
                isinstance(a, SetRouteWeights)
                and a.model not in moving
                and a.weights != view.weights(a.model)
            ):
                self.serve.set_route_weights(a.model, dict(a.weights))
        for d in drains:  # placement's way back to a cheaper provider, after the rest
            self._drain_external(d.node_id)
            self._record(LoopEvent.SERVE_PROVIDER_DRAIN, f"{d.node_id}: {d.reason}", None)

    def _wake(self, now: float) -> None:
        """Ask for the next decision at the policies' own timers."""
        tick = self.cfg.policy.tick_s
        times: list[float] = []
        for model, s in self.serving.demand.items():
            if s.direction.value != "none":
                d = self.policies.demand[model]
                times.append(
                    s.since_s
                    + (d.upscale_delay_s if s.direction.value == "up" else d.downscale_delay_s)
                )
        p = self.serving.placement
        cfg = self.policies.placement
        if p.room_since_s is not None:
            times.append(p.room_since_s + cfg.migrate_back_idle_s)
            if p.last_step_back_s is not None:
                times.append(p.last_step_back_s + cfg.migrate_back_interval_s)
        for op in self.ops:
            if op.phase is MovePhase.SHIFT:
                times.append(now + tick)  # the route applies at once: BREAK next tick
            times.append(op.phase_since_s + self.timeout_s + tick)
        for run in self.world.queued.values():
            if run.not_before_s is not None and run.not_before_s > now:
                times.append(run.not_before_s)
        later = [t for t in times if t > now]
        if later:
            at = max(now + tick, min(later))
            if not self._wake_at > now or at < self._wake_at:
                self._wake_at = at
                self.events.push(at, EventKind.WAKE)
