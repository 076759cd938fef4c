"""Evict-first at equal service: the simulator counts the GPU-hours a scheme trained on that
serving's demand needed on the cluster pool (the providers full, no cluster GPU free, its
replicas not there), and the report takes them off the baseline's goodput beside the goal."""

from __future__ import annotations

import pytest

from controlplane.simulate.engine import EventKind, EventQueue
from controlplane.simulate.report import at_equal_service
from controlplane.simulate.serving import SimServe
from controlplane.simulate.world import ProviderSpec, World
from policies.snapshot import Pool

RPS = 10.0  # one replica serves 10 requests/s at full use


def _serve(
    *, replicas: int, training_gpus: int, stockout: bool = False, max_replicas: int = 100
) -> SimServe:
    """Two cluster nodes of 8 GPUs; one provider of one 8-GPU node; model ``m`` at one GPU
    per replica with `replicas` RUNNING on the cluster pool and training holding
    `training_gpus` cluster GPUs."""
    q = EventQueue()
    outage = ((0.0, 1e9),) if stockout else ()
    world = World(2, 8, (ProviderSpec("a", 8, 1, 2.5, outage),), 300.0, 600.0, q)
    serve = SimServe(
        world, q, {"m": 1}, {"m": RPS}, {"m": 1.0}, 10.0, 5.0, {"m": (1, max_replicas)}
    )
    serve.targets[("m", Pool.CLUSTER)] = replicas
    serve.reconcile()
    while len(q):
        for ev in q.pop_instant():
            if ev.kind is EventKind.REPLICA_READY:
                serve.ready(ev.subject, ev.version)
    left = training_gpus
    for node_id in world.cluster_ids:
        take = min(left, world.nodes[node_id].free)
        if take:
            world.take(node_id, take, training=True)
        left -= take
    assert left == 0 and serve.running("m") == replicas
    return serve


@pytest.mark.parametrize(
    "case, demand_replicas, kw, taken",
    [
        # 20 wanted, the provider hosts 8, serving holds 4, training the other 12: 8 taken.
        ("providers full, training holds the rest", 20, {"replicas": 4, "training_gpus": 12}, 8),
        ("free cluster GPUs cover the need", 20, {"replicas": 4, "training_gpus": 4}, 0),
        (
            "stock-out: nothing rented",
            20,
            {"replicas": 4, "training_gpus": 12, "stockout": True},
            16,
        ),
        (
            "demand the provider and the cluster replicas hold",
            10,
            {"replicas": 4, "training_gpus": 12},
            0,
        ),
        (
            "max_replicas caps the demand",
            20,
            {"replicas": 4, "training_gpus": 12, "max_replicas": 12},
            0,
        ),
    ],
)
def test_taken_gpus(case: str, demand_replicas: int, kw: dict, taken: int) -> None:
    serve = _serve(**kw)
    serve.set_demand("m", demand_replicas * RPS)
    assert serve.taken_gpus() == taken, case
    serve.advance(60.0)
    assert serve.taken_gpu_s == pytest.approx(taken * 60.0), case


def test_no_bounds_means_unbounded_and_starting_replicas_count() -> None:
    q = EventQueue()
    world = World(1, 8, (ProviderSpec("a", 8, 0, 2.5),), 300.0, 600.0, q)
    serve = SimServe(world, q, {"m": 2}, {"m": RPS}, {"m": 0.5}, 10.0, 5.0)
    serve.set_demand("m", 2 * RPS)  # sized at 50 %: 4 replicas of 2 GPUs = 8 GPUs
    serve.targets[("m", Pool.CLUSTER)] = 1
    serve.reconcile()  # STARTING still holds its 2 GPUs
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
