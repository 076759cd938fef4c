"""The control loop on fake adapters: a hot node taken out of service, and a node with
InfiniBand errors kept for serving only.

Owns the check that, in one loop, a node whose GPU runs hot is cordoned (Ray drain), its gang
is checkpointed and re-queued, its replicas move make-before-break (to the external pool: the
cluster has no other node), the empty node is replaced, and the gang runs again on the new
node, with no request meeting a pool without a RUNNING replica. And that a node whose IB port
counts errors is not drained: its gang checkpoints and is re-queued, no gang is admitted there
again, its replicas stay, the state is in the store (``health.serving_only``), an event and a
gauge name it, a restarted controller keeps it without saying it twice, and a hot GPU later
takes the node out of everything. The real cluster version is
tests/integration/test_node_health.py.
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


def feed(w: World, hot: set[str], ib_bad: frozenset[str] = frozenset()) -> None:
    """One telemetry summary per live node for the next tick (hot nodes at 95 C, IB port
    errors on `ib_bad`)."""
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


def run(w: World, hot: set[str], until: object, limit: int = 60) -> None:
    for _ in range(limit):
        feed(w, hot)
        w.tick()
        if callable(until) and until():
            return
    raise AssertionError(f"not reached in {limit} ticks")


def one_node_world(tmp_path: Path) -> World:
    """Cluster node ``a`` (4 GPUs) with both replicas, external node ``e1`` (2 GPUs)."""
    w = make_world(
        tmp_path,
        "serve.deploy_app=true",
        "pools.external.providers=[{name: rent-a, max_nodes: 1, gpus_per_node: 2}]",
        "health.act=true",
        "health.replace_drained=true",
        config_text=TWO_REPLICAS,
    )
    w.cluster.add("a", Pool.CLUSTER, gpus=4)
    w.cluster.add("e1", Pool.EXTERNAL, gpus=2)
    w.serve.deploy(MODEL, cluster=2)
    return w


def test_a_hot_node_is_cordoned_its_gang_requeued_its_replicas_moved(tmp_path: Path) -> None:
    w = one_node_world(tmp_path)
    job_id = w.jobs.submit("on-the-hot-node", workers=2)
    run(w, set(), lambda: w.store.get(job_id).state is JobState.RUNNING)
    assert set(w.cluster.gangs[job_id]) == {"a"}

    run(w, {"a"}, lambda: bool(w.events("health.cordon")))
    assert "a" in w.cluster.draining_nodes
    assert "gpu_overheated" in w.events("health.cordon")[0]
    # The gang was preempted with a checkpoint first and went back to the queue.
    (preempt,) = [p for p in w.jobs.preempted if p.job_id == job_id]
    assert preempt.checkpoint_first

    run(w, {"a"}, lambda: "a" in w.cluster.stopped)
    assert w.serve.nodes_of(MODEL, Pool.EXTERNAL) == ["e1", "e1"]
    assert w.serve.nodes_of(MODEL, Pool.CLUSTER) == []
    assert any("leave_unhealthy_node" in m for m in w.events("serve.move.start"))
    assert w.events("health.drain")

    # The autoscaler replaces the node; the gang runs again there, and only there.
    w.cluster.add("b", Pool.CLUSTER, gpus=4)
    run(w, set(), lambda: w.store.get(job_id).state is JobState.RUNNING)
    assert set(w.cluster.gangs[job_id]) == {"b"}
    assert w.serve.failed_requests == 0
    assert w.loop.stats.failures == {}


def ticks(w: World, n: int, ib_bad: frozenset[str], hot: frozenset[str] = frozenset()) -> None:
    for _ in range(n):
        feed(w, set(hot), ib_bad)
        w.tick()


def serving_only_gauge(w: World, node: str) -> float:
    return w.metrics.gauges[("rcp_node_serving_only", (("node", node), ("pool", "cluster")))]


def test_a_node_with_ib_errors_serves_only_until_a_gpu_fault(tmp_path: Path) -> None:
    w = one_node_world(tmp_path)
    first = w.jobs.submit("on-a", workers=2)
    ticks(w, 5, frozenset())
    assert w.store.get(first).state is JobState.RUNNING and set(w.cluster.gangs[first]) == {"a"}

    bad = frozenset({"a"})
    ticks(w, 5, bad)
    (said,) = w.events("health.serving_only")
    assert "node a: serving only" in said and "ib_errors" in said
    assert not w.events("health.cordon") and "a" not in w.cluster.draining_nodes
    (preempt,) = [p for p in w.jobs.preempted if p.job_id == first]
    assert preempt.checkpoint_first and "serving_only: ib_errors" in preempt.reason
    assert serving_only_gauge(w, "a") == 1.0
    assert set(w.store.get_value(SERVING_ONLY_KEY, {})) == {"a"}

    # No gang lands there again; the replicas stay where they are.
    ticks(w, 10, bad)
    assert w.store.get(first).state is JobState.QUEUED and first not in w.cluster.gangs
    assert w.serve.nodes_of(MODEL, Pool.CLUSTER) == ["a", "a"]

    # A restarted controller keeps it, and does not say it again.
    w = w.restart()
    ticks(w, 3, bad)
    assert len(w.events("health.serving_only")) == 1
    assert w.store.get(first).state is JobState.QUEUED and serving_only_gauge(w, "a") == 1.0

    # A hot GPU takes it out of everything: cordoned (a Ray drain), and the record ends.
    ticks(w, 5, bad, hot=bad)
    (cordon,) = w.events("health.cordon")
    assert "node a" in cordon and "gpu_overheated" in cordon
    (ended,) = w.events("health.serving_only_end")
    assert "out of everything now" in ended and "gpu_overheated" in ended
    assert w.store.get_value(SERVING_ONLY_KEY, {}) == {} and serving_only_gauge(w, "a") == 0.0
    assert w.serve.failed_requests == 0
