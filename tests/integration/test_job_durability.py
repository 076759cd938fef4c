"""Training jobs that survive: plain commands as gangs, crashes, hangs, preemption, node loss
(issue 13), end to end on a real local cluster, submitted as a researcher would (the CLI
`rcp`, or the SDK `Client`).

The module shares one cluster (`durability_cluster`): 2 `cluster` nodes x 2 logical GPUs, no
Serve app, a 0.5 s tick. Every job of this module must fit the 4 GPUs; jobs run one at a time unless a test says so.
A test that needs more overrides adds them to `CLUSTER_OVERRIDES` (they hold for the whole
module). Scripts a job runs are written under the test's `tmp_path`: in local mode every node
is this machine, so an absolute path is readable by every worker (a job's code otherwise
comes only from a remote `working_dir`).

Helpers: `rcp(...)` runs the CLI against the cluster; `submit_command(...)` submits
``rcp submit ... -- CMD`` and returns the job id; `wait_state(...)`, `ray_job_status(...)`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.config import Config
from controlplane.local.cluster import LocalCluster
from controlplane.sdk import Client, Job
from tests.integration.conftest import ray_auth_headers, start_local_cluster, wait_for

pytestmark = pytest.mark.integration

CLUSTER_OVERRIDES = (
    "pools.cluster.num_nodes=2",
    "pools.cluster.gpus_per_node=2",
    "serve.deploy_app=false",
    # Test-only speed: a crashed or hung gang restarts after 1 s (default 10 s), and rank 0
    # reports its step every second, so the hang test's short stall timeout leaves a healthy
    # gang as much margin as the default 5 s reports left a 15 s one.
    "jobs.restart_backoff_initial_s=1",
    "jobs.step_report_interval_s=1",
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

out_dir, release = sys.argv[1], sys.argv[2]
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
deadline = time.monotonic() + 600
while not os.path.exists(release):  # the test says when every rank may finish
    assert time.monotonic() < deadline, "never released"
    time.sleep(0.2)
dist.barrier()
dist.destroy_process_group()
"""


def test_an_unmodified_torch_distributed_script_runs_on_every_rank(
    durability_cluster: tuple[Config, LocalCluster, Client], tmp_path: Path
) -> None:
    """A running gang is never taken for one that did not start however long it runs past
    ``jobs.gang_start_timeout_s``: test_runner's unit table (the real timeout, a fake clock)."""
    cfg, _cluster, client = durability_cluster
    script = tmp_path / "allreduce.py"
    script.write_text(ALL_REDUCE_SCRIPT)
    out = tmp_path / "ranks"
    out.mkdir()
    release = tmp_path / "release"
    job_id = submit_command(
        cfg,
        "--workers=4",
        "--gpus-per-worker=1",
        "--name=allreduce",
        command=["python", str(script), str(out), str(release)],
    )

    wait_state(client, job_id, {"RUNNING"})
    # RUNNING while it runs: every rank got through the all-reduce and waits to be released.
    wait_for("4 rank files", lambda: len(list(out.glob("rank-*.json"))) == 4, 120)
    assert client.status(job_id).state == "RUNNING"
    release.touch()
    done = wait_state(client, job_id, {"SUCCEEDED"}, timeout_s=240)

    assert [t["to"] for t in done.history] == ["QUEUED", "ADMITTED", "RUNNING", "SUCCEEDED"]
    assert done.attempt == 1

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
    # Issue 31: each rank's own line once, by rank (the local nodes share a log directory,
    # and each forwards every worker's lines), and no line of Ray's without --system.
    for rank in range(4):
        line = f"[rank {rank}] allreduce-ok rank={rank} world=4 sum=6"
        assert logs.stdout.splitlines().count(line) == 1, logs.stdout[-3000:]
    assert "(RayTrainWorker" not in logs.stdout and "TrainController" not in logs.stdout
    system = rcp(cfg, "logs", job_id, "--system").stdout
    assert "(RayTrainWorker" in system and "allreduce-ok rank=0 world=4 sum=6" in system


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
    raise RuntimeError("rank 1 cannot go on")
