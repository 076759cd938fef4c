"""A job launched the ordinary way is watched from the controller: its recovery gauges reach a
real Prometheus through Ray's metrics pipeline, the checkpoint alerts' expressions see it, and
`rcp status` shows the step it committed. When it ends, its series go.

Real parts: the embedded cluster (`rcp up`: the controller, the embedded S3-protocol store),
the example training loop submitted through the SDK with no metrics code of its own beyond the
checkpoint helper, and Debian's ``prometheus`` on 127.0.0.1 scraping every node's Ray metrics
agent with ``infra/prometheus/rules.yml`` loaded.

Waits are bounded by deadlines; nothing asserts how long anything took.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from controlplane.cli import cli
from controlplane.config import Config
from controlplane.local.prometheus import LocalPrometheus
from controlplane.ray_connection import connect
from controlplane.sdk import Client
from tests.integration.conftest import free_ports, start_local_cluster, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Config]:
    if shutil.which("prometheus") is None:
        pytest.skip("the prometheus binary is not installed (Debian: apt-get install prometheus)")
    (port,) = free_ports(1)
    cfg, local = start_local_cluster(
        tmp_path_factory,
        "pools.cluster.num_nodes=1",
        "pools.cluster.gpus_per_node=2",
        "pools.external.max_nodes=1",
        "observability.prometheus=true",
        f"observability.prometheus_port={port}",
        "observability.scrape_interval_s=1",
    )
    try:
        connect(cfg)
        yield cfg
    finally:
        local.down(echo=lambda _line: None)


@pytest.fixture(scope="module")
def prometheus(cluster: Config) -> LocalPrometheus:
    """The Prometheus `rcp up` started."""
    return LocalPrometheus.for_cluster(cluster, port=cluster.observability.prometheus_port)


@pytest.fixture(scope="module")
def job_id(cluster: Config) -> str:
    """The example loop, long enough to commit several checkpoints while it is watched."""
    client = Client(state_dir=cluster.state_path)
    config = {"num_steps": 600, "checkpoint_every": 5, "step_sleep_s": 0.5}
    job = client.submit(
        {
            "name": "watched",
            "entrypoint": "jobs.examples.train_mnistlike:train_loop",
            "num_workers": 1,
            "gpus_per_worker": 1,
            "runtime_env": {"env_vars": {"RCP_TRAIN_CONFIG": json.dumps(config)}},
        }
    )
    return job.id


def test_a_normally_launched_jobs_commit_reaches_status_and_prometheus(
    cluster: Config, prometheus: LocalPrometheus, job_id: str
) -> None:
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

    labels = f'job_id="{job_id}", name="watched", queue="default"'
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
    assert age["metric"] == {"job_id": job_id, "name": "watched", "queue": "default"}
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


def test_an_ended_jobs_series_go(cluster: Config, prometheus: LocalPrometheus, job_id: str) -> None:
    client = Client(state_dir=cluster.state_path)
    client.cancel(job_id)
    for name in ("ray_rcp_job_running_since_timestamp_seconds", "ray_rcp_job_restarts"):
        query = f'{name}{{job_id="{job_id}"}}'
        wait_for(f"the cancelled job's {name} to go", lambda q=query: not prometheus.query(q), 120)
