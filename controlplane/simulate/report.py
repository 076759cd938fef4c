"""What a simulation run says: the table, the one JSON object, the goals, the markdown and PNG.

Owns: `summarise` (every figure per scheme, the external GPU-hours and cost per provider for
every scheme, our ratios against each baseline, the per-decision cost of the real policies, and the goals of issue 28 with whether each is met and, if not,
which policy is at fault, from where the GPU-hours went, and beside a goodput goal the
bound the trace itself puts on a scheme that serves every request, `serving_floor_gpu_h`, and
the baseline's goodput at equal service, `at_equal_service`; and issue 30's: work lost to
failures against ``ours-requeue``, `RECOVERY_GOAL`, with each scheme's ETTR), `table` (plain text), `write_report`
(``report.md`` and ``fleet.png`` under the output directory) and `plot` (matplotlib, Agg).

Must not: simulate, or change a figure (it reads `SchemeResult`s).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from controlplane.simulate.run import SCHEME_NAMES, SchemeResult, percentile, run_all
from controlplane.simulate.scenario import Scenario, control_config
from controlplane.simulate.serving import CAUSES
from controlplane.simulate.trace import Trace

__all__ = [
    "GOODPUT_GOALS",
    "RECOVERY_GOAL",
    "at_equal_service",
    "SERVED_GOAL",
    "plot",
    "serving_floor_gpu_h",
    "simulate_and_report",
    "summarise",
    "table",
    "write_report",
]

GOODPUT_GOALS = {"static-split": 1.45, "evict-first": 1.0}
"""Our training goodput over each baseline's, at least (issue 28)."""
RECOVERY_GOAL = 0.6
"""Our work lost to failures (``failure_behind_gpu_h``) over ``ours-requeue``'s, at most
(issue 30: at least 40 % lower than re-queueing every failed gang)."""
SERVED_GOAL = 0.999
"""Requests served, at least (issue 28: serving's demand is a guarantee)."""

ROWS: tuple[tuple[str, str, str], ...] = (
    ("goodput_gpu_h", "training goodput (GPU-h)", "{:,.0f}"),
    ("jobs_done", "jobs done", "{:,.0f}"),
    ("jobs_queued_at_end", "jobs still queued at the horizon", "{:,.0f}"),
    ("jct_mean_h", "job completion time, mean (h)", "{:.1f}"),
    ("jct_p95_h", "job completion time, p95 (h)", "{:.1f}"),
    ("queue_delay_mean_h", "queueing delay, mean (h)", "{:.2f}"),
    ("queue_delay_p95_h", "queueing delay, p95 (h)", "{:.2f}"),
    ("shortfall_min", "serving shortfall (model-minutes)", "{:,.1f}"),
    ("shortfall_moves_min", "  (a) caused by moves (a move's BREAK)", "{:,.1f}"),
    ("shortfall_policy_min", "  (b) yielded to training by policy", "{:,.1f}"),
    ("shortfall_failures_min", "  (c) caused by node failures", "{:,.1f}"),
    ("shortfall_scaling_min", "  (d) external pool lacks capacity, or lag", "{:,.1f}"),
    ("shortfall_reclaims_min", "  (e) spot reclaims (notice ran out)", "{:,.1f}"),
    ("moves_leaving_serving_short", "  moves whose BREAK left a model short", "{:,.0f}"),
    ("served_fraction", "requests served", "{:.4f}"),
    ("reclaims", "spot reclaims of rented nodes", "{:,.0f}"),
    ("reclaimed_replicas", "  replicas still on them at the end", "{:,.0f}"),
    ("external_gpu_h", "external GPU-hours", "{:,.0f}"),
    ("external_cost", "external cost ($)", "{:,.0f}"),
    ("preemptions", "preemptions", "{:,.0f}"),
    ("lost_to_preemptions_gpu_h", "work lost to preemptions (GPU-h)", "{:,.0f}"),
    ("failure_behind_gpu_h", "work lost to failures, ETTR's (GPU-h)", "{:,.0f}"),
    ("lost_to_failures_gpu_h", "  of which done again (GPU-h)", "{:,.0f}"),
    ("failure_restart_gpu_h", "  GPUs held restarting after failures (GPU-h)", "{:,.0f}"),
    ("restarts_in_place", "restarts in place after a crash", "{:,.0f}"),
    ("restarts_on_another_node", "restarts at once after a node loss", "{:,.0f}"),
    ("serving_nodes_borrowed", "  on a node borrowed from serving", "{:,.0f}"),
    ("ettr", "ETTR (work kept / wall time since admission)", "{:.4f}"),
    ("checkpoint_stall_gpu_h", "checkpoint stalls (GPU-h)", "{:,.0f}"),
    ("restore_gpu_h", "restores (GPU-h)", "{:,.0f}"),
    ("utilisation", "owned-cluster GPU utilisation", "{:.3f}"),
    ("training_share", "  of which training", "{:.3f}"),
    ("idle_while_queued_gpu_h", "owned GPUs idle while jobs queued (GPU-h)", "{:,.0f}"),
    ("serving_taken_gpu_h", "serving's demand given to training (GPU-h)", "{:,.0f}"),
)


