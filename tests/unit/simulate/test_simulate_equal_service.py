"""Evict-first at equal service: the simulator counts the GPU-hours a scheme trained on that
serving's demand needed (no replica running for it in either pool, no cluster GPU free, so
only training's GPUs could have served it), and the report takes them off the baseline's
goodput beside the goal."""

from __future__ import annotations

import pytest

from controlplane.simulate.engine import EventKind, EventQueue
from controlplane.simulate.nodes import ProviderSpec
from controlplane.simulate.report import at_equal_service
from controlplane.simulate.serving import SimServe
from controlplane.simulate.world import World
from policies.snapshot import Pool, ReplicaState

RPS = 10.0  # one replica serves 10 requests/s at full use


def _run(world: World, serve: SimServe, until_s: float) -> None:
    q = world.events
    while len(q) and (q.peek_time() or 0.0) <= until_s:
        batch = q.pop_instant()
        world.advance(batch[0].at_s)
        for ev in batch:
            if ev.kind is EventKind.EXTERNAL_NODE_UP:
                world.external_up(ev.subject)
            elif ev.kind is EventKind.REPLICA_READY:
                serve.ready(ev.subject, ev.version)


def _serve(
    *, cluster: int, training_gpus: int, external: int = 0, max_replicas: int = 100
) -> SimServe:
    """Two cluster nodes of 8 GPUs, one provider of one 8-GPU node; model ``m`` at one GPU
    per replica with `cluster` and `external` replicas RUNNING and training holding
    `training_gpus` cluster GPUs."""
    world = World(2, 8, (ProviderSpec("a", 8, 1, 2.5),), 300.0, 600.0, EventQueue())
    serve = SimServe(
        world, world.events, {"m": 1}, {"m": RPS}, {"m": 1.0}, 10.0, 5.0, {"m": (1, max_replicas)}
    )
    if external:
        world.want_external({"a": 8})
        _run(world, serve, 300.0)
    serve.targets[("m", Pool.CLUSTER)] = cluster
    serve.targets[("m", Pool.EXTERNAL)] = external
    serve.reconcile()
    _run(world, serve, 1000.0)
    left = training_gpus
    for node_id in world.cluster_ids:
        take = min(left, world.nodes[node_id].free)
        if take:
            world.take(node_id, take, training=True)
        left -= take
    assert left == 0
    assert serve.running("m", Pool.CLUSTER) == cluster
    assert serve.running("m", Pool.EXTERNAL) == external
    return serve


@pytest.mark.parametrize(
    "case, demand, kw, taken",
    [
        # 14 wanted, 4 run, nothing free: training's 12 GPUs could serve the other 10.
        ("no cluster GPU free", 14, {"cluster": 4, "training_gpus": 12}, 10),
        ("at most what training holds", 20, {"cluster": 4, "training_gpus": 12}, 12),
        ("free cluster GPUs serve part of it", 14, {"cluster": 4, "training_gpus": 4}, 2),
        ("free cluster GPUs serve all of it", 10, {"cluster": 4, "training_gpus": 4}, 0),
        (
            "replicas running on the provider count",
            14,
            {"cluster": 4, "training_gpus": 12, "external": 8},
            2,
        ),
        (
            "max_replicas caps the demand",
            20,
            {"cluster": 4, "training_gpus": 12, "max_replicas": 6},
            2,
        ),
        ("demand within what runs", 4, {"cluster": 4, "training_gpus": 12}, 0),
    ],
)
def test_taken_gpus(case: str, demand: int, kw: dict, taken: int) -> None:
    serve = _serve(**kw)
    serve.set_demand("m", demand * RPS)
    assert serve.taken_gpus() == taken, case
    before = serve.taken_gpu_s
    serve.advance(60.0)
    assert serve.taken_gpu_s - before == pytest.approx(taken * 60.0), case


def test_a_replica_starting_on_the_cluster_holds_its_gpus() -> None:
    """A cluster replica still starting is on its way (its GPUs are serving's, not
    training's); no min/max given: the sized count alone."""
    world = World(1, 8, (ProviderSpec("a", 8, 0, 2.5),), 300.0, 600.0, EventQueue())
    serve = SimServe(world, world.events, {"m": 2}, {"m": RPS}, {"m": 0.5}, 10.0, 5.0)
    serve.set_demand("m", 2 * RPS)  # sized at 50 %: 4 replicas of 2 GPUs = 8 GPUs
    serve.targets[("m", Pool.CLUSTER)] = 1
    serve.reconcile()
    assert [r.state for r in serve.by_model["m"]] == [ReplicaState.STARTING]
    world.take(world.cluster_ids[0], 6, training=True)
    assert serve.taken_gpus() == 8 - 2


@pytest.mark.parametrize(
    "ours, other, expected",
    [
        (
            {"goodput_gpu_h": 950.0, "serving_taken_gpu_h": 0.0},
            {"goodput_gpu_h": 1000.0, "serving_taken_gpu_h": 100.0},
            {"taken_gpu_h": 100.0, "goodput_at_most_gpu_h": 900.0, "ratio": 1.056},
        ),
        (  # ours took some too: only the difference counts
            {"goodput_gpu_h": 850.0, "serving_taken_gpu_h": 50.0},
            {"goodput_gpu_h": 1000.0, "serving_taken_gpu_h": 100.0},
            {"taken_gpu_h": 50.0, "goodput_at_most_gpu_h": 950.0, "ratio": 0.895},
        ),
        (
            {"goodput_gpu_h": 950.0, "serving_taken_gpu_h": 10.0},
            {"goodput_gpu_h": 1000.0, "serving_taken_gpu_h": 10.0},
            None,
        ),
        ({"goodput_gpu_h": 950.0}, {"goodput_gpu_h": 1000.0}, None),
    ],
)
def test_at_equal_service(ours: dict, other: dict, expected: dict | None) -> None:
    assert at_equal_service(ours, other) == expected
