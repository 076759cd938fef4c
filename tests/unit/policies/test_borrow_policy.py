"""Tables for serving as the spare pool (`policies.admission.borrow`): pure, no Ray.

A gang that lost a node either borrows a node from serving now or waits for the cluster
pool's replacement, whichever costs fewer GPU-seconds; through `decide`, the borrowing shows
as the claim's move (``serving-lends-a-node``), the waiting as a `WaitJob` and a reservation
at the replacement's due time.
"""

from __future__ import annotations

import math

import pytest

from policies.admission import AdmissionConfig, AdmissionState, BorrowConfig, Why, decide
from policies.admission.borrow import replacement_eta_left_s, weigh_borrow
from policies.plan import AdmitJob, MoveServeReplicas, WaitJob
from policies.snapshot import ClusterSnapshot
from tests.unit.builders import gang, job, node, replica, snapshot

COSTS = BorrowConfig(replacement_eta_s=600.0, replica_move_s=60.0)


@pytest.mark.parametrize(
    ("lost_s", "now_s", "seen", "expected", "left"),
    [
        (0.0, 30.0, 2, 3, 570.0),  # due in 570 s
        (0.0, 599.0, 2, 3, 1.0),
        (0.0, 600.0, 2, 3, 600.0),  # overdue: expected as long again
        (0.0, 5000.0, 2, 3, 600.0),
        (0.0, 30.0, 3, 3, None),  # the pool has every node: health took it out, none comes
        (0.0, 30.0, 4, 3, None),
    ],
)
def test_when_the_replacement_is_due(
    lost_s: float, now_s: float, seen: int, expected: int, left: float | None
) -> None:
    assert replacement_eta_left_s(lost_s, now_s, seen, expected, COSTS) == left


@pytest.mark.parametrize(
    ("gang_gpus", "moved", "eta_left", "borrow", "wait_gpu_s", "borrow_gpu_s"),
    [
        # The module doc's worked example (weight 2): 2 x 4 x 60 + 2 x (570 + 120) < 2 x 4 x 570.
        (4, 2, 570.0, True, 4560.0, 1860.0),
        (4, 2, 100.0, False, 800.0, 920.0),  # due soon: waits
        # Break-even for 4 GPUs lending 2: 8e = 480 + 2(e + 120) -> e = 120.
        (4, 2, 120.0, False, 960.0, 960.0),  # a tie waits (no move for nothing)
        (4, 2, 121.0, True, 968.0, 962.0),
        # A one-node gang lending as many GPUs as it idles: 4e = 240 + 2(e + 120) -> e = 240.
        (2, 2, 240.0, False, 960.0, 960.0),
        (2, 2, 600.0, True, 2400.0, 1680.0),
        (16, 2, 120.0, True, 3840.0, 2400.0),  # a big gang for a small replica: borrow soon
        (4, 2, None, True, math.inf, 720.0),  # no replacement coming: always
        (4, 0, None, True, math.inf, 480.0),
    ],
)
def test_borrow_or_wait(
    gang_gpus: int,
    moved: int,
    eta_left: float | None,
    borrow: bool,
    wait_gpu_s: float,
    borrow_gpu_s: float,
) -> None:
    got = weigh_borrow(gang_gpus, moved, eta_left, COSTS)
    assert (got.borrow, got.wait_gpu_s, got.borrow_gpu_s) == (borrow, wait_gpu_s, borrow_gpu_s)
    assert ("waits" in got.reason) is not borrow


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_costs_name_the_field(bad: float) -> None:
    with pytest.raises(ValueError, match="replica_move_s"):
        BorrowConfig(replica_move_s=bad)


def _lost_gang_cluster(
    now_s: float, *, seen: int = 2, lost_s: float | None = 0.0
) -> ClusterSnapshot:
    """Cluster nodes of 2 GPUs: ``a`` (2 free), ``c`` (one 2-GPU replica of ``m``) and, with
    ``seen=3``, ``b`` listed but unhealthy; ``g`` (2 x 2 GPUs) lost its node at `lost_s`."""
    nodes = [node("a", gpus_total=2), node("c", gpus_total=2)]
    if seen == 3:
        nodes.append(node("b", gpus_total=2, healthy=False))
    return snapshot(
        nodes,
        replicas=[replica("r1", "c", gpus=2)],
        queued=[
            job("g", 2, 2, lost_s=lost_s),
            job("long", 1, 2),
            job("short", 1, 2, max_runtime_s=60),
        ],
        now_s=now_s,
    )


