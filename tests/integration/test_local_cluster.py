"""`rcp up` / `rcp nodes` / `rcp down` against a real embedded cluster (real Ray, real
autoscaler with its fake multi-node provider, real S3-protocol server on loopback), and the
telemetry agents on it: one per node, fault injection, health verdicts, and a real
Prometheus server scraping the agents' endpoints.

The CLI runs as a subprocess, as a user would run it. The module's one cluster (the default
pools) runs with ``health.act=false``: the controller reports verdicts but does not take the
nodes the telemetry tests inject faults into out of service (test_node_health.py covers
that). The telemetry tests connect this process to the cluster as a Ray driver; the agents
sample every `telemetry.interval_s` (1 s by default). Waits are bounded by deadlines and the
assertions are about samples and values, never about how long things took. The in-process
controller test takes the cluster's store over, so it runs after the others on it; the last
test brings up and stops a cluster of its own.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from controlplane.cli import cli
from controlplane.config import Config, load_config
from controlplane.local.autoscaler import JOB_DRIVER_SLOTS_PER_NODE
from controlplane.local.cluster import LocalCluster
from controlplane.local.processes import find_cluster_processes
from controlplane.pools import JOB_DRIVER_RESOURCE
from controlplane.ray_connection import connect
from controlplane.sdk import AuthError, Client, Forbidden
from controlplane.telemetry import manager
from controlplane.telemetry.simulated import HOT_GPU_TEMP_C
from controlplane.telemetry.verdicts import node_sample
from policies.health import HealthReason, HealthState, Verdict, evaluate
from tests.integration.conftest import (
    free_ports,
    local_overrides,
    ray_auth_headers,
    wait_for,
)

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
    """The module's one cluster, started as a user would (``rcp up``). Stopped in this
    process (`LocalCluster.down` never stops its caller): an ``rcp down`` in a subprocess
    would count this process as the cluster's once the telemetry tests made it a Ray driver
    (the driver's log files stay open under the cluster's temp dir)."""
    state_dir: Path = tmp_path_factory.mktemp("rcp-cli")
    overrides = local_overrides(
        state_dir, "health.act=false", f"pools.external.idle_timeout_s={IDLE_TIMEOUT_S}"
    )
    result = rcp("up", *overrides)
    assert result.returncode == 0, result.stdout + result.stderr
    try:
        yield overrides, result.stdout
    finally:
        LocalCluster(load_config(None, overrides)).down(echo=lambda _line: None)


def endpoint_lines(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        name, sep, url = line.partition(": ")
        if sep and name in {"storage", "dashboard", "ray", "metrics", "serve", "api"}:
            out[name] = url
    return out


def nodes_json(overrides: list[str]) -> list[dict[str, object]]:
    result = rcp("nodes", "--json", "--state-dir", str(state_dir_of(overrides)), timeout_s=120)
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


def state_dir_of(overrides: list[str]) -> Path:
    return Path(next(o.split("=", 1)[1] for o in overrides if o.startswith("state_dir=")))


def run_python(script: str, env: dict[str, str], timeout_s: float = 60) -> tuple[int, str]:
    """(exit code, output) of `script` in a fresh interpreter; a hang counts as a failure."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    return result.returncode, result.stdout + result.stderr


def test_job_drivers_can_land_on_cluster_workers_only(cluster: tuple[list[str], str]) -> None:
    overrides = cluster[0]
    script = f"""
import json, ray
from controlplane.config import load_config
from controlplane.ray_connection import connect
connect(load_config(None, {overrides!r}))
print(json.dumps([
    [n["Labels"].get("pool"), n["Resources"].get({JOB_DRIVER_RESOURCE!r}, 0)]
    for n in ray.nodes() if n["Alive"]
]))
"""
    code, out = run_python(script, dict(os.environ))
    assert code == 0, out[-2000:]
    offered = json.loads(out.strip().splitlines()[-1])
    assert sorted(offered) == [
        ["cluster", JOB_DRIVER_SLOTS_PER_NODE],
        ["cluster", JOB_DRIVER_SLOTS_PER_NODE],
        ["head", 0],
    ]


def test_state_dir_is_0700_and_every_state_file_0600(cluster: tuple[list[str], str]) -> None:
    state_dir = state_dir_of(cluster[0])
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    files = [p for p in state_dir.iterdir() if p.is_file()]
    names = {p.name for p in files}
    # The controller (a Ray actor) wrote the database and the API files: the cluster's own
    # processes create owner-only files too.
    want = {"ray-token", "api-token", "api-url", "controlplane.db", "local-cluster.json"}
    assert want <= names
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {
        p.name: "0o600" for p in files
    }


