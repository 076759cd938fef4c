"""The control loop on fake adapters: serving's demand is a guarantee (issue 28, item 1).

Owns the checks that, in one loop, when load rises and the external pool has no room, the
lowest-priority gang is asked to checkpoint and is preempted (``serving-reclaims``), the
model's new replica starts on the cluster pool on the GPUs it freed (no gang gets them
meanwhile), no request meets a pool without a RUNNING replica, and once the load falls and
the replica is gone the job is admitted again; and that a claim the external pool cannot
host leaves serving's replicas where they are, the gang waiting with a reason that names
the model. The policy tables are in tests/unit/policies/test_serving_guarantee.py.
"""

from __future__ import annotations

from pathlib import Path

from controlplane.store import JobState
from policies.snapshot import Pool
from tests.unit.loop_fakes import World, make_world

MODEL = "sample"
OVERRIDES = (
    "serve.deploy_app=true",
    "pools.external.providers=[{name: rent-a, max_nodes: 1, gpus_per_node: 1}]",
    "placement.migrate_back_idle_s=2",
    "placement.migrate_back_step=1",
    "placement.migrate_back_interval_s=4",
)
MODEL_CONFIG = (
    "serving:\n  models:\n    - name: sample\n      min_replicas: 1\n      max_replicas: 3\n"
    "      upscale_delay_s: 0\n      downscale_delay_s: 5\n"
)


def world(tmp_path: Path) -> World:
    """c1 (2 GPUs): one replica and one free GPU; e1 (1 GPU, the whole external pool): one
    replica. The external pool has no room left."""
    w = make_world(tmp_path, *OVERRIDES, config_text=MODEL_CONFIG)
    w.cluster.add("c1", Pool.CLUSTER, gpus=2)
    w.cluster.add("e1", Pool.EXTERNAL, gpus=1)
    w.serve.deploy(MODEL, cluster=1, external=1)
    w.serve.load[MODEL] = 4.0  # 2 replicas at 2 ongoing requests each
    return w


def until(w: World, done, ticks: int = 60) -> None:  # type: ignore[no-untyped-def]
    for _ in range(ticks):
        w.tick()
        if done():
            return
    raise AssertionError(f"not reached in {ticks} ticks; events: {w.events('')[-15:]}")


def test_serving_takes_a_gpu_back_from_the_lowest_training_and_returns_it(
    tmp_path: Path,
) -> None:
    w = world(tmp_path)
    job_id = w.jobs.submit("low", workers=1, priority="low")
    until(w, lambda: w.store.get(job_id).state is JobState.RUNNING)
    assert w.cluster.gangs[job_id] == {"c1": 1}

    # Load asks for a third replica; the external pool is full: serving reclaims.
    w.serve.load[MODEL] = 6.0
    until(w, lambda: w.serve.running(MODEL, Pool.CLUSTER) == 2)
    (preempt,) = w.jobs.preempted
    assert preempt.job_id == job_id and preempt.checkpoint_first
    assert preempt.reason.startswith("serving-reclaims:")
    assert w.store.get(job_id).state is JobState.QUEUED
    assert w.serve.nodes_of(MODEL, Pool.CLUSTER) == ["c1", "c1"]
    assert w.serve.targets[(MODEL, Pool.EXTERNAL)] == 1
    assert len(w.jobs.admitted) == 1  # no gang took the freed GPU meanwhile
    w.tick(5)
    assert w.store.get(job_id).state is JobState.QUEUED

    # Load falls: after the downscale delay a cluster replica goes, and the job runs again.
    w.serve.load[MODEL] = 2.0
    until(w, lambda: w.store.get(job_id).state is JobState.RUNNING)
    assert len(w.jobs.admitted) == 2
    assert w.serve.failed_requests == 0
    assert w.loop.stats.failures == {}


def test_a_claim_the_external_pool_cannot_host_waits_and_moves_nothing(tmp_path: Path) -> None:
    """A 2-GPU gang needs c1 whole; the replica there has nowhere to go: nothing moves, the
    gang waits, and its reason names the model and the external pool's room."""
    w = world(tmp_path)
    job_id = w.jobs.submit("big", workers=2, priority="high")
    w.tick(10)
    assert w.store.get(job_id).state is JobState.QUEUED
    assert not w.jobs.admitted and not w.jobs.preempted
    assert not w.events("serve.move.start")
    assert w.serve.nodes_of(MODEL, Pool.CLUSTER) == ["c1"]
    reason = w.store.get(job_id).info.get("message", "")
    assert reason.startswith("serving-demand:"), reason
    assert "model 'sample' keeps 1 replica(s)" in reason and "room for 0 GPU(s)" in reason
    assert w.serve.failed_requests == 0
