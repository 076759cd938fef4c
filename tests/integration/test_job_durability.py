"""Plain commands as gang jobs (issue 13), end to end on a real local cluster, submitted as a
researcher would (the CLI `rcp`, or the SDK `Client`). Crash, preemption and hang recovery are
covered by tests/unit/test_runner_restarts.py and test_runner.py (the runner against a real
store and S3 server), test_checkpoint_ray_train.py (a killed worker resumes bit-identically,
a checkpoint-now request commits before the stop), test_queue_scheduling.py (preemption
through the controller) and test_node_health.py (a drained node's gang checkpoints and
resumes).

The module shares one cluster (`durability_cluster`): 2 `cluster` nodes x 2 logical GPUs, no
Serve app, a 0.5 s tick, and a short `jobs.gang_start_timeout_s` (`GANG_START_TIMEOUT_S`), so
a job that runs past it shows that a running gang is not mistaken for one that never started.
Every job of this module must fit the 4 GPUs; jobs run one at a time unless a test says so.
A test that needs more overrides adds them to `CLUSTER_OVERRIDES` (they hold for the whole
module). Scripts a job runs are written under the test's `tmp_path`: in local mode every node
is this machine, so an absolute path is readable by every worker (a job's code otherwise
comes only from a remote `working_dir`).

Helpers: `rcp(...)` runs the CLI against the cluster; `submit_command(...)` submits
``rcp submit ... -- CMD`` and returns the job id; `wait_state(...)`, `ray_job_status(...)`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.config import Config
from controlplane.local.cluster import LocalCluster
from controlplane.sdk import Client, Job
from tests.integration.conftest import ray_auth_headers, start_local_cluster, wait_for

pytestmark = pytest.mark.integration

GANG_START_TIMEOUT_S = 40.0
"""Short, so a job can run past it; long enough for a 4-worker gang to start on 2 cores."""
CLUSTER_OVERRIDES = (
    "pools.cluster.num_nodes=2",
    "pools.cluster.gpus_per_node=2",
    "serve.deploy_app=false",
    "policy.tick_s=0.5",
    f"jobs.gang_start_timeout_s={GANG_START_TIMEOUT_S:g}",
    "jobs.job_signal_poll_s=0.2",
)


@pytest.fixture(scope="module")
def durability_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Config, LocalCluster, Client]]:
    """The module's cluster (see the module doc) and an SDK client on it."""
    cfg, cluster = start_local_cluster(tmp_path_factory, *CLUSTER_OVERRIDES)
    try:
        yield cfg, cluster, Client(state_dir=cfg.state_path)
    finally:
        cluster.down(echo=lambda _line: None)


def rcp(cfg: Config, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it (``python -m controlplane``), pointed at the cluster."""
    return subprocess.run(
        [sys.executable, "-m", "controlplane", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "RCP_STATE_DIR": str(cfg.state_path)},
        check=False,
    )


def submit_command(cfg: Config, *options: str, command: list[str]) -> str:
    """``rcp submit OPTIONS -- COMMAND``; the new job's id."""
    result = rcp(cfg, "submit", *options, "--", *command)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip().splitlines()[-1]


def wait_state(client: Client, job_id: str, states: set[str], timeout_s: float = 240) -> Job:
    """The job once it is in one of `states`; fails at once if it ends in another."""

    def check() -> Job | None:
        job = client.status(job_id)
        if job.state in states:
            return job
        assert not job.done, f"{job_id} ended {job.state}, wanted {states}: {job.message}"
        return None

    return wait_for(f"{job_id} in {sorted(states)}", check, timeout_s)


def ray_job_status(cfg: Config, submission_id: str) -> str:
    """Ray's own word on one Ray Job (``<job id>-<attempt>``); ``MISSING`` before the runner
    submitted it."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(
        f"http://{cfg.ray.node_ip}:{cfg.ray.dashboard_port}", headers=ray_auth_headers(cfg)
    )
    try:
        return str(client.get_job_status(submission_id).value)
    except RuntimeError as exc:
        if "does not exist" in str(exc):
            return "MISSING"
        raise


def processes_matching(marker: str) -> list[str]:
    """Command lines of live processes that name `marker` (this test's own excluded)."""
    result = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True, check=False)
    me = str(os.getpid())
    return [line for line in result.stdout.splitlines() if line.split(" ", 1)[0] != me]


# -- plain commands are gangs -------------------------------------------------------------------

ALL_REDUCE_SCRIPT = """\
import json, os, sys, time
import torch
import torch.distributed as dist

out_dir, sleep_s = sys.argv[1], float(sys.argv[2])
dist.init_process_group("gloo")  # env:// from MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank)])
dist.all_reduce(t)
assert t.item() == world * (world - 1) / 2, t
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
        "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "RCP_JOB_ID")
record = {k: os.environ.get(k) for k in keys}
record["sum"] = t.item()
with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
    json.dump(record, f)
print(f"allreduce-ok rank={rank} world={world} sum={t.item():g}", flush=True)
time.sleep(sleep_s)
dist.barrier()
dist.destroy_process_group()
"""


def test_an_unmodified_torch_distributed_script_runs_on_every_rank_past_the_start_timeout(
    durability_cluster: tuple[Config, LocalCluster, Client], tmp_path: Path
) -> None:
    cfg, _cluster, client = durability_cluster
    script = tmp_path / "allreduce.py"
    script.write_text(ALL_REDUCE_SCRIPT)
    out = tmp_path / "ranks"
    out.mkdir()
    run_s = GANG_START_TIMEOUT_S + 5  # each rank sleeps past the timeout after it started
    job_id = submit_command(
        cfg,
        "--workers=4",
        "--gpus-per-worker=1",
        "--name=allreduce",
        command=["python", str(script), str(out), f"{run_s:g}"],
    )

    wait_state(client, job_id, {"RUNNING"})
    # RUNNING while it runs: every rank got through the all-reduce and is still sleeping.
    wait_for("4 rank files", lambda: len(list(out.glob("rank-*.json"))) == 4, 60)
    assert client.status(job_id).state == "RUNNING"
    done = wait_state(client, job_id, {"SUCCEEDED"}, timeout_s=run_s + 180)

    assert [t["to"] for t in done.history] == ["QUEUED", "ADMITTED", "RUNNING", "SUCCEEDED"]
    assert done.attempt == 1
    admitted = next(t["at_s"] for t in done.history if t["to"] == "ADMITTED")
    succeeded = next(t["at_s"] for t in done.history if t["to"] == "SUCCEEDED")
    assert succeeded - admitted > GANG_START_TIMEOUT_S  # ran past it, and was never stopped

    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    assert sorted(int(r["RANK"]) for r in ranks) == [0, 1, 2, 3]
    assert {r["WORLD_SIZE"] for r in ranks} == {"4"}
    assert {r["sum"] for r in ranks} == {6.0}
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in ranks}) == 1
    assert {r["RCP_JOB_ID"] for r in ranks} == {job_id}
    # torchrun's local ranks: on each node (NODE_RANK) 0..LOCAL_WORLD_SIZE-1, once each.
    by_node: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in ranks:
        by_node[r["NODE_RANK"]].append(r)
    assert sum(int(rs[0]["LOCAL_WORLD_SIZE"]) for rs in by_node.values()) == 4
    for rs in by_node.values():
        assert {r["LOCAL_WORLD_SIZE"] for r in rs} == {str(len(rs))}
        assert sorted(int(r["LOCAL_RANK"]) for r in rs) == list(range(len(rs)))
    assert all(r["CUDA_VISIBLE_DEVICES"] for r in ranks)  # the bundle's (logical) GPUs

    logs = rcp(cfg, "logs", job_id)
    assert logs.returncode == 0, logs.stderr
    for rank in range(4):
        assert f"allreduce-ok rank={rank} world=4 sum=6" in logs.stdout


