"""The schemes on scenarios where the answer is known, and the goals the report prints."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from controlplane.simulate.report import (
    serving_floor_gpu_h,
    simulate_and_report,
    summarise,
    table,
)
from controlplane.simulate.run import SCHEME_NAMES, SchemeResult, run_all, simulate
from controlplane.simulate.scenario import Scenario, control_config, scenario_from_dict
from controlplane.simulate.serving import SimServe
from controlplane.simulate.trace import make_trace
from controlplane.simulate.world import World


def provider(name: str, price: float, max_nodes: int, gpus_per_node: int = 8) -> dict[str, Any]:
    """One entry of ``pools.external.providers``."""
    return {
        "name": name,
        "price_per_gpu_hour": price,
        "max_nodes": max_nodes,
        "gpus_per_node": gpus_per_node,
    }


QUIET = {"gpu_mttf_hours": 1e9, "hot_faults_per_node_year": 0, "fabric_faults_per_node_year": 0}
MODELS = [
    {
        "name": "a",
        "gpus_per_replica": 2,
        "replica_rps": 10,
        "peak_rps": 120,
        "min_replicas": 1,
        "max_replicas": 40,
    },
    {
        "name": "b",
        "gpus_per_replica": 1,
        "replica_rps": 50,
        "peak_rps": 500,
        "min_replicas": 1,
        "max_replicas": 40,
    },
]


def test_without_failures_or_serving_every_scheme_gets_the_same_goodput() -> None:
    s = scenario_from_dict(
        {
            "nodes": 16,
            "days": 2,
            "failures": QUIET,
            "training": {
                "jobs": 60,
                "offered_load": 0.2,
                "gang_gpus": {"1": 0.3, "8": 0.5, "16": 0.2},
                "median_hours": 1,
                "max_hours": 4,
                "checkpoint_stall_s": 0,
                "restore_s": 0,
            },
            "serving": {"models": []},
        }
    )
    results, trace = run_all(s)
    goodput = {name: r.figures["goodput_gpu_h"] for name, r in results.items()}
    assert goodput["ours"] > 0
    for name, value in goodput.items():
        assert value == pytest.approx(goodput["ours"], rel=1e-9), (name, goodput)
    assert all(r.figures["preemptions"] == 0 for r in results.values())


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_with_only_serving_no_training_gpu_is_ever_taken(scheme: str) -> None:
    s = scenario_from_dict(
        {
            "nodes": 8,
            "days": 1,
            "failures": QUIET,
            "training": {"jobs": 0, "gang_gpus": {"8": 1.0}},
            "serving": {"models": MODELS},
            "config": {"pools.external.providers": [provider("a", 2.5, 2)]},
        }
    )
    seen: list[int] = []

    def check(world: World, serve: SimServe, _: object) -> None:
        seen.append(world.training_used)

    r = simulate(s, scheme, make_trace(s), control_config(s), on_step=check)
    assert seen and set(seen) == {0}
    assert r.figures["preemptions"] == 0 and r.figures["training_share"] == 0
    assert r.figures["served_fraction"] > 0.99
    assert r.figures["shortfall_moves_min"] == 0


def _result(name: str, **figures: float) -> SchemeResult:
    base = dict.fromkeys(
        (
            "goodput_gpu_h", "idle_while_queued_gpu_h", "lost_to_failures_gpu_h",
            "checkpoint_stall_gpu_h", "restore_gpu_h", "utilisation", "training_share",
            "shortfall_moves_min", "external_gpu_h", "jobs_submitted",
        ),
        0.0,
    )  # fmt: skip
    base["served_fraction"] = 1.0
    base.update(figures)
    return SchemeResult(name, base, {}, decide_s=[0.001], wall_s=1.0)


@pytest.mark.parametrize(
    "ours, static, evict, moves, served, met",
    [
        (150.0, 100.0, 100.0, 0.0, 1.0, [True, True, True, True, True]),
        (140.0, 100.0, 100.0, 0.0, 1.0, [False, True, True, True, True]),
        (150.0, 100.0, 160.0, 0.0, 1.0, [True, False, True, True, True]),
        (150.0, 100.0, 100.0, 3.0, 1.0, [True, True, True, False, True]),
        (150.0, 100.0, 100.0, 0.0, 0.99, [True, True, False, True, True]),
    ],
    ids=[
        "all-met",
        "static-split-too-close",
        "evict-first-ahead",
        "moves-cost-serving",
        "serving-short",
    ],
)
def test_each_goal_says_whether_it_is_met_and_who_is_at_fault(
    ours: float, static: float, evict: float, moves: float, served: float, met: list[bool]
) -> None:
    s = scenario_from_dict({"nodes": 64, "days": 1})
    results: dict[str, SchemeResult] = {
        "ours": _result(
            "ours",
            goodput_gpu_h=ours,
            shortfall_moves_min=moves,
            external_gpu_h=5.0,
            idle_while_queued_gpu_h=30.0,
            served_fraction=served,
            shortfall_scaling_min=10.0 if served < 1.0 else 0.0,
        ),
        "static-split": _result("static-split", goodput_gpu_h=static),
        "evict-first": _result("evict-first", goodput_gpu_h=evict),
    }
    summary: dict[str, Any] = summarise(s, results, 3.0)
    assert [g["met"] for g in summary["goals"]] == met
    for g in summary["goals"]:
        assert (g["at_fault"] is None) == g["met"]
    if not met[1]:
        assert "admission" in summary["goals"][1]["at_fault"]
    if not met[2]:
        assert "serving-first reclaim" in summary["goals"][2]["at_fault"]
    if not met[3]:
        assert "operations" in summary["goals"][3]["at_fault"]
    text = table(summary)
    assert text.count("NOT MET") == met.count(False)


def test_the_report_writes_markdown_and_a_png(tmp_path: Path) -> None:
    s = scenario_from_dict(
        {
            "nodes": 8,
            "days": 0.5,
            "failures": QUIET,
            "training": {"jobs": 10, "gang_gpus": {"8": 1.0}},
            "serving": {"models": MODELS},
        }
    )
    summary, _ = simulate_and_report(s, tmp_path, ("ours", "static-split"))
    png = tmp_path / "fleet.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp_path / "report.md").read_text()
    assert "static-split" in md and "fleet.png" in md
    assert summary["files"] == [str(png), str(tmp_path / "report.md")]


def test_the_serving_floor_is_the_demand_the_external_pool_cannot_host() -> None:
    """The trace's own bound: with one external node (the least a config allows) nearly every
    GPU serving needs is owned; with an external pool bigger than the peak, none is; in
    between, less; and at least the first demand step's need beyond that one node."""
    base = scenario_from_dict({"nodes": 64, "days": 1})

    def with_external(max_nodes: int) -> Scenario:
        providers = [provider("a", 2.5, max_nodes)]
        return replace(base, config={**base.config, "pools.external.providers": providers})

    trace = make_trace(base)
    none, some, plenty = (serving_floor_gpu_h(with_external(n), trace) for n in (1, 4, 10_000))
    assert plenty == 0.0
    assert 0.0 < some < none
    first = sum(
        min(m.max_replicas, max(m.min_replicas, math.ceil(trace.rps(m.name, 0) / m.replica_rps)))
        * m.gpus_per_replica
        for m in base.serving.models
    )
    one_node = control_config(with_external(1)).pools.external.providers[0].gpus_per_node
    assert none >= (first - one_node) * base.serving.demand_step_s / 3600.0 > 0
