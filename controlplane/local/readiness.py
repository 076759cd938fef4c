"""Waiting for the local cluster's parts to come up, each wait with a deadline.

Owns: `wait_until` (a condition polled until a deadline), `wait_for_port` (a listener on a
port) and `wait_for_cluster_pool` (the ``cluster`` pool's nodes alive in Ray). A wait that
runs out raises `ClusterError` naming what it waited for.
Must not: start or stop anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from controlplane.config import Config
from controlplane.local.ports import port_in_use
from controlplane.pools import POOL_LABEL, Pool
from controlplane.ray_connection import ClusterError

__all__ = ["wait_for_cluster_pool", "wait_for_port", "wait_until"]


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(poll_s)
    raise ClusterError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def wait_for_port(host: str, port: int, timeout_s: float, what: str) -> None:
    """Until something listens on `host`:`port`; `what` names it in the timeout's message."""
    wait_until(lambda: port_in_use(host, port), timeout_s, f"{what} on {host}:{port}")


def wait_for_cluster_pool(cfg: Config) -> None:
    """Until ``pools.cluster.num_nodes`` nodes of the ``cluster`` pool are alive in Ray (this
    process is connected as a driver)."""
    import ray  # deferred: ray is heavy and optional here

    want = cfg.pools.cluster.num_nodes

    def ready() -> bool:
        alive = [
            n
            for n in ray.nodes()
            if n["Alive"] and n.get("Labels", {}).get(POOL_LABEL) == Pool.CLUSTER.value
        ]
        return len(alive) >= want

    wait_until(ready, cfg.ray.ready_timeout_s, f"{want} `cluster` pool node(s) to join")
