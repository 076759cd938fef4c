"""The trace every scheme replays: jobs, node failures, faults and request curves, from a seed.

Owns: `Trace` and `make_trace(scenario)`, which draws everything random once, from
``random.Random(scenario.seed)``, so every scheme meets the same jobs, the same failures at
the same instants on the same nodes, and the same demand. Jobs come from the scenario's trace
file when it names one (`read_trace`), else from the generator: Poisson arrivals over the
horizon, gang sizes and priorities from the scenario's mixes, lognormal run times scaled so
that the GPU-hours offered are ``offered_load`` x the cluster's GPU-hours.

Node failures are a Poisson process per node at ``gpus_per_node / gpu_mttf_hours``; hot and
fabric faults at their yearly rates; each fault escalates to a hard failure (if the node is
still in service then) with ``fault_escalation_probability``. Demand: per model, a daily
cosine between ``trough_fraction x peak`` and the peak, stepping every ``demand_step_s``,
with multiplicative noise.

Spot reclaims (`Reclaim`): per spot provider a Poisson process at
``spot_reclaims_per_node_day`` x its ``max_nodes`` a day, each naming a slot drawn uniformly
from ``0 .. max_nodes - 1``: which nodes exist depends on the scheme, so the trace fixes the
slot and the world maps it to a node (`World.reclaim_target`; a slot beyond what a scheme
rents hits nothing). They are drawn from their own generator, so the rest of the trace is
the same whatever the reclaim fields say.

Which hard failures are worker crashes (the node survives) rather than node losses
(`Trace.crashes`, each with ``crash_share``) is drawn last, from its own generator: the
failures' instants and nodes, and everything else, are the same whatever it says.

Must not: decide or simulate anything.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Annotated

from pydantic import StrictStr

from controlplane.config import Config
from controlplane.simulate.checks import Number, ScenarioError, Whole, read_bounded
from controlplane.simulate.scenario import Scenario, check_events, control_config, spot_providers
from policies.validation import FINITE, Checked, FieldError, at_least

__all__ = ["Fault", "JobSpec", "Reclaim", "Trace", "TraceJob", "make_trace", "read_trace"]

MAX_TRACE_JOBS = 200_000


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    submit_s: float
    num_workers: int
    gpus_per_worker: int
    work_s: float
    """Seconds of uninterrupted training the job needs."""
    priority: str

    @property
    def gpus(self) -> int:
        return self.num_workers * self.gpus_per_worker


@dataclass(frozen=True)
class Fault:
    at_s: float
    node: int
    kind: str
    """``hot`` or ``fabric``."""
    escalates: bool


@dataclass(frozen=True)
class Reclaim:
    at_s: float
    """When the provider gives notice (the node goes ``reclaim_notice_s`` later)."""
    provider: str
    slot: int
    """Which of the provider's rented nodes it takes (`World.reclaim_target`)."""


@dataclass(frozen=True)
class Trace:
    jobs: tuple[JobSpec, ...]
    failures: tuple[tuple[float, int], ...]
    """(time, node index) of every hard failure."""
    faults: tuple[Fault, ...]
    demand_rps: dict[str, tuple[float, ...]]
    """Per model, requests per second for each demand step."""
    reclaims: tuple[Reclaim, ...] = ()
    """Spot reclaims, in time order."""
    crashes: frozenset[int] = frozenset()
    """Indices into `failures` of the worker crashes (the node survives); the rest are node
    losses."""

    def rps(self, model: str, step: int) -> float:
        steps = self.demand_rps[model]
        return steps[min(step, len(steps) - 1)]


