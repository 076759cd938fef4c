"""The control loop on fake adapters: a node with InfiniBand errors serves only.

Owns the check that, in one loop, a cluster node whose IB port counts errors is not drained:
its gang checkpoints and is re-queued, no gang is admitted there again, its replicas stay,
the state is in the store (``health.serving_only``), an event and a gauge name it, and a
restarted controller keeps it without saying it twice; a hot GPU later takes the node out of
everything. The real cluster version is in tests/integration/test_node_health.py.
"""

from __future__ import annotations

from pathlib import Path

from controlplane.loop.health import SERVING_ONLY_KEY
from controlplane.store import JobState
from policies.snapshot import Pool
from tests.unit.loop_fakes import World, make_world

MODEL = "sample"
TWO_REPLICAS = (
    "serving:\n  models:\n    - name: sample\n      min_replicas: 2\n      max_replicas: 2\n"
)


def feed(w: World, ib_bad: set[str], hot: frozenset[str] = frozenset()) -> None:
    """One telemetry summary per live node (IB port errors on `ib_bad`, 95 C on `hot`)."""
    w.telemetry.samples = {
        n: [
            {
                "node_id": n,
                "sampled_s": w.clock.now_s,
                "gpus": [{"gpu": i, "temp_c": 95.0 if n in hot else 50.0} for i in range(gpus)],
                "gpus_expected": gpus,
                "ib_ports": [
                    {"port": "mlx5_0/1", "up": True, "errors_per_s": 50.0 if n in ib_bad else 0.0}
                ],
            }
        ]
        for n, (_pool, gpus) in w.cluster.nodes.items()
        if n not in w.cluster.stopped
    }


def run(w: World, ticks: int, ib_bad: set[str], hot: frozenset[str] = frozenset()) -> None:
    for _ in range(ticks):
        feed(w, ib_bad, hot)
        w.tick()


def gauge(w: World, node: str) -> float:
    return w.metrics.gauges[("rcp_node_serving_only", (("node", node), ("pool", "cluster")))]


def test_a_node_with_ib_errors_serves_only_until_a_gpu_fault(tmp_path: Path) -> None:
    w = make_world(
        tmp_path,
        "serve.deploy_app=true",
        "pools.external.max_nodes=1",
        "pools.external.gpus_per_node=2",
        "health.act=true",
        "health.replace_drained=true",
        config_text=TWO_REPLICAS,
    )
    w.cluster.add("a", Pool.CLUSTER, gpus=4)
    w.cluster.add("e1", Pool.EXTERNAL, gpus=2)
    w.serve.deploy(MODEL, cluster=2)
    first = w.jobs.submit("on-a", workers=2)
    run(w, 5, set())
    assert w.store.get(first).state is JobState.RUNNING and set(w.cluster.gangs[first]) == {"a"}

    run(w, 5, {"a"})
    (said,) = w.events("health.serving_only")
    assert "node a: serving only" in said and "ib_errors" in said
    assert not w.events("health.cordon") and "a" not in w.cluster.draining_nodes
    (preempt,) = [p for p in w.jobs.preempted if p.job_id == first]
    assert preempt.checkpoint_first and "serving_only: ib_errors" in preempt.reason
    assert gauge(w, "a") == 1.0
    assert set(w.store.get_value(SERVING_ONLY_KEY, {})) == {"a"}

    # No gang lands there again; the replicas stay where they are.
    run(w, 10, {"a"})
    assert w.store.get(first).state is JobState.QUEUED and first not in w.cluster.gangs
    assert w.serve.nodes_of(MODEL, Pool.CLUSTER) == ["a", "a"]

    # A restarted controller keeps it, and does not say it again.
    w = w.restart()
    run(w, 3, {"a"})
    assert len(w.events("health.serving_only")) == 1
    assert w.store.get(first).state is JobState.QUEUED and gauge(w, "a") == 1.0

    # A hot GPU takes it out of everything: cordoned (a Ray drain), and the record ends.
    run(w, 5, {"a"}, hot=frozenset({"a"}))
    (cordon,) = w.events("health.cordon")
    assert "node a" in cordon and "gpu_overheated" in cordon
    (ended,) = w.events("health.serving_only_end")
    assert "out of everything now" in ended and "gpu_overheated" in ended
    assert w.store.get_value(SERVING_ONLY_KEY, {}) == {} and gauge(w, "a") == 0.0
    assert w.serve.failed_requests == 0
