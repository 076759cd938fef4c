"""Integration fixtures: a real embedded cluster (`rcp up`) on free loopback ports.

One cluster per test module (module scope); each gets its own state dir, so modules never
share or stop each other's processes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from controlplane.config import Config, load_config
from controlplane.local.cluster import LocalCluster, free_loopback_ports, isolated_overrides
from controlplane.ray_connection import ray_token_path

T = TypeVar("T")


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float = 120.0) -> T:
    """`check()`'s first truthy answer, polled every 0.5 s; fails naming `what` and the last
    answer after `timeout_s`. Every integration wait goes through here: bounded, never timed."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {last!r}")


def ray_auth_headers(cfg: Config) -> dict[str, str]:
    """Headers for a request to the cluster's dashboard (it runs with Ray token auth; Ray's own
    clients in this process already send them once `connect` ran)."""
    return {"Authorization": "Bearer " + ray_token_path(cfg).read_text().strip()}


free_ports = free_loopback_ports
local_overrides = isolated_overrides


def start_local_cluster(
    tmp_path_factory: pytest.TempPathFactory, *extra: str, config_file: Path | None = None
) -> tuple[Config, LocalCluster]:
    state_dir = tmp_path_factory.mktemp("rcp-state")
    cfg = load_config(config_file, local_overrides(state_dir, *extra))
    cluster = LocalCluster(cfg)
    cluster.up(echo=lambda _line: None)
    return cfg, cluster


def two_replica_sample_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config file serving the sample model as exactly 2 one-GPU replicas (the modules
    that watch replicas move between pools)."""
    conf = tmp_path_factory.mktemp("serving-conf") / "rcp.yaml"
    conf.write_text(
        "serving:\n"
        "  models:\n"
        "    - name: sample\n"
        "      min_replicas: 2\n"
        "      max_replicas: 2\n"
        "      num_gpus: 1\n"
        "      num_cpus: 0.5\n"
        "      graceful_shutdown_timeout_s: 5\n"
    )
    return conf


@pytest.fixture(scope="module")
def local_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Config, LocalCluster]]:
    """A running embedded cluster with default pools; stopped after the module."""
    cfg, cluster = start_local_cluster(tmp_path_factory)
    try:
        yield cfg, cluster
    finally:
        cluster.down(echo=lambda _line: None)
