"""A make-before-break move never takes serving below what demand wants (issue 17, gap 1).

Owns the checks of `controlplane.loop.act.operations.kept` (a table: what the source pool
keeps when a move breaks) and of the move on the loop's fakes: demand that rises while the
replacements start keeps source replicas RUNNING and routed to, the move stays
make-before-break (no request meets a pool without a RUNNING replica), the operation stays
the only writer of the moving model's targets (the serving policies wait; only what the
load asks for is read), and the claim is finished by a later move.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.adapters.serve import PoolView, ServeView
from controlplane.loop.act import operations
from controlplane.loop.act.operations import MoveOperation, MoveOutcome, MovePhase
from controlplane.store import JobState
from policies.plan import MoveServeReplicas
from policies.snapshot import Pool
from tests.unit.loop_fakes import FakeCluster, FakeServe, World, make_world

MODEL = "sample"


def view(source_target: int, running_to: int) -> ServeView:
    return ServeView(
        deployed=True,
        pools={
            (MODEL, Pool.CLUSTER): PoolView(target=source_target, running=source_target),
            (MODEL, Pool.EXTERNAL): PoolView(target=running_to, running=running_to),
        },
    )


def op(num_replicas: int, from_target: int) -> MoveOperation:
    return MoveOperation(
        model=MODEL,
        from_pool=Pool.CLUSTER,
        to_pool=Pool.EXTERNAL,
        num_replicas=num_replicas,
        node_ids=(),
        reason="test",
        for_job_id=None,
        from_target=from_target,
        to_target=num_replicas,
        phase=MovePhase.SHIFT,
        started_s=0.0,
        phase_since_s=0.0,
    )


@pytest.mark.parametrize(
    ("source", "moved", "wanted", "running_to", "keeps"),
    [
        (2, 2, None, 2, 0),  # demand unknown: the planned count, as before
        (2, 2, 2, 2, 0),  # demand met by the replacements: all of the moved ones stop
        (2, 2, 3, 2, 1),  # demand rose by one during the move: one stays
        (2, 2, 9, 2, 2),  # demand far above: every source replica stays, none is added
        (4, 2, 1, 2, 2),  # demand fell: still only the moved count stops (policies do the rest)
        (3, 2, 4, 2, 2),  # relative to the source's target now (3), not the planned 1
        (2, 2, 3, 0, 2),  # nothing RUNNING at the destination: nothing stops
    ],
)
def test_what_the_source_keeps_when_a_move_breaks(
    source: int, moved: int, wanted: int | None, running_to: int, keeps: int
) -> None:
    assert operations.kept(op(moved, source - moved), view(source, running_to), wanted) == keeps


def drive(serve: FakeServe, wanted_by_step: list[int | None]) -> tuple[MoveOperation, list[str]]:
    """A 2-replica move cluster -> external, one `advance` per Serve step, with what demand
    wants at each step; what the move returned at each step."""
    serve.deploy(MODEL, cluster=2)
    started = operations.start(
        MoveServeReplicas(MODEL, Pool.CLUSTER, Pool.EXTERNAL, 2, (), "test"), serve.view(), 0.0
    )
    assert started is not None
    current, outcomes = started, []
    for i, wanted in enumerate(wanted_by_step):
        current, outcome = operations.advance(current, serve, float(i), 600.0, wanted)
        outcomes.append(outcome.value)
        serve.step()
        # Capacity never drops below demand because of the move (the source is only lowered
        # to what the RUNNING replacements leave uncovered).
        running = serve.running(MODEL, Pool.CLUSTER) + serve.running(MODEL, Pool.EXTERNAL)
        assert running >= min(wanted or 0, 2), (i, running, wanted)
        if outcome is MoveOutcome.DONE:
            break
    return current, outcomes


def serve_with_room() -> FakeServe:
    cluster = FakeCluster()
    cluster.add("c1", Pool.CLUSTER, gpus=4)
    cluster.add("e1", Pool.EXTERNAL, gpus=4)
    serve = FakeServe(cluster)
    cluster.serve = serve
    return serve


def test_demand_that_rose_during_the_move_keeps_a_source_replica_routed() -> None:
    serve = serve_with_room()
    done, outcomes = drive(serve, [2, 2, 3, 3, 3, 3, 3, 3, 3, 3])
    assert outcomes[-1] == "done"
    assert done.from_target == 1
    assert serve.running(MODEL, Pool.CLUSTER) == 1
    assert serve.running(MODEL, Pool.EXTERNAL) == 2
    # The route table was set again with the kept replica before any stop, and still sends
    # it its share: 1 of 3.
    assert serve.weights[MODEL][Pool.CLUSTER] == pytest.approx(1 / 3)
    cluster_writes = [n for kind, _, pool, n in serve.writes if pool is Pool.CLUSTER]
    assert cluster_writes == [1]  # one write, to 1, never to 0
    assert serve.failed_requests == 0


def test_demand_unchanged_moves_everything_as_before() -> None:
    serve = serve_with_room()
    done, outcomes = drive(serve, [2] * 10)
    assert outcomes[-1] == "done"
    assert done.from_target == 0
    assert serve.running(MODEL, Pool.CLUSTER) == 0
    targets = [(pool, n) for kind, _, pool, n in serve.writes if kind == "target"]
    assert targets == [(Pool.EXTERNAL, 2), (Pool.CLUSTER, 0)]
    assert serve.failed_requests == 0


OVERRIDES = (
    "serve.deploy_app=true",
    "pools.external.providers=[{name: rent-a, max_nodes: 1, gpus_per_node: 4}]",
    "placement.migrate_back_idle_s=600",
)
SCALING = (
    "serving:\n  models:\n    - name: sample\n      min_replicas: 2\n      max_replicas: 4\n"
    "      target_ongoing_requests: 1\n      upscale_delay_s: 0\n      downscale_delay_s: 600\n"
)


def world(tmp_path: Path) -> World:
    w = make_world(tmp_path, *OVERRIDES, config_text=SCALING)
    w.cluster.add("c1", Pool.CLUSTER, gpus=2)
    w.cluster.add("e1", Pool.EXTERNAL, gpus=4)
    w.serve.deploy(MODEL, cluster=2)
    w.serve.load[MODEL] = 2.0
    return w


def test_the_loop_keeps_what_demand_wants_through_a_claim_and_finishes_the_claim_later(
    tmp_path: Path,
) -> None:
    w = world(tmp_path)
    job_id = w.jobs.submit("claims-the-cluster", workers=2)
    w.tick()
    assert w.events("serve.move.start"), "the claim starts a move"
    w.serve.load[MODEL] = 3.0  # demand rises while the replacements start
    w.tick()
    assert w.loop.last is not None and w.loop.serve is not None
    assert w.loop.serve.operations, "the move is still in flight"
    assert w.loop.last.serving is None  # the policies wait: the operation is the one writer
    assert w.loop.last.wanted == ((MODEL, 3),)  # but what the load asks for is read
    lowest = 99
    for _ in range(40):
        w.tick()
        total = w.serve.running(MODEL, Pool.CLUSTER) + w.serve.running(MODEL, Pool.EXTERNAL)
        lowest = min(lowest, total)
        if w.store.get(job_id).state is not JobState.QUEUED:
            break
    assert lowest >= 2  # never below what the load wanted when the move started
    moves = w.events("serve.move.start")
    assert len(moves) == 2, moves  # the first move kept one; a later one finished the claim
    assert "sample: 2 cluster -> external" in moves[0]
    assert "sample: 1 cluster -> external" in moves[1]
    cluster_writes = [n for kind, _, pool, n in w.serve.writes if pool is Pool.CLUSTER]
    assert cluster_writes[0] == 1  # the first BREAK kept the replica demand still needed
    assert w.store.get(job_id).state in (JobState.ADMITTED, JobState.RUNNING)
    assert w.serve.running(MODEL, Pool.EXTERNAL) == 3
    assert w.serve.failed_requests == 0
    assert w.loop.stats.failures == {}
