"""The memory tier holds each rank's newest snapshot on another node than the writer's:
losing the writer's node restores from memory, a held copy that fails verification or is
gone falls back to storage, a writer on the holder's node moves the holder away, and the
control plane's cleanup kills the holders by name.

One local multi-node cluster (ray.cluster_utils.Cluster on 127.0.0.1): a head (pool=head,
where nothing may hold a snapshot) and cluster-pool nodes added and removed by the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import torch
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from jobs.checkpoint import CheckpointEngine, RayMemoryTier, clear_job_memory_tier
from jobs.checkpoint.memory_tiers import DEFAULT_NAMESPACE, holder_name

pytestmark = pytest.mark.integration

RUN = "peer-test"


def add_cluster_node(cluster: Cluster) -> Any:
    return cluster.add_node(num_cpus=1, labels={"pool": "cluster"}, node_ip_address="127.0.0.1")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "node_ip_address": "127.0.0.1",
            "num_cpus": 1,
            "labels": {"pool": "head"},
            "include_dashboard": False,
        },
    )
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def make_state(step: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(64, 64, generator=gen), "b": torch.randn(64, generator=gen)},
        "step": step,
    }


@ray.remote(num_cpus=1)
def save_steps(uri: str, steps: list[int]) -> str:
    """Save `steps` on whatever node this task was pinned to; returns that node's id."""
    engine = CheckpointEngine(uri, memory_tier=RayMemoryTier(RUN, put_timeout_s=20))
    for step in steps:
        engine.save(make_state(step), step)
    engine.wait()
    engine.close()
    return str(ray.get_runtime_context().get_node_id())


def save_on(node: Any, uri: str, steps: list[int]) -> None:
    pinned = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
    assert ray.get(save_steps.options(scheduling_strategy=pinned).remote(uri, steps)) == (
        node.node_id
    )


def holder_node() -> str | None:
    try:
        actor = ray.get_actor(holder_name(RUN, 0), namespace=DEFAULT_NAMESPACE)
    except ValueError:
        return None
    return str(ray.get(actor.node_id.remote(), timeout=20))


def restore(uri: str) -> tuple[CheckpointEngine, Any]:
    engine = CheckpointEngine(uri, memory_tier=RayMemoryTier(RUN, put_timeout_s=20))
    restored = engine.restore()
    engine.close()
    assert restored is not None
    return engine, restored


def assert_bit_equal(actual: dict[str, Any], step: int) -> None:
    expected = make_state(step)
    assert actual["step"] == step
    for key, tensor in expected["model"].items():
        got = actual["model"][key]
        assert got.dtype == tensor.dtype and got.shape == tensor.shape
        assert torch.equal(got.view(torch.int32), tensor.view(torch.int32))


def test_holder_lives_off_the_writers_node_and_survives_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    uri = (tmp_path / "store").as_uri()
    node_a, node_b = add_cluster_node(cluster), add_cluster_node(cluster)
    cluster.wait_for_nodes()

    save_on(node_a, uri, [1, 2])
    assert holder_node() == node_b.node_id  # not the writer's node, never the head

    cluster.remove_node(node_a)  # the writer's node is lost
    engine, restored = restore(uri)
    assert (restored.step, restored.source) == (2, "memory")
    assert engine.stats()["checkpoint_restored_from_memory"] == 1.0
    assert_bit_equal(restored.state, 2)

    # A held copy that fails its checksums is not used.
    holder = ray.get_actor(holder_name(RUN, 0), namespace=DEFAULT_NAMESPACE)
    step, index, payload = ray.get(holder.get.remote())
    damaged = np.array(payload, copy=True)
    damaged[100] ^= 0xFF
    ray.get(holder.put.remote(step, index, damaged))
    engine, restored = restore(uri)
    assert (restored.step, restored.source) == (2, "storage")
    assert engine.stats()["checkpoint_restored_from_memory"] == 0.0
    assert_bit_equal(restored.state, 2)

    # The restarted writer lands on the holder's node: the holder moves to another node.
    node_c = add_cluster_node(cluster)
    cluster.wait_for_nodes()
    save_on(node_b, uri, [3])
    assert holder_node() == node_c.node_id
    _engine, restored = restore(uri)
    assert (restored.step, restored.source) == (3, "memory")
    assert_bit_equal(restored.state, 3)

    # The control plane's cleanup when the job ends; missing holders are fine.
    assert clear_job_memory_tier(RUN, world_size=2) == 1
    assert clear_job_memory_tier(RUN, world_size=2) == 0
    _engine, restored = restore(uri)
    assert (restored.step, restored.source) == (3, "storage")

    # No eligible node but the writer's: the save goes on, storage only.
    cluster.remove_node(node_c)
    save_on(node_b, uri, [4])
    assert holder_node() is None
    _engine, restored = restore(uri)
    assert (restored.step, restored.source) == (4, "storage")
    assert_bit_equal(restored.state, 4)
