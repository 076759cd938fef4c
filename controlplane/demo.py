"""`rcp demo`: the product's main job on the embedded default, end to end.

Owns: the sequence of steps and what it prints. Every step calls the same functions the
individual commands call; nothing here is demo-only logic.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from controlplane.config import Config
from controlplane.inventory import format_table, list_nodes
from controlplane.local.cluster import LocalCluster, connect
from controlplane.pools import Pool, pool_resource

Echo = Callable[[str], None]


def _section(echo: Echo, title: str) -> None:
    echo("")
    echo(f"== {title}")


def burst_on_external_pool(echo: Echo, timeout_s: float = 120.0) -> str:
    """Run one task that needs an external-pool GPU; return the node it ran on."""
    import ray

    @ray.remote(num_gpus=1, resources={pool_resource(Pool.EXTERNAL): 1})
    def where() -> str:
        return str(ray.get_runtime_context().get_node_id())

    t0 = time.monotonic()
    node_id = str(ray.get(where.remote(), timeout=timeout_s))
    echo(f"the autoscaler added external node {node_id[-12:]} in {time.monotonic() - t0:.1f}s")
    return node_id


def run_demo(cfg: Config, keep: bool = False, echo: Echo = print) -> None:
    cluster = LocalCluster(cfg)
    _section(echo, "up")
    cluster.up(echo=echo)
    try:
        connect(cluster.running_config() or cfg)
        _section(echo, "nodes")
        echo(format_table(list_nodes()))
        _section(echo, "external pool scales from zero on demand")
        burst_on_external_pool(echo)
        echo(format_table(list_nodes()))
    finally:
        if not keep:
            _section(echo, "down")
            cluster.down(echo=echo)
