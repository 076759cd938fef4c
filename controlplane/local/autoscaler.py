"""The local cluster's autoscaler config: Ray's fake multi-node provider plays the node groups.

Owns: the cluster config `rcp up` hands the autoscaler (`autoscaler_config`) and the fake
provider's fixed names for the head. Production maps each node type to a KubeRay worker group
(docs/architecture.md).
Must not: start anything (``controlplane.local.head_process`` writes it and starts the head
with it) or read files.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controlplane.config import Config
from controlplane.pools import JOB_DRIVER_RESOURCE, POOL_LABEL, Pool, pool_resource
from controlplane.ray_connection import gcs_address
from policies.providers import PROVIDER_LABEL, provider_resource

__all__ = [
    "FAKE_HEAD_NODE_ID",
    "HEAD_NODE_TYPE",
    "JOB_DRIVER_SLOTS_PER_NODE",
    "POOL_RESOURCE_UNITS",
    "autoscaler_config",
    "external_node_type",
    "stockout_file",
]

# The fake provider names the head's node type this way; the autoscaler requires it.
HEAD_NODE_TYPE = "ray.head.default"
# ...and reserves this node id for it.
FAKE_HEAD_NODE_ID = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"
# Every node advertises this much of its pool's resource, so work can ask for 1 unit.
POOL_RESOURCE_UNITS = 1000
# How many job drivers one `cluster` pool worker may host (each entrypoint asks for 1).
JOB_DRIVER_SLOTS_PER_NODE = 16


def stockout_file(cfg: Config) -> Path:
    """Where `rcp fault stockout` names the providers that launch nothing (local only)."""
    return cfg.state_path / "stockouts.json"


def external_node_type(provider: str) -> str:
    """The node type of an external provider's nodes, e.g. ``external-rent-a``."""
    return f"{Pool.EXTERNAL.value}-{provider}"


def autoscaler_config(cfg: Config, serve_proxy_ports: Sequence[int] = ()) -> dict[str, Any]:
    """The Ray cluster config the autoscaler (fake multi-node provider) runs: the head,
    `cluster` (min = max = num_nodes: replaced only when a node dies) and one node type per
    external provider (``external-<name>``, min_nodes..max_nodes, advertising
    ``provider_<name>`` so a capacity request names the provider that rents). Each worker
    node's Serve proxy gets one of `serve_proxy_ports` (``controlplane.local.provider``)."""
    c, e = cfg.pools.cluster, cfg.pools.external
    return {
        "cluster_name": "rcp-local",
        "max_workers": c.num_nodes + e.max_nodes,
        "upscaling_speed": 1.0 + e.max_nodes,
        "idle_timeout_minutes": e.idle_timeout_s / 60.0,
        "provider": {
            # Ray's own fake multi-node provider, loaded as an "external" provider (the
            # `fake_multinode` type needs a defaults file, example.yaml, the wheel lacks), with
            # a Serve proxy port per node (ours: controlplane.local.provider).
            "type": "external",
            "module": "controlplane.local.provider.ProxyPortNodeProvider",
            "serve_proxy_ports": [int(p) for p in serve_proxy_ports],
            "gcs_address": gcs_address(cfg),
            "launch_multiple": True,
            "head_node_id": FAKE_HEAD_NODE_ID,
            # `rcp fault stockout`: the providers that launch nothing for now.
            "stockout_file": str(stockout_file(cfg)),
        },
        "auth": {"ssh_user": "rcp"},
        "head_node_type": HEAD_NODE_TYPE,
        "available_node_types": {
            HEAD_NODE_TYPE: {
                "resources": {
                    "CPU": cfg.head.num_cpus,
                    pool_resource(Pool.HEAD): POOL_RESOURCE_UNITS,
                },
                "labels": {POOL_LABEL: Pool.HEAD.value},
                "node_config": {},
                "max_workers": 0,
            },
            Pool.CLUSTER.value: {
                "resources": {
                    "CPU": c.cpus_per_node,
                    "GPU": c.gpus_per_node,
                    pool_resource(Pool.CLUSTER): POOL_RESOURCE_UNITS,
                    # Job drivers run here only: not on the head (the control plane's
                    # credentials), not on rented external nodes (scaled by demand).
                    JOB_DRIVER_RESOURCE: JOB_DRIVER_SLOTS_PER_NODE,
                },
                "labels": {POOL_LABEL: Pool.CLUSTER.value},
                "node_config": {},
                "min_workers": c.num_nodes,
                "max_workers": c.num_nodes,
            },
            **{
                external_node_type(p.name): {
                    "resources": {
                        "CPU": p.cpus_per_node,
                        "GPU": p.gpus_per_node,
                        pool_resource(Pool.EXTERNAL): POOL_RESOURCE_UNITS,
                        # A capacity request that carries it launches this provider's nodes.
                        provider_resource(p.name): POOL_RESOURCE_UNITS,
                    },
                    "labels": {POOL_LABEL: Pool.EXTERNAL.value, PROVIDER_LABEL: p.name},
                    "node_config": {},
                    "min_workers": p.min_nodes,
                    "max_workers": p.max_nodes,
                }
                for p in e.providers
            },
        },
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }
