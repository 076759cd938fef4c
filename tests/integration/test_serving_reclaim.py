"""Serving takes GPUs back from training when no provider delivers (issue 28, item 1), on a
real cluster under load: the lowest-priority gang checkpoints (its manifest in object
storage) and yields, the model's new replica runs on the cluster pool, no request fails, and
once the load falls the gang resumes from the step it checkpointed.

Real parts: the embedded cluster (`rcp up`: Ray, the autoscaler with the fake multi-node
provider playing one provider, ``only``, out of stock for the whole test: `rcp fault
stockout`), the controller actor (demand, placement, admission's serving reclaim, the runner
and its checkpoint-first preemption), the embedded S3 server, a plain-command gang that
checkpoints with `jobs.checkpointing`, Serve with the production app and HTTP load on its
endpoint.

The cluster pool is two nodes with one GPU each: one holds the sample model's first replica,
the other the gang. The model answers in 1 s and wants one replica per request in flight.
The forecast's slots are a minute long here (``forecast.bin_s=60``, production 15 min): the
load's peak is remembered for its slot and the next, so the gang waits that long after the
load falls (``serving-forecast``) rather than a quarter hour or more.

Marked ``full``: the reclaim rules are unit tables (test_serving_guarantee,
test_forecast_policy); this plays them once on real parts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from controlplane.cli import cli
from controlplane.config import Config
from controlplane.ray_connection import connect
from controlplane.sdk import Client
from tests.integration.conftest import Load, pools_of, start_local_cluster, wait_for
from tests.integration.test_job_durability import (
    manifest_in_storage,
    recovery_script,
    start_trainer,
    steps_of,
    wait_job,
)

pytestmark = [pytest.mark.integration, pytest.mark.full]

DEADLINE_S = 30
"""``only``'s delivery deadline: past it with a node owed, it is out, and what serving's
demand still lacks is taken from training."""


@pytest.fixture(scope="module")
def reclaim_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Config, Client]]:
    conf = tmp_path_factory.mktemp("reclaim-conf") / "rcp.yaml"
    conf.write_text(
        "pools:\n"
        "  external:\n"
        "    providers:\n"
        "      - {name: only, price_per_gpu_hour: 2.0, max_nodes: 1, gpus_per_node: 1,\n"
        f"         cpus_per_node: 2, delivery_deadline_s: {DEADLINE_S}, backoff_s: 3600}}\n"
        "serving:\n"
        "  models:\n"
        "    - name: sample\n"
        "      min_replicas: 1\n"
        "      max_replicas: 2\n"
        "      num_gpus: 1\n"
        "      num_cpus: 0.5\n"
        "      target_ongoing_requests: 1\n"
        "      upscale_delay_s: 1\n"
        "      downscale_delay_s: 15\n"
        "      graceful_shutdown_timeout_s: 5\n"
        "      init_kwargs: {extra_latency_ms: 1000}\n"
    )
    cfg, cluster = start_local_cluster(
        tmp_path_factory,
        "pools.cluster.num_nodes=2",
        "pools.cluster.gpus_per_node=1",
        "serve.deploy_app=true",
        "forecast.bin_s=60",
        "jobs.step_report_interval_s=1",
        config_file=conf,
    )
    try:
        yield cfg, Client(state_dir=cfg.state_path)
    finally:
        cluster.down(echo=lambda _line: None)


def cluster_replicas() -> int:
    """Sample's replicas serving on the cluster pool."""
    cluster = pools_of().get("cluster") or {}
    return sum(1 for r in cluster.get("replicas") or [] if r["state"] == "RUNNING")


def test_no_provider_delivers_so_the_gang_checkpoints_yields_and_resumes_when_load_falls(
    reclaim_cluster: tuple[Config, Client], tmp_path: Path
) -> None:
    cfg, client = reclaim_cluster
    connect(cfg)
    got = CliRunner().invoke(cli, ["fault", "stockout", "only", f"state_dir={cfg.state_dir}"])
    assert got.exit_code == 0, got.output
    wait_for("sample's first replica on the cluster pool", lambda: cluster_replicas() >= 1, 180)
    script, out = recovery_script(tmp_path)
    low = start_trainer(cfg, client, script, out, "--priority=low", "--name=low")
    url = f"http://127.0.0.1:{cfg.serve.http_port}"
    try:
        with Load(url, threads=2, pace_s=0.0, max_duration_s=900) as load:
            # Two requests in flight: a second replica. The cluster pool is full and `only`
            # delivers nothing; past its deadline serving takes the gang's GPU, checkpoint
            # first.
            job = wait_job(
                cfg,
                client,
                low,
                "the gang checkpointed, preempted and re-queued for serving",
                lambda j: j.num_preemptions >= 1,
                DEADLINE_S + 240,
            )
            wait_for("sample on 2 cluster replicas", lambda: cluster_replicas() >= 2, 240)
            load.wait_for(load.total + 10)
        # The load is gone: demand falls to 1 after the downscale delay, the replica stops,
        # and once the peak's slots pass the gang runs again.
        resumed = wait_for(
            "the gang training again",
            lambda: [s for s in steps_of(out) if s["attempt"] == 2],
            15 + 300,
        )
    finally:
        with contextlib.suppress(Exception):
            client.cancel(low)
    reason = next(t["reason"] for t in job.history if t["to"] == "PREEMPTED")
    assert "checkpointed-for-preemption at step" in reason, reason
    events = [e for e in client.events(limit=1000) if e.get("job_id") == low]
    (asked,) = [str(e["message"]) for e in events if e["kind"] == "policy.PreemptJob"]
    assert asked.startswith("serving-reclaims: serving's demand needs 1 cluster GPU"), asked
    step = job.attempts[0].checkpoint_step
    assert step is not None and job.attempts[0].kind == "preempted" and job.restarts == 0
    manifest = manifest_in_storage(cfg, f"{job.checkpoint_uri}/step-{step:012d}")
    assert int(str(manifest["step"])) == step
    assert max(int(str(s["step"])) for s in steps_of(out) if s["attempt"] == 1) == step
    assert resumed[0]["start"] == step + 1, resumed[0]
    assert load.errors == [], load.errors[:5]
    assert set(load.statuses) == {200}, load.statuses
    waits = [str(e["message"]) for e in events if e["kind"] == "policy.WaitJob"]
    print(f"requests: {sum(load.statuses.values())}, all 200; checkpointed at step {step}")
    print("asked:", asked)
    print("waits:", *waits, sep="\n  ")