PROVIDER_ROWS = {"external_gpu_h": "gpu_h", "external_cost": "cost"}
"""Rows followed by one row per provider (`summarise`'s ``external_by_provider``)."""


def _provider_rows(
    by_provider: dict[str, dict[str, dict[str, float]]],
    names: list[str],
    width: int,
    field: str,
    fmt: str,
) -> list[str]:
    """One line per provider (in the config's order) of `field`, for every scheme."""
    providers: dict[str, float] = {}
    for n in names:
        for provider, row in by_provider.get(n, {}).items():
            providers.setdefault(provider, row.get("price_per_gpu_hour", 0.0))
    lines = []
    for provider, price in providers.items():
        label = f"  {provider} (${price:g}/GPU-h)"
        cells = "".join(
            fmt.format(by_provider.get(n, {}).get(provider, {}).get(field, 0.0)).rjust(14)
            for n in names
        )
        lines.append(label.ljust(width) + cells)
    return lines


def decision_cost(result: SchemeResult) -> dict[str, float]:
    """The real policies' cost per decision (decide phase; observe built separately)."""
    d = result.decide_s
    n = len(d)
    return {
        "decisions": float(n),
        "decide_mean_ms": 1000.0 * sum(d) / n if n else 0.0,
        "decide_p95_ms": 1000.0 * percentile(d, 0.95),
        "decide_max_ms": 1000.0 * percentile(d, 1.0),
        "observe_mean_ms": 1000.0 * result.observe_s / n if n else 0.0,
        "decide_cpu_mean_ms": 1000.0 * sum(result.decide_cpu_s) / n if n else 0.0,
        "decide_cpu_p95_ms": 1000.0 * percentile(result.decide_cpu_s, 0.95),
        "decide_cpu_max_ms": 1000.0 * percentile(result.decide_cpu_s, 1.0),
    }


def serving_floor_gpu_h(s: Scenario, trace: Trace) -> float:
    """Owned GPU-hours serving's demand needs whatever the scheduler, from the trace: per
    demand step, the GPUs of the replicas each model needs to serve every request (at full
    use of each replica, so a lower bound), less what the external pool can host at most
    (the sum of its providers' ``max_nodes x gpus_per_node``), summed over the horizon."""
    external = control_config(s).pools.external.max_gpus
    steps = max(len(v) for v in trace.demand_rps.values()) if trace.demand_rps else 0
    step_h = s.serving.demand_step_s / 3600.0
    total = 0.0
    for i in range(steps):
        if i * s.serving.demand_step_s >= s.horizon_s:
            break
        need = sum(
            min(
                m.max_replicas, max(m.min_replicas, math.ceil(trace.rps(m.name, i) / m.replica_rps))
            )
            * m.gpus_per_replica
            for m in s.serving.models
        )
        total += max(0, need - external) * step_h
    return total