FAILING_SCRIPT = """\
import os, signal, sys, time

out_dir = sys.argv[1]
rank = int(os.environ["RANK"])

def on_term(signum, frame):
    open(os.path.join(out_dir, f"terminated-{rank}"), "w").close()
    sys.exit(143)

signal.signal(signal.SIGTERM, on_term)
open(os.path.join(out_dir, f"started-{rank}"), "w").close()
if rank == 1:
    while len([n for n in os.listdir(out_dir) if n.startswith("started-")]) < 4:
        time.sleep(0.2)
    print("rank 1 gives up", flush=True)
    sys.exit(3)
time.sleep(600)
"""


def test_a_rank_that_exits_non_zero_fails_the_gang_and_leaves_no_process(
    durability_cluster: tuple[Config, LocalCluster, Client], tmp_path: Path
) -> None:
    cfg, _cluster, client = durability_cluster
    marker = f"rcp-fail-{uuid.uuid4().hex[:12]}"
    script = tmp_path / f"{marker}.py"
    script.write_text(FAILING_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    job_id = submit_command(
        cfg,
        "--workers=4",
        "--gpus-per-worker=1",
        "--max-restarts=0",
        command=["python", str(script), str(out)],
    )
    sid = f"{job_id}-1"
    wait_for(
        f"Ray Job {sid} to fail",
        lambda: ray_job_status(cfg, sid) in ("FAILED", "SUCCEEDED", "STOPPED"),
        240,
    )
    assert ray_job_status(cfg, sid) == "FAILED"
    # The control plane saw it end (FAILED here; a restart policy may re-queue it instead).
    wait_for(
        f"{job_id} to leave attempt 1",
        lambda: (j := client.status(job_id)).done or j.state == "QUEUED" or j.attempt > 1,
        60,
    )
    # The others were asked to stop (SIGTERM) before they were killed.
    assert sorted(p.name for p in out.glob("terminated-*")) == [
        "terminated-0",
        "terminated-2",
        "terminated-3",
    ]
    wait_for("no process of the script left", lambda: not processes_matching(marker), 30)
    logs = rcp(cfg, "logs", job_id).stdout
    # The driver's log ends with what failed.
    assert "rcp: the gang failed: rank 1 of 4 (node " in logs, logs[-4000:]
    assert "the command exited with code 3" in logs
    assert "rank 1 gives up" in logs


def test_a_cancelled_command_job_leaves_no_process_even_one_ignoring_sigterm(
    durability_cluster: tuple[Config, LocalCluster, Client], tmp_path: Path
) -> None:
    cfg, _cluster, client = durability_cluster
    marker = f"rcp-stop-{uuid.uuid4().hex[:12]}"
    script = tmp_path / f"{marker}.py"
    script.write_text(
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(600)\n"
    )
    job_id = submit_command(
        cfg, "--workers=2", "--gpus-per-worker=1", command=["python", str(script)]
    )
    wait_state(client, job_id, {"RUNNING"})
    assert len(processes_matching(f"{marker}.py")) >= 3  # the driver and both ranks
    result = rcp(cfg, "cancel", job_id)
    assert result.returncode == 0, result.stderr
    wait_for("no process of the script left", lambda: not processes_matching(marker), 60)
