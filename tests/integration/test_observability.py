"""Every Grafana panel has data on a live cluster, scraped by a real Prometheus.

Real parts: the embedded cluster (`rcp up` with the production Serve app and the controller),
the telemetry agents, a checkpoint engine saving inside a Ray actor on a `cluster` node (its
metrics reach Prometheus through Ray's metrics pipeline), a training job submitted through
the SDK (so the admission gauges move; it checkpoints through the helper every job uses, so
the controller's recovery gauges for it reach Prometheus and the checkpoint alerts' expressions
see it, and `rcp status` shows the step it committed; when it ends, its series go), HTTP traffic on the Serve endpoint (the edge; good requests and
client errors), and the Debian ``prometheus`` binary on 127.0.0.1 scraping every node's Ray
metrics agent (Ray's own file_sd list), every telemetry agent and the edge, with
infra/prometheus's alert rules loaded.

Waits are bounded by deadlines; nothing asserts how long anything took.

Marked ``full`` (``bash infra/local/test.sh --full``): the default run has a real Prometheus
scrape the telemetry agents and answer PromQL (test_local_cluster), and the dashboards'
expressions are checked against the metrics the code exports by test_observability_config.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from click.testing import CliRunner

from controlplane.cli import cli
from controlplane.config import Config
from controlplane.local.ports import port_in_use as _port_in_use
from controlplane.local.prometheus import LocalPrometheus
from controlplane.observability import (
    EDGE_PATH_LABEL,
    for_query,
    load_dashboards,
    panel_expressions,
)
from controlplane.ray_connection import connect
from controlplane.sdk import Client
from controlplane.telemetry import manager
from serve.edge.config import EDGE_METRICS_PATH, HAPROXY_METRICS_PATH
from tests.integration.conftest import (
    free_ports,
    ray_auth_headers,
    report_ray_metrics_fast,
    start_local_cluster,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.full]
report_ray_metrics_fast()  # this module reads ray_* series

RUN = "observability"
JOB_NAME = "watched"
PANEL_DEADLINE_S = 150.0


@pytest.fixture(scope="module")
def prometheus_port() -> int:
    (port,) = free_ports(1)
    return port


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, prometheus_port: int) -> Iterator[Config]:
    if shutil.which("prometheus") is None:
        pytest.skip("the prometheus binary is not installed (Debian: apt-get install prometheus)")
    conf = tmp_path_factory.mktemp("obs-conf") / "rcp.yaml"
    conf.write_text(
        "serving:\n"
        "  models:\n"
        "    - name: sample\n"
        "      min_replicas: 1\n"
        "      max_replicas: 1\n"
        "      num_gpus: 1\n"
        "      num_cpus: 0.5\n"
    )
    # `rcp up` starts Prometheus on this port and points the head's dashboard at it
    # (RAY_PROMETHEUS_HOST): the Metrics tab's wiring.
    cfg, local = start_local_cluster(
        tmp_path_factory,
        "pools.cluster.num_nodes=1",
        "pools.cluster.gpus_per_node=2",
        "pools.external.providers=[{name: rent-a, max_nodes: 1}]",
        "serve.deploy_app=true",
        "observability.prometheus=true",
        f"observability.prometheus_port={prometheus_port}",
        "observability.scrape_interval_s=1",
        config_file=conf,
    )
    try:
        connect(cfg)
        yield cfg
    finally:
        local.down(echo=lambda _line: None)
    # `rcp down` stops the Prometheus `rcp up` started, with everything else.
    wait_for(
        "prometheus to stop with the cluster",
        lambda: not _port_in_use(cfg.ray.node_ip, prometheus_port),
        30,
    )


@pytest.fixture(scope="module")
def checkpointer(cluster: Config, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A checkpoint engine in an actor on the `cluster` node, saving a small state."""
    import ray

    uri = (tmp_path_factory.mktemp("ckpt") / "run").as_uri()

    @ray.remote(num_cpus=0, resources={"pool_cluster": 1})
    class Checkpointer:
        def __init__(self, uri: str) -> None:
            from jobs.checkpoint import CheckpointEngine

            self.engine = CheckpointEngine(uri, run_name=RUN, keep_last=2)

        def save(self, step: int) -> int:
            import torch

            self.engine.save({"w": torch.full((256,), float(step))}, step)
            self.engine.wait(timeout_s=60)
            return step

    actor = Checkpointer.remote(uri)  # type: ignore[attr-defined]
    ray.get(actor.save.remote(0), timeout=120)
    yield actor
    ray.kill(actor)


