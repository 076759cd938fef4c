"""Production traffic survives the loss of the head (issue 18), on a real local cluster.

One cluster (GCS fault tolerance on: a real Redis on loopback; Serve proxies on every node
that holds a replica, each on a loopback port of its own, behind the edge on
serve.http_port, HAProxy configured by ``serve.edge``; ingress replicas spread over the head and the
cluster nodes, one on each here). A client that retries a refused or reset connection once
sends steady traffic to the `serve` endpoint `rcp up` printed (the edge) while:

- every Ray process of the head (GCS, raylet, dashboard, autoscaler, Serve's controller, the
  head's proxy and ingress replica, the control plane's controller, the job signals actor)
  is SIGKILLed while a gang of each kind runs (a Ray Train loop and a plain command);
  requests go on through the cluster nodes' proxies; the head is started again
  (`LocalCluster.restart_head`), the controller resumes from its store and reconciles: both
  gangs run on in their first attempt and succeed (issue 26), and a queued job is admitted
  once their GPUs are free;
- (``full`` only) a cluster node whose proxy takes requests (but that holds no model
  replica) is killed: every request is answered, at worst after one retry, and never
  wrongly; that proxy listened on its node's own port, and the edge took it out;
- (``full`` only) Redis is killed and restarted while the head is healthy: serving goes on.

The external pool has no GPUs here, so no admission can move a replica there (a move needs
the autoscaler, which a restarted local head runs without: docs/operations.md).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from controlplane.config import Config
from controlplane.controller.actor import get_controller
from controlplane.local.cluster import LocalCluster
from controlplane.local.head import node_env
from controlplane.local.ports import port_in_use
from controlplane.local.processes import find_cluster_processes, kill_now, node_processes
from controlplane.local.redis import LocalRedis
from controlplane.local.state_file import head_node_id
from controlplane.sdk import Client, Job
from tests.integration.conftest import (
    HEAD_LOSS_CLUSTER,
    RetryOnceLoad,
    alive_cluster_nodes,
    mnistlike_job,
    node_proxy_port,
    start_local_cluster,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ha_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Config, LocalCluster, Client]]:
    cfg, cluster = start_local_cluster(tmp_path_factory, *HEAD_LOSS_CLUSTER)
    try:
        yield cfg, cluster, Client(state_dir=cfg.state_path)
    finally:
        cluster.down(echo=lambda _line: None)


def job_in(client: Client, job_id: str, states: set[str], timeout_s: float = 300) -> Job:
    def check() -> Job | None:
        job = client.status(job_id)
        assert not (job.done and job.state not in states), (job.state, job.message)
        return job if job.state in states else None

    return wait_for(f"{job_id} in {states}", check, timeout_s)


def _value(v: Any) -> str:
    """An enum of Serve's details (ProxyStatus, ReplicaState) or its plain value, as text."""
    return str(getattr(v, "value", v))


def proxy_nodes() -> dict[str, str]:
    """Serve's proxies by node id: their status."""
    from serve.control.client import read_details

    return {n: _value(p["status"]) for n, p in read_details()["proxies"].items()}


def replica_nodes(deployment: str) -> set[str]:
    """Nodes that hold a RUNNING replica of `deployment` (``Ingress`` or ``Backend``)."""
    from serve.control.client import read_details

    return {
        r["node_id"]
        for app in read_details()["applications"].values()
        for d in app["deployments"].values()
        if d["name"] == deployment
        for r in d["replicas"]
        if _value(r["state"]) == "RUNNING"
    }


def serving_proxies_ready(head: str, min_off_head: int) -> bool:
    """Serve's proxies HEALTHY on at least `min_off_head` nodes besides the head (node id
    `head`), and an ingress replica RUNNING off the head."""
    healthy = [n for n, status in proxy_nodes().items() if status == "HEALTHY"]
    off_head = [n for n in healthy if n != head]
    return len(off_head) >= min_off_head and bool(replica_nodes("Ingress") - {head})


