"""Recovery from failures (issue 30): a crash restarts in place, a node loss restarts at once on
a free or borrowed serving node (never below serving's floor), and every scheme meets the same
failure draws."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from controlplane.simulate.engine import EventQueue
from controlplane.simulate.recovery import Recovery
from controlplane.simulate.report import RECOVERY_GOAL, recovery_goal
from controlplane.simulate.run import run_all
from controlplane.simulate.scenario import Scenario, scenario_from_dict
from controlplane.simulate.serving import SimServe
from controlplane.simulate.trace import JobSpec, make_trace
from controlplane.simulate.training import JobPhase, JobRun
from controlplane.simulate.world import World
from policies.snapshot import Pool

GANG_NODE = "n00000"


def world_with_gang(nodes: int = 1) -> tuple[World, JobRun]:
    """`nodes` nodes of 8 GPUs; an 8-GPU gang on the first, checkpointing every 1,000 s of
    work with a 10 s stall, its restore from storage 300 s, 1,500 s after it started."""
    world = World(nodes, 8, (), 300.0, 600.0, EventQueue())
    run = JobRun(JobSpec("j", 0.0, 1, 8, 10_000.0, "medium"), 1000.0, 10.0, 300.0)
    world.submit(run)
    world.admit("j", {GANG_NODE: 8})
    world.advance(1500.0)  # one cycle (1,010 s) and 490 s: done 1,490, committed 1,000
    return world, run


@pytest.mark.parametrize(
    "in_place_s, phase, restart_s, behind_s",
    [
        # in place: trains again at 1,560 from 1,000, back at 1,490 at 2,050
        (60.0, JobPhase.RUNNING, 60.0, 550.0),
        # re-queued: admitted again at 1,510 (the backoff), restores 300 s, back at 2,300
        (None, JobPhase.QUEUED, 300.0, 800.0),
    ],
    ids=["restart-in-place", "re-queue"],
)
def test_a_crash_restarts_in_place_and_loses_less_than_a_requeue(
    in_place_s: float | None, phase: JobPhase, restart_s: float, behind_s: float
) -> None:
    world, run = world_with_gang()
    world.crash(GANG_NODE, 10.0, in_place_s)
    assert run.phase is phase
    assert world.nodes[GANG_NODE].up  # the node survives a crash
    assert run.lost_failure_s == pytest.approx(490.0)  # the same work done again either way
    if phase is JobPhase.QUEUED:
        world.advance(1510.0)
        world.admit("j", {GANG_NODE: 8})
    else:
        assert run.placement == {GANG_NODE: 8} and run.restarts_in_place == 1
    assert run.failure_restart_s == pytest.approx(restart_s)
    assert run.behind_s(3000.0) == pytest.approx(behind_s)


def serve_on(world: World, replicas: int, rps: float, min_replicas: int) -> SimServe:
    """Model ``a`` (1 GPU, 10 req/s a replica) with `replicas` RUNNING on the cluster
    nodes after the gang's (most-used first), at `rps` of demand."""
    serve = SimServe(world, world.events, {"a": 1}, {"a": 10.0}, {"a": 0.8}, 120.0, 20.0,
                     {"a": (min_replicas, 100)})  # fmt: skip
    serve.targets[("a", Pool.CLUSTER)] = replicas
    serve.reconcile()
    for r in list(serve.replicas.values()):
        serve.ready(r.replica_id, r.version)
    serve.set_demand("a", rps)
    return serve


def test_a_node_loss_with_no_free_node_borrows_a_serving_node_at_full_size() -> None:
    world, run = world_with_gang(nodes=3)
    serve = serve_on(world, 16, 60.0, 2)  # n1 and n2 full of replicas; demand needs 6
    assert all(world.nodes[i].free == 0 for i in world.cluster_ids)
    rec = Recovery(world, serve, 60.0, 120.0)
    world.fail_node(GANG_NODE, 10.0, rec.replace)
    assert run.phase is JobPhase.RUNNING and run.gpus == sum(run.placement.values()) == 8
    assert run.placement == {"n00001": 8} and run.replacements == 1
    assert run.compute_start_s == pytest.approx(1500.0 + 20.0 + 120.0)  # drain, restart
    assert serve.running("a") == 8 and rec.borrowed == 1
    world.advance(1600.0)
    world.node_back(GANG_NODE)
    rec.node_back(GANG_NODE)  # the lost node is back: the gang moves, n1 serves again
    assert run.placement == {GANG_NODE: 8} and rec.returned == 1
    assert world.nodes["n00001"].free == 8


@pytest.mark.parametrize(
    "replicas, rps, min_replicas, borrows",
    [
        (16, 60.0, 2, True),  # 8 left >= 6 needed and >= 2
        (16, 81.0, 2, False),  # 8 left < 9 needed: serving would be short
        (16, 60.0, 9, False),  # 8 left < min_replicas 9
        (16, 80.0, 8, True),  # exactly the floor
    ],
    ids=["headroom", "short-of-demand", "below-min-replicas", "at-the-floor"],
)
def test_borrowing_never_takes_serving_below_its_floor(
    replicas: int, rps: float, min_replicas: int, borrows: bool
) -> None:
    world, run = world_with_gang(nodes=3)
    serve = serve_on(world, replicas, rps, min_replicas)
    rec = Recovery(world, serve, 60.0, 120.0)
    world.fail_node(GANG_NODE, 10.0, rec.replace)
    assert (run.phase is JobPhase.RUNNING) is borrows
    assert rec.borrowed == int(borrows)
    assert serve.running("a") >= max(serve.needed("a"), min_replicas)
    assert not serve.short("a")