def _fault(
    ours: dict[str, float], other: dict[str, float], name: str, max_share: float | None = None
) -> str:
    """Which policy the goodput gap against `name` points at, from where GPU-hours went."""

    def lost(f: dict[str, float]) -> float:
        return f["lost_to_failures_gpu_h"] + f["checkpoint_stall_gpu_h"] + f["restore_gpu_h"]

    def serving(f: dict[str, float]) -> float:
        return f["utilisation"] - f["training_share"]

    idle = ours["idle_while_queued_gpu_h"] - other["idle_while_queued_gpu_h"]
    kept = (serving(ours) - serving(other)) * ours["owned_gpu_h"]
    gap = {
        "admission (policies/admission: reservation and backfill left GPUs idle while jobs "
        "queued)": idle,
        "health and checkpointing (policies/health, policies/checkpointing: lost work, stalls, "
        "restores)": lost(ours) - lost(other),
        "placement (policies/placement: serving kept cluster GPUs)": kept,
    }
    worst, hours = max(gap.items(), key=lambda kv: kv[1])
    bound = ""
    goal = GOODPUT_GOALS[name]
    if other["training_share"] * goal > 1.0:
        bound = (
            f"out of reach for any scheduler: {name} already trains on "
            f"{other['training_share']:.1%} of the owned GPUs (ours {ours['training_share']:.1%}), "
            f"{goal}x would need {other['training_share'] * goal:.0%}; "
        )
    elif max_share is not None and max_share < other["training_share"] * goal:
        bound = (
            f"out of reach for a scheme that serves every request: serving's demand beyond "
            f"what the external pool hosts needs {1 - max_share:.1%} of the owned GPU-hours "
            f"(from the trace), so training can have at most {max_share:.1%}; {name} trains "
            f"on {other['training_share']:.1%} while serving "
            f"{other.get('served_fraction', 1.0):.1%} of requests; "
        )
    if hours <= 0:
        return bound + f"no policy of ours loses GPU-hours against {name}"
    return bound + f"the gap left is {worst}: {hours:,.0f} GPU-h more than {name}"


def at_equal_service(ours: dict[str, float], other: dict[str, float]) -> dict[str, float] | None:
    """`other`'s goodput had it served the demand ours serves, at most: less the GPU-hours it
    trained on that serving's demand needed beyond what ours took (`serving_taken_gpu_h`,
    `controlplane.simulate.serving`); None when `other` took no more than ours."""
    taken = other.get("serving_taken_gpu_h", 0.0) - ours.get("serving_taken_gpu_h", 0.0)
    if taken <= 0 or "goodput_gpu_h" not in other:
        return None
    most = other["goodput_gpu_h"] - taken
    return {
        "taken_gpu_h": round(taken, 1),
        "goodput_at_most_gpu_h": round(most, 1),
        "ratio": round(ours["goodput_gpu_h"] / most, 3) if most > 0 else math.inf,
    }


def recovery_goal(ours: dict[str, float], today: dict[str, float]) -> dict[str, Any]:
    """Issue 30's goal: our work lost to failures (ETTR's: the gangs' GPUs from each failure
    until caught up) at most `RECOVERY_GOAL` of ``ours-requeue``'s, with each one's parts and
    ETTR beside it."""
    keys = ("failure_behind_gpu_h", "lost_to_failures_gpu_h", "failure_restart_gpu_h")
    was = today["failure_behind_gpu_h"]
    ratio = ours["failure_behind_gpu_h"] / was if was > 0 else 0.0
    met = ratio <= RECOVERY_GOAL
    beside = {
        name: {**{k: round(f[k], 1) for k in keys}, "ettr": round(f["ettr"], 4)}
        for name, f in (("ours", ours), ("ours-requeue", today))
    }
    why = (
        "the recovery (controlplane/simulate/recovery.py): failed gangs still waited or "
        f"restarted slowly ({ours['restarts_in_place']:.0f} restarts in place, "
        f"{ours['restarts_on_another_node']:.0f} at once after a node loss, "
        f"{ours['serving_nodes_borrowed']:.0f} on a node borrowed from serving); the work "
        "done again is the checkpoint interval's, the same in both"
    )
    return {
        "goal": f"work lost to failures (ETTR's) <= {RECOVERY_GOAL:g}x ours-requeue (ours)",
        "value": round(ratio, 4),
        "met": met,
        "at_fault": None if met else why,
        "recovery": beside,
    }


