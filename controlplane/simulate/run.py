"""One simulation per scheme on the same trace, and the figures each run yields.

Owns: `simulate(scenario, scheme, trace, cfg)` -> `SchemeResult` (the event loop: every
instant's events applied to the world, then one decision by the scheme at that simulated
time) and `run_all`, every scheme on the same trace and seed. What an event does:

- a job arrives (queued) or ends (its GPUs free), or finishes checkpointing out (re-queued);
- a node is lost (its gangs lose the work since their last commit and are re-queued after
  the restart backoff, or restart where the scheme's `Recovery` puts them; its replicas are
  gone; back after ``repair_hours``, when a node borrowed for it goes back to serving), or a
  worker crashes on one (the trace's `crashes`: the node stays up, its gangs lose the same
  work and are re-queued, or restart in place);
- a fault starts (our scheme's health policy sees telemetry samples; the node fails after
  ``fault_escalation_s`` if it escalates and is still in service) or clears;
- a replica turns RUNNING or finishes stopping; an external node comes up or idles out;
- a spot provider gives notice on the rented node a trace's reclaim hits, if any
  (`World.reclaim_target`; the scheme hears of it, `on_reclaim`), and takes it when the
  notice runs out (replicas still on it are gone, blamed on ``reclaims``);
- demand steps; a scheme's timer fires; the report samples its time series.

Must not: decide (schemes do), or draw random numbers (the trace holds them).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from controlplane.config import Config
from controlplane.simulate.baselines import SCHEMES
from controlplane.simulate.engine import EventKind, EventQueue
from controlplane.simulate.nodes import ProviderSpec
from controlplane.simulate.ours import OurScheme
from controlplane.simulate.recovery import Recovery
from controlplane.simulate.scenario import Scenario, control_config, stockout_provider
from controlplane.simulate.serving import CAUSES, SimServe
from controlplane.simulate.trace import Trace, make_trace
from controlplane.simulate.training import JobPhase, JobRun
from controlplane.simulate.world import World
from policies.snapshot import Pool

__all__ = ["SCHEME_NAMES", "SchemeResult", "percentile", "providers", "run_all", "simulate"]

SCHEME_NAMES = ("ours", "ours-requeue", *SCHEMES)
"""``ours-requeue``: our scheme as before issue 30 (every failed gang re-queued), the
baseline of the recovery goal."""
SAMPLE_S = 3600.0
QUIET = frozenset({EventKind.SAMPLE, EventKind.EXTERNAL_IDLE, EventKind.REPLICA_READY})
"""Events after which no scheme decides anything new: the report's sample, an idle external
node going, and a replica turning RUNNING (which changes only route weights, unless a
make-before-break move waits for it: then the loop's next tick advances the move). A spot
reclaim's notice asks for a decision only if it hits a node."""
SERIES = ("t_h", "util", "training", "demand_rps", "capacity_rps", "external_gpus", "queued")
"""The report's time series, sampled every `SAMPLE_S`."""


@dataclass
class SchemeResult:
    name: str
    figures: dict[str, float]
    series: dict[str, list[float]]
    decide_s: list[float] = field(default_factory=list)
    decide_cpu_s: list[float] = field(default_factory=list)
    observe_s: float = 0.0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    events: int = 0
    plan_events: list[tuple[str, str]] = field(default_factory=list)
    failures_met: list[tuple[float, str, str]] = field(default_factory=list)
    """Every hard failure of the trace the run met: (time, node, ``crash`` or ``node``)."""
    jobs: dict[str, JobRun] = field(default_factory=dict)
    check: dict[str, Any] = field(default_factory=dict)
    providers: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per external provider, in the config's order: ``price_per_gpu_hour``, ``gpu_h``
    (billed) and ``cost`` ($); they add up to the figures' ``external_gpu_h`` and
    ``external_cost``."""


def providers(s: Scenario, cfg: Config) -> tuple[ProviderSpec, ...]:
    """The world's providers: ``pools.external.providers`` of the control plane's config,
    the scenario's stock-out windows on the one they hit (`stockout_provider`)."""
    hit = stockout_provider(s, cfg)
    windows = tuple(
        (h * 3600.0, (h + s.external.stockout_hours) * 3600.0)
        for h in sorted(s.external.stockout_start_hours)
    )
    return tuple(
        ProviderSpec(
            p.name,
            p.gpus_per_node,
            p.max_nodes,
            p.price_per_gpu_hour,
            windows if p.name == hit else (),
        )
        for p in cfg.pools.external.providers
    )


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank `q` quantile of `values` (0 when there are none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def simulate(
    s: Scenario, name: str, trace: Trace, cfg: Config, on_step: Any = None
) -> SchemeResult:
    """One scheme over the whole horizon (see the module doc)."""
    started = time.perf_counter()
    started_cpu = time.process_time()
    q = EventQueue()
    world = World(
        s.nodes,
        s.gpus_per_node,
        providers(s, cfg),
        s.external.provision_s,
        cfg.pools.external.idle_timeout_s,
        q,
    )
    models = s.serving.models
    serve = SimServe(
        world, q, {m.name: m.gpus_per_replica for m in models}, {m.name: m.replica_rps for m in models},
        {m.name: m.target_utilisation for m in models}, s.serving.replica_start_s, s.serving.replica_stop_s,
        {m.name: (m.min_replicas, m.max_replicas) for m in models},
    )  # fmt: skip
    repair_s = s.failures.repair_hours * 3600.0
    scheme: Any
    if name in ("ours", "ours-requeue"):
        rs = s.recovery
        recovery = Recovery(
            world,
            serve,
            rs.in_place_restart_s if rs.restart_in_place else None,
            rs.replacement_restart_s if rs.replace_lost_node else None,
            repair_s,
        )
        persist_s = s.training.checkpoint_persist_s
        scheme = OurScheme(
            cfg, world, serve, q, repair_s, persist_s, recovery if name == "ours" else None
        )
    else:
        scheme = SCHEMES[name](s, world, serve, q)
    backoff_s = cfg.jobs.restart_backoff_initial_s
    jobs = {j.job_id: j for j in trace.jobs}
    t = s.training
    job_terms = (t.baseline_checkpoint_interval_s, t.checkpoint_stall_s, t.restore_s)
    for j in trace.jobs:
        q.push(j.submit_s, EventKind.JOB_ARRIVAL, j.job_id)
    for i, (at, idx) in enumerate(trace.failures):
        crash = "|crash" if i in trace.crashes else ""
        q.push(at, EventKind.NODE_FAIL, world.cluster_ids[idx] + crash)
    for i, f in enumerate(trace.faults):
        q.push(f.at_s, EventKind.FAULT_START, str(i))
    for i, rc in enumerate(trace.reclaims):
        q.push(rc.at_s, EventKind.RECLAIM_NOTICE, str(i))
    steps = int(math.ceil(s.horizon_s / s.serving.demand_step_s))
    for k in range(steps):
        q.push(k * s.serving.demand_step_s, EventKind.DEMAND_STEP, str(k))
    for k in range(int(s.horizon_s // SAMPLE_S) + 1):
        q.push(k * SAMPLE_S, EventKind.SAMPLE)
    # Before the first instant: serving deployed and RUNNING at the first step's demand.
    for m in models:
        serve.set_demand(m.name, trace.rps(m.name, 0))
        want = max(m.min_replicas, min(m.max_replicas, math.ceil(serve.sized(m.name))))
        serve.targets[(m.name, Pool.CLUSTER)] = want
    serve.reconcile()
    for r in serve.replicas.values():
        r.state = r.state.__class__.RUNNING
        r.version += 1
    for m in models:
        serve.route_for_targets(m.name, {Pool.CLUSTER: serve.running(m.name), Pool.EXTERNAL: 0})
    series: dict[str, list[float]] = {k: [] for k in SERIES}
    failures_met: list[tuple[float, str, str]] = []
    last = 0.0
    horizon = s.horizon_s
    while len(q) and (q.peek_time() or 0.0) <= horizon:
        batch = q.pop_instant()
        now = batch[0].at_s
        world.advance(now)
        serve.advance(now - last)
        last = now
        decide = False
        for ev in batch:
            kind = ev.kind
            decide = (
                decide
                or (kind not in QUIET and kind is not EventKind.RECLAIM_NOTICE)
                or (kind is EventKind.REPLICA_READY and bool(getattr(scheme, "ops", ())))
            )
            if kind is EventKind.JOB_ARRIVAL:
                world.submit(JobRun(jobs[ev.subject], *job_terms))
            elif kind is EventKind.JOB_END:
                world.finish(ev.subject, ev.version)
            elif kind is EventKind.JOB_RELEASED:
                world.released(ev.subject, ev.version)
            elif kind is EventKind.NODE_FAIL:
                node_id, _, why = ev.subject.partition("|")
                n = world.nodes[node_id]
                if why != "fault":
                    failures_met.append((now, node_id, why or "node"))
                if not n.up or (why == "fault" and (n.fault is None or n.out)):
                    continue
                scheme.on_failure(node_id)
                if why == "crash":
                    world.crash(node_id, backoff_s, scheme.in_place_s)
                    continue
                serve.node_lost(node_id)
                world.fail_node(node_id, backoff_s, scheme.replace)
                q.push(now + repair_s, EventKind.NODE_BACK, node_id)
            elif kind is EventKind.NODE_BACK:
                n = world.nodes[ev.subject]
                if not n.up:
                    world.node_back(ev.subject)
                    scheme.on_fault(ev.subject, None)
                    scheme.node_back(ev.subject)
            elif kind is EventKind.FAULT_START:
                f = trace.faults[int(ev.subject)]
                node_id = world.cluster_ids[f.node]
                n = world.nodes[node_id]
                if not n.up or n.out or n.fault:
                    continue
                n.fault = f.kind
                scheme.on_fault(node_id, f.kind)
                if f.escalates:
                    q.push(
                        now + s.failures.fault_escalation_s, EventKind.NODE_FAIL, f"{node_id}|fault"
                    )
                else:
                    q.push(now + s.failures.fault_clear_s, EventKind.FAULT_END, node_id)
            elif kind is EventKind.FAULT_END:
                n = world.nodes[ev.subject]
                if n.fault and n.up and not n.out:
                    n.fault = None
                    scheme.on_fault(ev.subject, None)
            elif kind is EventKind.REPLICA_READY:
                serve.ready(ev.subject, ev.version)
            elif kind is EventKind.REPLICA_GONE:
                serve.gone(ev.subject, ev.version)
            elif kind is EventKind.EXTERNAL_NODE_UP:
                world.external_up(ev.subject)
            elif kind is EventKind.EXTERNAL_IDLE:
                world.release_idle_external()
            elif kind is EventKind.RECLAIM_NOTICE:
                rc = trace.reclaims[int(ev.subject)]
                target = world.reclaim_target(rc.provider, rc.slot)
                if target is None:
                    continue  # the slot is beyond what this scheme rents there now
                world.reclaim_notice(target.node_id, s.external.reclaim_notice_s)
                scheme.on_reclaim(target.node_id)
                decide = True
            elif kind is EventKind.NODE_RECLAIMED:
                if ev.subject in world.external:
                    world.tally.reclaimed_replicas += serve.node_lost(ev.subject, "reclaims")
                    world.reclaimed(ev.subject)
            elif kind is EventKind.DEMAND_STEP:
                for m in models:
                    serve.set_demand(m.name, trace.rps(m.name, int(ev.subject)))
            elif kind is EventKind.SAMPLE:
                series["t_h"].append(now / 3600.0)
                series["util"].append(world.cluster_used / world.cluster_gpus)
                series["training"].append(world.training_used / world.cluster_gpus)
                series["demand_rps"].append(sum(serve.rps.values()))
                series["capacity_rps"].append(
                    sum(serve.running(m.name) * m.replica_rps for m in models)
                )
                series["external_gpus"].append(float(world.external_gpus()))
                series["queued"].append(float(len(world.queued)))
        if decide:
            serve.reconcile()
            scheme.step(now)
            if on_step is not None:
                on_step(world, serve, scheme)
    world.advance(horizon)
    serve.advance(horizon - last)
    result = SchemeResult(name, _figures(s, world, serve, trace), series)
    result.providers = _by_provider(world)
    result.wall_s = time.perf_counter() - started
    result.cpu_s = time.process_time() - started_cpu
    result.events = q.handled
    result.jobs = world.jobs
    result.failures_met = failures_met
    if isinstance(scheme, OurScheme):
        result.decide_s = scheme.cost.decide_s
        result.decide_cpu_s = scheme.cost.decide_cpu_s
        result.observe_s = scheme.cost.observe_s
        result.plan_events = scheme.recorded
        result.figures["moves_leaving_serving_short"] = float(scheme.breaks_short)
        rec = scheme.recovery
        result.figures["serving_nodes_borrowed"] = float(rec.borrowed if rec else 0)
        result.figures["borrowed_nodes_returned"] = float(rec.returned if rec else 0)
    return result


def _figures(s: Scenario, world: World, serve: SimServe, trace: Trace) -> dict[str, float]:
    runs = list(world.jobs.values())
    gpu_h = 1 / 3600.0
    done = [r for r in runs if r.phase is JobPhase.DONE]
    jct_h = [((r.finish_s or 0) - r.spec.submit_s) / 3600.0 for r in done]
    waits_h = [
        ((r.first_admit_s if r.first_admit_s is not None else s.horizon_s) - r.spec.submit_s)
        / 3600.0
        for r in runs
    ]
    t = world.tally
    short = {c: sum(f.short_s[c] for f in serve.figures.values()) / 60.0 for c in CAUSES}
    demand = sum(f.demand_rps_s for f in serve.figures.values())
    served = sum(f.served_rps_s for f in serve.figures.values())
    ext_gpu_h = t.external_gpu_s * gpu_h
    return {
        "goodput_gpu_h": sum(world.useful_s(r) * r.gpus for r in runs) * gpu_h,
        "jobs_submitted": float(len(runs)),
        "jobs_done": float(len(done)),
        "jobs_queued_at_end": float(len(world.queued)),
        "jobs_running_at_end": float(len(world.running)),
        "jobs_rejected": float(sum(1 for r in runs if r.phase is JobPhase.REJECTED)),
        "jct_mean_h": sum(jct_h) / len(jct_h) if jct_h else 0.0,
        "jct_p95_h": percentile(jct_h, 0.95),
        "queue_delay_mean_h": sum(waits_h) / len(waits_h) if waits_h else 0.0,
        "queue_delay_p95_h": percentile(waits_h, 0.95),
        "preemptions": float(sum(r.preemptions for r in runs)),
        "job_failures": float(sum(r.failures for r in runs)),
        "lost_to_failures_gpu_h": sum(r.lost_failure_s * r.gpus for r in runs) * gpu_h,
        **_recovery_figures(s, runs),
        "lost_to_preemptions_gpu_h": sum(r.lost_preempt_s * r.gpus for r in runs) * gpu_h,
        "checkpoint_stall_gpu_h": sum(r.stall_total_s * r.gpus for r in runs) * gpu_h,
        "restore_gpu_h": sum(r.restore_total_s * r.gpus for r in runs) * gpu_h,
        "shortfall_min": sum(short.values()),
        "shortfall_moves_min": short["moves"],
        "shortfall_policy_min": short["policy"],
        "shortfall_failures_min": short["failures"],
        "shortfall_reclaims_min": short["reclaims"],
        "shortfall_scaling_min": short["scaling"],
        "served_fraction": served / demand if demand else 1.0,
        "reclaims": float(t.reclaims),
        "reclaimed_replicas": float(t.reclaimed_replicas),
        "external_gpu_h": ext_gpu_h,
        "external_serving_gpu_h": t.external_serving_gpu_s * gpu_h,
        "external_cost": sum(p["cost"] for p in _by_provider(world).values()),
        "utilisation": t.used_gpu_s / t.owned_gpu_s if t.owned_gpu_s else 0.0,
        "training_share": t.training_gpu_s / t.owned_gpu_s if t.owned_gpu_s else 0.0,
        "idle_while_queued_gpu_h": t.idle_with_queue_gpu_s * gpu_h,
        "serving_taken_gpu_h": serve.taken_gpu_s * gpu_h,
    }


def _recovery_figures(s: Scenario, runs: list[JobRun]) -> dict[str, float]:
    """What failures cost the jobs (docs/simulator.md, "Recovery from failures"):
    ``failure_behind_gpu_h`` the gang's GPUs x the seconds from each failure until the job's
    done work is back where it was (ETTR's lost time: the wait, the restart, the restore, the
    work done again; open at the horizon: until then), ``failure_restart_gpu_h`` the GPUs held
    restarting after failures, and ``ettr``: the work kept over the wall time since the first
    admission (to the end, or the horizon), summed over the jobs admitted."""
    end = s.horizon_s
    admitted = [r for r in runs if r.first_admit_s is not None]
    wall = sum((r.finish_s if r.finish_s is not None else end) - (r.first_admit_s or 0.0)
               for r in admitted)  # fmt: skip
    kept = sum(r.at(end)[0] if r.phase is JobPhase.RUNNING else r.committed_s for r in admitted)
    return {
        "failure_behind_gpu_h": sum(r.behind_s(end) * r.gpus for r in runs) / 3600.0,
        "failure_restart_gpu_h": sum(r.failure_restart_s * r.gpus for r in runs) / 3600.0,
        "restarts_in_place": float(sum(r.restarts_in_place for r in runs)),
        "restarts_on_another_node": float(sum(r.replacements for r in runs)),
        "ettr": kept / wall if wall > 0 else 1.0,
    }


def _by_provider(world: World) -> dict[str, dict[str, float]]:
    """Billed GPU-hours and cost per provider (`SchemeResult.providers`)."""
    out: dict[str, dict[str, float]] = {}
    for name, p in world.providers.items():
        gpu_h = world.tally.external_gpu_s_by.get(name, 0.0) / 3600.0
        out[name] = {
            "price_per_gpu_hour": p.price_per_gpu_hour,
            "gpu_h": gpu_h,
            "cost": gpu_h * p.price_per_gpu_hour,
        }
    return out


def run_all(
    s: Scenario, schemes: tuple[str, ...] = SCHEME_NAMES
) -> tuple[dict[str, SchemeResult], Trace]:
    """Every scheme on the same trace (drawn once from the seed)."""
    cfg = control_config(s)
    trace = make_trace(s, cfg)
    return {name: simulate(s, name, trace, cfg) for name in schemes}, trace