@pytest.fixture(scope="module")
def traffic(cluster: Config) -> Iterator[dict[str, int]]:
    """Production traffic until the module ends: predictions plus some client errors."""
    url = f"http://{cluster.ray.node_ip}:{cluster.serve.http_port}"
    counts: dict[str, int] = {}
    stop = threading.Event()

    def run() -> None:
        good = {"inputs": [[0.1 * i for i in range(16)]]}
        with requests.Session() as s:
            i = 0
            while not stop.is_set() and i < 20000:
                i += 1
                try:
                    if i % 10 == 0:  # a malformed body: 4xx, counted as an error request
                        r = s.post(f"{url}/v1/models/sample/predict", json={"x": 1}, timeout=10)
                    else:
                        r = s.post(f"{url}/v1/models/sample/predict", json=good, timeout=10)
                    key = str(r.status_code)
                except requests.RequestException as exc:
                    key = type(exc).__name__
                counts[key] = counts.get(key, 0) + 1
                stop.wait(0.05)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for("the first answers", lambda: counts.get("200", 0) >= 5, 60)
    yield counts
    stop.set()
    thread.join(timeout=30)


@pytest.fixture(scope="module")
def training_job(cluster: Config) -> str:
    """A one-GPU training job, admitted next to the serving replica: the example loop, long
    enough to commit several checkpoints while it is watched (the module's last test cancels
    it)."""
    client = Client(state_dir=cluster.state_path)
    config = {"num_steps": 600, "checkpoint_every": 5, "step_sleep_s": 0.5}
    job = client.submit(
        {
            "name": JOB_NAME,
            "entrypoint": "jobs.examples.train_mnistlike:train_loop",
            "num_workers": 1,
            "gpus_per_worker": 1,
            "runtime_env": {"env_vars": {"RCP_TRAIN_CONFIG": json.dumps(config)}},
        }
    )
    wait_for(
        "the job to be admitted",
        lambda: client.status(job.id).state not in {"QUEUED"},
        120,
    )
    return job.id


@pytest.fixture(scope="module")
def prometheus(
    cluster: Config, tmp_path_factory: pytest.TempPathFactory, prometheus_port: int
) -> Iterator[LocalPrometheus]:
    manager.ensure_agents(cluster)

    def all_sampling() -> dict[str, Any] | None:
        import ray

        infos = manager.agent_endpoints(timeout_s=10)
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        ready = alive <= set(infos) and all(i["samples"] >= 1 for i in infos.values())
        return infos if ready else None

    wait_for("an agent on every node", all_sampling, 120)
    # The one `rcp up` started; the controller keeps its list of agent targets current.
    prom = LocalPrometheus.for_cluster(cluster, port=prometheus_port)
    alive = set(all_sampling() or ())

    def listed() -> set[str]:
        if not prom.telemetry_sd_file.exists():
            return set()
        return {g["labels"]["rcp_node"] for g in json.loads(prom.telemetry_sd_file.read_text())}

    wait_for("the controller to list every agent for Prometheus", lambda: listed() >= alive, 60)
    yield prom


def has_a_number(result: list[dict[str, Any]]) -> bool:
    """A non-empty result with at least one value that is a number (not NaN)."""
    return any(not math.isnan(float(r["value"][1])) for r in result)


def ray_targets(prom: LocalPrometheus) -> list[str]:
    groups = json.loads(prom.ray_sd_file.read_text())
    return sorted(t for g in groups for t in g["targets"])