def summarise(
    s: Scenario, results: dict[str, SchemeResult], wall_s: float, trace: Trace | None = None
) -> dict[str, Any]:
    """The one JSON object: every figure, ratio, cost and goal (with `trace`, the bound the
    trace itself puts on training beside a goodput goal that is missed)."""
    ours = results["ours"].figures
    owned_gpu_h = s.nodes * s.gpus_per_node * s.days * 24.0
    floor_gpu_h = serving_floor_gpu_h(s, trace) if trace is not None else None
    max_share = 1.0 - floor_gpu_h / owned_gpu_h if floor_gpu_h is not None else None
    for r in results.values():
        r.figures["owned_gpu_h"] = owned_gpu_h
    ratios = {
        f"goodput_vs_{name}": (
            ours["goodput_gpu_h"] / r.figures["goodput_gpu_h"]
            if r.figures["goodput_gpu_h"]
            else math.inf
        )
        for name, r in results.items()
        if name != "ours"
    }
    goals: list[dict[str, Any]] = []

    def goal(text: str, value: float, met: bool, at_fault: str | None, **more: Any) -> None:
        at_fault = None if met else at_fault
        goals.append({"goal": text, "value": value, "met": met, "at_fault": at_fault, **more})

    for name, want in GOODPUT_GOALS.items():
        if name not in results:
            continue
        ratio = ratios[f"goodput_vs_{name}"]
        met = ratio >= want
        fault = None if met else _fault(ours, results[name].figures, name, max_share)
        equal = at_equal_service(ours, results[name].figures)
        more = {} if equal is None else {"at_equal_service": equal}
        goal(f"training goodput >= {want}x {name}", round(ratio, 4), met, fault, **more)
    served = ours.get("served_fraction", 1.0)
    short = {c: ours.get(f"shortfall_{c}_min", 0.0) for c in CAUSES}
    causes = {
        "placement and admission (policies/placement rule 3, policies/admission claims): "
        "serving yielded to training": short["policy"],
        "health (policies/health): node failures took replicas": short["failures"],
        "admission's serving-first reclaim (policies/admission, jobs.preemption caps) and the "
        "external pool's size: demand nobody hosted in time": short["scaling"],
        "the move operations (controlplane/loop/act/operations.py)": short["moves"],
        "spot reclaims (external.reclaim_notice_s): replicas not moved off a reclaimed node "
        "before it went": short["reclaims"],
    }
    goal(
        f"requests served >= {SERVED_GOAL:.1%} (ours)",
        round(served, 5),
        served >= SERVED_GOAL,
        max(causes.items(), key=lambda kv: kv[1])[0],
        serving_floor_gpu_h=None if floor_gpu_h is None else round(floor_gpu_h, 1),
    )
    moves = ours["shortfall_moves_min"]
    breaks = int(ours.get("moves_leaving_serving_short", 0))
    why = (
        "the move operations (controlplane/loop/act/operations.py): a move's step stopped "
        f"replicas demand still needed ({breaks} moves whose BREAK left a model short)"
    )
    beside = {
        "yielded_to_training_by_policy": round(short["policy"], 2),
        "node_failures": round(short["failures"], 2),
        "external_pool_lacks_capacity": round(short["scaling"], 2),
        "spot_reclaims": round(short["reclaims"], 2),
    }
    goal(
        "zero minutes of serving shortfall caused by moves (ours)",
        round(moves, 2),
        moves == 0,
        why,
        beside=beside,
    )
    if "ours-requeue" in results:
        goals.append(recovery_goal(ours, results["ours-requeue"].figures))
    external_h = ours["external_gpu_h"]
    goal(
        "external GPU-hours reported (ours)", round(external_h, 1), math.isfinite(external_h), None
    )
    findings: list[str] = []
    if floor_gpu_h is not None:
        findings.append(
            f"serving's demand beyond what the external pool can host needs at least "
            f"{floor_gpu_h:,.0f} owned GPU-hours over the horizon ({floor_gpu_h / owned_gpu_h:.1%} "
            "of the owned GPUs), whatever the scheduler: training can have at most "
            f"{1 - floor_gpu_h / owned_gpu_h:.1%} of them while every request is served"
        )
    days_per_min = s.days * len(results) / (wall_s / 60.0) if wall_s > 0 else 0.0
    return {
        "bench": "fleet",
        "scenario": {
            "source": s.source or "default",
            "nodes": s.nodes,
            "gpus": s.nodes * s.gpus_per_node,
            "days": s.days,
            "seed": s.seed,
            "models": [m.name for m in s.serving.models],
            "jobs": int(ours["jobs_submitted"]),
        },
        "schemes": {
            name: {k: round(v, 4) for k, v in r.figures.items()} for name, r in results.items()
        },
        "external_by_provider": {
            name: {
                provider: {k: round(v, 4) for k, v in row.items()}
                for provider, row in r.providers.items()
            }
            for name, r in results.items()
        },
        "ratios": {k: round(v, 4) for k, v in ratios.items()},
        "decision_cost": decision_cost(results["ours"]),
        "wall_s": {name: round(r.wall_s, 2) for name, r in results.items()},
        "cpu_s": {name: round(r.cpu_s, 2) for name, r in results.items()},
        "wall_total_s": round(wall_s, 2),
        "sim_days_per_wall_min": round(days_per_min, 2),
        "sim_days_per_wall_min_ours": round(s.days / (results["ours"].wall_s / 60.0), 2)
        if results["ours"].wall_s
        else 0.0,
        "goals": goals,
        "findings": findings,
        "all_goals_met": all(g["met"] for g in goals),
    }