time.sleep(600)
"""


@pytest.mark.full
def test_a_rank_that_exits_non_zero_fails_the_gang_and_leaves_no_process(
    durability_cluster: tuple[Config, LocalCluster, Client], tmp_path: Path
) -> None:
    """``full``: the launcher's unit tests run real processes through the same rule (a
    failed rank's exit status and summary, SIGTERM then SIGKILL to the others, the command
    dying with its worker: test_launcher)."""
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
    # The control plane saw it end: FAILED, with no restart left to spend (--max-restarts=0).
    failed = wait_state(client, job_id, {"FAILED"}, timeout_s=60)
    assert failed.attempt == 1 and failed.attempts[0].kind == "failed", failed.attempts
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
    assert "the command exited with code 1" in logs
    # Issue 31: rank 1's own lines, its traceback whole and once; no line of Ray's.
    lines = logs.splitlines()
    assert lines.count("[rank 1] rank 1 gives up") == 1, logs[-4000:]
    assert lines.count("[rank 1] Traceback (most recent call last):") == 1
    assert lines.count("[rank 1] RuntimeError: rank 1 cannot go on") == 1
    assert "(RayTrainWorker" not in logs and "TrainController" not in logs


@pytest.mark.full
def test_a_cancelled_command_job_leaves_no_process_even_one_ignoring_sigterm(
    durability_cluster: tuple[Config, LocalCluster, Client], tmp_path: Path
) -> None:
    """``full``: test_launcher's stop tests kill a real command that ignores SIGTERM after
    the grace, and what it left behind."""
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


# -- crashes, preemption and hangs: the runner restarts from the last committed checkpoint ------

RECOVERY_SCRIPT = """\
import glob, hashlib, json, os, sys, time
import torch
import torch.distributed as dist
from jobs.checkpointing import Checkpointing

out_dir, num_steps, every, sleep_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
# argv[5:7]: the rank world-1 of run <hang_run> stops making progress <hang_after> steps
# after the step it started from.
hang_after = int(sys.argv[5]) if len(sys.argv) > 5 else -1
hang_run = int(sys.argv[6]) if len(sys.argv) > 6 else 1
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ["RCP_ATTEMPT"])
# The run: how many times this rank's script started for the job (a restart in place starts
# it again within the same attempt; a re-queue in a new attempt).
run = 1 + len(glob.glob(os.path.join(out_dir, f"pid-*-{rank}.json")))
if run > 1:
    sleep_s = min(sleep_s, 0.02)  # a resumed run only has to finish


def note(name, record):
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump(record, f)


if world > 1:
    dist.init_process_group("gloo")
ckpt = Checkpointing(every_n_steps=every)
note(f"pid-{run}-{rank}.json", {"pid": os.getpid()})


def digests(state):
    return {k: hashlib.sha256(v.numpy().tobytes()).hexdigest() for k, v in sorted(state.items())}


state = {
    "w": torch.randn(4096, generator=torch.Generator().manual_seed(rank)),
    "steps_seen": torch.zeros(1, dtype=torch.int64),
}
start, restored = 0, ckpt.restore()
if restored is not None:
    state = {k: v.clone() for k, v in restored.state.items()}
    start = restored.step + 1
    note(f"restored-{run}-{rank}.json",
         {"step": restored.step, "source": restored.source, "digests": digests(state)})
for step in range(start, num_steps):
    if run == hang_run and step == start + hang_after and rank == world - 1:
        note(f"hang-{run}.json", {"step": step})
        print(f"rank {rank} stops making progress at step {step}", flush=True)
        time.sleep(3600)
    t = torch.tensor([float(step + rank)])
    if world > 1:
        dist.all_reduce(t)
    state["w"].mul_(0.999).add_(t.item() * 1e-3)
    state["steps_seen"] += 1
    if rank == 0:
        with open(os.path.join(out_dir, "steps.jsonl"), "a") as f:
            line = {"attempt": attempt, "run": run, "step": step, "start": start, "at_s": time.time()}
            f.write(json.dumps(line) + "\\n")
    if ckpt.should_checkpoint(step) or step == num_steps - 1:
        note(f"saved-{rank}-{step}.json", digests(state))
        ckpt.save(step, state)
        if ckpt.preempted:
            break
    ckpt.report(step, {})
    time.sleep(sleep_s)
ckpt.finish()
if world > 1:
    dist.destroy_process_group()
