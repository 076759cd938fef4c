"""Pins as tables: a model an operator pinned to a pool keeps its replicas there.

Placement never moves a pinned model's replicas out of its pool (no yield, no growth
elsewhere, no migration back out of `external`); admission's claim never takes the GPUs of
replicas pinned to `cluster`, and a gang only they keep out gets a `WaitJob` naming them.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from policies.admission import AdmissionConfig, AdmissionState
from policies.admission import decide as admit
from policies.placement import ModelDemand, PlacementConfig, PlacementState
from policies.placement import decide as place
from policies.plan import AdmitJob, MoveServeReplicas, WaitJob
from policies.snapshot import Pool
from tests.unit.builders import job, node, replica, snapshot

C1 = node("c1", gpus_total=4)
E1 = node("e1", gpus_total=4, pool=Pool.EXTERNAL)


def on(model: str, pool: Pool, n: int) -> list:  # type: ignore[type-arg]
    where = "c1" if pool is Pool.CLUSTER else "e1"
    return [replica(f"{model}-{pool.value}{i}", where, model=model, pool=pool) for i in range(n)]


@dataclass
class PlaceCase:
    id: str
    pin: Pool | None
    cur: tuple[int, int]
    want: int
    claim: int = 0
    queued: bool = False
    idle_s: float = 1000.0
    expect: tuple[int, int] = (0, 0)
    moves: tuple[tuple[Pool, Pool, int], ...] = ()


PLACE = [
    PlaceCase("unpinned-yields-to-a-claim", None, (4, 0), 4, claim=4, expect=(0, 4),
              moves=((Pool.CLUSTER, Pool.EXTERNAL, 4),)),
    PlaceCase("pinned-cluster-keeps-its-replicas-under-a-claim", Pool.CLUSTER, (4, 0), 4,
              claim=4, expect=(4, 0)),
    PlaceCase("pinned-cluster-growth-stays-on-cluster", Pool.CLUSTER, (4, 0), 6, expect=(4, 0)),
    PlaceCase("unpinned-growth-overflows-external", None, (4, 0), 6, expect=(4, 2)),
    PlaceCase("unpinned-external-comes-back", None, (0, 2), 2, expect=(1, 1),
              moves=((Pool.EXTERNAL, Pool.CLUSTER, 1),)),
    PlaceCase("pinned-external-never-comes-back", Pool.EXTERNAL, (0, 2), 2, expect=(0, 2)),
    PlaceCase("pinned-external-grows-external", Pool.EXTERNAL, (0, 1), 3, expect=(0, 3)),
]  # fmt: skip


@pytest.mark.parametrize("case", PLACE, ids=[c.id for c in PLACE])
def test_placement_respects_pins(case: PlaceCase) -> None:
    snap = snapshot(
        [C1, E1],
        replicas=on("m", Pool.CLUSTER, case.cur[0]) + on("m", Pool.EXTERNAL, case.cur[1]),
        queued=[job("q", 4)] if case.queued else [],
        pinned={"m": case.pin} if case.pin else {},
        now_s=2000.0,
    )
    state = PlacementState(room_since_s=2000.0 - case.idle_s)
    (targets, actions), _ = place(
        snap,
        (ModelDemand("m", case.want, 1, 1),),
        PlacementConfig(external_max_gpus=4, migrate_back_idle_s=60.0),
        state,
        training_claim_gpus=case.claim,
    )
    assert (targets[0].cluster, targets[0].external) == case.expect
    moves = tuple(
        (a.from_pool, a.to_pool, a.num_replicas)
        for a in actions
        if isinstance(a, MoveServeReplicas)
    )
    assert moves == case.moves


def test_a_cluster_pin_that_blocks_growth_says_so() -> None:
    snap = snapshot([C1, E1], replicas=on("m", Pool.CLUSTER, 4), pinned={"m": Pool.CLUSTER})
    (targets, _), _ = place(
        snap, (ModelDemand("m", 6, 1, 1),), PlacementConfig(external_max_gpus=4), PlacementState()
    )
    assert targets[0].note.startswith("pinned: m is pinned to the cluster pool")


def test_a_pinned_model_takes_the_cluster_budget_before_others() -> None:
    reps = on("a", Pool.CLUSTER, 2) + on("b", Pool.CLUSTER, 2)
    snap = snapshot([C1, E1], replicas=reps, pinned={"b": Pool.CLUSTER})
    (targets, _), _ = place(
        snap,
        (ModelDemand("a", 2, 1, 1), ModelDemand("b", 2, 1, 1)),
        PlacementConfig(external_max_gpus=4),
        PlacementState(),
        training_claim_gpus=2,
    )
    by_model = {t.model: (t.cluster, t.external) for t in targets}
    assert by_model == {"a": (0, 2), "b": (2, 0)}


@dataclass
class AdmitCase:
    id: str
    pinned: tuple[str, ...]
    need: int
    admitted_or_claimed: bool
    waits_naming: str | None


# c1 has 4 GPUs: model a holds 2, model b holds 2; nothing is free.
ADMIT = [
    AdmitCase("no-pin-claims-serving", (), 4, True, None),
    AdmitCase("one-pin-claim-takes-the-other-model", ("a",), 2, True, None),
    AdmitCase("one-pin-blocks-a-gang-that-needs-it", ("a",), 4, False, "a (2 GPU(s))"),
    AdmitCase("both-pinned-blocks-and-names-both", ("a", "b"), 2, False, "a (2 GPU(s)), b (2 GPU(s))"),
    AdmitCase("too-big-even-with-pins-names-no-pin", ("a",), 6, False, None),
]  # fmt: skip


@pytest.mark.parametrize("case", ADMIT, ids=[c.id for c in ADMIT])
def test_the_claim_respects_pins(case: AdmitCase) -> None:
    snap = snapshot(
        [C1],
        replicas=on("a", Pool.CLUSTER, 2) + on("b", Pool.CLUSTER, 2),
        queued=[job("g", case.need, priority="high")],
        pinned={m: Pool.CLUSTER for m in case.pinned},
    )
    plan, _ = admit(snap, AdmissionConfig(), AdmissionState())
    moves = [a for a in plan if isinstance(a, MoveServeReplicas)]
    assert not {m.model for m in moves} & set(case.pinned)
    acted = bool(moves) or any(isinstance(a, AdmitJob) for a in plan)
    assert acted is case.admitted_or_claimed
    waits = [a for a in plan if isinstance(a, WaitJob)]
    assert all(a.reason.startswith(f"{a.code}: ") for a in waits)  # the event log's key
    if case.waits_naming is None:
        assert waits == []
    else:
        (wait,) = waits
        assert wait.job_id == "g"
        assert wait.reason.startswith("pinned-serving:")
        assert case.waits_naming in wait.reason


def test_an_external_pin_leaves_cluster_replicas_claimable() -> None:
    snap = snapshot(
        [C1],
        replicas=on("a", Pool.CLUSTER, 4),
        queued=[job("g", 4, priority="high")],
        pinned={"a": Pool.EXTERNAL},
    )
    plan, _ = admit(snap, AdmissionConfig(), AdmissionState())
    (move,) = [a for a in plan if isinstance(a, MoveServeReplicas)]
    assert (move.model, move.num_replicas) == ("a", 4)