def test_no_output_or_log_carries_the_ray_token(cluster: tuple[list[str], str]) -> None:
    overrides, stdout = cluster
    state_dir = state_dir_of(overrides)
    token = (state_dir / "ray-token").read_text().strip()
    assert len(token) == 64
    assert token not in stdout
    assert str(state_dir / "ray-token") in stdout  # where to find it, instead
    state = json.loads((state_dir / "local-cluster.json").read_text())
    logs = [*(state_dir / "logs").rglob("*"), *Path(state["temp_dir"]).rglob("logs/**/*")]
    searched = 0
    for path in logs:
        if path.is_file() and not path.is_symlink():
            searched += 1
            assert token.encode() not in path.read_bytes(), path
    assert searched > 10, "found no logs to search"


def test_a_client_without_the_ray_token_is_refused(cluster: tuple[list[str], str]) -> None:
    """On loopback, too: another local user cannot submit Ray jobs around the API token."""
    overrides = cluster[0]
    cfg = load_config(None, overrides)
    jobs_url = f"http://{cfg.ray.node_ip}:{cfg.ray.dashboard_port}/api/jobs/"

    def status(headers: dict[str, str]) -> int:
        req = urllib.request.Request(jobs_url, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    assert status({}) == 401
    assert status({"Authorization": "Bearer " + "0" * 64}) == 403
    assert status(ray_auth_headers(cfg)) == 200

    # A Ray driver: without a token, and with a wrong one, it cannot join; with it, it can.
    # HOME is empty so Ray's default token file (~/.ray/auth_token) is not found either.
    home = state_dir_of(overrides).parent / "empty-home"
    home.mkdir(exist_ok=True)
    bare = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")} | {
        "HOME": str(home)
    }
    init = f"""
import ray
ray.init(address={f"{cfg.ray.node_ip}:{cfg.ray.gcs_port}"!r}, logging_level="ERROR")
print("nodes", len(ray.nodes()))
"""
    # The three drivers try at once (a refused one spends most of its time waiting).
    envs = {
        "no token": bare,
        "a wrong token": bare | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64},
        "the token": bare
        | {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(state_dir_of(overrides) / "ray-token"),
        },
    }
    with ThreadPoolExecutor(len(envs)) as pool:
        runs = dict(
            zip(envs, pool.map(lambda env: run_python(init, env, 60), envs.values()), strict=True)
        )
    for what in ("no token", "a wrong token"):
        code, out = runs[what]
        assert code != 0, f"joined with {what}: {out[-1000:]}"
    code, out = runs["the token"]
    assert code == 0 and "nodes 3" in out, out[-2000:]


def test_second_up_is_a_no_op(cluster: tuple[list[str], str]) -> None:
    overrides, first_stdout = cluster
    before = {r["node_id"] for r in nodes_json(overrides)}
    result = rcp("up", *overrides)
    assert result.returncode == 0, result.stderr
    assert "already running" in result.stdout
    assert endpoint_lines(result.stdout) == endpoint_lines(first_stdout)
    assert {r["node_id"] for r in nodes_json(overrides)} == before


