"""The control loop on fake adapters: a training claim and serving's way back.

Owns the checks that, in one loop and one thread, a gang that needs the GPUs serving holds
gets them make-before-break (replicas start on the external pool, traffic shifts, only then
do the cluster replicas stop, then the gang is admitted on the nodes admission chose), that
no request meets a pool without a RUNNING replica on the way, and that once the gang is gone
the replicas come back a few at a time. The real cluster version is
tests/integration/test_policy_loop.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.cli.cluster import provider_lines
from controlplane.store import JobState
from policies.snapshot import Pool
from tests.unit.loop_fakes import World, make_world

MODEL = "sample"
OVERRIDES = (
    "serve.deploy_app=true",
    "pools.external.providers=[{name: rent-a, max_nodes: 1, gpus_per_node: 2}]",
    "placement.migrate_back_idle_s=2",
    "placement.migrate_back_step=1",
    "placement.migrate_back_interval_s=4",
)

TWO_REPLICAS = (
    "serving:\n  models:\n    - name: sample\n      min_replicas: 2\n      max_replicas: 2\n"
)


def world(tmp_path: Path, *more: str) -> World:
    w = make_world(tmp_path, *OVERRIDES, *more, config_text=TWO_REPLICAS)
    w.cluster.add("c1", Pool.CLUSTER, gpus=2)
    w.cluster.add("e1", Pool.EXTERNAL, gpus=2)
    w.serve.deploy(MODEL, cluster=2)
    return w


def claim_the_cluster(w: World) -> str:
    job_id = w.jobs.submit("claims-the-cluster", workers=2)
    for _ in range(40):
        w.tick()
        if w.store.get(job_id).state is not JobState.QUEUED:
            break
    return job_id


def test_a_claim_moves_replicas_out_make_before_break_then_admits_the_gang(
    tmp_path: Path,
) -> None:
    w = world(tmp_path)
    job_id = claim_the_cluster(w)

    assert w.store.get(job_id).state in (JobState.ADMITTED, JobState.RUNNING)
    (admit,) = w.jobs.admitted
    assert {p.node_id for p in admit.placement} == {"c1"}
    assert w.serve.nodes_of(MODEL, Pool.EXTERNAL) == ["e1", "e1"]
    assert w.serve.nodes_of(MODEL, Pool.CLUSTER) == []
    assert w.serve.failed_requests == 0
    # The order of the writes is make-before-break: external up, then cluster down.
    targets = [(pool, n) for kind, _, pool, n in w.serve.writes if kind == "target"]
    assert targets == [(Pool.EXTERNAL, 2), (Pool.CLUSTER, 0)]
    (start,) = w.events("serve.move.start")
    assert "cluster -> external" in start and "yield_to_training" in start
    (done,) = w.events("serve.move.done")
    assert "c1 freed" in done  # the node admission chose is the one that was emptied
    bundle = {"GPU": 1.0, "CPU": 1.0, "pool_external": 1.0, "provider_rent-a": 1.0}
    assert w.serve.requests_external[0] == [bundle] * 2
    # The move that ran is the one admission's claim named: its node ids and its job.
    assert w.loop.last is not None
    assert w.store.get_value("serving.operations") is None  # nothing left in flight
    assert w.loop.stats.failures == {}


def test_the_move_carries_the_claims_node_ids(tmp_path: Path) -> None:
    w = world(tmp_path)
    w.jobs.submit("claims-the-cluster", workers=2)
    moves = []
    for _ in range(10):
        w.tick()
        moves += list(w.loop.serve.operations) if w.loop.serve is not None else []
        if moves:
            break
    (op,) = moves[:1]
    assert op.node_ids == ("c1", "c1")
    assert op.for_job_id is not None
    claims = [c for c in (w.loop.last.claims if w.loop.last else ())]
    assert claims and claims[0].node_ids == ("c1", "c1")


def test_replicas_come_back_one_per_interval_after_the_gang(tmp_path: Path) -> None:
    w = world(tmp_path)
    job_id = claim_the_cluster(w)
    w.tick(3)
    # The gang ends: its GPUs are free again.
    w.cluster.gangs.pop(job_id)
    w.store.transition(job_id, JobState.SUCCEEDED, "done")
    for _ in range(40):
        w.tick()
        if (
            w.serve.nodes_of(MODEL, Pool.CLUSTER) == ["c1", "c1"]
            and not w.serve.targets[(MODEL, Pool.EXTERNAL)]
        ):
            break
    back = [m for m in w.events("serve.move.start") if "external -> cluster" in m]
    assert len(back) == 2, back  # one replica per step
    assert w.serve.failed_requests == 0
    assert w.serve.targets[(MODEL, Pool.EXTERNAL)] == 0
    assert w.serve.requests_external[-1] == []
    assert w.loop.stats.failures == {}


@pytest.mark.parametrize("tick_s", [0.5, 1.0])
def test_one_thread_decides(tmp_path: Path, tick_s: float) -> None:
    """The loop makes one thread (``rcp-tick``) and no other."""
    import threading

    w = world(tmp_path, f"policy.tick_s={tick_s}")
    before = set(threading.enumerate())
    assert not w.loop.alive()
    w.loop.start()
    try:
        new = set(threading.enumerate()) - before
        assert w.loop.alive()  # what the in-process controller (controller.in_process) watches
    finally:
        w.loop.stop()
    assert [t.name for t in new] == ["rcp-tick"]
    assert not w.loop.alive()  # stop waits for the tick in flight


def test_a_claim_rents_from_the_cheapest_provider_first_and_the_rest_from_the_next(
    tmp_path: Path,
) -> None:
    """Two providers: ``cheap`` has room for one replica's GPU, ``dear`` for two. The claim
    moves both replicas out: one capacity bundle names ``cheap``, the other ``dear``, and the
    event says what each provider was asked for."""
    w = make_world(
        tmp_path,
        *(o for o in OVERRIDES if not o.startswith("pools.external")),
        "pools.external.providers=[{name: dear, price_per_gpu_hour: 3, max_nodes: 1, "
        "gpus_per_node: 2}, {name: cheap, price_per_gpu_hour: 1, max_nodes: 1, gpus_per_node: 1}]",
        config_text=TWO_REPLICAS,
    )
    w.cluster.add("c1", Pool.CLUSTER, gpus=2)
    w.cluster.add("e1", Pool.EXTERNAL, gpus=1, provider="cheap")
    w.cluster.add("e2", Pool.EXTERNAL, gpus=2, provider="dear")
    w.serve.deploy(MODEL, cluster=2)
    job_id = claim_the_cluster(w)

    assert w.store.get(job_id).state in (JobState.ADMITTED, JobState.RUNNING)
    assert sorted(w.serve.nodes_of(MODEL, Pool.EXTERNAL)) == ["e1", "e2"]
    assert w.serve.failed_requests == 0
    bundle = {"GPU": 1.0, "CPU": 1.0, "pool_external": 1.0}
    assert sorted(w.serve.requests_external[0], key=str) == [
        {**bundle, "provider_cheap": 1.0},
        {**bundle, "provider_dear": 1.0},
    ]
    (asked,) = w.events("serve.external_capacity")
    assert "dear 1, cheap 1" in asked
    # What users see: each provider's price, room, what it holds and was asked, per metric
    # and in `rcp serve status`.
    g = w.metrics.gauges
    assert g[("rcp_external_provider_price_per_gpu_hour", (("provider", "cheap"),))] == 1.0
    assert g[("rcp_external_provider_gpus_max", (("provider", "dear"),))] == 2.0
    assert g[("rcp_external_provider_gpus_live", (("provider", "dear"),))] == 2.0
    assert g[("rcp_external_provider_gpus_requested", (("provider", "cheap"),))] == 1.0
    assert g[("rcp_external_provider_out", (("provider", "cheap"),))] == 0.0
    lines = provider_lines(w.loop.tick_metrics.provider_rows)
    assert lines == [
        "provider:     dear $3/GPU-h, GPUs live 2 asked 1 of 2: delivering",
        "provider:     cheap $1/GPU-h, GPUs live 1 asked 1 of 1: delivering",
    ]


def test_serve_status_says_which_provider_is_out_and_which_owes() -> None:
    rows = [
        {
            "name": "a",
            "price_per_gpu_hour": 2.5,
            "gpus_max": 8,
            "gpus_live": 0,
            "gpus_requested": 0,
            "out": True,
            "out_for_s": 1500.4,
            "owed_for_s": None,
        },
        {
            "name": "b",
            "price_per_gpu_hour": 3.0,
            "gpus_max": 8,
            "gpus_live": 2,
            "gpus_requested": 6,
            "out": False,
            "out_for_s": None,
            "owed_for_s": 42.0,
        },
    ]
    assert provider_lines(rows) == [
        "provider:     a $2.5/GPU-h, GPUs live 0 asked 0 of 8: OUT for 1500 s more (did not "
        "deliver in time)",
        "provider:     b $3/GPU-h, GPUs live 2 asked 6 of 8: delivering: owed for 42 s",
    ]
