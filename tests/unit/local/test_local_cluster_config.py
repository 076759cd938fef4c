"""The autoscaler config that `rcp up` writes: pools map to node types, sizes from config."""

from __future__ import annotations

import json

import pytest

from controlplane.config import load_config
from controlplane.inventory import pool_of
from controlplane.local.autoscaler import (
    HEAD_NODE_TYPE,
    JOB_DRIVER_SLOTS_PER_NODE,
    autoscaler_config,
)
from controlplane.local.head_process import head_command
from controlplane.pools import JOB_DRIVER_RESOURCE
from controlplane.ray_connection import ray_temp_dir


def test_node_types_carry_pool_as_label_and_resource() -> None:
    cfg = load_config(
        None,
        [
            "pools.cluster.num_nodes=3",
            "pools.external.providers=[{name: a, max_nodes: 5}, "
            "{name: b, min_nodes: 1, max_nodes: 2, gpus_per_node: 8, price_per_gpu_hour: 9}]",
        ],
    )
    conf = autoscaler_config(cfg)
    types = conf["available_node_types"]
    assert set(types) == {HEAD_NODE_TYPE, "cluster", "external-a", "external-b"}
    assert types["cluster"]["labels"] == {"pool": "cluster"}
    assert types["cluster"]["resources"]["pool_cluster"] > 0
    assert (types["cluster"]["min_workers"], types["cluster"]["max_workers"]) == (3, 3)
    for name, lo, hi, gpus in (("a", 0, 5, 2), ("b", 1, 2, 8)):
        t = types[f"external-{name}"]
        assert t["labels"] == {"pool": "external", "provider": name}
        assert (t["min_workers"], t["max_workers"]) == (lo, hi)
        assert t["resources"]["GPU"] == gpus
        assert t["resources"]["pool_external"] > 0 and t["resources"][f"provider_{name}"] > 0
        assert f"provider_{name}" not in types["cluster"]["resources"]
    assert conf["max_workers"] == 3 + 5 + 2
    assert "GPU" not in types[HEAD_NODE_TYPE]["resources"]


def test_idle_timeout_and_gcs_address_come_from_config() -> None:
    cfg = load_config(None, ["pools.external.idle_timeout_s=90", "ray.gcs_port=7000"])
    conf = autoscaler_config(cfg)
    assert conf["idle_timeout_minutes"] == pytest.approx(1.5)
    assert conf["provider"]["gcs_address"] == "127.0.0.1:7000"


def test_temp_dir_is_short_and_per_state_dir(tmp_path) -> None:  # type: ignore[no-untyped-def]
    a = ray_temp_dir(load_config(None, [f"state_dir={tmp_path / 'a'}"]))
    b = ray_temp_dir(load_config(None, [f"state_dir={tmp_path / 'b'}"]))
    assert a != b
    # Ray puts unix sockets ~70 characters below its temp dir; sockets are limited to 107.
    assert len(str(a)) <= 20


@pytest.mark.parametrize(
    ("labels", "resources", "pool"),
    [
        pytest.param({"pool": "external"}, {}, "external", id="label"),
        pytest.param({}, {"pool_cluster": 1000.0}, "cluster", id="resource-fallback"),
        pytest.param({"pool": "bogus"}, {"pool_head": 1.0}, "head", id="unknown-label-falls-back"),
        pytest.param({}, {"CPU": 4.0}, "unknown", id="neither"),
    ],
)
def test_pool_of(labels: dict[str, str], resources: dict[str, float], pool: str) -> None:
    assert pool_of(labels, resources) == pool


def test_only_cluster_pool_workers_offer_the_job_driver_resource(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Job entrypoints ask for JOB_DRIVER_RESOURCE; the head (the control plane's credentials)
    and rented external nodes must not offer it, so user drivers land on cluster workers."""
    cfg = load_config(None, [f"state_dir={tmp_path}"])
    types = autoscaler_config(cfg)["available_node_types"]
    assert types["cluster"]["resources"][JOB_DRIVER_RESOURCE] == JOB_DRIVER_SLOTS_PER_NODE
    assert JOB_DRIVER_RESOURCE not in types[HEAD_NODE_TYPE]["resources"]
    assert JOB_DRIVER_RESOURCE not in types["external-rent-a"]["resources"]
    assert JOB_DRIVER_RESOURCE not in types["external-rent-b"]["resources"]
    # The head's own `ray start` (what the head really advertises) does not offer it either.
    cmd = head_command(cfg, tmp_path / "autoscaler.yaml")
    head_resources = json.loads(
        next(a for a in cmd if a.startswith("--resources=")).split("=", 1)[1]
    )
    assert JOB_DRIVER_RESOURCE not in head_resources
    assert "--num-gpus=0" in cmd
