"""The training queue end to end on a real local cluster (`rcp up`): the controller actor,
its API, the admission policy, Ray Jobs running Ray Train gangs, and checkpoint-before-preempt.

The cluster pool is shrunk to one node with 2 logical GPUs and every job is a 2-worker x 1 GPU
gang of the example script (`jobs.examples.train_mnistlike`), so each job fills the pool and
jobs run strictly one at a time. Steps are tiny; `step_sleep_s` only makes a job last long
enough for the next thing to happen to it.

Marked ``full`` (``bash infra/local/test.sh --full``): the default run plays checkpoint,
preempt and resume in test_job_durability (bit-exact, on another node) and a controller that
comes back in test_head_loss; priority order and the queue's restart are unit-tested
(test_admission_policy, test_runner_restarts, test_loop_restart).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.config import Config
from controlplane.local.cluster import LocalCluster
from controlplane.sdk import Client, Job
from tests.integration.conftest import start_local_cluster
from tests.integration.conftest import wait_for as wait_until

pytestmark = [pytest.mark.integration, pytest.mark.full]

EXAMPLE = "jobs.examples.train_mnistlike:train_loop"


@pytest.fixture(scope="module")
def queue_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Config, LocalCluster, Client]]:
    cfg, cluster = start_local_cluster(
        tmp_path_factory,
        "pools.cluster.num_nodes=1",
        "pools.cluster.gpus_per_node=2",
        "serve.deploy_app=false",
        # Gang start on two shared cores can take a minute; the timeout is not under test here.
        "jobs.gang_start_timeout_s=300",
    )
    try:
        yield cfg, cluster, Client(state_dir=cfg.state_path)
    finally:
        cluster.down(echo=lambda _line: None)


def spec(
    name: str, priority: str, *, steps: int, log: Path, sleep_s: float = 0.0
) -> dict[str, Any]:
    train_config = {
        "num_steps": steps,
        "checkpoint_every": 1000,
        "step_sleep_s": sleep_s,
        "log_path": str(log),
    }
    return {
        "name": name,
        "entrypoint": EXAMPLE,
        "num_workers": 2,
        "gpus_per_worker": 1,
        "priority_class": priority,
        "runtime_env": {"env_vars": {"RCP_TRAIN_CONFIG": json.dumps(train_config)}},
    }


def wait_for(client: Client, job_id: str, states: set[str], timeout_s: float = 300) -> Job:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.status(job_id)
        if job.state in states:
            return job
        if job.done or time.monotonic() > deadline:
            raise AssertionError(f"{job_id} is {job.state}, wanted {states}: {job.message}")
        time.sleep(0.5)


def wait_for_file(path: Path, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.5)


def entered(job: Job, state: str) -> list[float]:
    return [t["at_s"] for t in job.history if t["to"] == state]


def log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def controller_starts(client: Client) -> list[dict[str, Any]]:
    return [e for e in client.events(limit=10_000) if e["kind"] == "controller.start"]


def ray_submissions(cfg: Config) -> dict[str, list[str]]:
    """Ray Job submission ids per control-plane job id, from Ray's own job list."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(f"http://{cfg.ray.node_ip}:{cfg.ray.dashboard_port}")
    out: dict[str, list[str]] = {}
    for info in client.list_jobs():
        job_id = (info.metadata or {}).get("rcp_job")
        if job_id and info.submission_id:
            out.setdefault(job_id, []).append(info.submission_id)
    return out