def test_prometheus_scrapes_every_ray_node_and_telemetry_agent_on_loopback(
    cluster: Config, prometheus: LocalPrometheus
) -> None:
    targets = ray_targets(prometheus)
    head = f"{cluster.ray.node_ip}:{cluster.ray.metrics_export_port}"
    assert head in targets, f"the head's metrics endpoint is not in Ray's list: {targets}"
    assert len(targets) >= 2, "Ray's list should hold the head and the cluster node"
    assert all(t.startswith("127.0.0.1:") for t in targets)

    def ups(job: str) -> dict[str, float]:
        return {
            r["metric"]["instance"]: float(r["value"][1])
            for r in prometheus.query(f'up{{job="{job}"}}')
        }

    def ray_scraped() -> bool:
        up = ups("ray")
        print("up{job=ray}:", up, "targets:", ray_targets(prometheus))
        return set(up) >= {head} and all(v == 1 for v in up.values())

    wait_for("every Ray metrics agent scraped", ray_scraped, 60)
    telemetry = json.loads(prometheus.telemetry_sd_file.read_text())
    agents = {t for g in telemetry for t in g["targets"]}
    assert agents and all(t.startswith("127.0.0.1:") for t in agents)
    wait_for(
        "every telemetry agent scraped",
        lambda: (
            set(ups("rcp-telemetry")) == agents
            and all(v == 1 for v in ups("rcp-telemetry").values())
        ),
        60,
    )
    # the edge (HAProxy) on its admin port: HAProxy's exporter and the route-table gauges
    edge = f"{cluster.ray.node_ip}:{cluster.serve.edge_admin_port}"

    def edge_ups() -> dict[tuple[str, str], float]:
        return {
            (r["metric"]["instance"], r["metric"].get(EDGE_PATH_LABEL, "")): float(r["value"][1])
            for r in prometheus.query('up{job="rcp-edge"}')
        }

    both = {(edge, HAPROXY_METRICS_PATH): 1.0, (edge, EDGE_METRICS_PATH): 1.0}
    wait_for("the edge scraped at both paths", lambda: edge_ups() == both, 60)
    # the alert rules load and evaluate against live data without errors
    groups = prometheus.api("rules")["groups"]
    assert {g["name"] for g in groups} == {"rcp-alerts"}

    def evaluated() -> bool:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        return all(r.get("health") == "ok" for r in rules)

    wait_for("every rule evaluated without error", evaluated, 30)


def test_every_grafana_panel_returns_data(
    cluster: Config,
    prometheus: LocalPrometheus,
    checkpointer: Any,
    traffic: dict[str, int],
    training_job: str,
) -> None:
    import ray

    exprs = [
        (f"{name}: {title} [{ref}]", for_query(expr))
        for name, dashboard in load_dashboards().items()
        for title, ref, expr in panel_expressions(dashboard)
    ]
    assert len(exprs) >= 20
    missing = dict(exprs)
    deadline = time.monotonic() + PANEL_DEADLINE_S
    step = 1
    while missing and time.monotonic() < deadline:
        # more saves while Prometheus watches, so the histograms' rates have increases
        ray.get(checkpointer.save.remote(step), timeout=60)
        step += 1
        for label, expr in list(missing.items()):
            if has_a_number(prometheus.query(expr)):
                del missing[label]
        if missing:
            time.sleep(2)
    assert not missing, "panels without data (or only NaN):\n" + "\n".join(
        f"  {label}: {expr}" for label, expr in missing.items()
    )
    assert traffic.get("200", 0) > 0, traffic


def test_checkpoint_metrics_reach_prometheus_through_rays_pipeline(
    prometheus: LocalPrometheus, checkpointer: Any
) -> None:
    import ray

    ray.get(checkpointer.save.remote(100), timeout=60)

    def step_100() -> list[dict[str, Any]]:
        return prometheus.query(
            f'max by (run) (ray_rcp_checkpoint_last_committed_step{{run="{RUN}"}}) == 100'
        )

    (result,) = wait_for("step 100 as the last committed step", step_100, 60)
    assert result["metric"]["run"] == RUN
    (age,) = prometheus.query(
        f'time() - max by (run) (ray_rcp_checkpoint_last_commit_unix_seconds{{run="{RUN}"}})'
    )
    assert 0 <= float(age["value"][1]) < 3600
    counts = prometheus.query(f'sum(ray_rcp_checkpoint_stall_seconds_count{{run="{RUN}"}})')
    assert counts and float(counts[0]["value"][1]) >= 2


def test_client_errors_are_counted_but_no_request_failed_on_the_server(
    prometheus: LocalPrometheus, traffic: dict[str, int]
) -> None:
    def codes() -> dict[str, float]:
        # application!="": as the alert counts them; a proxy that is not ready yet answers the
        # balancer's health checks with 503 under an empty application.
        rows = prometheus.query(
            'sum by (error_code) (ray_serve_num_http_error_requests_total{application!=""})'
        )
        return {r["metric"].get("error_code", ""): float(r["value"][1]) for r in rows}

    seen = wait_for("client errors counted", lambda: codes() or None, 60)
    assert any(c.startswith("4") for c in seen), seen
    assert not any(c.startswith("5") for c in seen), seen
    assert not any(k.startswith("5") for k in traffic), traffic

    # What clients got, as the edge answered it (the alert counts its 5xx): predicts routed
    # straight to the backend app by the route table, the malformed ones answered 4xx by the
    # model, none 5xx.
    def edge_answers() -> dict[str, float]:
        rows = prometheus.query(
            'sum by (code) (haproxy_frontend_http_responses_total{proxy="public"})'
        )
        return {r["metric"]["code"]: float(r["value"][1]) for r in rows}

    def routed() -> float:
        rows = prometheus.query('sum(haproxy_backend_http_requests_total{proxy="routed"})')
        return float(rows[0]["value"][1]) if rows else 0.0

    answers = wait_for(
        "client answers counted by the edge",
        lambda: (a := edge_answers()).get("2xx", 0) > 0 and a.get("4xx", 0) > 0 and a,
        60,
    )
    assert answers.get("5xx", 0) == 0, answers
    assert routed() > 0, "no predict was routed straight to a backend app"