def table(summary: dict[str, Any]) -> str:
    names = list(summary["schemes"])
    width = max(len(label) for _, label, _ in ROWS) + 2
    lines = ["".ljust(width) + "".join(n.rjust(14) for n in names)]
    by_provider = summary.get("external_by_provider", {})
    for key, label, fmt in ROWS:
        cells = "".join(fmt.format(summary["schemes"][n].get(key, 0.0)).rjust(14) for n in names)
        lines.append(label.ljust(width) + cells)
        if key in PROVIDER_ROWS:
            lines += _provider_rows(by_provider, names, width, PROVIDER_ROWS[key], fmt)
    lines.append("")
    for k, v in summary["ratios"].items():
        lines.append(f"ours {k.replace('_', ' ')}: {v:.4f}x")
    c = summary["decision_cost"]
    lines.append(
        f"per decision (real policies): decide {c['decide_mean_ms']:.2f} ms mean, "
        f"{c['decide_p95_ms']:.2f} ms p95, {c['decide_max_ms']:.1f} ms max over "
        f"{c['decisions']:,.0f} decisions; observe {c['observe_mean_ms']:.2f} ms (process CPU: "
        f"{c['decide_cpu_mean_ms']:.2f} ms mean, {c['decide_cpu_p95_ms']:.2f} ms p95, "
        f"{c['decide_cpu_max_ms']:.1f} ms max)"
    )
    cpu = summary.get("cpu_s", {})
    if cpu:
        lines.append(
            "process CPU seconds per scheme: "
            + ", ".join(f"{name} {sec:.0f}" for name, sec in cpu.items())
        )
    lines.append(
        f"simulated {summary['scenario']['days']:g} days x {len(names)} schemes in "
        f"{summary['wall_total_s']:.0f} s: {summary['sim_days_per_wall_min']:.1f} simulated "
        f"days per wall-clock minute (ours alone: {summary['sim_days_per_wall_min_ours']:.1f})"
    )
    lines.append("")
    for text in summary.get("findings", []):
        lines.append(f"finding: {text}")
    for g in summary["goals"]:
        mark = "MET" if g["met"] else "NOT MET"
        lines.append(f"[{mark}] {g['goal']}: {g['value']}")
        if g.get("beside"):
            other = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in g["beside"].items())
            lines.append(f"        not moves, beside it (model-minutes): {other}")
        for name, f in g.get("recovery", {}).items():
            lines.append(
                f"        {name}: lost {f['failure_behind_gpu_h']:,.0f} GPU-h (done again "
                f"{f['lost_to_failures_gpu_h']:,.0f}, restarting {f['failure_restart_gpu_h']:,.0f}"
                f"), ETTR {f['ettr']:.4f}"
            )
        if g["at_fault"]:
            lines.append(f"        at fault: {g['at_fault']}")
        if g.get("at_equal_service"):
            e = g["at_equal_service"]
            lines.append(
                f"        at equal service: it trained {e['taken_gpu_h']:,.0f} GPU-h more than "
                "ours on GPUs serving's demand needed (no replica running for it, no cluster "
                "GPU free), so had it served that demand it would train at most "
                f"{e['goodput_at_most_gpu_h']:,.0f} GPU-h: ours is {e['ratio']}x of that"
            )
    return "\n".join(lines)