def _decide(snap: ClusterSnapshot, cluster_nodes: int | None = 3) -> tuple[object, ...]:
    config = AdmissionConfig(cluster_nodes=cluster_nodes, borrow=COSTS)
    plan, state = decide(snap, config, AdmissionState())
    return (*plan, state)


@pytest.mark.parametrize(
    ("now_s", "seen", "cluster_nodes", "lost_s", "outcome"),
    [
        (30.0, 2, 3, 0.0, "lends"),  # replacement due in 570 s: borrowing pays
        (500.0, 2, 3, 0.0, "waits"),  # due in 100 s: waits for it
        (700.0, 2, 3, 0.0, "lends"),  # overdue: expected another 600 s
        (500.0, 3, 3, 0.0, "lends"),  # health took ``b`` out: no replacement is coming
        (500.0, 2, None, 0.0, "lends"),  # pool size unknown: never waits on one
        (500.0, 2, 3, None, "yields"),  # not a lost gang: today's claim
    ],
)
def test_a_lost_gang_borrows_serving_or_waits_for_the_replacement(
    now_s: float, seen: int, cluster_nodes: int | None, lost_s: float | None, outcome: str
) -> None:
    *plan, state = _decide(_lost_gang_cluster(now_s, seen=seen, lost_s=lost_s), cluster_nodes)
    moves = [a for a in plan if isinstance(a, MoveServeReplicas)]
    waits = [a for a in plan if isinstance(a, WaitJob) and a.job_id == "g"]
    admitted = {a.job_id for a in plan if isinstance(a, AdmitJob)}
    if outcome == "waits":
        assert moves == []
        assert [w.code for w in waits] == [Why.REPLACEMENT_NODE.value]
        assert "waits 100s for the replacement node: 800 GPU-s" in waits[0].reason
        assert state.reservation is not None
        assert (state.reservation.job_id, state.reservation.start_by_s) == ("g", 600.0)
        # The free node is the gang's once the replacement comes: only work that ends by
        # then backfills onto it.
        assert admitted == {"short"}
        return
    assert waits == []
    assert [(m.node_ids, m.for_job_id) for m in moves] == [(("c",), "g")]
    code = Why.SERVING_LENDS if outcome == "lends" else Why.SERVE_YIELDS
    assert moves[0].reason.startswith(code.value), moves[0].reason
    assert admitted == set()  # the free node is protected for the gang


def test_a_waiting_lost_gang_is_admitted_when_the_replacement_joins() -> None:
    snap = snapshot(
        [node("a", gpus_total=2), node("b2", gpus_total=2), node("c", gpus_total=2)],
        replicas=[replica("r1", "c", gpus=2)],
        queued=[job("g", 2, 2, lost_s=0.0)],
        now_s=580.0,
    )
    *plan, _ = _decide(snap)
    assert [a for a in plan if isinstance(a, MoveServeReplicas)] == []
    admits = [a for a in plan if isinstance(a, AdmitJob)]
    assert [(a.job_id, {p.node_id for p in a.placement}) for a in admits] == [("g", {"a", "b2"})]


def test_a_lost_gang_that_fits_on_free_nodes_borrows_nothing() -> None:
    snap = snapshot(
        [node("a", gpus_total=2), node("d", gpus_total=2), node("c", gpus_total=2)],
        running=[gang("other", {"d": 0})],
        replicas=[replica("r1", "c", gpus=2)],
        queued=[job("g", 2, 2, lost_s=0.0)],
        now_s=30.0,
    )
    *plan, _ = _decide(snap, cluster_nodes=4)
    assert [a for a in plan if isinstance(a, MoveServeReplicas)] == []
    assert [a.job_id for a in plan if isinstance(a, AdmitJob)] == ["g"]
