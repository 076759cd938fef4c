"""What the fleet simulator simulates: the scenario, its defaults, and reading one from a file.

Owns: `Scenario` (every default the default scenario's; its sections are
`controlplane.simulate.sections`'s), `SCENARIO` (pydantic's check: each field's own, then the
checks across fields here), `load_scenario` and `scenario_from_dict` (unknown keys, wrong
types, non-finite numbers and impossible values refused with one message per problem naming
the field's full path, `ScenarioError`), the bound on the work a scenario implies
(`implied_events` against `MAX_SIM_EVENTS`), `resized` (the CLI's --days/--nodes/--seed), the
providers stock-outs and spot reclaims hit, and `control_config`, the control plane's own
`Config` (packaged defaults, then the scenario's ``config`` overrides) whose policy configs
the simulator hands to the real policies. Where the defaults come from is in
docs/simulator.md.

Must not: simulate, or read any file but the scenario (and a trace it names, `trace`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from controlplane.config import Config, ConfigError, load_config
from controlplane.config.cluster import ExternalPoolConfig, ProviderConfig
from controlplane.simulate.checks import (
    MAX_SCENARIO_BYTES,
    Number,
    Overrides,
    ScenarioError,
    Whole,
    read_bounded,
    within,
)
from controlplane.simulate.sections import (
    META_GPU_MTTF_HOURS,
    ExternalSpec,
    FailureSpec,
    ModelSpec,
    RecoverySpec,
    SchemeSpec,
    ServingSpec,
    TrainingSpec,
)
from policies.validation import FINITE, Checked, FieldError
from serve.config import ModelConfig

__all__ = [
    "MAX_SCENARIO_BYTES",
    "META_GPU_MTTF_HOURS",
    "MAX_SIM_EVENTS",
    "ExternalSpec",
    "FailureSpec",
    "ModelSpec",
    "RecoverySpec",
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

    __pydantic_config__ = FINITE

    nodes: Annotated[Whole, within(1, 100_000)] = 512
    """Owned cluster nodes."""
    gpus_per_node: Annotated[Whole, within(1, 64)] = 8
    days: Annotated[Number, within(0.001, 366)] = 30.0
    seed: Annotated[Whole, within(0, 2**32 - 1)] = 1
    external: ExternalSpec = field(default_factory=ExternalSpec)
    failures: FailureSpec = field(default_factory=FailureSpec)
    training: TrainingSpec = field(default_factory=TrainingSpec)
    serving: ServingSpec = field(default_factory=ServingSpec)
    schemes: SchemeSpec = field(default_factory=SchemeSpec)
    recovery: RecoverySpec = field(default_factory=RecoverySpec)
    config: Overrides = field(
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
        raw_seed = self.seed if seed is None else seed
        options = {"days": raw_days, "nodes": raw_nodes, "seed": raw_seed}
        errors = [e for e in SCENARIO.problems(options) if e.field in options]
        if errors:
            raise ScenarioError("invalid option: " + "; ".join(map(str, errors)))
        out = dataclasses.replace(self, days=float(raw_days), nodes=int(raw_nodes), seed=raw_seed)
        factor = raw_nodes / self.nodes
        jobs = self.training.jobs * (raw_days / self.days) * factor
        out.training = dataclasses.replace(self.training, jobs=max(1, round(jobs)))
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
    if not isinstance(raw, list):
        raw = [dataclasses.asdict(p) for p in ExternalPoolConfig().providers]
    rows = [
        (
            str(p.get("name", d.name)),
            number(p.get("price_per_gpu_hour"), d.price_per_gpu_hour),
            max(0.0, number(p.get("max_nodes"), d.max_nodes)),
        )
        for p in raw
        if isinstance(p, dict)
    ]
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


def _across_fields(s: Scenario) -> list[FieldError]:
    errors: list[FieldError] = []
    t = s.training
    for name, mix in (("training.gang_gpus", t.gang_gpus), ("training.priorities", t.priorities)):
        if not mix:
            errors.append(FieldError(name, "at least one entry is required"))
        errors += [
            FieldError(f"{name}.{key}", f"must be a share >= 0, got {share!r}")
            for key, share in mix.items()
            if share < 0
        ]
        if mix and sum(mix.values()) <= 0:
            errors.append(FieldError(name, "the shares must not all be 0"))
    for key in t.gang_gpus:
        where = f"training.gang_gpus.{key}"
        if not key.isdigit() or int(key) < 1:
            errors.append(FieldError(where, "a gang size must be a whole number >= 1"))
        elif int(key) > s.nodes * s.gpus_per_node and not t.trace:
            errors.append(FieldError(where, "bigger than the cluster"))
        elif int(key) > s.gpus_per_node and int(key) % s.gpus_per_node and not t.trace:
            why = (
                f"a gang bigger than a node must be a multiple of gpus_per_node ({s.gpus_per_node})"
            )
            errors.append(FieldError(where, why))
    e = s.external
    if len(e.stockout_start_hours) > 1000:
        errors.append(FieldError("external.stockout_start_hours", "at most 1000 stock-outs"))
    errors += [
        FieldError(f"external.stockout_start_hours[{i}]", f"must be an hour >= 0, got {h!r}")
        for i, h in enumerate(e.stockout_start_hours)
        if h < 0
    ]
    errors += [
        FieldError(f"external.spot_providers[{i}]", f"{name!r} is named twice")
        for i, name in enumerate(e.spot_providers or [])
        if name in (e.spot_providers or [])[:i]
    ]
    if t.max_hours < t.median_hours:
        why = f"must be >= median_hours ({t.median_hours:g})"
        errors.append(FieldError("training.max_hours", why))
    seen: set[str] = set()
    for i, m in enumerate(s.serving.models):  # none: training only, allowed
        where = f"serving.models[{i}]"
        if not m.name or m.name in seen:
            why = f"must be a unique, non-empty name, got {m.name!r}"
            errors.append(FieldError(f"{where}.name", why))
        seen.add(m.name)
        if m.max_replicas < m.min_replicas:
            why = f"must be >= min_replicas ({m.min_replicas})"
            errors.append(FieldError(f"{where}.max_replicas", why))
        if m.gpus_per_replica > s.gpus_per_node:
            why = f"must fit one node ({s.gpus_per_node})"
            errors.append(FieldError(f"{where}.gpus_per_replica", why))
    return errors


SCENARIO = Checked(Scenario, ScenarioError, _across_fields, root="scenario")
"""The check of a scenario from plain data: each field's own (``Annotated``), then
`_across_fields`."""


def scenario_from_dict(raw: Any, source: str = "") -> Scenario:
    """A validated `Scenario` from parsed YAML/JSON; `ScenarioError` names every bad field."""
    errors = [FieldError("source", "unknown field (set by the loader)")]
    if not (isinstance(raw, dict) and "source" in raw):
        errors = SCENARIO.problems(raw)
    if errors:
        raise ScenarioError(errors, f"invalid scenario{f' {source}' if source else ''}")
    scenario = SCENARIO.load(raw)
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
        return next(iter(_cheapest(cfg)), "")
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
    names = s.external.spot_providers
    if names is None:
        return _cheapest(cfg)
    known = [p.name for p in cfg.pools.external.providers]
    bad = [
        f"external.spot_providers[{i}]: {name!r} is not one of pools.external.providers "
        f"({', '.join(known)})"
        for i, name in enumerate(names)
        if name not in known
    ]
    if bad:
        raise ScenarioError("; ".join(bad))
    return tuple(name for name in known if name in names)


def _cheapest(cfg: Config) -> tuple[str, ...]:
    """The cheapest of ``pools.external.providers`` (ties: the config's order), if any."""
    providers = cfg.pools.external.providers
    return (min(providers, key=lambda p: p.price_per_gpu_hour).name,) if providers else ()


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