def plot(results: dict[str, SchemeResult], path: Path) -> None:
    """Utilisation and serving capacity against demand over the run, per scheme."""
    # Deferred: matplotlib is heavy and only this function draws.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(12, 10), sharex=True)
    for name, r in results.items():
        t = [h / 24.0 for h in r.series["t_h"]]
        axes[0].plot(t, r.series["util"], label=name, linewidth=0.8)
        axes[1].plot(t, r.series["capacity_rps"], label=f"{name} capacity", linewidth=0.8)
        axes[2].plot(t, r.series["external_gpus"], label=name, linewidth=0.8)
    first = next(iter(results.values()))
    axes[1].plot(
        [h / 24.0 for h in first.series["t_h"]],
        first.series["demand_rps"],
        "k--",
        linewidth=0.8,
        label="demand",
    )
    axes[0].set_ylabel("owned GPU utilisation")
    axes[1].set_ylabel("serving capacity (req/s)")
    axes[2].set_ylabel("external GPUs")
    axes[2].set_xlabel("day")
    for ax in axes:
        ax.legend(loc="upper right", fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(
    s: Scenario,
    results: dict[str, SchemeResult],
    summary: dict[str, Any],
    outdir: Path,
    png: bool = True,
) -> list[Path]:
    """``report.md`` (and ``fleet.png``) under `outdir`; the paths written."""
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    if png:
        plot(results, outdir / "fleet.png")
        written.append(outdir / "fleet.png")
    sc = summary["scenario"]
    md = [
        "# Fleet simulation",
        "",
        f"Scenario: {sc['source']}; {sc['nodes']} nodes ({sc['gpus']:,} GPUs), {sc['days']:g} days, "
        f"seed {sc['seed']}, {sc['jobs']:,} jobs, models {', '.join(sc['models'])}. "
        "Every scheme replays the same trace (docs/simulator.md says what is modelled).",
        "",
        "```",
        table(summary),
        "```",
        "",
    ]
    if png:
        md += ["![utilisation, serving capacity against demand, external GPUs](fleet.png)", ""]
    (outdir / "report.md").write_text("\n".join(md), encoding="utf-8")
    written.append(outdir / "report.md")
    return written


def simulate_and_report(
    s: Scenario, outdir: Path | None, schemes: tuple[str, ...] = SCHEME_NAMES, png: bool = True
) -> tuple[dict[str, Any], dict[str, SchemeResult]]:
    """Every scheme on the scenario; the summary (and the report files under `outdir`)."""
    started = time.perf_counter()
    results, trace = run_all(s, schemes)
    summary = summarise(s, results, time.perf_counter() - started, trace)
    if outdir is not None:
        summary["files"] = [str(p) for p in write_report(s, results, summary, outdir, png)]
    return summary, results
