"""The control loop on fake adapters: a hot node taken out of service.

Owns the check that, in one loop, a node whose GPU runs hot is cordoned (Ray drain), its gang
is checkpointed and re-queued, its replicas move make-before-break (to the external pool: the
cluster has no other node), the empty node is replaced, and the gang runs again on the new
node, with no request meeting a pool without a RUNNING replica. The real cluster version is
tests/integration/test_node_health.py.
"""

from __future__ import annotations

from pathlib import Path

from controlplane.store import JobState
from policies.snapshot import Pool
from tests.unit.loop_fakes import World, make_world

MODEL = "sample"
TWO_REPLICAS = (
    "serving:\n  models:\n    - name: sample\n      min_replicas: 2\n      max_replicas: 2\n"
)


def feed(w: World, hot: set[str]) -> None:
    """One telemetry summary per live node for the next tick (hot nodes at 95 C)."""
    w.telemetry.samples = {
        n: [
            {
                "node_id": n,
                "sampled_s": w.clock.now_s,
                "gpus": [{"gpu": i, "temp_c": 95.0 if n in hot else 50.0} for i in range(gpus)],
                "gpus_expected": gpus,
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


def test_a_hot_node_is_cordoned_its_gang_requeued_its_replicas_moved(tmp_path: Path) -> None:
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