def _gang(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(workers, GPUs per worker): whole-node workers for gangs of a node or more."""
    if gpus >= gpus_per_node:
        return gpus // gpus_per_node, gpus_per_node
    return 1, gpus


def _pick(rng: random.Random, mix: dict[str, float]) -> str:
    keys = sorted(mix, key=lambda k: (len(k), k))
    return rng.choices(keys, weights=[mix[k] for k in keys])[0]


def _poisson_times(rng: random.Random, rate_per_s: float, horizon_s: float) -> list[float]:
    out: list[float] = []
    if rate_per_s <= 0:
        return out
    t = rng.expovariate(rate_per_s)
    while t < horizon_s:
        out.append(t)
        t += rng.expovariate(rate_per_s)
    return out


def _generate_jobs(s: Scenario, rng: random.Random) -> list[JobSpec]:
    t = s.training
    horizon = s.horizon_s
    raw: list[tuple[float, int, int, float, str]] = []
    arrivals = sorted(rng.uniform(0, horizon) for _ in range(t.jobs))
    mu = math.log(t.median_hours * 3600.0)
    for at in arrivals:
        workers, per_worker = _gang(int(_pick(rng, t.gang_gpus)), s.gpus_per_node)
        run_s = min(rng.lognormvariate(mu, t.sigma), t.max_hours * 3600.0)
        raw.append((at, workers, per_worker, max(60.0, run_s), _pick(rng, t.priorities)))
    offered = sum(w * g * r for _, w, g, r, _ in raw)
    target = t.offered_load * s.nodes * s.gpus_per_node * horizon
    scale = target / offered if offered > 0 else 1.0
    return [
        JobSpec(f"j{i:06d}", at, w, g, max(60.0, r * scale), prio)
        for i, (at, w, g, r, prio) in enumerate(raw)
    ]


@dataclass
class TraceJob:
    """One job of a trace file, as written there."""

    __pydantic_config__ = FINITE

    submit_h: Annotated[Number, at_least(0)]
    num_workers: Annotated[Whole, at_least(1)]
    gpus_per_worker: Annotated[Whole, at_least(1)]
    hours: Annotated[Number, at_least(0)]
    priority: StrictStr = "medium"


TRACE = Checked(list[TraceJob], ScenarioError, prefix="training.trace")


def read_trace(path: str, s: Scenario) -> list[JobSpec]:
    """Jobs from a trace file: a list of mappings with ``submit_h``, ``num_workers``,
    ``gpus_per_worker``, ``hours`` and ``priority``; errors name the entry and field."""
    raw = read_bounded(path, "trace file")
    if not isinstance(raw, list):
        raise ScenarioError(f"trace file {path!r}: must be a list of jobs")
    if len(raw) > MAX_TRACE_JOBS:
        raise ScenarioError(f"trace file {path!r}: more than {MAX_TRACE_JOBS} jobs")
    errors = TRACE.problems(raw)
    items = [] if errors else TRACE.load(raw)
    errors += [
        FieldError(f"training.trace[{i}].gpus_per_worker", "more than one node has")
        for i, item in enumerate(items)
        if item.gpus_per_worker > s.gpus_per_node
    ]
    if errors:
        raise ScenarioError(errors[:50], f"invalid trace {path}")
    jobs = [
        JobSpec(
            f"j{i:06d}",
            item.submit_h * 3600.0,
            item.num_workers,
            item.gpus_per_worker,
            max(1.0, item.hours * 3600.0),
            item.priority,
        )
        for i, item in enumerate(items)
    ]
    return sorted(jobs, key=lambda j: (j.submit_s, j.job_id))


def _demand(s: Scenario, rng: random.Random) -> dict[str, tuple[float, ...]]:
    step_s = s.serving.demand_step_s
    steps = int(math.ceil(s.horizon_s / step_s)) + 1
    out: dict[str, tuple[float, ...]] = {}
    for m in s.serving.models:
        values = []
        for k in range(steps):
            base = m.curve_rps((k * step_s / 3600.0) % 24.0)
            noise = max(0.0, 1 + rng.gauss(0.0, s.serving.noise)) if s.serving.noise else 1.0
            values.append(base * noise)
        out[m.name] = tuple(values)
    return out


def _reclaims(s: Scenario, cfg: Config | None, rng: random.Random) -> tuple[Reclaim, ...]:
    rate = s.external.spot_reclaims_per_node_day
    if rate <= 0:
        return ()
    cfg = cfg if cfg is not None else control_config(s)
    spot = spot_providers(s, cfg)
    out: list[Reclaim] = []
    for p in cfg.pools.external.providers:
        if p.name not in spot or p.max_nodes < 1:
            continue
        pr = random.Random(rng.random())
        for at in _poisson_times(pr, rate * p.max_nodes / 86400.0, s.horizon_s):
            out.append(Reclaim(at, p.name, pr.randrange(p.max_nodes)))
    out.sort(key=lambda r: (r.at_s, r.provider, r.slot))
    return tuple(out)


def make_trace(s: Scenario, cfg: Config | None = None) -> Trace:
    """Everything random about the run, drawn once from the seed (see the module doc);
    `cfg` is `s`'s control plane config (`control_config`, built here if not given: the
    providers the reclaims hit)."""
    check_events(s)  # before anything is drawn: a Scenario built in code is bounded too
    rng = random.Random(s.seed)
    jobs = read_trace(s.training.trace, s) if s.training.trace else _generate_jobs(s, rng)
    check_events(s, len(jobs))
    f = s.failures
    horizon = s.horizon_s
    node_rate = s.gpus_per_node / (f.gpu_mttf_hours * 3600.0)
    fail_rng = random.Random(rng.random())
    failures = tuple(
        (at, fail_rng.randrange(s.nodes))
        for at in _poisson_times(fail_rng, node_rate * s.nodes, horizon)
    )
    faults: list[Fault] = []
    year_s = 365 * 86400.0
    for kind, per_year in (
        ("hot", f.hot_faults_per_node_year),
        ("fabric", f.fabric_faults_per_node_year),
    ):
        fr = random.Random(rng.random())
        for at in _poisson_times(fr, per_year * s.nodes / year_s, horizon):
            faults.append(
                Fault(at, fr.randrange(s.nodes), kind, fr.random() < f.fault_escalation_probability)
            )
    faults.sort(key=lambda x: (x.at_s, x.node, x.kind))
    demand = _demand(s, random.Random(rng.random()))
    reclaims = _reclaims(s, cfg, random.Random(rng.random()))
    crash_rng = random.Random(rng.random())
    crashes = frozenset(i for i in range(len(failures)) if crash_rng.random() < f.crash_share)
    return Trace(tuple(jobs), failures, tuple(faults), demand, reclaims, crashes)
