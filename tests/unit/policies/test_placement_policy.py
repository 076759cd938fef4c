"""The placement policy as tables: prefer the cluster pool, yield to training make-before-break,
overflow to external, never below demand (``on_shortfall: yield``: never below min_replicas),
and come back gradually."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from policies.placement import (
    ModelDemand,
    PlacementConfig,
    PlacementState,
    decide,
    external_cap_gpus,
    provider_room,
)
from policies.plan import MoveServeReplicas, RequestExternalCapacity, SetRouteWeights
from policies.providers import Provider, ProviderState
from policies.snapshot import Pool, ReplicaState
from tests.unit.builders import gang, job, node, replica, snapshot

CLUSTER = [node("c1", gpus_total=4), node("c2", gpus_total=4)]
EXTERNAL = [
    node("e1", gpus_total=2, pool=Pool.EXTERNAL),
    node("e2", gpus_total=2, pool=Pool.EXTERNAL),
]


def replicas(
    n_cluster: int, n_external: int, model: str = "m", state: ReplicaState = ReplicaState.RUNNING
):  # type: ignore[no-untyped-def]
    out = [
        replica(f"{model}-c{i}", "c1" if i < 4 else "c2", model=model, state=state)
        for i in range(n_cluster)
    ]
    out += [
        replica(
            f"{model}-e{i}", "e1" if i < 2 else "e2", model=model, pool=Pool.EXTERNAL, state=state
        )
        for i in range(n_external)
    ]
    return out


@dataclass
class Case:
    id: str
    want: int
    min_replicas: int = 1
    cur: tuple[int, int] = (0, 0)
    claim: int = 0
    queued: bool = False
    running_gang: dict[str, int] = field(default_factory=dict)
    external_max: int = 8
    expect: tuple[int, int] = (0, 0)
    moved_out: int = 0
    yields: bool = False
    """The model is ``on_shortfall: yield`` (best effort); else its demand is a guarantee."""


CASES = [
    Case("fresh-model-prefers-cluster", want=3, expect=(3, 0)),
    Case("grows-into-cluster-when-room", want=5, cur=(3, 0), expect=(5, 0)),
    Case("overflow-goes-external", want=10, cur=(8, 0), expect=(8, 2)),
    Case(
        "growth-goes-external-while-training-queued", want=4, cur=(2, 0), queued=True, expect=(2, 2)
    ),
    Case(
        "training-claim-moves-replicas-out", want=6, cur=(6, 0), claim=4, expect=(2, 4), moved_out=4
    ),
    # Demand (ongoing requests or p99) asks for 2 more while training claims 4 GPUs: the 2
    # free cluster GPUs are the gang's, so the new replicas land on the external pool.
    Case(
        "scale-up-during-a-claim-lands-on-external",
        want=8,
        cur=(6, 0),
        claim=4,
        queued=True,
        expect=(2, 6),
        moved_out=4,
    ),
    Case(
        "claim-of-whole-pool-moves-everything",
        want=4,
        cur=(4, 0),
        claim=8,
        expect=(0, 4),
        moved_out=4,
    ),
    # The external pool holds 2 of the 6 a claim of the whole pool would move: the other 4
    # stay on the cluster pool (the claim is not freed; admission's gang waits for them).
    Case(
        "external-full-keeps-demand-on-cluster",
        want=6,
        cur=(6, 0),
        claim=8,
        external_max=2,
        expect=(4, 2),
        moved_out=2,
    ),
    Case(
        "external-full-yielding-model-keeps-min-on-cluster",
        want=6,
        min_replicas=4,
        cur=(6, 0),
        claim=8,
        external_max=2,
        expect=(2, 2),
        moved_out=2,
        yields=True,
    ),
    Case(
        "external-full-yielding-model-shrinks-to-what-fits-above-min",
        want=6,
        min_replicas=1,
        cur=(6, 0),
        claim=8,
        external_max=2,
        expect=(0, 2),
        moved_out=2,
        yields=True,
    ),
    # Training waits, demand asks for 6 more and the external pool has room for 2: the other
    # 4 start on the cluster pool's free GPUs (a yielding model would wait for room).
    Case(
        "growth-beyond-external-room-goes-to-cluster-while-training-queued",
        want=8,
        cur=(2, 0),
        queued=True,
        external_max=2,
        expect=(6, 2),
    ),
    Case(
        "growth-of-a-yielding-model-waits-for-external-room-while-training-queued",
        want=8,
        cur=(2, 0),
        queued=True,
        external_max=2,
        expect=(2, 2),
        yields=True,
    ),
    Case(
        "growth-nobody-can-host-is-not-started",
        want=12,
        cur=(0, 0),
        running_gang={"c1": 4},
        external_max=2,
        expect=(4, 2),
    ),
    Case("running-gang-holds-gpus", want=6, cur=(0, 0), running_gang={"c1": 4}, expect=(4, 2)),
    Case("shrink-keeps-cluster-first", want=2, cur=(3, 2), expect=(2, 0)),
    Case("external-kept-until-migration-timer", want=4, cur=(2, 2), expect=(2, 2)),
    Case("never-below-min", want=0, min_replicas=2, cur=(2, 0), expect=(2, 0)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_targets(case: Case) -> None:
    snap = snapshot(
        CLUSTER + EXTERNAL,
        replicas=replicas(*case.cur),
        queued=[job("q", 8)] if case.queued else [],
        running=[gang("g", case.running_gang)] if case.running_gang else [],
    )
    (targets, actions), _ = decide(
        snap,
        (ModelDemand("m", case.want, case.min_replicas, 1, yields_on_shortfall=case.yields),),
        PlacementConfig(external_max_gpus=case.external_max),
        PlacementState(),
        training_claim_gpus=case.claim,
    )
    assert (targets[0].cluster, targets[0].external) == case.expect
    moves = [a for a in actions if isinstance(a, MoveServeReplicas) and a.to_pool is Pool.EXTERNAL]
    assert sum(m.num_replicas for m in moves) == case.moved_out
    assert targets[0].cluster + targets[0].external >= case.min_replicas
    for m in moves:
        assert m.reason.startswith("yield_to_training")


def test_external_full_is_explained() -> None:
    snap = snapshot(CLUSTER + EXTERNAL, replicas=replicas(6, 0))
    (targets, _), _ = decide(
        snap,
        (ModelDemand("m", 6, 4, 1),),
        PlacementConfig(external_max_gpus=2),
        PlacementState(),
        8,
    )
    assert targets[0].note.startswith("external_full")


def test_cluster_budget_is_shared_between_models_in_name_order() -> None:
    reps = [replica(f"a{i}", "c1", model="a") for i in range(4)]
    reps += [replica(f"b{i}", "c2", model="b") for i in range(4)]
    snap = snapshot(CLUSTER, replicas=reps)
    (targets, _), _ = decide(
        snap,
        (ModelDemand("b", 4, 1, 1), ModelDemand("a", 4, 1, 1)),
        PlacementConfig(external_max_gpus=8),
        PlacementState(),
        training_claim_gpus=4,
    )
    by_model = {t.model: (t.cluster, t.external) for t in targets}
    assert by_model == {"a": (4, 0), "b": (0, 4)}


@pytest.mark.parametrize("at_risk", [False, True], ids=["in-name-order", "slo-at-risk-first"])
def test_one_models_growth_never_pushes_anothers_replicas_out(at_risk: bool) -> None:
    """The cluster pool is full (a: 4, b: 4) and `a` wants 2 more (its p99 is over its SLO,
    or its ongoing requests ask): the 2 new replicas go to the external pool; `b`, later in
    keep order, keeps all of its cluster replicas and nothing moves (no training claims)."""
    reps = [replica(f"a{i}", "c1", model="a") for i in range(4)]
    reps += [replica(f"b{i}", "c2", model="b") for i in range(4)]
    snap = snapshot(CLUSTER + EXTERNAL, replicas=reps)
    (targets, actions), _ = decide(
        snap,
        (ModelDemand("a", 6, 1, 1, slo_at_risk=at_risk), ModelDemand("b", 4, 1, 1)),
        PlacementConfig(external_max_gpus=4),
        PlacementState(),
    )
    assert {t.model: (t.cluster, t.external) for t in targets} == {"a": (4, 2), "b": (4, 0)}
    assert not [a for a in actions if isinstance(a, MoveServeReplicas)]


def test_multi_gpu_replicas_count_gpus_not_replicas() -> None:
    snap = snapshot(CLUSTER + EXTERNAL, replicas=[replica("r", "c1", gpus=2)])
    # Serving holds 2 GPUs and must hand back 2: budget 0, so all 3 two-GPU replicas go
    # external, which is asked for 6 GPUs.
    (targets, actions), _ = decide(
        snap,
        (ModelDemand("m", 3, 1, 2),),
        PlacementConfig(external_max_gpus=8),
        PlacementState(),
        2,
    )
    assert (targets[0].cluster, targets[0].external) == (0, 3)
    request = [a for a in actions if isinstance(a, RequestExternalCapacity)]
    assert request and request[0].num_gpus == 6


def test_claim_counts_against_what_serving_holds_not_the_whole_pool() -> None:
    # 8 GPUs, one 1-GPU replica, a gang needs all 8: admission claims the replica's 1 GPU.
    snap = snapshot(CLUSTER + EXTERNAL, replicas=[replica("r", "c1")], queued=[job("q", 2, 4)])
    (targets, actions), _ = decide(
        snap,
        (ModelDemand("m", 1, 1, 1),),
        PlacementConfig(external_max_gpus=4),
        PlacementState(),
        1,
    )
    assert (targets[0].cluster, targets[0].external) == (0, 1)
    moves = [a for a in actions if isinstance(a, MoveServeReplicas)]
    assert [(m.from_pool, m.to_pool, m.num_replicas) for m in moves] == [
        (Pool.CLUSTER, Pool.EXTERNAL, 1)
    ]


def run(ticks: list[tuple[float, bool]], cfg: PlacementConfig) -> list[tuple[float, int]]:
    """Replay a migration-back timeline: 4 replicas on external, cluster empty and idle.

    Each tick: (now_s, training queued?). The actuator is assumed to finish each move before
    the next tick. Returns (now_s, replicas moved back) for each tick that moved any.
    """
    on_cluster, on_external = 0, 4
    state = PlacementState(requested_external_gpus=4)
    moved_at = []
    for now_s, queued in ticks:
        snap = snapshot(
            CLUSTER + EXTERNAL,
            replicas=replicas(on_cluster, on_external),
            queued=[job("q", 8)] if queued else [],
            now_s=now_s,
        )
        (targets, actions), state = decide(snap, (ModelDemand("m", 4, 1, 1),), cfg, state)
        back = sum(
            a.num_replicas
            for a in actions
            if isinstance(a, MoveServeReplicas) and a.to_pool is Pool.CLUSTER
        )
        if back:
            moved_at.append((now_s, back))
        on_cluster, on_external = targets[0].cluster, targets[0].external
    return moved_at


def test_migration_back_waits_for_idle_then_steps() -> None:
    cfg = PlacementConfig(
        external_max_gpus=8, migrate_back_idle_s=60, migrate_back_step=1, migrate_back_interval_s=30
    )
    ticks = [(float(t), False) for t in range(0, 200, 10)]
    assert run(ticks, cfg) == [(60.0, 1), (90.0, 1), (120.0, 1), (150.0, 1)]


def test_migration_back_step_size() -> None:
    cfg = PlacementConfig(
        external_max_gpus=8, migrate_back_idle_s=0, migrate_back_step=2, migrate_back_interval_s=30
    )
    ticks = [(float(t), False) for t in range(0, 100, 10)]
    assert run(ticks, cfg) == [(0.0, 2), (30.0, 2)]


def test_queued_training_resets_the_idle_timer() -> None:
    cfg = PlacementConfig(
        external_max_gpus=8, migrate_back_idle_s=60, migrate_back_step=1, migrate_back_interval_s=30
    )
    # A job is queued at t=50 (and admitted by t=60): the 60 s wait starts again at t=60.
    ticks = [(float(t), t == 50) for t in range(0, 200, 10)]
    assert run(ticks, cfg)[0] == (120.0, 1)


def test_external_capacity_request_follows_targets_and_is_emitted_on_change() -> None:
    snap = snapshot(CLUSTER + EXTERNAL, replicas=replicas(6, 0))
    demand = (ModelDemand("m", 6, 1, 1),)
    cfg = PlacementConfig(external_max_gpus=8)
    (_, actions), state = decide(snap, demand, cfg, PlacementState(), training_claim_gpus=4)
    requests = [a for a in actions if isinstance(a, RequestExternalCapacity)]
    assert [r.num_gpus for r in requests] == [4]
    (_, actions), _ = decide(snap, demand, cfg, state, training_claim_gpus=4)
    assert not [a for a in actions if isinstance(a, RequestExternalCapacity)]


@pytest.mark.parametrize(
    ("running", "starting", "weights"),
    [
        pytest.param((4, 0), (0, 0), ((Pool.CLUSTER, 1.0), (Pool.EXTERNAL, 0.0)), id="all-cluster"),
        pytest.param((1, 3), (0, 0), ((Pool.CLUSTER, 0.25), (Pool.EXTERNAL, 0.75)), id="split"),
        pytest.param(
            (2, 0),
            (0, 2),
            ((Pool.CLUSTER, 1.0), (Pool.EXTERNAL, 0.0)),
            id="starting-gets-no-traffic",
        ),
    ],
)
def test_route_weights_follow_readiness(
    running: tuple[int, int], starting: tuple[int, int], weights: tuple[tuple[Pool, float], ...]
) -> None:
    reps = replicas(*running) + [
        replica(f"s{i}", "e1", pool=Pool.EXTERNAL, state=ReplicaState.STARTING)
        for i in range(starting[1])
    ]
    snap = snapshot(CLUSTER + EXTERNAL, replicas=reps)
    (_, actions), state = decide(
        snap,
        (ModelDemand("m", sum(running) + sum(starting), 1, 1),),
        PlacementConfig(8),
        PlacementState(),
    )
    set_weights = [a for a in actions if isinstance(a, SetRouteWeights)]
    assert len(set_weights) == 1 and set_weights[0].weights == weights
    (_, again), _ = decide(
        snap, (ModelDemand("m", sum(running) + sum(starting), 1, 1),), PlacementConfig(8), state
    )
    assert not [a for a in again if isinstance(a, SetRouteWeights)]  # unchanged: not re-sent


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"external_max_gpus": -1}, id="negative-external"),
        pytest.param({"external_max_gpus": 4, "migrate_back_step": 0}, id="zero-step"),
    ],
)
def test_bad_config_is_rejected(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        PlacementConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("healthy_c2", "expect", "reason"),
    [
        # c1 (4 GPUs, holds the 4 replicas) is taken out; c2 is busy with training: out they go.
        (True, (0, 4), "leave_unhealthy_node"),
        # Both out: the same, the budget is 0.
        (False, (0, 4), "leave_unhealthy_node"),
    ],
)
def test_replicas_on_a_node_health_took_out_move_and_say_why(
    healthy_c2: bool, expect: tuple[int, int], reason: str
) -> None:
    nodes = [
        node("c1", gpus_total=4, healthy=False),
        node("c2", gpus_total=4, healthy=healthy_c2),
        *EXTERNAL,
    ]
    snap = snapshot(nodes, replicas=replicas(4, 0), running=[gang("g", {"c2": 4})])
    (targets, actions), _ = decide(
        snap, (ModelDemand("m", 4, 1, 1),), PlacementConfig(external_max_gpus=8), PlacementState()
    )
    assert (targets[0].cluster, targets[0].external) == expect
    (move,) = [a for a in actions if isinstance(a, MoveServeReplicas)]
    assert move.reason.startswith(reason) and "4 run on nodes health took out" in move.reason
    assert move.node_ids == ("c1",) * 4  # the node it leaves, one entry per replica


def test_replicas_on_a_bad_node_stay_in_the_cluster_when_healthy_nodes_have_room() -> None:
    """Serve's own drain migration moves them between cluster nodes: no cross-pool move."""
    nodes = [node("c1", gpus_total=4, healthy=False), node("c2", gpus_total=4), *EXTERNAL]
    snap = snapshot(nodes, replicas=replicas(2, 0))
    (targets, actions), _ = decide(
        snap, (ModelDemand("m", 2, 1, 1),), PlacementConfig(external_max_gpus=8), PlacementState()
    )
    assert (targets[0].cluster, targets[0].external) == (2, 0)
    assert not [a for a in actions if isinstance(a, MoveServeReplicas)]