def test_ray_dashboard_metrics_tab_reaches_the_prometheus(
    cluster: Config, prometheus: LocalPrometheus
) -> None:
    url = f"http://{cluster.ray.node_ip}:{cluster.ray.dashboard_port}/api/prometheus_health"

    def healthy() -> bool:
        r = requests.get(url, headers=ray_auth_headers(cluster), timeout=10)
        return r.status_code == 200 and "prometheus running" in r.text

    wait_for(f"{url} to report Prometheus running", healthy, 60)


def test_a_normally_launched_jobs_commit_reaches_status_and_prometheus(
    cluster: Config, prometheus: LocalPrometheus, training_job: str
) -> None:
    job_id = training_job
    client = Client(state_dir=cluster.state_path)
    seen: list[Any] = []

    def committed() -> Any:
        job = client.status(job_id)
        seen[:] = [(job.state, job.attempt, job.message, job.progress)]
        return job if job.last_committed_step is not None else None

    try:
        job = wait_for("the controller to read a committed step from storage", committed, 300)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the job: {seen}") from None
    assert job.state == "RUNNING", job.message
    assert job.checkpoint_age_s is not None and job.checkpoint_age_s >= 0
    committed_s = job.last_checkpoint["committed_unix_s"] if job.last_checkpoint else None
    assert committed_s is not None and committed_s <= time.time()

    env = {"RCP_STATE_DIR": str(cluster.state_path)}
    out = CliRunner().invoke(cli, ["status", job_id], env=env).output
    assert re.search(r"checkpoint:  step \d+, committed \d+", out), out
    assert "restarts:    0 of 3 used" in out, out

    labels = f'job_id="{job_id}", name="{JOB_NAME}", queue="default"'
    for name in (
        "ray_rcp_job_checkpoint_last_commit_timestamp_seconds",
        "ray_rcp_job_running_since_timestamp_seconds",
        "ray_rcp_job_checkpoint_interval_seconds",
        "ray_rcp_job_restarts",
        "ray_rcp_job_max_restarts",
        "ray_rcp_job_hangs",
    ):
        wait_for(f"{name} for the job", lambda n=name: prometheus.query(f"{n}{{{labels}}}"), 90)
    (mtbf,) = wait_for(
        "the fleet GPU MTBF", lambda: prometheus.query("max(ray_rcp_fleet_gpu_mtbf_hours)"), 60
    )
    assert float(mtbf["value"][1]) > 0

    # The too-old and never-committed alerts' left-hand sides, as the rules group them.
    (age,) = prometheus.query(
        "time() - max by (job_id, name, queue) "
        f"(ray_rcp_job_checkpoint_last_commit_timestamp_seconds{{{labels}}})",
    )
    assert age["metric"] == {"job_id": job_id, "name": JOB_NAME, "queue": "default"}
    assert 0 <= float(age["value"][1]) < 3600
    never = prometheus.query(
        "time() - max by (job_id, name, queue) "
        f"(ray_rcp_job_running_since_timestamp_seconds{{{labels}}}) "
        "unless on (job_id, name, queue) ray_rcp_job_checkpoint_last_commit_timestamp_seconds"
    )
    assert never == [], "the job committed: the never-committed alert must not see it"

    def rules_ok() -> bool:
        rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
        return bool(rules) and all(r.get("health") == "ok" for r in rules)

    wait_for("every alert rule evaluated without error", rules_ok, 60)
    firing = [
        a["labels"]["alertname"]
        for a in prometheus.api("alerts")["alerts"]
        if a["labels"].get("job_id") == job_id
    ]
    assert firing == [], firing


def test_an_ended_jobs_series_go(
    cluster: Config, prometheus: LocalPrometheus, training_job: str
) -> None:
    """Last in the module: it cancels the training job."""
    job_id = training_job
    client = Client(state_dir=cluster.state_path)
    client.cancel(job_id)
    for name in ("ray_rcp_job_running_since_timestamp_seconds", "ray_rcp_job_restarts"):
        query = f'{name}{{job_id="{job_id}"}}'
        wait_for(f"the cancelled job's {name} to go", lambda q=query: not prometheus.query(q), 120)
