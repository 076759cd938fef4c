"""The simulator blames each serving shortfall on the write that stopped the replica: a move's
BREAK step (``moves``), a placement or demand scale-down (``policy``), a node failure
(``failures``), or no stop at all (``scaling``: the external pool lacks the capacity)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from controlplane.loop.act.operations import MoveOperation, MoveOutcome, MovePhase, advance
from controlplane.simulate.engine import EventKind, EventQueue
from controlplane.simulate.nodes import ProviderSpec
from controlplane.simulate.serving import CAUSES, SimServe
from controlplane.simulate.world import World
from policies.snapshot import Pool, ReplicaState

RPS = 10.0  # one replica serves 10 requests/s; demand 40 needs 4 replicas


def _serve(cluster: int = 4, external: int = 0) -> tuple[World, SimServe, EventQueue]:
    q = EventQueue()
    world = World(2, 8, (ProviderSpec("a", 8, 1, 2.5),), 300.0, 600.0, q)
    serve = SimServe(world, q, {"m": 1}, {"m": RPS}, {"m": 1.0}, 10.0, 5.0)
    serve.set_demand("m", 4 * RPS)
    serve.targets[("m", Pool.CLUSTER)] = cluster
    if external:
        serve.targets[("m", Pool.EXTERNAL)] = external
    serve.reconcile()
    while len(q):
        for ev in q.pop_instant():
            if ev.kind is EventKind.REPLICA_READY:
                serve.ready(ev.subject, ev.version)
    assert serve.running("m") == cluster and not serve.short("m")
    return world, serve, q


def _minutes(serve: SimServe) -> dict[str, float]:
    serve.advance(60.0)
    return serve.figures["m"].short_s


def _early_break(serve: SimServe) -> None:
    """A move cluster -> external whose route applied while the external replicas still start:
    its BREAK stops 2 cluster replicas demand needs."""
    serve.targets[("m", Pool.EXTERNAL)] = 2
    serve.reconcile()  # STARTING, not RUNNING
    op = MoveOperation(
        model="m", from_pool=Pool.CLUSTER, to_pool=Pool.EXTERNAL, num_replicas=2,
        node_ids=(), reason="yield_to_training", for_job_id="g", from_target=2, to_target=2,
        phase=MovePhase.SHIFT, started_s=0.0, phase_since_s=0.0, generation=0,
    )  # fmt: skip
    serve.writer = "moves"
    new, outcome = advance(op, serve, 0.0, 600.0)
    assert outcome is MoveOutcome.STEPPED and new.phase is MovePhase.BREAK


def _floor_scale_down(serve: SimServe) -> None:
    """A training claim with the external pool full: the cluster pool shrinks toward the
    model's floor (min_replicas 1) with a plain scale-down."""
    serve.writer = "policy"
    serve.scale_pool("m", Pool.CLUSTER, 1)
    serve.writer = "moves"


def _node_fails(serve: SimServe) -> None:
    node = serve.by_model["m"][0].node_id
    serve.node_lost(node)


def _demand_rises(serve: SimServe) -> None:
    """Nothing stops: demand doubles and no replica can start in time (no room)."""
    serve.set_demand("m", 8 * RPS)


@pytest.mark.parametrize(
    "act, cause",
    [
        (_early_break, "moves"),
        (_floor_scale_down, "policy"),
        (_node_fails, "failures"),
        (_demand_rises, "scaling"),
    ],
    ids=["move-stops-early", "floor-scale-down", "node-failure", "no-stop"],
)
def test_each_shortfall_goes_to_the_write_that_stopped_the_replica(
    act: Callable[[SimServe], None], cause: str
) -> None:
    _, serve, _ = _serve()
    act(serve)
    assert serve.short("m")
    short = _minutes(serve)
    assert short[cause] == 60.0
    assert sum(short.values()) == 60.0, {c: short[c] for c in CAUSES}


def test_a_scale_down_demand_does_not_need_is_no_shortfall() -> None:
    _, serve, _ = _serve(cluster=6)
    _floor_scale_down(serve)  # 6 -> 1 while 4 are needed: short, by policy
    assert _minutes(serve)["policy"] == 60.0
    serve.set_demand("m", RPS)  # demand falls to what 1 replica serves: no longer short
    assert serve.figures["m"].cause is None
    assert sum(_minutes(serve).values()) == 60.0


def test_a_move_stop_overrides_an_earlier_cause_and_a_later_policy_stop_does_not() -> None:
    _, serve, _ = _serve(cluster=6)
    serve.writer = "policy"
    serve.set_pool_target("m", Pool.CLUSTER, 3)  # 3 < 4 needed: short, by policy
    assert serve.figures["m"].cause == "policy"
    serve.writer = "moves"
    serve.set_pool_target("m", Pool.CLUSTER, 2)  # a move stops one more: now the move's
    assert serve.figures["m"].cause == "moves"
    serve.writer = "policy"
    serve.set_pool_target("m", Pool.CLUSTER, 1)  # still the move's until capacity is back
    assert serve.figures["m"].cause == "moves"
    assert [r.state for r in serve.by_model["m"]].count(ReplicaState.STOPPING) == 5
    assert _minutes(serve)["moves"] == 60.0
