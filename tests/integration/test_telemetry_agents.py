"""Telemetry agents on a real local cluster: one per node, fault injection, health verdicts,
and a real Prometheus server scraping the agents' endpoints.

The agents sample every `telemetry.interval_s` (1 s by default). Waits are bounded by
deadlines and the assertions are about samples and values, never about how long things took.

The cluster runs with ``health.act=false``: the controller reports verdicts but does not take
the nodes this module injects faults into out of service (test_node_health.py covers that).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from controlplane.cli import cli
from controlplane.config import Config
from controlplane.local.cluster import LocalCluster
from controlplane.telemetry import manager
from controlplane.telemetry.simulated import HOT_GPU_TEMP_C
from controlplane.telemetry.verdicts import node_sample
from policies.health import HealthReason, HealthState, Verdict, evaluate
from tests.integration.conftest import free_ports, start_local_cluster, wait_for

pytestmark = pytest.mark.integration


def alive_nodes() -> dict[str, dict[str, Any]]:
    import ray

    return {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}


@pytest.fixture(scope="module")
def local_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Config, LocalCluster]]:
    """The default cluster, with the controller only reporting health (see the module doc)."""
    cfg, cluster = start_local_cluster(
        tmp_path_factory, "health.act=false", "pools.external.idle_timeout_s=8"
    )
    try:
        yield cfg, cluster
    finally:
        cluster.down(echo=lambda _line: None)


@pytest.fixture(scope="module")
def agents(local_cluster: tuple[Config, LocalCluster]) -> Iterator[dict[str, dict[str, Any]]]:
    """Agents on every node, each with at least one sample; `info()` by node id."""
    cfg, _cluster = local_cluster
    manager.ensure_agents(cfg)

    def all_sampling() -> dict[str, dict[str, Any]] | None:
        infos = manager.agent_endpoints(timeout_s=10)
        ready = set(alive_nodes()) <= set(infos) and all(i["samples"] >= 1 for i in infos.values())
        return infos if ready else None

    infos = wait_for("an agent on every node, sampling", all_sampling, timeout_s=180)
    yield infos  # the cluster (and with it every agent) goes down after the module


def cluster_node_ids(infos: dict[str, dict[str, Any]]) -> list[str]:
    return sorted(n for n, i in infos.items() if i["pool"] == "cluster")


def test_one_agent_per_node_each_on_its_own_loopback_port(
    local_cluster: tuple[Config, LocalCluster], agents: dict[str, dict[str, Any]]
) -> None:
    cfg, _ = local_cluster
    nodes = alive_nodes()
    assert set(agents) == set(nodes)
    assert {i["pool"] for i in agents.values()} >= {"head", "cluster"}
    assert len(cluster_node_ids(agents)) == cfg.pools.cluster.num_nodes
    ports = [i["exporter_port"] for i in agents.values()]
    assert len(set(ports)) == len(ports), f"agents share a port: {ports}"
    assert {i["exporter_host"] for i in agents.values()} == {"127.0.0.1"}
    # a second call starts nothing new
    assert not any(ref.started for ref in manager.ensure_agents(cfg))
    # every agent is pinned to its node: its GPUs are the node's GPUs
    summaries = manager.collect_summaries()
    for node_id, s in summaries.items():
        assert len(s["gpus"]) == int(nodes[node_id]["Resources"].get("GPU", 0))
    for node_id, info in agents.items():
        text = urllib.request.urlopen(info["exporter_url"], timeout=10).read().decode()
        assert f'rcp_telemetry_sample_seq{{node="{node_id}"' in text


def test_hot_gpu_makes_the_node_unhealthy_within_two_samples(
    local_cluster: tuple[Config, LocalCluster], agents: dict[str, dict[str, Any]]
) -> None:
    cfg, _ = local_cluster
    hot, other = cluster_node_ids(agents)[:2]
    limits = cfg.health

    before = manager.collect_samples()
    verdicts, state = evaluate(
        {n: [node_sample(s) for s in ss] for n, ss in before.items()}, limits, HealthState(), 0.0
    )
    assert verdicts[hot].verdict is Verdict.HEALTHY, verdicts[hot].reason

    injected = manager.inject_fault(hot, "hot-gpu")
    after_seq = injected["after_seq"]

    def two_new_samples() -> list[dict[str, Any]] | None:
        samples = manager.collect_samples()[hot]
        new = [s for s in samples if s["seq"] > after_seq]
        return new[:2] if len(new) >= 2 else None

    first, second = wait_for("two samples after the injection", two_new_samples)
    assert first["gpus"][0]["temp_c"] == HOT_GPU_TEMP_C
    seen = []
    for i, s in enumerate((first, second), start=1):
        verdicts, state = evaluate({hot: [node_sample(s)]}, limits, state, float(i))
        seen.append(verdicts[hot].verdict)
    assert seen[-1] is Verdict.UNHEALTHY, verdicts[hot].reason
    assert HealthReason.GPU_OVERHEATED in verdicts[hot].reasons
    assert f"gpu 0 at {HOT_GPU_TEMP_C:g} C" in verdicts[hot].reason

    # the other cluster node is untouched
    latest_other = manager.collect_samples()[other]
    verdicts, _ = evaluate(
        {other: [node_sample(s) for s in latest_other]}, limits, HealthState(), 0.0
    )
    assert verdicts[other].verdict is Verdict.HEALTHY, verdicts[other].reason


def test_cli_fault_inject_health_and_nodes(
    local_cluster: tuple[Config, LocalCluster], agents: dict[str, dict[str, Any]]
) -> None:
    cfg, _ = local_cluster
    target = cluster_node_ids(agents)[-1]
    runner = CliRunner()
    args = ["--state-dir", str(cfg.state_dir)]
    out = runner.invoke(cli, ["fault", "inject", target[-12:], "ib-link-down", *args])
    assert out.exit_code == 0, out.output
    assert f"node {target}: injected ib-link-down" in out.output

    bad = runner.invoke(cli, ["fault", "inject", "no-such-node", "xid", *args])
    assert bad.exit_code == 2 and "no node matches 'no-such-node'" in bad.output

    def serving_only_row() -> dict[str, Any] | None:
        res = runner.invoke(cli, ["health", "--json", *args])
        assert res.exit_code == 0, res.output
        rows = {r["node_id"]: r for r in json.loads(res.output)}
        row = rows[target]
        # A link down is a fabric fault alone: the node is kept for serving (issue 16).
        return row if row["verdict"] == "serving_only" else None

    row = wait_for("rcp health to report the link down", serving_only_row, timeout_s=60)
    assert "ib_link_down" in row["reasons"] and "ib-link-down" in row["faults"]
    text = runner.invoke(cli, ["health", *args])
    assert text.exit_code == 0, text.output
    (line,) = [ln for ln in text.output.splitlines() if ln.startswith(target[-12:])]
    assert "serving_only" in line and "ib_link_down" in line and "mlx5_0/1 down" in line

    res = runner.invoke(cli, ["nodes", "--json", *args])
    assert res.exit_code == 0, res.output
    nodes = {r["node_id"]: r for r in json.loads(res.output)}
    assert nodes[target]["health"] == "serving_only"
    assert nodes[target]["gpu_temp_max_c"] is not None
    assert nodes[target]["tensor_active_ratio"] is not None
    table = runner.invoke(cli, ["nodes", *args]).output
    assert "HEALTH" in table and "IB ERR/S" in table

    assert runner.invoke(cli, ["fault", "inject", target, "clear", *args]).exit_code == 0


def test_prometheus_scrapes_agents_and_promql_returns_injected_temperature(
    agents: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is not installed (Debian: apt-get install prometheus)")
    hot = cluster_node_ids(agents)[0]
    manager.inject_fault(hot, "hot-gpu")
    file_sd = manager.prometheus_file_sd(agents)
    targets = [t for group in file_sd for t in group["targets"]]
    (tmp_path / "targets.json").write_text(json.dumps(file_sd))
    (tmp_path / "prometheus.yml").write_text(
        json.dumps(  # JSON is YAML
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "rcp-telemetry",
                        "file_sd_configs": [
                            {"files": [str(tmp_path / "targets.json")], "refresh_interval": "5s"}
                        ],
                    }
                ],
            }
        )
    )
    (port,) = free_ports(1)
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def query(promql: str) -> list[dict[str, Any]] | None:
            if proc.poll() is not None:
                raise AssertionError(
                    f"prometheus exited with {proc.returncode}: "
                    + (tmp_path / "prometheus.log").read_text()[-2000:]
                )
            url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode(
                {"query": promql}
            )
            try:
                body = json.loads(urllib.request.urlopen(url, timeout=5).read())
            except OSError:
                return None
            assert body["status"] == "success", body
            return body["data"]["result"] or None

        temp = f'DCGM_FI_DEV_GPU_TEMP{{node="{hot}",gpu="0",pool="cluster"}}'
        (result,) = wait_for("prometheus to return the injected temperature", lambda: query(temp))
        assert float(result["value"][1]) == HOT_GPU_TEMP_C
        assert result["metric"]["rcp_node"] == hot  # the file_sd target label came through
        ups = wait_for(
            "every agent scraped",
            lambda: (r := query('up{job="rcp-telemetry"} == 1')) and len(r) == len(targets) and r,
        )
        assert len(ups) == len(targets)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_busy_external_node_gets_an_agent_and_idle_one_still_scales_to_zero(
    local_cluster: tuple[Config, LocalCluster], agents: dict[str, dict[str, Any]]
) -> None:
    import ray

    cfg, _ = local_cluster

    @ray.remote(num_gpus=1, resources={"pool_external": 1})
    class Holder:
        def node(self) -> str:
            return str(ray.get_runtime_context().get_node_id())

    holder = Holder.remote()  # type: ignore[attr-defined]
    external = ray.get(holder.node.remote(), timeout=180)
    refs = {r.node_id: r for r in manager.ensure_agents(cfg)}
    # Started by this call or already by the controller's tick (it ensures agents each tick).
    assert refs[external].pool == "external" and not refs[external].idle_external

    def sampling() -> dict[str, Any] | None:
        info = manager.agent_endpoints(timeout_s=10).get(external)
        return info if info and info["samples"] >= 1 else None

    info = wait_for("an agent on the new external node", sampling)
    assert info["pool"] == "external"
    summary = manager.collect_summaries()[external]
    assert len(summary["gpus"]) == cfg.pools.external.gpus_per_node

    ray.kill(holder)

    def stopped_while_idle() -> bool:
        ref = {r.node_id: r for r in manager.ensure_agents(cfg)}.get(external)
        if ref is None:  # already removed: only possible with no agent keeping it busy
            return external not in alive_nodes()
        return ref.idle_external and external not in manager.find_agents()

    wait_for("the agent on the idle external node to stop", stopped_while_idle, timeout_s=60)

    def removed() -> bool:
        manager.ensure_agents(cfg)  # as the policy actor does every tick
        return external not in alive_nodes()

    wait_for(
        "the idle external node to be removed",
        removed,
        timeout_s=cfg.pools.external.idle_timeout_s + 180,
    )
