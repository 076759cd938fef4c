"""Serving-only nodes (issue 16, part 3) as tables: a node health found with fabric faults and
healthy GPUs keeps its replicas, takes new ones, and never gets a gang.

The verdict rules themselves (fabric-only is serving_only, a GPU fault is unhealthy) are rows
of `tests/unit/policies/test_health_policy.py`; here: what the snapshot, remediation, admission and
placement make of a serving-only node."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies import admission
from policies.admission import AdmissionConfig, AdmissionState
from policies.health import HealthReason, NodeVerdict, Verdict, remediate, with_verdicts
from policies.placement import ModelDemand, PlacementConfig, PlacementState
from policies.placement import decide as place
from policies.plan import AdmitJob, MoveServeReplicas, PreemptJob, WaitJob
from policies.snapshot import ClusterSnapshot, NodeView, Pool
from tests.unit.builders import gang, job, node, replica, snapshot

IB = NodeVerdict("so", Verdict.SERVING_ONLY, (HealthReason.IB_ERRORS,), ("mlx5_0/1 5 errors/s",))
EXTERNAL = [
    node("e1", gpus_total=2, pool=Pool.EXTERNAL),
    node("e2", gpus_total=2, pool=Pool.EXTERNAL),
]


def serving_only(n: NodeView) -> NodeView:
    return replace(n, serving_only=True)


# -- the snapshot and remediation -------------------------------------------------------------


@pytest.mark.parametrize(
    ("verdict", "healthy", "marked"),
    [
        pytest.param(IB, True, True, id="serving-only-stays-live-and-is-marked"),
        pytest.param(replace(IB, held=True), True, False, id="held-by-the-breaker-untouched"),
        pytest.param(
            NodeVerdict("so", Verdict.UNHEALTHY, (HealthReason.GPU_OVERHEATED,)),
            False,
            False,
            id="unhealthy-out-of-capacity",
        ),
    ],
)
def test_with_verdicts_marks_serving_only_nodes(
    verdict: NodeVerdict, healthy: bool, marked: bool
) -> None:
    snap = with_verdicts(snapshot([node("so"), node("ok")]), {"so": verdict})
    so = snap.node("so")
    assert so is not None and (so.healthy, so.serving_only) == (healthy, marked)
    gang_nodes = ["ok"] if marked or not healthy else ["so", "ok"]
    assert [n.node_id for n in snap.gang_nodes(Pool.CLUSTER)] == gang_nodes
    assert len(snap.live_nodes(Pool.CLUSTER)) == (2 if healthy else 1)


@pytest.mark.parametrize(
    ("snap", "expect"),
    [
        pytest.param(
            snapshot([node("so")], replicas=[replica("r1", "so")]),
            [],
            id="replicas-stay-nothing-cordoned-or-drained",
        ),
        pytest.param(
            snapshot([node("so"), node("ok")], running=[gang("j1", {"so": 2, "ok": 2})]),
            ["preempt j1"],
            id="its-gang-checkpoints-and-restarts-elsewhere",
        ),
        pytest.param(
            snapshot([node("so")], running=[replace(gang("j1", {"so": 2}), preempting=True)]),
            [],
            id="a-gang-being-preempted-is-not-asked-again",
        ),
    ],
)
def test_remediate_a_serving_only_node(snap: ClusterSnapshot, expect: list[str]) -> None:
    plan = remediate(snap, {"so": IB})
    got = [f"preempt {a.job_id}" for a in plan if isinstance(a, PreemptJob)]
    assert got == expect and len(plan) == len(expect), plan
    for a in plan:
        assert "node so serving_only: ib_errors" in a.reason


def test_a_gang_on_a_serving_only_and_an_unhealthy_node_is_asked_once() -> None:
    hot = NodeVerdict("hot", Verdict.UNHEALTHY, (HealthReason.GPU_OVERHEATED,))
    snap = snapshot([node("so"), node("hot")], running=[gang("j1", {"so": 2, "hot": 2})])
    plan = remediate(snap, {"so": IB, "hot": hot})
    assert [type(a).__name__ for a in plan] == ["PreemptJob", "CordonNode"]


# -- admission: no gang there, its replicas never claimed -------------------------------------


def admit(snap: ClusterSnapshot) -> tuple[dict[str, dict[str, int]], list[MoveServeReplicas]]:
    plan, _ = admission.decide(snap, AdmissionConfig(), AdmissionState())
    admitted = {
        a.job_id: {p.node_id: p.num_workers for p in a.placement}
        for a in plan
        if isinstance(a, AdmitJob)
    }
    return admitted, [a for a in plan if isinstance(a, MoveServeReplicas)]


@pytest.mark.parametrize(
    ("nodes", "replicas", "queued", "admitted", "claimed"),
    [
        pytest.param(
            [serving_only(node("so", gpus_total=8)), node("ok", gpus_total=4)],
            [],
            [job("j", 1, 4), job("k", 1, 4)],
            {"j": {"ok": 1}},
            (),
            id="only-the-gang-node-takes-a-gang",
        ),
        pytest.param(
            [serving_only(node("so", gpus_total=8))],
            [],
            [job("j", 1, 1)],
            {},
            (),
            id="a-pool-of-serving-only-nodes-admits-nothing",
        ),
        pytest.param(
            [serving_only(node("so", gpus_total=4)), node("ok", gpus_total=4)],
            [replica("r-so", "so", gpus=2), replica("r-ok", "ok", gpus=2)],
            [job("j", 1, 4)],
            {},
            ("ok",),
            id="claims-only-replicas-on-gang-nodes",
        ),
        pytest.param(
            [serving_only(node("so", gpus_total=4)), node("ok", gpus_total=4)],
            [replica("r-so", "so", gpus=4)],
            [job("j", 2, 4)],
            {},
            (),
            id="moving-serving-only-replicas-frees-nothing-for-gangs",
        ),
    ],
)
def test_admission_never_uses_a_serving_only_node(
    nodes: list[NodeView],
    replicas: list,  # type: ignore[type-arg]
    queued: list,  # type: ignore[type-arg]
    admitted: dict[str, dict[str, int]],
    claimed: tuple[str, ...],
) -> None:
    got, moves = admit(snapshot(nodes, replicas=replicas, queued=queued))
    assert got == admitted
    assert tuple(n for m in moves for n in m.node_ids) == claimed


@pytest.mark.parametrize(
    ("nodes", "running", "queued", "waits"),
    [
        pytest.param(
            [serving_only(node("so", gpus_total=4)), node("ok", gpus_total=4)],
            [],
            [job("j", 2, 4)],
            "serving-only-nodes: fits only with serving-only node(s) so",
            id="fits-only-with-the-serving-only-node-says-so",
        ),
        pytest.param(
            [serving_only(node("so", gpus_total=4)), node("ok", gpus_total=4)],
            [gang("g", {"ok": 4})],
            [job("j", 1, 4)],
            None,
            id="waits-for-a-gang-node-to-free-says-nothing-of-serving-only",
        ),
        pytest.param(
            [serving_only(node("so", gpus_total=4)), node("ok", gpus_total=4)],
            [],
            [job("j", 3, 4)],
            None,
            id="too-big-even-with-it-says-nothing-of-serving-only",
        ),
    ],
)
def test_a_gang_only_serving_only_nodes_keep_out_waits_naming_them(
    nodes: list[NodeView],
    running: list,  # type: ignore[type-arg]
    queued: list,  # type: ignore[type-arg]
    waits: str | None,
) -> None:
    plan, _ = admission.decide(
        snapshot(nodes, running=running, queued=queued), AdmissionConfig(), AdmissionState()
    )
    reasons = [a.reason for a in plan if isinstance(a, WaitJob)]
    assert all(a.reason.startswith(f"{a.code}: ") for a in plan if isinstance(a, WaitJob))
    if waits is None:
        assert not reasons
    else:
        (reason,) = reasons
        assert reason.startswith(waits), reason


# -- placement: serving-only GPUs are serving's -----------------------------------------------


def targets(snap: ClusterSnapshot, want: int, claim: int = 0) -> tuple[int, int]:
    (t, _), _ = place(
        snap,
        (ModelDemand("m", want, 1, 1),),
        PlacementConfig(external_max_gpus=4, migrate_back_idle_s=0, migrate_back_interval_s=0),
        PlacementState(),
        training_claim_gpus=claim,
    )
    return t[0].cluster, t[0].external


@pytest.mark.parametrize(
    ("snap", "want", "claim", "expect"),
    [
        pytest.param(
            snapshot(
                [serving_only(node("so", gpus_total=2)), node("ok", gpus_total=2), *EXTERNAL],
                replicas=[replica("a", "so"), replica("b", "so"), replica("c", "ok")],
            ),
            3,
            1,
            (2, 1),
            id="claim-takes-the-gang-node-replica-serving-only-ones-stay",
        ),
        pytest.param(
            snapshot(
                [serving_only(node("so", gpus_total=2)), node("ok", gpus_total=2), *EXTERNAL],
                replicas=[replica("a", "so"), replica("c", "ok")],
                running=[gang("g", {"ok": 1})],
                queued=[job("q", 1, 2)],
            ),
            3,
            0,
            (3, 0),
            id="gang-nodes-full-growth-lands-on-serving-only-while-training-waits",
        ),
        pytest.param(
            snapshot(
                [serving_only(node("so", gpus_total=2)), node("ok", gpus_total=4), *EXTERNAL],
                replicas=[replica("a", "so")],
                queued=[job("q", 1, 4)],
            ),
            2,
            0,
            (1, 1),
            id="a-free-gang-gpu-keeps-growth-external-while-training-waits",
        ),
        pytest.param(
            snapshot(
                [serving_only(node("so", gpus_total=2)), *EXTERNAL],
                replicas=[replica("x", "e1", pool=Pool.EXTERNAL)],
                queued=[job("q", 1, 2)],
            ),
            1,
            0,
            (1, 0),
            id="external-replica-comes-back-onto-serving-only-while-training-waits",
        ),
    ],
)
def test_placement_counts_serving_only_gpus_as_servings(
    snap: ClusterSnapshot, want: int, claim: int, expect: tuple[int, int]
) -> None:
    assert targets(snap, want, claim) == expect
