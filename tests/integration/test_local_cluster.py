"""`rcp up` / `rcp nodes` / `rcp down` against a real embedded cluster (real Ray, real
autoscaler with its fake multi-node provider, real S3-protocol server on loopback).

The CLI runs as a subprocess, as a user would run it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from controlplane.local.processes import find_cluster_processes
from tests.integration.conftest import local_overrides

pytestmark = pytest.mark.integration

IDLE_TIMEOUT_S = 8


def rcp(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    return subprocess.run(
        [sys.executable, "-m", "controlplane", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[str], str]]:
    state_dir: Path = tmp_path_factory.mktemp("rcp-cli")
    overrides = local_overrides(state_dir, f"pools.external.idle_timeout_s={IDLE_TIMEOUT_S}")
    result = rcp("up", *overrides)
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        yield overrides, result.stdout
    finally:
        rcp("down", *overrides)


def endpoint_lines(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        name, sep, url = line.partition(": ")
        if sep and name in {"storage", "dashboard", "ray", "metrics", "serve", "api"}:
            out[name] = url
    return out


def nodes_json(overrides: list[str]) -> list[dict[str, object]]:
    result = rcp("nodes", "--json", *overrides, timeout_s=120)
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, object]] = json.loads(result.stdout)
    return rows


def test_up_prints_each_endpoint_on_loopback(cluster: tuple[list[str], str]) -> None:
    _, stdout = cluster
    endpoints = endpoint_lines(stdout)
    assert {"storage", "dashboard", "ray", "metrics", "serve"} <= set(endpoints)
    for url in endpoints.values():
        assert "127.0.0.1:" in url
    # Every listener that a process of this cluster opened is on loopback.
    state_dir = next(o.split("=", 1)[1] for o in cluster[0] if o.startswith("state_dir="))
    state = json.loads((Path(state_dir) / "local-cluster.json").read_text())
    procs = find_cluster_processes(state["cluster_id"], [state["temp_dir"]])
    listeners = set()
    for p in procs:
        try:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    listeners.add(c.laddr.ip)
        except psutil.Error:
            pass
    assert listeners, "found no listening sockets of the cluster"

    def loopback(ip: str) -> bool:
        addr = ipaddress.ip_address(ip)
        mapped = getattr(addr, "ipv4_mapped", None)
        return bool((mapped or addr).is_loopback)

    assert all(loopback(ip) for ip in listeners), listeners


def test_nodes_shows_head_and_fixed_cluster_pool_and_no_external(
    cluster: tuple[list[str], str],
) -> None:
    rows = nodes_json(cluster[0])
    pools = sorted(str(r["pool"]) for r in rows)
    assert pools == ["cluster", "cluster", "head"]
    for r in rows:
        assert r["state"] == "ALIVE"
        assert r["labels"] == {"pool": r["pool"]}
        if r["pool"] == "cluster":
            assert r["gpus_total"] == 4.0
        else:
            assert r["gpus_total"] == 0.0


def test_second_up_is_a_no_op(cluster: tuple[list[str], str]) -> None:
    overrides, first_stdout = cluster
    before = {r["node_id"] for r in nodes_json(overrides)}
    result = rcp("up", *overrides)
    assert result.returncode == 0, result.stderr
    assert "already running" in result.stdout
    assert endpoint_lines(result.stdout) == endpoint_lines(first_stdout)
    assert {r["node_id"] for r in nodes_json(overrides)} == before


def test_external_demand_adds_a_node_within_60s_which_leaves_when_idle(
    cluster: tuple[list[str], str],
) -> None:
    overrides = cluster[0]
    script = f"""
import json, time, ray
from controlplane.config import load_config
from controlplane.local.cluster import connect
connect(load_config(None, {overrides!r}))

@ray.remote(num_gpus=1, resources={{"pool_external": 1}})
def where():
    return ray.get_runtime_context().get_node_id()

t0 = time.monotonic()
node = ray.get(where.remote(), timeout=60)
print(json.dumps({{"node": node, "seconds": time.monotonic() - t0}}))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    placed = json.loads(result.stdout.strip().splitlines()[-1])
    assert placed["seconds"] < 60
    rows = {r["node_id"]: r for r in nodes_json(overrides)}
    assert placed["node"] in rows, "the task ran on a node that is not listed"
    assert rows[placed["node"]]["pool"] == "external"
    assert rows[placed["node"]]["gpus_total"] == 2.0

    deadline = time.monotonic() + IDLE_TIMEOUT_S + 60
    while time.monotonic() < deadline:
        if not any(r["pool"] == "external" for r in nodes_json(overrides)):
            break
        time.sleep(2)
    assert not any(r["pool"] == "external" for r in nodes_json(overrides)), "external node stayed"


def test_down_stops_everything_up_started_and_nothing_else(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    state_dir = tmp_path_factory.mktemp("rcp-down")
    overrides = local_overrides(state_dir, "pools.cluster.num_nodes=1", "storage.embedded=false")
    # A process that looks like Ray but is not ours must survive `down`.
    decoy = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", "raylet", "gcs_server"],
    )
    try:
        result = rcp("up", *overrides)
        assert result.returncode == 0, result.stderr
        state = json.loads((state_dir / "local-cluster.json").read_text())
        assert find_cluster_processes(state["cluster_id"], [state["temp_dir"]])

        result = rcp("down", *overrides)
        assert result.returncode == 0, result.stderr
        assert "stopped cluster" in result.stdout
        assert find_cluster_processes(state["cluster_id"], [state["temp_dir"]]) == []
        assert not (state_dir / "local-cluster.json").exists()
        assert decoy.poll() is None, "down stopped a process it did not start"

        again = rcp("down", *overrides)
        assert again.returncode == 0
        assert "nothing to stop" in again.stdout
        nodes = rcp("nodes", *overrides)
        assert nodes.returncode == 1
        assert "no local cluster is running" in nodes.stderr
    finally:
        decoy.kill()