def test_a_training_claim_keeps_the_yield_reason_even_with_a_bad_node() -> None:
    nodes = [node("c1", gpus_total=4, healthy=False), node("c2", gpus_total=4), *EXTERNAL]
    snap = snapshot(nodes, replicas=[*replicas(4, 0), replica("x", "c2")])
    (_, actions), _ = decide(
        snap,
        (ModelDemand("m", 5, 1, 1),),
        PlacementConfig(external_max_gpus=8),
        PlacementState(),
        training_claim_gpus=1,
    )
    moves = [a for a in actions if isinstance(a, MoveServeReplicas)]
    assert moves and all(m.reason.startswith("yield_to_training") for m in moves)


def test_an_external_pool_that_does_not_deliver_is_out_and_growth_goes_to_the_cluster() -> None:
    """Rule 6: 4 external GPUs asked for and none up. Within the deadline the pool is only
    owed; past it the pool is out for the back-off and counts only its live GPUs (none), so
    the 4 replicas demand wants beyond the cluster's 2 go to the cluster pool's free GPUs
    while training waits; once the back-off is over it is asked again."""
    cfg = PlacementConfig(external_max_gpus=8, external_deadline_s=900, external_backoff_s=1800)
    demand = (ModelDemand("m", 6, 1, 1),)

    def tick(now: float, state: PlacementState):  # type: ignore[no-untyped-def]
        snap = snapshot(CLUSTER, replicas=replicas(2, 0), queued=[job("q", 8)], now_s=now)
        return decide(snap, demand, cfg, state)

    asked = PlacementState(
        requested_external_gpus=4, providers={"external": ProviderState(requested_gpus=4)}
    )
    (targets, _), owed = tick(100.0, asked)
    assert (targets[0].cluster, targets[0].external) == (2, 4)
    assert owed.providers["external"] == ProviderState(4, owed_since_s=100.0)
    (targets, actions), out = tick(1000.0, owed)
    assert out.providers["external"] == ProviderState(0, out_until_s=2800.0)
    assert (targets[0].cluster, targets[0].external) == (6, 0)
    assert [a.num_gpus for a in actions if isinstance(a, RequestExternalCapacity)] == [0]
    (targets, _), again = tick(2800.0, out)
    assert again.providers["external"] == ProviderState(4, owed_since_s=2800.0)
    assert (targets[0].cluster, targets[0].external) == (2, 4)


