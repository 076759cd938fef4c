"""What the fleet simulator simulates: the scenario, its defaults, and reading one from a file.

Owns: `Scenario` and its sections (every field documented, every default the default
scenario's), `load_scenario` (a YAML or JSON file, at most `MAX_SCENARIO_BYTES`) and
`scenario_from_dict`, which reject unknown keys, wrong types, non-finite numbers and
impossible values with one message per problem naming the field's full path (the typed
reading is `controlplane.simulate.checks`; the checks across fields are here), the bound on
the work a scenario implies (`implied_events` against `MAX_SIM_EVENTS`: each field can be
within its limit while their product is billions of events), `resized` (the CLI's
--days/--nodes/--seed), `with_stockouts` and `stockout_provider` (the stock-out scenario and
the provider it hits), `spot_providers` (the providers whose nodes spot reclaims take back),
and `control_config`, the control plane's own `Config` (packaged defaults, then the
scenario's ``config`` overrides, a list such as ``pools.external.providers`` given whole,
validated by `controlplane.config.load_config`) whose policy configs the simulator hands to
the real policies.

Where the defaults come from is in docs/simulator.md.

Must not: simulate, or read any file but the scenario (and a trace it names, `trace`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.config import Config, ConfigError, load_config
from controlplane.config.cluster import ExternalPoolConfig, ProviderConfig
from controlplane.simulate.checks import (
    MAX_SCENARIO_BYTES,
    ScenarioError,
    read_bounded,
    read_section,
    read_value,
)
from serve.config import ModelConfig

__all__ = [
    "MAX_SCENARIO_BYTES",
    "MAX_SIM_EVENTS",
    "ExternalSpec",
    "FailureSpec",
    "ModelSpec",
    "Scenario",
    "ScenarioError",
    "SchemeSpec",
    "ServingSpec",
    "TrainingSpec",
    "check_events",
    "control_config",
    "implied_events",
    "load_scenario",
    "scenario_from_dict",
    "spot_providers",
    "stockout_provider",
    "with_stockouts",
]


MAX_SIM_EVENTS = 2_000_000
"""The most events a scenario may imply (`implied_events`). Each is drawn and queued before
the first instant (about 350 bytes apiece in the trace and the queue: 0.7 GB at the limit),
and every scheme replays them all. The default scenario implies about 41,000; resized
(`--days`, `--nodes`, jobs scaled) to 366 days about 500,000, to 100,000 nodes over 30 days
about 1.1 million."""

META_GPU_MTTF_HOURS = 7.9 * 1024
"""Meta's Llama 3 report: one interruption every 7.9 h for a 1,024-GPU job, i.e. a mean time
to failure of 7.9 x 1,024 = 8,090 h per GPU (1,011 h per 8-GPU node)."""


@dataclass
class ExternalSpec:
    """The rented pool: how fast a node comes up, when a provider delivers nothing, and how
    often a spot provider takes a node back. Its providers (each one's name, price, node
    size and most nodes) are the control plane's ``pools.external.providers`` (``config``
    overrides), so our scheme, the baselines and the report read one list."""

    provision_s: float = 300.0
    """Request to a node that can take a replica (cloud node start plus Ray join)."""
    stockout_start_hours: list[float] = field(default_factory=list)
    """Stock-outs: hours since the start at which `stockout_provider` stops delivering nodes
    for ``stockout_hours`` (a node due then comes up ``provision_s`` after the outage ends
    and is not billed before it; the ones already up stay). Every scheme meets the same
    outages."""
    stockout_hours: float = 6.0
    """How long each stock-out lasts."""
    stockout_provider: str | None = None
    """The provider the stock-outs hit (a name in ``pools.external.providers``); None: the
    cheapest (the first of the cheapest, in the config's order)."""
    spot_reclaims_per_node_day: float = 0.05
    """Spot reclaims: each node of a `spot_providers` provider that is up is taken back at
    this rate a day (a Poisson process per node: 0.05 is about a 5 % chance a day), after
    ``reclaim_notice_s`` of notice; the provider is not out of stock, so it may be asked for
    a node again at once. 0: no reclaims. The trace draws the instants and which rented node
    each hits (`controlplane.simulate.trace`), so every scheme meets the same reclaims."""
    reclaim_notice_s: float = 120.0
    """The notice before a reclaimed node goes (AWS spot's two minutes; `rcp fault reclaim
    --notice-s` plays one on the local cluster). 0: no notice."""
    spot_providers: list[str] | None = None
    """The providers whose nodes are reclaimed (names in ``pools.external.providers``);
    None: the cheapest (the first of the cheapest: cheap capacity is the spot kind); []:
    none."""


@dataclass
class FailureSpec:
    """Hard failures and the faults telemetry sees first."""

    gpu_mttf_hours: float = META_GPU_MTTF_HOURS
    """Mean time to failure of one GPU; a node fails at gpus_per_node times that rate."""
    repair_hours: float = 4.0
    """A failed or drained node is back this long after it left."""
    hot_faults_per_node_year: float = 2.0
    """GPU overheating episodes per node per year (telemetry: a GPU above the threshold)."""
    fabric_faults_per_node_year: float = 2.0
    """InfiniBand error bursts per node per year (telemetry: IB errors above the threshold)."""
    fault_escalation_probability: float = 0.5
    """Share of faults that end in a hard failure if the node is still in service."""
    fault_escalation_s: float = 1800.0
    """When an escalating fault turns into a hard failure, after it started."""
    fault_clear_s: float = 3600.0
    """When a fault that does not escalate clears by itself."""


@dataclass
class TrainingSpec:
    """The training jobs: from a trace file, or generated from the seed."""

    jobs: int = 5000
    """Jobs generated over the horizon (Poisson arrivals); ignored with a trace."""
    trace: str | None = None
    """A JSON or YAML list of jobs (``submit_h``, ``num_workers``, ``gpus_per_worker``,
    ``hours``, ``priority``); relative to the scenario file."""
    offered_load: float = 1.0
    """Generated GPU-hours of training as a share of the owned cluster's GPU-hours over the
    horizon (durations are scaled to hit it)."""
    median_hours: float = 6.0
    """Median run time before scaling (lognormal)."""
    sigma: float = 1.2
    """Lognormal sigma of run times."""
    max_hours: float = 96.0
    """Longest run time."""
    gang_gpus: dict[str, float] = field(
        default_factory=lambda: {
            "8": 0.45,
            "16": 0.2,
            "32": 0.15,
            "64": 0.1,
            "128": 0.07,
            "256": 0.03,
        }
    )
    """Gang size (GPUs) -> share of jobs; gangs of 8 or more take whole 8-GPU workers."""
    priorities: dict[str, float] = field(
        default_factory=lambda: {"low": 0.3, "medium": 0.5, "high": 0.2}
    )
    """Priority class -> share of jobs (classes of the control plane's ``jobs`` section)."""
    runtime_limit_factor: float = 1.5
    """A job's max runtime (what admission backfills by) is its run time times this."""
    checkpoint_stall_s: float = 30.0
    """Training-visible stall per checkpoint (async snapshot)."""
    checkpoint_persist_s: float = 60.0
    """Background upload per checkpoint (bounds the interval from below)."""
    restore_s: float = 300.0
    """Restart from a checkpoint: reschedule, load, warm up."""
    baseline_checkpoint_interval_s: float = 3600.0
    """The baselines checkpoint on a fixed clock (ours asks `policies.checkpointing`)."""


@dataclass
class ModelSpec:
    """One served model and its daily request curve."""

    name: str = "model"
    gpus_per_replica: int = 1
    replica_rps: float = 10.0
    """Requests per second one replica serves at its latency target."""
    peak_rps: float = 100.0
    trough_fraction: float = 0.3
    """Night-time demand as a share of the peak."""
    peak_hour: float = 14.0
    min_replicas: int = 2
    max_replicas: int = 1000
    target_utilisation: float = 0.8
    """Every scheme sizes the model for demand / (replica_rps x this): the headroom that
    absorbs demand rising faster than a replica starts. Shortfall is counted against
    demand / replica_rps (full capacity)."""


def _default_models() -> list[ModelSpec]:
    return [
        ModelSpec("chat", 8, 20.0, 1600.0, 0.3, 14.0, 4, 200),
        ModelSpec("code", 4, 25.0, 2000.0, 0.25, 11.0, 4, 200),
        ModelSpec("embed", 1, 200.0, 40000.0, 0.35, 16.0, 8, 500),
    ]


@dataclass
class ServingSpec:
    models: list[ModelSpec] = field(default_factory=_default_models)
    demand_step_s: float = 300.0
    """The request curves step this often (the load board's resolution in the model)."""
    noise: float = 0.05
    """Relative standard deviation of each step's demand around the curve."""
    replica_start_s: float = 120.0
    """A replica's start to RUNNING on a node that has room (model load, warm up)."""
    replica_stop_s: float = 20.0
    """A stopping replica drains this long (the models' graceful shutdown) before its GPUs
    are free."""


@dataclass
class SchemeSpec:
    """The baselines' knobs."""

    static_serving_share: float | None = None
    """Share of the cluster's nodes fixed for serving; None: the peak need plus 10 %."""
    night_serving_share: float | None = None
    """Time-of-day lending: serving's share at night; None: the trough need plus 10 %."""
    night_start_hour: float = 22.0
    night_end_hour: float = 7.0


def _default_providers() -> list[dict[str, Any]]:
    """Two providers of 64 nodes x 8 GPUs (1,024 GPUs in all): on-demand H100-class list
    prices, the cheaper one first."""
    return [
        {"name": "cheap", "price_per_gpu_hour": 2.5, "max_nodes": 64, "gpus_per_node": 8},
        {"name": "dear", "price_per_gpu_hour": 3.5, "max_nodes": 64, "gpus_per_node": 8},
    ]


@dataclass
class Scenario:
    """Everything one simulation needs; the defaults are the default scenario."""

    nodes: int = 512
    """Owned cluster nodes."""
    gpus_per_node: int = 8
    days: float = 30.0
    seed: int = 1
    external: ExternalSpec = field(default_factory=ExternalSpec)
    failures: FailureSpec = field(default_factory=FailureSpec)
    training: TrainingSpec = field(default_factory=TrainingSpec)
    serving: ServingSpec = field(default_factory=ServingSpec)
    schemes: SchemeSpec = field(default_factory=SchemeSpec)
    config: dict[str, Any] = field(
        default_factory=lambda: {
            "pools.external.providers": _default_providers(),
            "placement.migrate_back_idle_s": 600,
            "placement.migrate_back_interval_s": 60,
            "placement.migrate_back_step": 4,
            "serving.ready_timeout_s": 900,
        }
    )
    """The control plane's config overrides (``key.path: value``; a list, such as
    ``pools.external.providers``, is given whole), validated by its loader; the real
    policies' configs are built from the result (`controlplane.policy_config`)."""
    source: str = ""
    """Where the scenario came from (set by `load_scenario`)."""

    @property
    def horizon_s(self) -> float:
        return self.days * 86400.0

    def resized(self, days: float | None, nodes: int | None, seed: int | None) -> Scenario:
        """This scenario over `days` on `nodes`, with `seed`; errors name the option.

        The fleet keeps its proportions: the job count scales with days and nodes (jobs
        arrive at the same rate per GPU); with nodes, each model's peak demand and
        ``max_replicas`` and each external provider's ``max_nodes`` (in
        ``config["pools.external.providers"]``) scale too."""
        raw_days = self.days if days is None else days
        raw_nodes = self.nodes if nodes is None else nodes
        errors: list[str] = []
        read_value(float, raw_days, "days", errors)
        read_value(int, raw_nodes, "nodes", errors)
        if seed is not None:
            read_value(int, seed, "seed", errors)
        if errors:
            raise ScenarioError("invalid option: " + "; ".join(errors))
        out = dataclasses.replace(self, days=float(raw_days), nodes=int(raw_nodes))
        out.training = dataclasses.replace(
            self.training,
            jobs=max(
                1, round(self.training.jobs * (raw_days / self.days) * (raw_nodes / self.nodes))
            ),
        )
        factor = raw_nodes / self.nodes
        if factor != 1:
            out.serving = dataclasses.replace(
                self.serving,
                models=[
                    dataclasses.replace(
                        m,
                        peak_rps=m.peak_rps * factor,
                        max_replicas=max(m.min_replicas, math.ceil(m.max_replicas * factor)),
                    )
                    for m in self.serving.models
                ],
            )
            key = "pools.external.providers"
            providers = self.config.get(key)
            if isinstance(providers, list):
                default = ProviderConfig().max_nodes
                out.config = {
                    **self.config,
                    key: [
                        {**p, "max_nodes": max(1, math.ceil(p.get("max_nodes", default) * factor))}
                        if isinstance(p, dict)
                        else p
                        for p in providers
                    ],
                }
        if seed is not None:
            out.seed = seed
        check_events(out)
        return out


def implied_events(s: Scenario, jobs: int | None = None) -> dict[str, float]:
    """The events `s` implies, by source (expected counts; the trace draws them all up
    front): `jobs` when known (a trace file's), else the generated ``training.jobs`` (0 with
    a trace not read yet).

    Example: the default scenario (512 nodes x 8 GPUs, 30 days, MTTF 8,090 h, 4 faults per
    node-year, 5,000 jobs, 3 models stepping every 300 s, 0.05 reclaims per node-day on
    ``cheap``'s 64 nodes) implies 365 failures, 168 faults, 5,000 jobs, 34,560 demand steps
    (8,640 steps x 4: one per model in the trace, one queued), 721 samples and 96 reclaims
    (drawn for every node the spot providers could have; one hitting a node not rented then
    is a no-op): about 40,910 events.
    """
    f = s.failures
    hours = s.days * 24.0
    steps = math.ceil(s.days * 86400.0 / s.serving.demand_step_s)
    if jobs is None:
        jobs = 0 if s.training.trace else s.training.jobs
    return {
        "node failures": s.nodes * s.gpus_per_node * hours / f.gpu_mttf_hours,
        "faults": s.nodes
        * (f.hot_faults_per_node_year + f.fabric_faults_per_node_year)
        * s.days
        / 365.0,
        "jobs": float(jobs),
        "demand steps": float(steps * (len(s.serving.models) + 1)),
        "samples": math.floor(hours) + 1.0,
        "reclaims": s.external.spot_reclaims_per_node_day * s.days * _spot_max_nodes(s),
    }


def _spot_max_nodes(s: Scenario) -> float:
    """The most nodes `s`'s spot providers may have, read from the ``config`` overrides as
    given (the packaged providers if they name none; a malformed entry counts as the packaged
    defaults: the config's loader refuses it later), so that `check_events` needs no config
    loaded."""
    d = ProviderConfig()

    def number(raw: Any, default: float) -> float:
        ok = isinstance(raw, int | float) and not isinstance(raw, bool) and math.isfinite(raw)
        return float(raw) if ok else default

    raw = s.config.get("pools.external.providers")
    rows = (
        [
            (
                str(p.get("name", d.name)),
                number(p.get("price_per_gpu_hour"), d.price_per_gpu_hour),
                max(0.0, number(p.get("max_nodes"), d.max_nodes)),
            )
            for p in raw
            if isinstance(p, dict)
        ]
        if isinstance(raw, list)
        else [
            (p.name, p.price_per_gpu_hour, float(p.max_nodes))
            for p in ExternalPoolConfig().providers
        ]
    )
    names = s.external.spot_providers
    if names is None:
        return min(rows, key=lambda r: r[1])[2] if rows else 0.0
    return sum(most for name, _, most in rows if name in names)


def check_events(s: Scenario, jobs: int | None = None) -> None:
    """Refuse (ScenarioError naming the fields) a scenario implying more than
    `MAX_SIM_EVENTS` events; arithmetic only, before anything is drawn or allocated."""
    parts = implied_events(s, jobs)
    total = sum(parts.values())
    if total <= MAX_SIM_EVENTS:
        return
    f = s.failures
    e = s.external
    why = {
        "node failures": f"nodes {s.nodes} x gpus_per_node {s.gpus_per_node} x days {s.days:g}"
        f" x 24 / failures.gpu_mttf_hours {f.gpu_mttf_hours:g}",
        "faults": f"nodes {s.nodes} x (failures.hot_faults_per_node_year "
        f"{f.hot_faults_per_node_year:g} + failures.fabric_faults_per_node_year "
        f"{f.fabric_faults_per_node_year:g}) x days {s.days:g} / 365",
        "jobs": "training.jobs" if jobs is None else "the trace's jobs",
        "demand steps": f"days {s.days:g} x 86400 / serving.demand_step_s "
        f"{s.serving.demand_step_s:g} x (serving.models {len(s.serving.models)} + 1)",
        "samples": f"days {s.days:g} x 24 + 1",
        "reclaims": f"external.spot_reclaims_per_node_day {e.spot_reclaims_per_node_day:g} x "
        f"days {s.days:g} x max_nodes of external.spot_providers {_spot_max_nodes(s):g}",
    }
    terms = "; ".join(
        f"{name} {count:,.0f} ({why[name]})"
        for name, count in sorted(parts.items(), key=lambda kv: -kv[1])
        if count >= 1
    )
    raise ScenarioError(
        f"invalid scenario{f' {s.source}' if s.source else ''}: it implies about "
        f"{total:,.0f} events, more than the simulator's limit of {MAX_SIM_EVENTS:,} "
        f"(MAX_SIM_EVENTS): {terms}. Lower the largest term's fields (fewer nodes or days, a "
        "longer gpu_mttf_hours, fewer faults, jobs, models or reclaims, a longer demand step)"
    )


def _check(s: Scenario, errors: list[str]) -> None:
    t = s.training
    for name, mix in (("training.gang_gpus", t.gang_gpus), ("training.priorities", t.priorities)):
        if not mix:
            errors.append(f"{name}: at least one entry is required")
        for key, share in mix.items():
            if not math.isfinite(share) or share < 0:
                errors.append(f"{name}.{key}: must be a share >= 0, got {share!r}")
        if mix and sum(mix.values()) <= 0:
            errors.append(f"{name}: the shares must not all be 0")
    for key in t.gang_gpus:
        if not key.isdigit() or int(key) < 1:
            errors.append(f"training.gang_gpus.{key}: a gang size must be a whole number >= 1")
        elif int(key) > s.nodes * s.gpus_per_node and not t.trace:
            errors.append(f"training.gang_gpus.{key}: bigger than the cluster")
        elif int(key) > s.gpus_per_node and int(key) % s.gpus_per_node and not t.trace:
            errors.append(
                f"training.gang_gpus.{key}: a gang bigger than a node must be a multiple of "
                f"gpus_per_node ({s.gpus_per_node})"
            )
    e = s.external
    if len(e.stockout_start_hours) > 1000:
        errors.append("external.stockout_start_hours: at most 1000 stock-outs")
    for i, h in enumerate(e.stockout_start_hours):
        if not math.isfinite(h) or h < 0:
            errors.append(f"external.stockout_start_hours[{i}]: must be an hour >= 0, got {h!r}")
    for i, name in enumerate(e.spot_providers or []):
        if name in (e.spot_providers or [])[:i]:
            errors.append(f"external.spot_providers[{i}]: {name!r} is named twice")
    if t.max_hours < t.median_hours:
        errors.append(f"training.max_hours: must be >= median_hours ({t.median_hours:g})")
    if not s.serving.models:
        pass  # training only: allowed
    seen: set[str] = set()
    for i, m in enumerate(s.serving.models):
        where = f"serving.models[{i}]"
        if not m.name or m.name in seen:
            errors.append(f"{where}.name: must be a unique, non-empty name, got {m.name!r}")
        seen.add(m.name)
        if m.max_replicas < m.min_replicas:
            errors.append(f"{where}.max_replicas: must be >= min_replicas ({m.min_replicas})")
        if m.gpus_per_replica > s.gpus_per_node:
            errors.append(f"{where}.gpus_per_replica: must fit one node ({s.gpus_per_node})")


def scenario_from_dict(raw: Any, source: str = "") -> Scenario:
    """A validated `Scenario` from parsed YAML/JSON; `ScenarioError` names every bad field."""
    errors: list[str] = []
    scenario = read_section(Scenario, raw, "", errors)
    assert isinstance(scenario, Scenario)
    if not errors:
        _check(scenario, errors)
    if errors:
        where = f" {source}" if source else ""
        raise ScenarioError(f"invalid scenario{where}:\n  " + "\n  ".join(errors))
    scenario.source = source
    check_events(scenario)
    if scenario.training.trace and source:
        trace = Path(scenario.training.trace)
        if not trace.is_absolute():
            scenario.training.trace = str(Path(source).parent / trace)
    return scenario


def load_scenario(path: str | Path | None) -> Scenario:
    """The scenario in `path` over the defaults, or the default scenario (None)."""
    if path is None:
        return Scenario()
    raw = read_bounded(path, "scenario file")
    return scenario_from_dict({} if raw is None else raw, str(path))


def with_stockouts(
    s: Scenario,
    days: tuple[int, ...] = (5, 15, 25),
    start_hour: float = 8.0,
    hours: float = 6.0,
    provider: str | None = None,
) -> Scenario:
    """`s` with `provider` (None: the cheapest) delivering nothing for `hours` from
    `start_hour` on each of `days` that the horizon holds (the stock-out scenario of issue
    28: the cheapest provider, 6 hours on 3 of 30 days, during the morning ramp up to
    serving's 14:00 peak, when the pool's nodes are being rented again after the night);
    the trace is unchanged."""
    starts = [d * 24.0 + start_hour for d in days if d * 24.0 + start_hour < s.days * 24.0]
    external = dataclasses.replace(
        s.external, stockout_start_hours=starts, stockout_hours=hours, stockout_provider=provider
    )
    return dataclasses.replace(s, external=external, source=f"{s.source or 'default'} + stock-outs")


def stockout_provider(s: Scenario, cfg: Config) -> str:
    """The provider `s`'s stock-outs hit: ``external.stockout_provider``, else the cheapest
    of ``pools.external.providers`` (ties: the config's order). ScenarioError if it names
    none of them."""
    providers = cfg.pools.external.providers
    name = s.external.stockout_provider
    if name is None:
        return min(providers, key=lambda p: p.price_per_gpu_hour).name if providers else ""
    if name not in {p.name for p in providers}:
        raise ScenarioError(
            f"external.stockout_provider: {name!r} is not one of pools.external.providers "
            f"({', '.join(p.name for p in providers)})"
        )
    return name


def spot_providers(s: Scenario, cfg: Config) -> tuple[str, ...]:
    """The providers `s`'s spot reclaims hit, in the config's order:
    ``external.spot_providers``, else the cheapest of ``pools.external.providers`` (ties: the
    config's order). ScenarioError naming the entry if one is none of them."""
    providers = cfg.pools.external.providers
    names = s.external.spot_providers
    if names is None:
        return (min(providers, key=lambda p: p.price_per_gpu_hour).name,) if providers else ()
    known = [p.name for p in providers]
    bad = [
        f"external.spot_providers[{i}]: {name!r} is not one of pools.external.providers "
        f"({', '.join(known)})"
        for i, name in enumerate(names)
        if name not in known
    ]
    if bad:
        raise ScenarioError("; ".join(bad))
    return tuple(name for name in known if name in names)


def control_config(scenario: Scenario) -> Config:
    """The control plane's `Config`: packaged defaults, then ``config`` overrides, then the
    scenario's models as ``serving.models`` (so demand and placement see their sizes)."""
    overrides = [f"{k}={json.dumps(v)}" for k, v in sorted(scenario.config.items())]
    overrides.append("serve.deploy_app=true")
    try:
        cfg = load_config(None, overrides)
    except ConfigError as exc:
        raise ScenarioError(f"config: {exc}") from exc
    base = cfg.serving.models[0] if cfg.serving.models else ModelConfig()
    cfg.serving.models = [
        dataclasses.replace(
            base,
            name=m.name,
            num_gpus=float(m.gpus_per_replica),
            min_replicas=m.min_replicas,
            max_replicas=m.max_replicas,
        )
        for m in scenario.serving.models
    ]
    return cfg
