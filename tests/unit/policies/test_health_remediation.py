"""From verdicts to a plan: cordon, checkpoint-and-requeue, move replicas, drain once empty."""

from __future__ import annotations

import pytest

from policies.health import (
    DRAINED_BY_OTHERS,
    CordonNode,
    HealthReason,
    NodeVerdict,
    RemediationAction,
    Verdict,
    acting_verdicts,
    remediate,
    with_verdicts,
)
from policies.plan import DrainNode, PreemptJob
from policies.snapshot import ClusterSnapshot, Pool, ReplicaState
from tests.unit.builders import gang, node, replica, snapshot

HOT = NodeVerdict("a", Verdict.UNHEALTHY, (HealthReason.GPU_OVERHEATED,), ("gpu 0 at 91.5 C",))
WHY = "node a unhealthy: gpu_overheated (gpu 0 at 91.5 C)"


def kinds(plan: tuple[RemediationAction, ...]) -> list[str]:
    out = []
    for a in plan:
        if isinstance(a, PreemptJob):
            out.append(f"preempt {a.job_id}" + (" (checkpoint)" if a.checkpoint_first else ""))
        else:
            out.append(f"{type(a).__name__} {a.node_id}")
    return out


CASES: list[tuple[str, ClusterSnapshot, dict[str, NodeVerdict], list[str]]] = [
    (
        "healthy-nothing-to-do",
        snapshot([node("a"), node("b")], running=[gang("j1", {"a": 4})]),
        {"a": NodeVerdict("a", Verdict.HEALTHY)},
        [],
    ),
    (
        "degraded-stays-in-service",
        snapshot([node("a")], running=[gang("j1", {"a": 4})]),
        {"a": NodeVerdict("a", Verdict.DEGRADED, (HealthReason.GPU_TEMP_HIGH,))},
        [],
    ),
    (
        "docstring-example-first-tick",
        snapshot(
            [node("a"), node("b", gpus_total=4)],
            running=[gang("j1", {"a": 4}), gang("j2", {"b": 4})],
            replicas=[replica("r1", "a")],
        ),
        {"a": HOT},
        # the replica is placement's to move (its budget loses node a): no move here
        ["CordonNode a", "preempt j1 (checkpoint)"],
    ),
    (
        "replicas-there-keep-it-from-being-drained",
        snapshot([node("a"), node("b")], replicas=[replica("r1", "a"), replica("r2", "a")]),
        {"a": HOT},
        ["CordonNode a"],
    ),
    (
        "external-node-with-a-replica-is-cordoned-not-drained",
        snapshot(
            [node("a", pool=Pool.EXTERNAL, gpus_total=2)],
            replicas=[replica("r1", "a", pool=Pool.EXTERNAL, model="llm")],
        ),
        {"a": HOT},
        ["CordonNode a"],
    ),
    (
        "already-preempting-and-stopping-are-not-asked-again",
        snapshot(
            [node("a")],
            running=[gang("j1", {"a": 4}, preempting=True)],
            replicas=[replica("r1", "a", state=ReplicaState.STOPPING)],
        ),
        {"a": HOT},
        ["CordonNode a"],
    ),
    (
        "empty-node-is-drained",
        snapshot([node("a"), node("b")], running=[gang("j2", {"b": 8})]),
        {"a": HOT},
        ["CordonNode a", "DrainNode a"],
    ),
    (
        "head-is-never-drained",
        snapshot([node("h", pool=Pool.HEAD, gpus_total=0)]),
        {"h": NodeVerdict("h", Verdict.UNHEALTHY, (HealthReason.NO_TELEMETRY,))},
        [],
    ),
]


@pytest.mark.parametrize(
    ("snap", "verdicts", "expected"), [pytest.param(s, v, e, id=i) for i, s, v, e in CASES]
)
def test_remediate(
    snap: ClusterSnapshot, verdicts: dict[str, NodeVerdict], expected: list[str]
) -> None:
    assert kinds(remediate(snap, verdicts)) == expected