def test_an_admin_adds_a_researcher_who_submits_and_cancels_over_the_url_audited(
    cluster: tuple[list[str], str], tmp_path: Path
) -> None:
    """The admin's token is the one `rcp up` wrote; the researcher's `rcp` knows only the URL
    and their own token (an empty state dir), and every change names who made it."""
    overrides, stdout = cluster
    url = endpoint_lines(stdout)["api"]
    state = state_dir_of(overrides)
    admin = Client(url, (state / "api-token").read_text().strip())
    assert admin.whoami()["role"] == "admin"
    token = admin.users_add("res-one", "researcher", ["default"]).token
    assert token is not None
    env = {
        **os.environ,
        "RCP_API_URL": url,
        "RCP_API_TOKEN": token,
        "RCP_STATE_DIR": str(tmp_path / "nothing-here"),
    }

    def as_researcher(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "controlplane", *args],
            capture_output=True, text=True, timeout=120, env=env, check=False,
        )  # fmt: skip

    sleeper = ("python", "-c", "import time; time.sleep(600)")  # still running at the cancel
    submitted = as_researcher("submit", "--json", "--name", "audited", "--", *sleeper)
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]
    with pytest.raises(Forbidden, match="manage-users"):
        Client(url, token).users_add("sneaky", "admin")
    # Someone else's job: the researcher may see the queue, not cancel it; a wrong token gets
    # 401, not a guess at a role.
    theirs = admin.submit(
        {"name": "not-theirs", "entrypoint": 'python -c "import time; time.sleep(600)"'}
    ).id
    try:
        with pytest.raises(Forbidden) as refused:
            Client(url, token).cancel(theirs)
        assert refused.value.status == 403, refused.value
        assert admin.status(theirs).state != "CANCELLED"
        with pytest.raises(AuthError) as wrong:
            Client(url, "0" * 64).status(theirs)
        assert wrong.value.status == 401 and not isinstance(wrong.value, Forbidden), wrong.value
    finally:
        admin.cancel(theirs)
    cancelled = as_researcher("cancel", job_id)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout, cancelled.stderr
    queue = rcp("queue", "--all", "--json", "--state-dir", str(state))
    assert {j["id"]: j["owner"] for j in json.loads(queue.stdout)}[job_id] == "res-one"
    events = json.loads(
        rcp("events", "--json", "--limit", "10000", "--state-dir", str(state)).stdout
    )
    audit = [
        (e["kind"], e["data"]["status"])
        for e in events
        if e["kind"].startswith("audit.") and e["data"].get("user") == "res-one"
    ]
    assert audit == [
        ("audit.jobs.submit", 201),
        ("audit.users.add", 403),
        ("audit.jobs.cancel", 403),
        ("audit.jobs.cancel", 200),
    ]


def test_every_operator_command_works_given_only_the_url_and_a_token(
    cluster: tuple[list[str], str], tmp_path: Path
) -> None:
    """Issue 15's front door: from a process whose HOME and state dir hold nothing (no
    local-cluster.json, no Ray token), each operator command reaches the cluster through the
    API alone (`--url` and RCP_API_TOKEN, here the admin's: the role matrix is the users
    tests'), and what it changes shows in the next listing and the event log."""
    overrides, stdout = cluster
    url = endpoint_lines(stdout)["api"]
    token = (state_dir_of(overrides) / "api-token").read_text().strip()
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RCP_", "RAY_"))}
    env.update(HOME=str(home), RCP_STATE_DIR=str(home / "no-state"), RCP_API_TOKEN=token)

    def remote(*args: str, code: int | None = 0) -> str:
        """The command's output; its exit status must be `code` (None: any)."""
        result = subprocess.run(
            [sys.executable, "-m", "controlplane", *args, "--url", url],
            capture_output=True, text=True, timeout=120, env=env, check=False,
        )  # fmt: skip
        assert code is None or result.returncode == code, (args, result.stdout, result.stderr)
        return result.stdout + result.stderr

    rows = json.loads(remote("nodes", "--json"))
    assert sorted(r["pool"] for r in rows) == ["cluster", "cluster", "head"]
    node = next(r["node_id"] for r in rows if r["pool"] == "cluster")
    assert node[-12:] in remote("nodes")
    # The controller judges every node from its telemetry agent's samples each tick.
    health = wait_for(
        "a health verdict for the cluster node",
        lambda: (h := remote("health")).startswith("NODE") and node[-12:] in h and h,
        120,
    )
    assert "no verdicts yet" not in health
    assert isinstance(json.loads(remote("health", "--json")), list)
    assert "breaker:  closed" in remote("health", "breaker")
    assert json.loads(remote("health", "breaker", "--json"))["window_s"] > 0

    try:  # the later tests share this cluster's store: never leave it paused or cordoned
        assert "paused by admin: sweep" in remote("policy", "pause", "--reason", "sweep")
        assert "PAUSED by admin" in remote("serve", "status")
        served = json.loads(remote("serve", "status", "--json"))
        assert served["policy"]["paused"] is True
        assert "cordoned by admin: sweep" in remote("cordon", node[-12:], "--reason", "sweep")
        cordoned = {r["node_id"]: r["cordon"] for r in json.loads(remote("nodes", "--json"))}
        assert cordoned[node]["reason"] == "sweep"
        assert f"node {node}: uncordoned" in remote("uncordon", node[-12:])
        assert "is not cordoned by hand" in remote("uncordon", node[-12:], code=2)
    finally:
        remote("uncordon", node[-12:], code=None)
        resumed = remote("policy", "resume", "--reason", "sweep done", code=None)
    assert "resumed (paused by admin: sweep)" in resumed
    assert json.loads(remote("policy", "status", "--json"))["paused"] is False
    # This module serves no model (serve.deploy_app=false): a pin names what is served.
    assert served["deployed"] is False
    refused = remote("serve", "pin", "sample", "--pool", "cluster", code=2)
    assert "no served model 'sample'; models: none" in refused

    assert "injected clear" in remote("fault", "inject", node[-12:], "clear")
    assert "no node matches" in remote("fault", "inject", "no-such-node", "xid", code=2)
    # The node has a health record (it was judged above): clearing it answers so.
    assert f"node {node}: lemon record cleared" in remote("health", "clear", node[-12:])
    assert "breaker reset" in remote("health", "breaker", "reset", "--reason", "sweep")

    kinds = {e["kind"] for e in json.loads(remote("events", "--json", "--limit", "10000"))}
    assert {
        "policy.pause", "policy.resume", "node.cordon", "node.uncordon", "fault.inject",
        "health.breaker_reset",
    } <= kinds  # fmt: skip
    assert not (home / ".rcp").exists()  # nothing looked for or wrote a state dir