def test_a_replica_waiting_for_a_node_an_out_provider_will_not_deliver_is_placed_again() -> None:
    """The cluster pool (2 x 4 GPUs) is full: 3 replicas on c1, a gang on c2 and c1's last
    GPU. The 4th replica waits on the external pool (STARTING, no node) and its provider is
    out: it no longer keeps an external place. With no cluster room it is growth nobody can
    host (the loop's unplaced GPUs: admission takes them back from training); before the
    provider was out, it kept its place."""
    cfg = PlacementConfig(external_max_gpus=8)
    demand = (ModelDemand("m", 4, 1, 1),)
    pending = replica("m-e0", "", model="m", pool=Pool.EXTERNAL, state=ReplicaState.STARTING)
    snap = snapshot(
        CLUSTER,
        replicas=[*replicas(3, 0), pending],
        running=[gang("g", {"c2": 4, "c1": 1})],
        now_s=1000.0,
    )
    owed = PlacementState(
        requested_external_gpus=1,
        providers={"external": ProviderState(1, owed_since_s=900.0)},
    )
    (targets, _), _ = decide(snap, demand, cfg, owed)
    assert (targets[0].cluster, targets[0].external) == (3, 1)  # within its deadline
    out = PlacementState(providers={"external": ProviderState(0, out_until_s=2000.0)})
    (targets, _), _ = decide(snap, demand, cfg, out)
    assert (targets[0].cluster, targets[0].external) == (3, 0)
    assert "external" in targets[0].note and "runs 3 (wanted 4" in targets[0].note