def test_priorities_run_in_order_and_a_controller_restart_loses_and_duplicates_nothing(
    queue_cluster: tuple[Config, LocalCluster, Client], tmp_path: Path
) -> None:
    import ray

    from controlplane.controller.actor import get_controller

    cfg, _cluster, client = queue_cluster
    filler_log = tmp_path / "filler.jsonl"
    filler = client.submit(spec("filler", "high", steps=6, sleep_s=1.0, log=filler_log))
    wait_for(client, filler.id, {"RUNNING"})
    # The pool is full: these three queue behind the filler, submitted low first.
    queued = [
        client.submit(spec(p, p, steps=2, log=tmp_path / f"{p}.jsonl"), idempotency_key=f"k-{p}")
        for p in ("low", "medium", "high")
    ]

    # They wait behind the filler: once the filler has logged another step (a second, two of
    # the loop's ticks at test speed), the admission has looked at each and left it queued.
    def filler_steps() -> int:
        return len(filler_log.read_text().splitlines()) if filler_log.exists() else 0

    seen = filler_steps()
    wait_until("the filler's next step", lambda: filler_steps() > seen or None, 60)
    assert {client.status(j.id).state for j in queued} == {"QUEUED"}
    assert client.status(filler.id).state == "RUNNING"

    # Kill the controller mid-queue; Ray restarts it and it resumes from the store.
    ray.kill(get_controller(), no_restart=False)
    deadline = time.monotonic() + 120
    while len(controller_starts(client)) < 2:
        assert time.monotonic() < deadline, "the controller did not come back"
        time.sleep(0.5)
    # A client retrying its submissions after the outage gets the same jobs back.
    retried = [
        client.submit(spec(p, p, steps=2, log=tmp_path / f"{p}.jsonl"), idempotency_key=f"k-{p}")
        for p in ("low", "medium", "high")
    ]
    assert [j.id for j in retried] == [j.id for j in queued]

    done = {j.id: wait_for(client, j.id, {"SUCCEEDED"}, timeout_s=420) for j in [filler, *queued]}
    low, medium, high = (done[j.id] for j in queued)
    # Order: high, then medium, then low; each admitted only after the previous one ended.
    assert entered(done[filler.id], "SUCCEEDED")[0] <= entered(high, "ADMITTED")[0]
    assert entered(high, "SUCCEEDED")[0] <= entered(medium, "ADMITTED")[0]
    assert entered(medium, "SUCCEEDED")[0] <= entered(low, "ADMITTED")[0]
    # Nothing lost, nothing duplicated: 4 jobs, each admitted once, one Ray Job each.
    assert len(client.list()) == 4
    submissions = ray_submissions(cfg)
    for job in done.values():
        assert [t["to"] for t in job.history] == ["QUEUED", "ADMITTED", "RUNNING", "SUCCEEDED"]
        assert job.attempt == 1
        assert submissions[job.id] == [f"{job.id}-1"]
    assert len(controller_starts(client)) == 2


def test_a_higher_priority_job_preempts_a_lower_one_which_checkpoints_and_resumes(
    queue_cluster: tuple[Config, LocalCluster, Client], tmp_path: Path
) -> None:
    _cfg, _cluster, client = queue_cluster
    low_log = tmp_path / "low.jsonl"
    low = client.submit(spec("victim", "low", steps=40, sleep_s=0.3, log=low_log))
    wait_for(client, low.id, {"RUNNING"})
    wait_for_file(low_log)

    high = client.submit(spec("urgent", "high", steps=2, log=tmp_path / "high.jsonl"))
    high_done = wait_for(client, high.id, {"SUCCEEDED"}, timeout_s=420)
    low_done = wait_for(client, low.id, {"SUCCEEDED"}, timeout_s=420)

    states = [t["to"] for t in low_done.history]
    assert states[:6] == ["QUEUED", "ADMITTED", "RUNNING", "PREEMPTED", "QUEUED", "ADMITTED"]
    assert states[-1] == "SUCCEEDED"
    assert low_done.num_preemptions == 1 and low_done.attempt == 2
    preempted = next(t for t in low_done.history if t["to"] == "PREEMPTED")
    assert "checkpointed-for-preemption at step" in preempted["reason"]
    ckpt_step = low_done.attempts[0].checkpoint_step
    assert ckpt_step is not None, low_done.attempts
    # The high job got the GPUs only after the victim let go of them.
    assert preempted["at_s"] <= entered(high_done, "ADMITTED")[0]
    assert entered(high_done, "SUCCEEDED")[0] <= entered(low_done, "ADMITTED")[-1]

    lines = log_lines(low_log)
    first_run = [r["step"] for r in lines if r["start"] == 0]
    resumed = [r for r in lines if r["start"] > 0]
    assert resumed, "the victim never resumed"
    # Resumed from the preemption checkpoint: the step counter continues from there.
    assert resumed[0]["start"] == ckpt_step + 1 == resumed[0]["step"]
    assert max(first_run) >= ckpt_step
    assert resumed[-1]["step"] == 39