"""

SLEEP_SCRIPT = "import sys, time; time.sleep(float(sys.argv[1]))"


def recovery_script(tmp_path: Path) -> tuple[Path, Path]:
    script = tmp_path / "recovering.py"
    script.write_text(RECOVERY_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    return script, out


def steps_of(out: Path) -> list[dict[str, object]]:
    path = out / "steps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_trainer(cfg: Config, client: Client, script: Path, out: Path, *options: str) -> str:
    """Submit the recovery script as a long 1-worker job (checkpoints only when asked) and
    return its id once it has trained 5 steps."""
    job_id = submit_command(
        cfg,
        "--workers=1",
        *options,
        command=["python", str(script), str(out), "100000", "1000", "0.2"],
    )
    wait_state(client, job_id, {"RUNNING"})
    wait_for(f"{job_id} to train", lambda: len(steps_of(out)) >= 5, 180)
    return job_id


def wait_job(
    cfg: Config, client: Client, job_id: str, what: str, cond: Any, timeout_s: float
) -> Job:
    """The job once `cond(job)` holds; on timeout the failure shows the job and its log."""
    try:

        def check() -> Job | None:
            job = client.status(job_id)
            return job if cond(job) else None

        return wait_for(what, check, timeout_s)
    except AssertionError as exc:
        job = client.status(job_id)
        logs = rcp(cfg, "logs", job_id, "--system").stdout[-6000:]
        raise AssertionError(f"{exc}\njob: {job.raw}\nlog tail:\n{logs}") from None


def ray_job_end_s(cfg: Config, submission_id: str) -> float:
    """When Ray says the Ray Job ended (its gang stopped)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(
        f"http://{cfg.ray.node_ip}:{cfg.ray.dashboard_port}", headers=ray_auth_headers(cfg)
    )
    end_ms = client.get_job_info(submission_id).end_time
    assert end_ms, f"Ray Job {submission_id} has not ended"
    return float(end_ms) / 1000.0


def placement(cfg: Config, job_id: str) -> set[str]:
    """The nodes the job's current attempt was admitted on (the store's record)."""
    from controlplane.store import Store

    with Store(cfg.jobs_db_path) as store:
        return set(store.get(job_id).info.get("placement") or {})


def recovery_info(cfg: Config, job_id: str, job: Job) -> dict[str, object]:
    """What ETTR is computed from, for a failure message."""
    from controlplane.store import Store

    with Store(cfg.jobs_db_path) as store:
        info = store.get(job_id).info
    keys = ("first_admitted_s", "recovering", "recoveries", "stall_s_total", "progress")
    return {"updated_s": job.raw.get("updated_s"), **{k: info.get(k) for k in keys}}


def manifest_in_storage(cfg: Config, step_uri: str) -> dict[str, object]:
    """The committed manifest of a step (``s3://bucket/.../step-<S>``), read from the store."""
    from controlplane.storage import bucket_of, s3_client

    bucket, key = bucket_of(step_uri)
    body = s3_client(cfg).get_object(Bucket=bucket, Key=f"{key}/manifest.json")["Body"].read()
    return dict(json.loads(body))


def assert_restored_bit_exact(out: Path, run: int, world: int) -> int:
    """Every rank of `run` (the script's n-th start: the attempt, unless a run restarted in
    place) restored what it saved at the restored step; returns it."""
    steps = set()
    for rank in range(world):
        restored = json.loads((out / f"restored-{run}-{rank}.json").read_text())
        saved = json.loads((out / f"saved-{rank}-{restored['step']}.json").read_text())
        assert restored["digests"] == saved, f"rank {rank} restored other bytes than it saved"
        steps.add(restored["step"])
    assert len(steps) == 1, steps
    return steps.pop()


