"""The fleet simulator's engine and world: event order, determinism from the seed, and
conservation (no GPU double-booked, every job done, running or queued at the horizon)."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.simulate.engine import EventKind, EventQueue
from controlplane.simulate.run import SCHEME_NAMES, run_all, simulate
from controlplane.simulate.scenario import Scenario, control_config, scenario_from_dict
from controlplane.simulate.serving import SimServe
from controlplane.simulate.trace import make_trace
from controlplane.simulate.training import JobPhase
from controlplane.simulate.world import World
from policies.snapshot import ReplicaState


def small(**more: Any) -> Scenario:
    raw: dict[str, Any] = {
        "nodes": 8,
        "days": 1,
        "seed": 7,
        "failures": {
            "gpu_mttf_hours": 200,
            "hot_faults_per_node_year": 200,
            "fabric_faults_per_node_year": 200,
        },
        "training": {
            "jobs": 40,
            "gang_gpus": {"2": 0.3, "8": 0.4, "16": 0.3},
            "median_hours": 1,
            "max_hours": 6,
        },
        "serving": {
            "models": [
                {
                    "name": "a",
                    "gpus_per_replica": 2,
                    "replica_rps": 10,
                    "peak_rps": 80,
                    "min_replicas": 1,
                    "max_replicas": 20,
                },
                {
                    "name": "b",
                    "gpus_per_replica": 1,
                    "replica_rps": 50,
                    "peak_rps": 300,
                    "min_replicas": 1,
                    "max_replicas": 20,
                },
            ]
        },
        "config": {
            "pools.external.providers": [
                {"name": "cheap", "price_per_gpu_hour": 2.5, "max_nodes": 1, "gpus_per_node": 8},
                {"name": "dear", "price_per_gpu_hour": 3.5, "max_nodes": 1, "gpus_per_node": 8},
            ]
        },
    }
    raw.update(more)
    return scenario_from_dict(raw)


@pytest.mark.parametrize(
    "pushes, expected",
    [
        ([(5.0, EventKind.WAKE, "w"), (1.0, EventKind.JOB_ARRIVAL, "j")], ["j", "w"]),
        ([(1.0, EventKind.WAKE, "w"), (1.0, EventKind.NODE_FAIL, "f")], ["f", "w"]),
        ([(1.0, EventKind.JOB_ARRIVAL, "a"), (1.0, EventKind.JOB_ARRIVAL, "b")], ["a", "b"]),
    ],
    ids=["earlier-first", "world-change-before-timer", "fifo-on-ties"],
)
def test_events_come_out_in_time_then_kind_then_insertion_order(
    pushes: list[tuple[float, EventKind, str]], expected: list[str]
) -> None:
    q = EventQueue()
    for at, kind, subject in pushes:
        q.push(at, kind, subject)
    out: list[str] = []
    while len(q):
        out += [e.subject for e in q.pop_instant()]
    assert out == expected


def test_pop_instant_takes_every_event_at_the_earliest_time_only() -> None:
    q = EventQueue()
    for at in (2.0, 1.0, 1.0, 3.0):
        q.push(at, EventKind.WAKE)
    assert [e.at_s for e in q.pop_instant()] == [1.0, 1.0]
    assert q.peek_time() == 2.0


def test_the_same_seed_gives_the_same_figures_and_decisions() -> None:
    first, _ = run_all(small(), ("ours", "evict-first"))
    second, _ = run_all(small(), ("ours", "evict-first"))
    for name in first:
        assert first[name].figures == second[name].figures
    assert first["ours"].plan_events == second["ours"].plan_events
    other, _ = run_all(small(seed=8), ("ours",))
    assert other["ours"].figures != first["ours"].figures


def test_the_trace_is_drawn_from_the_seed() -> None:
    a, b, c = make_trace(small()), make_trace(small()), make_trace(small(seed=9))
    assert a == b
    assert a.jobs != c.jobs and a.failures != c.failures


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_no_gpu_is_double_booked_and_every_job_is_accounted_for(scheme: str) -> None:
    s = small()
    cfg = control_config(s)
    trace = make_trace(s)
    assert trace.failures and trace.faults  # the check runs through failures and faults
    checked = []

    def check(world: World, serve: SimServe, _: object) -> None:
        held: dict[str, int] = {}
        for run in world.running.values():
            for node_id, gpus in run.placement.items():
                held[node_id] = held.get(node_id, 0) + gpus
        for r in serve.replicas.values():
            held[r.node_id] = held.get(r.node_id, 0) + r.gpus
        for node in [*world.nodes.values(), *world.external.values()]:
            assert held.get(node.node_id, 0) == node.used, node.node_id
            assert 0 <= node.used <= node.gpus, node.node_id
            if not node.up:
                assert not any(
                    r.node_id == node.node_id and r.state is ReplicaState.STARTING
                    for r in serve.replicas.values()
                )
        checked.append(world.now_s)

    result = simulate(s, scheme, trace, cfg, on_step=check)
    assert len(checked) > 100
    phases = [run.phase for run in result.jobs.values()]
    assert len(phases) == len(trace.jobs)
    assert set(phases) <= {
        JobPhase.DONE,
        JobPhase.QUEUED,
        JobPhase.RUNNING,
        JobPhase.CHECKPOINTING_OUT,
    }
    assert JobPhase.DONE in phases
    f = result.figures
    assert f["jobs_done"] + f["jobs_queued_at_end"] + f["jobs_running_at_end"] == len(
        trace.jobs
    ) - sum(1 for p in phases if p is JobPhase.CHECKPOINTING_OUT)
    # No job keeps more than its whole work, and none loses work it never did.
    for run in result.jobs.values():
        assert 0 <= run.committed_s <= run.spec.work_s
        assert run.lost_failure_s >= 0 and run.lost_preempt_s >= 0