@pytest.mark.full
def test_external_demand_adds_a_node_which_leaves_when_idle(
    cluster: tuple[list[str], str],
) -> None:
    """``full``: the default run plays external demand adding a node that scales back to zero
    in test_busy_external_node_gets_an_agent_and_idle_one_still_scales_to_zero (below). How
    soon the node comes is printed, not bounded: bench/ holds speed goals."""
    overrides = cluster[0]
    script = f"""
import json, time, ray
from controlplane.config import load_config
from controlplane.ray_connection import connect
connect(load_config(None, {overrides!r}))

@ray.remote(num_gpus=1, resources={{"pool_external": 1}})
def where():
    return ray.get_runtime_context().get_node_id()

t0 = time.monotonic()
node = ray.get(where.remote(), timeout=240)
print(json.dumps({{"node": node, "seconds": time.monotonic() - t0}}))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    placed = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"the external node took the task {placed['seconds']:.1f}s after it was submitted")
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


# -- telemetry agents (the telemetry tests connect this process to the cluster) --------------


def alive_nodes() -> dict[str, dict[str, Any]]:
    import ray

    return {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}


@pytest.fixture(scope="module")
def local_cluster(cluster: tuple[list[str], str]) -> tuple[Config, None]:
    """The module's cluster as the telemetry tests see it: its config, with this process
    connected to it as a Ray driver (see the module doc)."""
    cfg = load_config(None, cluster[0])
    connect(cfg)
    return cfg, None


@pytest.fixture(scope="module")
def agents(local_cluster: tuple[Config, None]) -> Iterator[dict[str, dict[str, Any]]]:
    """Agents on every node, each with at least one sample; `info()` by node id."""
    cfg, _ = local_cluster
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
    local_cluster: tuple[Config, None], agents: dict[str, dict[str, Any]]
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
    local_cluster: tuple[Config, None], agents: dict[str, dict[str, Any]]
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
    local_cluster: tuple[Config, None], agents: dict[str, dict[str, Any]]
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
    local_cluster: tuple[Config, None], agents: dict[str, dict[str, Any]]
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
    assert len(summary["gpus"]) == cfg.pools.external.providers[0].gpus_per_node

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


# What `ray start --address=... --block` runs once it has resolved the address (a KubeRay
# worker pod's command): a worker `Node` that stops its processes at exit, and so installs
# Ray's SIGTERM handler. `ray start` itself cannot join on loopback: it rewrites a loopback
# address to the machine's own (Ray takes one machine for a laptop there).
POD = """
import sys, time
import ray._private.node, ray._private.parameter
params = ray._private.parameter.RayParams(
    node_ip_address=sys.argv[1], gcs_address=sys.argv[2], num_cpus=1, num_gpus=0,
    labels={sys.argv[3]: sys.argv[4], sys.argv[5]: sys.argv[6]},
)
ray._private.node.Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
while True:
    time.sleep(1)