def test_a_killed_worker_restarts_in_place_and_a_hung_one_re_queues_each_resuming_bit_exact(
    durability_cluster: tuple[Config, LocalCluster, Client], tmp_path: Path
) -> None:
    """One 2-rank gang meets both faults (one gang start less than a test each): run 1 loses
    a worker to SIGKILL mid-run and the gang restarts in place (issue 30: the same attempt,
    a new worker group, a restart spent, the recovery timed); run 2 restores and then one of
    its ranks stops making progress; the watchdog finds the hang, logs every rank's stack
    and re-queues the job; attempt 2 (run 3) restores and finishes. Each restore is the last
    committed step, bit-exact."""
    cfg, _cluster, client = durability_cluster
    script, out = recovery_script(tmp_path)
    stall_s = 8.0
    job_id = submit_command(
        cfg,
        "--workers=2",
        "--gpus-per-worker=1",
        "--max-restarts=2",
        f"--stall-timeout-s={stall_s:g}",
        "--name=crash-then-hang",
        # 120 steps, a commit every 5, 0.25 s a step; run 2 hangs 12 steps after its start
        command=["python", str(script), str(out), "120", "5", "0.25", "12", "2"],
    )
    wait_state(client, job_id, {"RUNNING"})
    wait_for(
        "a committed step the controller read from storage",
        lambda: (client.status(job_id).last_committed_step or 0) >= 10,
        240,
    )
    committed_at_kill = int(client.status(job_id).last_committed_step or 0)
    victim = json.loads((out / "pid-1-1.json").read_text())["pid"]
    os.kill(victim, 9)  # SIGKILL one worker process mid-run

    hung = wait_job(cfg, client, job_id, "the hang to be detected", lambda j: j.hangs >= 1, 300)
    assert hung.attempt == 1, hung.attempts  # the kill did not end the attempt
    assert [(a.kind, a.in_place) for a in hung.attempts][:1] == [("crash", 1)], hung.attempts
    assert "killed by signal 9 (SIGKILL)" in hung.attempts[0].reason, hung.attempts[0].reason
    (event,) = [e for e in client.events(job_id=job_id) if e["kind"] == "job.hung"]
    last_step = max(float(s["at_s"]) for s in steps_of(out) if s["run"] == 2)
    # How soon after the stall it was found is the watchdog's unit tests' (a fake clock);
    # here it is printed, not bounded against this machine's load.
    print(
        f"hang detected {float(event['at_s']) - last_step:.1f}s after the last step, "
        f"{event['data']['stalled_s']:.1f}s after the step last grew as reported "
        f"(stall_timeout_s={stall_s:g})"
    )
    assert event["data"]["stalled_s"] > stall_s
    logs = rcp(cfg, "logs", job_id).stdout
    header = "=== attempt 1: hang: stacks of the workers (py-spy via Ray) ==="
    assert header in logs, logs[-3000:]
    stacks = logs.split(header, 1)[1]
    assert "--- rank 0 (pid" in stacks and "--- rank 1 (pid" in stacks
    assert "recovering.py" in stacks, stacks[:3000]  # the user's own frames

    done = wait_state(client, job_id, {"SUCCEEDED"}, timeout_s=600)
    assert done.attempt == 2 and done.restarts == 2 and done.hangs == 1, done.attempts
    assert [(a.kind, a.in_place) for a in done.attempts] == [
        ("crash", 1),
        ("hang", None),
        ("succeeded", None),
    ], done.attempts
    steps = steps_of(out)
    # Run 2 (in place): from the commit at or after the kill's, which run 1 had trained past.
    after_crash = assert_restored_bit_exact(out, 2, 2)
    assert after_crash >= committed_at_kill
    first = [s["step"] for s in steps if s["run"] == 1]
    assert max(first) >= after_crash
    second = [s for s in steps if s["run"] == 2]
    assert {s["attempt"] for s in second} == {1}
    assert second[0]["step"] == after_crash + 1 and second[0]["start"] == after_crash + 1
    # Run 3 (attempt 2): from a commit run 2 made before it hung (12 steps, a commit every 5).
    hang_step = json.loads((out / "hang-2.json").read_text())["step"]
    after_hang = assert_restored_bit_exact(out, 3, 2)
    assert after_crash < after_hang < hang_step, (after_crash, after_hang, hang_step)
    third = [s for s in steps if s["run"] == 3]
    assert {s["attempt"] for s in third} == {2}
    assert third[0]["step"] == after_hang + 1 and third[-1]["step"] == 119
    # Each recovery timed, failure to first new step, with where its restore read from.
    in_place, requeued = done.recoveries
    assert in_place["in_place"] and in_place["kind"] == "crash", done.recoveries
    assert in_place["restored_step"] == after_crash and in_place["source"] in ("memory", "storage")
    assert not requeued["in_place"] and requeued["kind"] == "hang", done.recoveries
    assert requeued["restored_step"] == after_hang
    assert all(r["seconds"] is not None and r["seconds"] > 0 for r in done.recoveries)
    assert done.ettr is not None and 0 < done.ettr < 1, recovery_info(cfg, job_id, done)
    print(f"recoveries: {done.recoveries}; ettr {done.ettr:.3f}")