TWO_PROVIDERS = PlacementConfig(
    external_max_gpus=8,
    providers=(
        Provider("dear", 4, 3.5, deadline_s=900, backoff_s=1800),
        Provider("cheap", 4, 2.0, deadline_s=900, backoff_s=1800),
    ),
)


def test_external_gpus_are_rented_cheapest_first_and_a_provider_that_does_not_deliver_hands_over() -> (
    None
):
    """Rule 6 over two providers: 6 external GPUs wanted go 4 to ``cheap`` (its most) and 2
    to ``dear``. ``cheap`` delivers nothing for the deadline: it is out, and ``dear`` is asked
    for all it has (4); the 2 no provider can host stay on the cluster pool."""
    demand = (ModelDemand("m", 8, 1, 1),)

    def tick(now: float, state: PlacementState, live: dict[str, int]):  # type: ignore[no-untyped-def]
        ext = [
            node(f"x-{name}{i}", gpus_total=1, pool=Pool.EXTERNAL, labels={"provider": name})
            for name, n in live.items()
            for i in range(n)
        ]
        snap = snapshot([*CLUSTER, *ext], replicas=replicas(2, 0), queued=[job("q", 8)], now_s=now)
        return decide(snap, demand, TWO_PROVIDERS, state)

    (targets, actions), first = tick(0.0, PlacementState(), {})
    asks = [a for a in actions if isinstance(a, RequestExternalCapacity)]
    assert [a.by_provider for a in asks] == [(("cheap", 4), ("dear", 2))]
    assert (targets[0].cluster, targets[0].external) == (2, 6)
    assert first.providers["cheap"].owed_since_s == 0.0
    (_, actions), later = tick(600.0, first, {"dear": 2})
    assert (
        later.providers["cheap"].owed_since_s == 0.0
        and later.providers["dear"].owed_since_s is None
    )
    assert not [a for a in actions if isinstance(a, RequestExternalCapacity)]
    (targets, actions), out = tick(900.0, later, {"dear": 2})
    assert out.providers["cheap"].out_until_s == 2700.0
    asks = [a for a in actions if isinstance(a, RequestExternalCapacity)]
    assert [(a.num_gpus, a.by_provider) for a in asks] == [(4, (("cheap", 0), ("dear", 4)))]
    assert "out: cheap" in asks[0].reason
    assert (targets[0].cluster, targets[0].external) == (4, 4)