@pytest.mark.parametrize("repair_s, borrows", [(300.0, False), (3600.0, True)])
def test_borrowing_is_the_admission_policys_call(repair_s: float, borrows: bool) -> None:
    """`policies.admission.borrow.weigh_borrow` decides: a one-node gang borrows as many GPUs
    as it idles, which pays only when the repair is more than 4 moves away (a move here:
    the replica's 120 s start and 20 s drain, so 560 s)."""
    world, run = world_with_gang(nodes=3)
    serve = serve_on(world, 16, 60.0, 2)
    rec = Recovery(world, serve, 60.0, 120.0, repair_s)
    world.fail_node(GANG_NODE, 10.0, rec.replace)
    assert (run.phase is JobPhase.RUNNING) is borrows
    assert rec.borrowed == int(borrows)


def test_a_free_node_is_taken_before_serving_is_borrowed() -> None:
    world, run = world_with_gang(nodes=3)
    serve = serve_on(world, 8, 60.0, 2)  # n1 full of replicas, n2 free
    rec = Recovery(world, serve, 60.0, 120.0)
    world.fail_node(GANG_NODE, 10.0, rec.replace)
    assert run.placement == {"n00002": 8} and rec.borrowed == 0
    assert run.compute_start_s == pytest.approx(1500.0 + 120.0)


def failing(**more: Any) -> Scenario:
    raw: dict[str, Any] = {
        "nodes": 12,
        "days": 2,
        "seed": 7,
        "failures": {"gpu_mttf_hours": 150, "crash_share": 0.5},
        "training": {"jobs": 30, "gang_gpus": {"8": 0.5, "16": 0.5}, "median_hours": 3},
        "serving": {
            "models": [
                {
                    "name": "a",
                    "gpus_per_replica": 1,
                    "replica_rps": 10,
                    "peak_rps": 120,
                    "min_replicas": 2,
                    "max_replicas": 40,
                },
            ]
        },  # fmt: skip
        "config": {
            "pools.external.providers": [
                {"name": "cheap", "price_per_gpu_hour": 2.5, "max_nodes": 2, "gpus_per_node": 8}
            ]
        },
    }
    raw.update(more)
    return scenario_from_dict(raw)


@pytest.mark.parametrize("crash_share", [0.0, 1.0], ids=["all-node-losses", "all-crashes"])
def test_the_crash_draw_leaves_every_other_draw_alone(crash_share: float) -> None:
    base = make_trace(failing())
    s = failing(failures={"gpu_mttf_hours": 150, "crash_share": crash_share})
    other = make_trace(s)
    assert base.crashes and 0 < len(base.crashes) < len(base.failures)
    assert dataclasses.replace(other, crashes=base.crashes) == base
    assert len(other.crashes) == (len(other.failures) if crash_share else 0)


def test_both_schemes_meet_the_same_failures_and_ours_loses_less() -> None:
    results, trace = run_all(failing(), ("ours", "ours-requeue"))
    ours, today = results["ours"], results["ours-requeue"]
    assert ours.failures_met == today.failures_met
    kinds = {k for _, _, k in ours.failures_met}
    assert len(ours.failures_met) == len(trace.failures) and kinds == {"crash", "node"}
    f, t = ours.figures, today.figures
    assert f["restarts_in_place"] > 0 and t["restarts_in_place"] == 0
    assert f["restarts_on_another_node"] > 0 and t["restarts_on_another_node"] == 0
    assert f["failure_behind_gpu_h"] < t["failure_behind_gpu_h"]
    assert f["failure_restart_gpu_h"] < t["failure_restart_gpu_h"]
    assert 0 < t["ettr"] < f["ettr"] <= 1


@pytest.mark.parametrize(
    "ours_lost, today_lost, met",
    [(600.0, 1000.0, True), (601.0, 1000.0, False), (0.0, 0.0, True)],
    ids=["40-percent-lower", "just-short", "no-failures"],
)
def test_the_recovery_goal(ours_lost: float, today_lost: float, met: bool) -> None:
    def figures(lost: float) -> dict[str, float]:
        return dict.fromkeys(
            ("lost_to_failures_gpu_h", "failure_restart_gpu_h", "restarts_in_place",
             "restarts_on_another_node", "serving_nodes_borrowed"), 0.0,
        ) | {"failure_behind_gpu_h": lost, "ettr": 0.9}  # fmt: skip

    goal = recovery_goal(figures(ours_lost), figures(today_lost))
    assert goal["met"] is met and (goal["at_fault"] is None) is met
    assert set(goal["recovery"]) == {"ours", "ours-requeue"}
    assert str(RECOVERY_GOAL) in goal["goal"]