def api_answers(cfg: Config) -> bool:
    try:
        return requests.get(f"http://{cfg.ray.node_ip}:{cfg.api.port}/healthz", timeout=2).ok
    except requests.RequestException:
        return False


def named(procs: list[psutil.Process], name: str) -> list[psutil.Process]:
    """The processes of `procs` called `name`; one that exits while we look is skipped."""
    found = []
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.name() == name:
                found.append(proc)
    return found


HELD_GANGS = {"function": 2, "command": 0}
"""The two kinds of gang, by the GPUs of their one worker: a Ray Train loop
(``module:function``) fills the cluster node without the sample model's replica, as a gang
did before issue 26; a plain command beside it needs no GPU, so the two never wait for one
another's GPUs (admission counts a gang Ray does not see yet only against the store's
record, not against Ray's free GPUs: two gangs admitted in one tick may be placed on one
node's single free GPU)."""
GANGS_DIR = Path(__file__).with_name("gangs")


def held_gang(kind: str, log: Path, release: Path) -> dict[str, Any]:
    """A one-worker job spec stepping until `release` exists (`gangs/held_gang.py`), each
    step a line in `log`; `kind` is ``function`` or ``command`` (`HELD_GANGS`)."""
    entrypoint = {
        "function": "held_gang:train_loop",
        "command": f"python {GANGS_DIR / 'held_gang.py'}",
    }[kind]
    config = {"log": str(log), "release": str(release)}
    return {
        "name": f"held-{kind}",
        "entrypoint": entrypoint,
        "num_workers": 1,
        "gpus_per_worker": HELD_GANGS[kind],
        "runtime_env": {
            "env_vars": {"PYTHONPATH": str(GANGS_DIR), "RCP_TRAIN_CONFIG": json.dumps(config)}
        },
    }