def test_a_provider_out_keeps_what_it_delivered() -> None:
    """An out provider's room is its live GPUs: what it delivered keeps serving."""
    state = PlacementState(
        providers={"cheap": ProviderState(4, out_until_s=5000.0), "dear": ProviderState(0)}
    )
    ext = [
        node(f"x-c{i}", gpus_total=1, pool=Pool.EXTERNAL, labels={"provider": "cheap"})
        for i in range(3)
    ]
    snap = snapshot([*CLUSTER, *ext], replicas=replicas(2, 0), queued=[job("q", 8)], now_s=100.0)
    assert provider_room(snap, TWO_PROVIDERS, state) == {"dear": 4, "cheap": 3}
    assert external_cap_gpus(snap, TWO_PROVIDERS, state) == 7


@pytest.mark.parametrize(
    ("providers", "error"),
    [
        ((Provider("a", 4, 1.0), Provider("a", 4, 2.0)), "unique"),
        ((Provider("a", 4, 1.0),), "sum of the providers"),
    ],
)
def test_placement_config_refuses_inconsistent_providers(
    providers: tuple[Provider, ...], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        PlacementConfig(external_max_gpus=8, providers=providers)


@pytest.mark.parametrize(
    "gangs, pending, expect_back",
    [
        # 4 GPUs free, 2 on each node: a 4-GPU replica fits on neither, so none comes back.
        ({"c1": 2, "c2": 2}, 0, 0),
        # 4 free on c2: one comes back there.
        ({"c1": 4}, 0, 1),
        # c2's 4 free GPUs are the pending 4-GPU replica's (Serve has not placed it yet).
        ({"c1": 4}, 1, 0),
    ],
    ids=["scattered-free-gpus", "one-node-has-room", "pending-replica-takes-the-room"],
)
def test_migration_back_only_where_a_node_holds_the_replica(
    gangs: dict[str, int], pending: int, expect_back: int
) -> None:
    """Rule 5 moves a replica back only where one node has all its GPUs free (Serve places a
    replica's GPUs on one node): room in total is not enough."""
    external = [replica(f"m-e{i}", "e1", gpus=4, pool=Pool.EXTERNAL) for i in range(2)]
    waiting = [replica(f"m-p{i}", "", gpus=4, state=ReplicaState.STARTING) for i in range(pending)]
    snap = snapshot(
        [node("c1", gpus_total=4), node("c2", gpus_total=4), node("e1", pool=Pool.EXTERNAL)],
        running=[gang(f"g-{n}", {n: k}) for n, k in gangs.items()],
        replicas=external + waiting,
        now_s=1000.0,
    )
    cfg = PlacementConfig(
        external_max_gpus=8, migrate_back_idle_s=0, migrate_back_step=2, migrate_back_interval_s=0
    )
    demand = (ModelDemand("m", 2 + pending, 1, 4),)
    (_, actions), _ = decide(snap, demand, cfg, PlacementState(room_since_s=0.0))
    back = sum(
        a.num_replicas
        for a in actions
        if isinstance(a, MoveServeReplicas) and a.to_pool is Pool.CLUSTER
    )
    assert back == expect_back