"""


@pytest.mark.full
def test_sigterm_to_a_worker_pod_is_a_drain_with_notice_as_on_kuberay(
    local_cluster: tuple[Config, None], tmp_path: Path
) -> None:
    """The KubeRay path of a spot notice: Kubernetes deleting a worker pod (a spot reclaim, a
    node upgrade) sends SIGTERM to the pod's ``ray start --block``, and with
    ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S`` set (infra/k8s/raycluster.yaml sets it, under
    the pod's grace period: test_k8s_manifests) Ray drains the node with that deadline
    (``DRAIN_NODE_REASON_PREEMPTION``) before it stops. That drain is what the controller
    reads (`RayNodeControl.draining`, the loop's ``observe_draining``), the same as the
    local `rcp fault reclaim` gives: test_serving_reclaim plays the controller's answer to
    it, and test_node_health's ``full`` test a node Ray drains for someone else. Real parts:
    a node of the module's cluster run as a pod runs it (`POD`), an actor on it standing for
    a replica, the signal. The node stays, draining, while the actor runs there, and leaves
    soon after it stops, long before the notice ends. ``full``: this checks the signal's
    link only."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from controlplane.adapters.nodes import RayNodeControl
    from controlplane.local.head import node_env
    from controlplane.local.processes import NODE_ID_ENV
    from controlplane.pools import POOL_LABEL, Pool
    from policies.providers import PROVIDER_LABEL

    cfg, _ = local_cluster
    state = LocalCluster(cfg).read_state()
    assert state is not None
    notice_s = 120
    env = node_env(cfg, state["cluster_id"])  # its processes are the cluster's: `down` stops them
    env.pop(NODE_ID_ENV, None)  # the head's fake-provider ids: this node is a new one
    env.pop("RAY_CLOUD_INSTANCE_ID", None)
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = str(notice_s)
    provider = cfg.pools.external.providers[0].name
    before = set(alive_nodes())
    out = tmp_path / "pod.log"
    pod = subprocess.Popen(
        [
            sys.executable,
            "-c",
            POD,
            cfg.ray.node_ip,
            f"{cfg.ray.node_ip}:{cfg.ray.gcs_port}",
            POOL_LABEL,
            Pool.EXTERNAL.value,
            PROVIDER_LABEL,
            provider,
        ],
        env=env,
        stdout=out.open("wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    try:
        joined = wait_for(
            "the pod's node to join",
            lambda: (set(alive_nodes()) - before) or pod.poll() is not None,
            timeout_s=120,
        )
        assert isinstance(joined, set), out.read_text()[-3000:]
        (node_id,) = joined
        assert alive_nodes()[node_id]["Labels"][PROVIDER_LABEL] == provider

        @ray.remote(num_cpus=1)
        class Replica:
            def node(self) -> str:
                return str(ray.get_runtime_context().get_node_id())

        here = NodeAffinitySchedulingStrategy(node_id, soft=False)
        replica = Replica.options(scheduling_strategy=here).remote()  # type: ignore[attr-defined]
        assert ray.get(replica.node.remote(), timeout=60) == node_id

        pod.send_signal(15)  # SIGTERM, as the kubelet sends it
        signalled = time.time()
        deadline_ms = wait_for(
            "Ray to drain the signalled node",
            lambda: RayNodeControl().draining().get(node_id),
            timeout_s=30,
        )
        # The notice is the deadline the pod's environment gives (ms since the epoch).
        assert signalled - 5 <= deadline_ms / 1000.0 - notice_s <= time.time() + 1
        assert pod.poll() is None and node_id in alive_nodes()  # draining, not gone

        ray.kill(replica)  # what moved off it (Serve starts replicas elsewhere first)
        try:  # once idle it leaves: long before the notice ends
            pod.wait(timeout=notice_s / 2)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the drained node did not leave within {notice_s / 2:.0f}s of going idle "
                f"(alive: {node_id in alive_nodes()}, draining: "
                f"{node_id in RayNodeControl().draining()}); its log:\n{out.read_text()[-3000:]}"
            ) from None
        assert node_id not in alive_nodes()
    finally:
        if pod.poll() is None:
            pod.kill()
            pod.wait(timeout=30)


@pytest.mark.full
def test_the_controller_runs_in_process_as_on_kubernetes(
    cluster: tuple[list[str], str], tmp_path: Path
) -> None:
    """The bootstrap in its Kubernetes default mode: a Ray driver that stops the
    rcp-controller actor (one controller per store), runs the controller in its own process,
    serves the API and runs a job to SUCCEEDED, with no controller actor. Runs after every
    other test that uses the module's cluster: it takes the actor's store over. ``full``: the
    bootstrap's choices are test_controller_in_process's unit tables; the default run's jobs go
    through the same controller code as an actor."""
    from controlplane.config import to_yaml
    from controlplane.ray_connection import ray_auth_env, ray_token_path

    overrides = cluster[0]
    (api_port,) = free_ports(1)
    cfg = load_config(None, [*overrides, f"api.port={api_port}"])
    config_file = tmp_path / "rcp.yaml"
    config_file.write_text(to_yaml(cfg))
    env = {
        **os.environ,
        **ray_auth_env(ray_token_path(cfg)),
        "RCP_CONFIG": str(config_file),
        "RCP_NODE_IP": cfg.ray.node_ip,
        "RCP_BOOTSTRAP_CHECK_S": "1",
    }
    bootstrap = Path(__file__).parents[2] / "infra" / "k8s" / "bootstrap" / "rcp_bootstrap.py"
    log_path = tmp_path / "controller.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-u", str(bootstrap)], env=env, stdout=log_file, stderr=log_file
        )
    try:
        url = f"http://{cfg.ray.node_ip}:{api_port}"

        def healthy() -> bool:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2) as resp:
                    return bool(resp.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        wait_for("the in-process controller's /healthz", healthy, 60)
        client = Client(state_dir=cfg.state_path)
        job = client.submit(
            {
                "name": "in-process",
                "entrypoint": "jobs.examples.train_mnistlike:train_loop",
                "num_workers": 1,
                "gpus_per_worker": 1,
                "runtime_env": {
                    "env_vars": {
                        "RCP_TRAIN_CONFIG": json.dumps({"num_steps": 2, "checkpoint_every": 100})
                    }
                },
            }
        )
        done = client.wait(job.id, timeout_s=150)
        assert done.state == "SUCCEEDED", (done, log_path.read_text()[-3000:])
        script = f"""
import ray
from controlplane.config import load_config
from controlplane.ray_connection import connect
from controlplane.controller.actor import get_controller
connect(load_config(None, {overrides!r}))
print("actor" if get_controller() is not None else "no-actor")
"""
        code, out = run_python(script, dict(os.environ))
        assert code == 0, out[-2000:]
        assert out.strip().splitlines()[-1] == "no-actor"
        assert proc.poll() is None, log_path.read_text()[-3000:]
    finally:
        proc.terminate()
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    assert code == 0, f"exit {code} on SIGTERM: {log_path.read_text()[-3000:]}"


def _open_files(pid: int) -> list[str]:
    try:
        return [f.path for f in psutil.Process(pid).open_files()]
    except psutil.Error:
        return []


@pytest.mark.full
def test_down_stops_everything_up_started_and_nothing_else(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``full``: a cluster of its own. Which processes `down` takes as the cluster's is
    test_local_processes' table with real processes (a user's process holding the cluster's
    logs, one with another cluster's id, one known only by its open files)."""
    state_dir = tmp_path_factory.mktemp("rcp-down")
    overrides = local_overrides(
        state_dir,
        "pools.cluster.num_nodes=1",
        "storage.embedded=false",
        "storage.job_credentials=shared",  # no role to mint jobs' credentials from here
    )
    # A process that looks like Ray but is not ours must survive `down`.
    decoy = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", "raylet", "gcs_server"],
    )
    started: subprocess.Popen[bytes] | None = None
    try:
        result = rcp("up", *overrides)
        assert result.returncode == 0, result.stderr
        state = json.loads((state_dir / "local-cluster.json").read_text())
        assert find_cluster_processes(state["cluster_id"], [state["temp_dir"]])
        # A user's own Python, run from the state dir, holding a log open under Ray's temp
        # dir (as a driver connected to the cluster does), is not the cluster's either.
        user_log = Path(state["temp_dir"]) / "user-driver.log"
        hold = "import sys, time; f = open(sys.argv[1], 'a'); time.sleep(300)"
        user = subprocess.Popen(
            [sys.executable, "-c", hold, str(user_log)],
            cwd=state_dir,
            env={k: v for k, v in os.environ.items() if k != "RCP_CLUSTER_ID"},
        )
        started = user
        wait_for("the user's process holds its log", lambda: bool(_open_files(user.pid)), 30)

        result = rcp("down", *overrides)
        assert result.returncode == 0, result.stderr
        assert "stopped cluster" in result.stdout
        assert find_cluster_processes(state["cluster_id"], [state["temp_dir"]]) == []
        assert not (state_dir / "local-cluster.json").exists()
        assert decoy.poll() is None, "down stopped a process it did not start"
        assert user.poll() is None, "down stopped a user's process that held a file of Ray's"

        again = rcp("down", *overrides)
        assert again.returncode == 0
        assert "nothing to stop" in again.stdout
        nodes = rcp("nodes", "--state-dir", str(state_dir))
        assert nodes.returncode == 1
        assert "rcp up" in nodes.stderr  # no API answers (or none is named) after down
    finally:
        decoy.kill()
        if started is not None:
            started.kill()