def steps(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def gang_pids(log: Path) -> set[str]:
    """The processes that wrote `log`'s steps (``<step> <pid>`` lines)."""
    return {line.split()[1] for line in log.read_text().splitlines()}


def ticks_since(t0: float) -> int:
    """Ticks the controller started after `t0` (wall clock), from the start times it records
    itself (`get_stats()["tick_starts_s"]`); 0 while it does not answer."""
    import ray  # deferred: ray is heavy

    controller = get_controller()
    if controller is None:
        return 0
    try:
        starts = ray.get(controller.get_stats.remote(), timeout=10)["tick_starts_s"]
    except ray.exceptions.GetTimeoutError:  # a slow answer on 2 busy cores: ask again
        return 0
    return sum(1 for t in starts if t > t0)


@pytest.mark.full
def test_killing_the_node_whose_proxy_requests_entered_never_gives_a_wrong_answer(
    ha_cluster: tuple[Config, LocalCluster, Client],
) -> None:
    """Kill, mid-traffic, a cluster node whose proxy (and ingress replica) is taking requests
    but that holds no model replica: requests in flight through it end in an answer or a
    reset/refused connection that one retry answers, never a wrong answer or a failure."""
    _cfg, cluster, _client = ha_cluster
    serve_url = next(e["url"] for e in cluster.read_state()["endpoints"] if e["name"] == "serve")
    wait_for(
        "a proxy and an ingress replica on every node",
        lambda: (
            sum(s == "HEALTHY" for s in proxy_nodes().values()) >= 3
            and len(replica_nodes("Ingress")) >= 3
        ),
        180,
    )
    victim = next(
        n
        for n, status in proxy_nodes().items()
        if status == "HEALTHY"
        and n != head_node_id(cluster.read_state())
        and n not in replica_nodes("Backend")
    )
    state = cluster.read_state()
    procs = node_processes(state["cluster_id"], [state["temp_dir"]], victim)
    assert named(procs, "raylet")
    # The victim's proxy listens on a port of its own, one `rcp up` allocated for a node.
    port = node_proxy_port(state, victim)
    assert port in state["serve_proxies"]["nodes"]
    assert requests.get(f"http://127.0.0.1:{port}/-/healthz", timeout=5).status_code == 200
    edge_log = cluster.log_dir / "serve-edge.log"
    server = f"node{state['serve_proxies']['nodes'].index(port)}"
    try:
        with RetryOnceLoad(serve_url, threads=6) as load:
            assert load.answered_since(0, 50) >= 50
            kill_now(procs)
            psutil.wait_procs(procs, timeout=10)
            before = load.answered
            assert load.answered_since(before, 50, timeout_s=60) >= 50
        load.check("node with a proxy killed")
        # The edge took the dead proxy out (a refused or broken connection, or a check).
        assert f"Server routed/{server} is DOWN" in edge_log.read_text()
    finally:
        # Ray marks the node dead (missed heartbeats) and the autoscaler replaces it, before
        # the next test admits a gang: a node that is dead but not yet marked so looks free.
        wait_for(
            "the killed node marked dead and the pool back at 2 nodes",
            lambda: victim not in alive_cluster_nodes() and len(alive_cluster_nodes()) >= 2,
            240,
        )


def test_traffic_and_running_gangs_survive_the_head_and_the_control_plane_comes_back(
    ha_cluster: tuple[Config, LocalCluster, Client], tmp_path: Path
) -> None:
    """Every process of the head is SIGKILLed under steady traffic while a gang of each kind
    runs (a Ray Train loop, ``module:function``, and a plain ``python`` command); `rcp up`
    restarts the head. Traffic is answered throughout; once the restarted controller has
    reconciled (ticks after it came back, not merely `rcp up` returning), both gangs are
    still in their first attempt, in the same processes, and succeed when released; the
    queued job is admitted once their GPUs are free. Before issue 26 both drivers were
    attached to the head's raylet, their Ray Train controllers ran on the head, and the kill
    ended each attempt (``crash: The actor ... is unavailable``)."""
    import ray  # deferred: ray is heavy

    cfg, cluster, client = ha_cluster
    serve_url = next(e["url"] for e in cluster.read_state()["endpoints"] if e["name"] == "serve")
    head_id = head_node_id(cluster.read_state())
    wait_for("proxies and an ingress off the head", lambda: serving_proxies_ready(head_id, 1), 120)

    release = tmp_path / "release"
    logs = {kind: tmp_path / f"{kind}.log" for kind in HELD_GANGS}
    gangs = {kind: client.submit(held_gang(kind, logs[kind], release)).id for kind in HELD_GANGS}
    for gang in gangs.values():
        job_in(client, gang, {"RUNNING"})
    wait_for("both gangs' first steps", lambda: all(steps(log) >= 2 for log in logs.values()), 300)
    # The function gang holds a node's 2 GPUs, the sample model's replica one of the other's.
    submitted = time.time()
    queued = client.submit(mnistlike_job("queued", steps=2, gpus_per_worker=2)).id
    # Still queued once the controller has ticked 3 times since (it had 3 chances to admit).
    wait_for("3 ticks after the submit", lambda: ticks_since(submitted) >= 3, 60)
    assert client.status(queued).state == "QUEUED", client.status(queued).message

    state = cluster.read_state()
    head = node_processes(state["cluster_id"], [state["temp_dir"]], head_node_id(state))
    assert named(head, "gcs_server") and named(head, "raylet"), head
    pids = {kind: gang_pids(log) for kind, log in logs.items()}
    assert all(len(p) == 1 for p in pids.values()), pids

    with RetryOnceLoad(serve_url) as load:
        assert load.answered_since(0, 30) >= 30
        ray.shutdown()  # this process's driver would wait on the dead GCS
        killed_at = time.monotonic()
        assert kill_now(head) > 0
        psutil.wait_procs(head, timeout=10)
        # Traffic keeps being answered while the head is down, through the other proxies.
        before = load.answered
        assert load.answered_since(before, 50, timeout_s=60) >= 50
        answered_50_s = time.monotonic() - killed_at
        said: list[str] = []
        cluster.up(echo=said.append)  # finds the head gone, the workers alive: restart_head
        api_after_s = time.monotonic() - killed_at
        api_back = time.time()
        assert any("head restarted" in line for line in said), said
        before = load.answered
        assert load.answered_since(before, 30) >= 30
    load.check(
        "head loss",
        f"; 50 answers within {answered_50_s:.1f}s of the kill, the API again after "
        f"{api_after_s:.1f}s",
    )

    # The restarted controller reconciled both gangs: they run on in their first attempt.
    wait_for("3 ticks of the restarted controller", lambda: ticks_since(api_back) >= 3, 120)
    grown = {kind: steps(log) for kind, log in logs.items()}
    for kind, gang in gangs.items():
        job = client.status(gang)
        assert (job.state, job.attempt, job.restarts, job.attempts) == ("RUNNING", 1, 0, ()), (
            kind,
            job.state,
            job.attempt,
            job.attempts,
            job.message,
        )
    wait_for(
        "both gangs' steps after the controller reconciled",
        lambda: all(steps(logs[kind]) > grown[kind] for kind in logs),
        120,
    )
    assert {kind: gang_pids(log) for kind, log in logs.items()} == pids  # the same processes
    release.touch()
    for kind, gang in gangs.items():
        job = job_in(client, gang, {"SUCCEEDED"}, timeout_s=120)
        assert (job.attempt, job.restarts) == (1, 0), (kind, job.attempts)
        assert [(a.attempt, a.kind) for a in job.attempts] == [(1, "succeeded")], job.attempts
    # The queued job is admitted once the gangs' GPUs are free (its gang starting is every
    # other test's: admitted is what this one is about).
    job_in(client, queued, {"ADMITTED", "RUNNING", "SUCCEEDED"}, timeout_s=300)


@pytest.mark.full
def test_serving_goes_on_while_redis_is_killed_and_restarted(
    ha_cluster: tuple[Config, LocalCluster, Client],
) -> None:
    """Serving never needs Redis (nor the GCS) on the request path. Ray 2.60's GCS does not
    reconnect to a Redis that went away: it aborts once its retries run out (upstream
    ray-project/ray#65298, open), so the head may go down afterwards; then `rcp up` brings it
    back, and traffic goes on through all of it."""
    import ray  # deferred: ray is heavy

    cfg, cluster, _client = ha_cluster
    serve_url = next(e["url"] for e in cluster.read_state()["endpoints"] if e["name"] == "serve")
    state = cluster.read_state()
    redis = LocalRedis(cfg)
    servers = named(
        find_cluster_processes(state["cluster_id"], cluster.process_roots(state)), "redis-server"
    )
    assert len(servers) == 1
    with RetryOnceLoad(serve_url) as load:
        assert load.answered_since(0, 20) >= 20
        kill_now(servers)
        psutil.wait_procs(servers, timeout=10)
        assert not redis.ping()
        before = load.answered
        assert load.answered_since(before, 30, timeout_s=60) >= 30
        redis.start(node_env(cfg, state["cluster_id"]), fresh=False)
        before = load.answered
        assert load.answered_since(before, 30, timeout_s=60) >= 30
        time.sleep(10)  # longer than the GCS's Redis retries (about 3.5 s)
        gcs_survived = port_in_use(cfg.ray.node_ip, cfg.ray.gcs_port)
        if not gcs_survived:
            ray.shutdown()
            cluster.up(echo=lambda _line: None)  # the head comes back on the restarted Redis
        before = load.answered
        assert load.answered_since(before, 30, timeout_s=60) >= 30
    load.check("redis loss", f"; the GCS {'survived' if gcs_survived else 'aborted'}")
    wait_for("the API", lambda: api_answers(cfg), 60)