def test_a_preempted_job_commits_before_its_gang_stops_and_resumes_on_another_node(
    durability_cluster: tuple[Config, LocalCluster, Client], tmp_path: Path
) -> None:
    cfg, _cluster, client = durability_cluster
    script, out = recovery_script(tmp_path)
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text(SLEEP_SCRIPT)
    low = start_trainer(
        cfg, client, script, out, "--gpus-per-worker=2", "--priority=low", "--name=low"
    )
    (first_node,) = placement(cfg, low)
    filler = submit_command(
        cfg,
        "--workers=1",
        "--gpus-per-worker=2",
        "--priority=medium",
        "--name=filler",
        command=["python", str(sleeper), "600"],
    )
    wait_state(client, filler, {"RUNNING"})
    high = submit_command(
        cfg,
        "--workers=1",
        "--gpus-per-worker=2",
        "--priority=high",
        "--name=high",
        command=["python", str(sleeper), "600"],
    )
    try:
        job = wait_for(
            "low to be preempted and re-queued",
            lambda: (j := client.status(low)).num_preemptions >= 1 and j,
            300,
        )
        reason = next(t["reason"] for t in job.history if t["to"] == "PREEMPTED")
        assert "checkpointed-for-preemption at step" in reason, reason
        step = job.attempts[0].checkpoint_step
        assert step is not None, job.attempts
        assert job.attempts[0].kind == "preempted" and job.restarts == 0
        # The requested step's manifest was in storage before the gang was stopped, and the
        # loop trained no step past it.
        manifest = manifest_in_storage(cfg, f"{job.checkpoint_uri}/step-{step:012d}")
        assert float(manifest["created_unix_s"]) < ray_job_end_s(cfg, f"{low}-1")
        assert max(int(s["step"]) for s in steps_of(out) if s["attempt"] == 1) == step
        # It runs again once the filler's node is free (cancelled now, rather than waited
        # out): from that step, on the other node.
        client.cancel(filler)
        wait_for("low attempt 2", lambda: any(s["attempt"] == 2 for s in steps_of(out)), 300)
        second = [s for s in steps_of(out) if s["attempt"] == 2]
        assert second[0]["start"] == step + 1 and second[0]["step"] == step + 1
        assert placement(cfg, low) and first_node not in placement(cfg, low)
        assert assert_restored_bit_exact(out, 2, 1) == step
        assert client.status(high).state == "RUNNING"
    finally:
        for job_id in (low, filler, high):
            with contextlib.suppress(Exception):
                client.cancel(job_id)
    for job_id in (low, filler, high):
        wait_for(f"{job_id} settled", lambda j=job_id: client.status(j).done, 120)


@pytest.mark.full
def test_a_job_on_a_node_removed_by_health_restores_from_the_peer_memory_copy(
    durability_cluster: tuple[Config, LocalCluster, Client], tmp_path: Path
) -> None:
    """Last in the module: it takes a node out (the autoscaler replaces it). ``full``: the
    default run takes a hot node out under a gang in test_node_health and restores from a
    peer's memory copy in test_memory_tier_peer."""
    from controlplane.ray_connection import connect
    from controlplane.telemetry import manager

    cfg, _cluster, client = durability_cluster
    connect(cfg)
    script, out = recovery_script(tmp_path)
    job_id = start_trainer(cfg, client, script, out, "--gpus-per-worker=1", "--name=on-a-bad-node")
    (bad,) = placement(cfg, job_id)
    wait_for("the agent on its node", lambda: bad in manager.collect_summaries(), 120)
    try:
        manager.inject_fault(bad, "hot-gpu")
        job = wait_job(
            cfg,
            client,
            job_id,
            "the job to be moved off the bad node",
            lambda j: j.attempt >= 2 and j.state == "RUNNING",
            300,
        )
        assert job.attempts[0].kind == "health" and job.restarts == 0, job.attempts
        wait_for("attempt 2 to train", lambda: any(s["attempt"] == 2 for s in steps_of(out)), 180)
        if not (out / "restored-2-0.json").exists():
            history = "\n".join(f"  {t['to']}: {t.get('reason')}" for t in job.history)
            events = "\n".join(
                f"  {e['kind']}: {e['message']}" for e in client.events(job_id=job_id)
            )
            logs = rcp(cfg, "logs", job_id, "--system").stdout[-8000:]
            raise AssertionError(
                f"attempt 2 restored nothing\nhistory:\n{history}\nevents:\n{events}\n"
                f"log tail:\n{logs}"
            )
        restored = json.loads((out / "restored-2-0.json").read_text())
        print(f"health move: restored step {restored['step']} from {restored['source']}")
        assert restored["source"] == "memory"  # the peer copy on the other node
        assert assert_restored_bit_exact(out, 2, 1) == restored["step"]
        second = [s for s in steps_of(out) if s["attempt"] == 2]
        assert second[0]["step"] == restored["step"] + 1
        assert placement(cfg, job_id) and bad not in placement(cfg, job_id)
    finally:
        with contextlib.suppress(Exception):
            client.cancel(job_id)
    wait_for(f"{job_id} settled", lambda: client.status(job_id).done, 120)
