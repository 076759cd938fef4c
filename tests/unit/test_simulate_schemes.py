"""The schemes on scenarios where the answer is known, and the goals the report prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.simulate.report import simulate_and_report, summarise, table
from controlplane.simulate.run import SCHEME_NAMES, SchemeResult, run_all, simulate
from controlplane.simulate.scenario import control_config, scenario_from_dict
from controlplane.simulate.serving import SimServe
from controlplane.simulate.trace import make_trace
from controlplane.simulate.world import World

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
            "config": {"pools.external.max_nodes": 2, "pools.external.gpus_per_node": 8},
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
    base.update(figures)
    return SchemeResult(name, base, {}, decide_s=[0.001], wall_s=1.0)


@pytest.mark.parametrize(
    "ours, static, evict, moves, met",
    [
        (130.0, 100.0, 100.0, 0.0, [True, True, True, True]),
        (130.0, 100.0, 120.0, 0.0, [True, False, True, True]),
        (130.0, 100.0, 100.0, 3.0, [True, True, False, True]),
    ],
    ids=["all-met", "evict-first-too-close", "moves-cost-serving"],
)
def test_each_goal_says_whether_it_is_met_and_who_is_at_fault(
    ours: float, static: float, evict: float, moves: float, met: list[bool]
) -> None:
    s = scenario_from_dict({"nodes": 64, "days": 1})
    results: dict[str, SchemeResult] = {
        "ours": _result(
            "ours",
            goodput_gpu_h=ours,
            shortfall_moves_min=moves,
            external_gpu_h=5.0,
            idle_while_queued_gpu_h=30.0,
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
        assert "operations" in summary["goals"][2]["at_fault"]
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