def test_every_action_carries_the_verdict_as_its_reason() -> None:
    snap = snapshot([node("a")], running=[gang("j1", {"a": 4})], replicas=[replica("r1", "a")])
    plan = remediate(snap, {"a": HOT})
    assert all(WHY in a.reason for a in plan), [a.reason for a in plan]
    assert plan[0] == CordonNode("a", WHY)


def test_drain_comes_only_after_the_node_is_empty() -> None:
    busy = snapshot([node("a")], running=[gang("j1", {"a": 4}, preempting=True)])
    assert not any(isinstance(a, DrainNode) for a in remediate(busy, {"a": HOT}))
    empty = snapshot([node("a")])
    assert remediate(empty, {"a": HOT})[-1] == DrainNode("a", WHY)


def test_with_verdicts_takes_unhealthy_nodes_out_of_capacity_at_once() -> None:
    snap = snapshot([node("a"), node("b"), node("c")])
    verdicts = {"a": HOT, "b": NodeVerdict("b", Verdict.DEGRADED, (HealthReason.GPU_TEMP_HIGH,))}
    marked = with_verdicts(snap, verdicts)
    assert [n.healthy for n in marked.nodes] == [False, True, True]
    assert marked.live_gpus_total(Pool.CLUSTER) == 16
    assert snap.live_gpus_total(Pool.CLUSTER) == 24  # the input is not changed


# -- acting_verdicts: what the controller acts on ------------------------------------------------

FINE = NodeVerdict("a", Verdict.HEALTHY)


@pytest.mark.parametrize(
    ("judged", "previous", "cordoned", "draining", "gang_on", "expect", "expect_others"),
    [
        # nothing special: telemetry's verdicts as they are
        ({"a": FINE}, {}, [], [], None, {"a": (Verdict.HEALTHY, ())}, set()),
        # cordoned and its samples recovered: stays out, with the verdict that put it out
        (
            {"a": FINE},
            {"a": HOT},
            ["a"],
            ["a"],
            None,
            {"a": (Verdict.UNHEALTHY, HOT.details)},
            set(),
        ),
        # cordoned, no earlier verdict (a restarted controller): a bare unhealthy one
        ({}, {}, ["a"], ["a"], None, {"a": (Verdict.UNHEALTHY, ("cordoned",))}, set()),
        # someone else drains a node a gang runs on: unhealthy, and not ours to remove
        ({"a": FINE}, {}, [], ["a"], "a", {"a": (Verdict.UNHEALTHY, (DRAINED_BY_OTHERS,))}, {"a"}),
        # someone else drains an idle node (the autoscaler): left alone
        ({"a": FINE}, {}, [], ["a"], None, {"a": (Verdict.HEALTHY, ())}, set()),
        # a gang elsewhere does not make a draining node ours to act on
        ({"a": FINE}, {}, [], ["a"], "b", {"a": (Verdict.HEALTHY, ())}, set()),
        # already unhealthy by telemetry and drained by someone else: telemetry's verdict wins
        ({"a": HOT}, {}, [], ["a"], "a", {"a": (Verdict.UNHEALTHY, HOT.details)}, set()),
    ],
)
def test_acting_verdicts(
    judged: dict[str, NodeVerdict],
    previous: dict[str, NodeVerdict],
    cordoned: list[str],
    draining: list[str],
    gang_on: str | None,
    expect: dict[str, tuple[Verdict, tuple[str, ...]]],
    expect_others: set[str],
) -> None:
    snap = snapshot(
        [node("a", gpus_total=4), node("b", gpus_total=4)],
        running=[gang("j", {gang_on: 2})] if gang_on else [],
    )
    out, others = acting_verdicts(judged, previous, cordoned, draining, snap)
    assert {n: (v.verdict, v.details) for n, v in out.items()} == expect
    assert others == expect_others


def test_keep_nodes_drops_the_records_of_nodes_that_are_gone() -> None:
    from policies.health import HealthState, NodeHealthState, keep_nodes

    state = HealthState({"a": NodeHealthState(lemon=True), "b": NodeHealthState(clean_samples=2)})
    assert dict(keep_nodes(state, ["b", "c"]).nodes) == {"b": NodeHealthState(clean_samples=2)}
    assert dict(keep_nodes(state, []).nodes) == {}
