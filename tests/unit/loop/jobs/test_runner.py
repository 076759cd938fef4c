"""The runner's job life against a fake Ray (no Ray): admission, gang-start timeout with
exponential backoff, checkpoint-before-preempt, idempotency after a restart, and the observe
phase's snapshot rules.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from controlplane.adapters.ray_jobs import RayJobs, RayJobStatus
from controlplane.api.job_views import job_to_json
from controlplane.api.jobs import ApiError, JobService
from controlplane.config import Config, load_config
from controlplane.inventory import NodeRow
from controlplane.loop.act.jobs.launching import entrypoint_command
from controlplane.loop.act.jobs.limits import ORPHAN_SWEEP_INTERVAL_S
from controlplane.loop.act.jobs.runner import JobRunner
from controlplane.loop.observe import build_snapshot
from controlplane.store import JobState, Store
from jobs.signals.trust import token_sha256
from jobs.spec import JobSpec
from jobs.storage_credentials import StorageCredentials
from jobs.storage_uri import StorageUri
from policies.plan import AdmitJob, PreemptJob, WorkerPlacement
from tests.unit.api.test_api_server import make_invalid
from tests.unit.fake_logs import LogsFromText
from tests.unit.runner_tick import reconcile


class FakeRay(LogsFromText):
    """Ray Jobs and the signals actor, in memory (driver logs: `logs`, read by range)."""

    def __init__(self) -> None:
        self.jobs: dict[str, RayJobStatus] = {}
        self.submitted: list[tuple[str, str, dict[str, Any]]] = []
        self.stopped: list[str] = []
        self.signals: dict[str, dict[str, Any]] = {}
        self.requests: list[str] = []
        self.registered: list[tuple[str, int, str, str]] = []
        self.calls: list[str] = []
        self.signals_down = False
        self.holders: set[str] = set()
        """Memory-tier actor names (``<job id>/rank-<r>``) alive."""
        self.killed_holders: list[str] = []
        self.credentials: dict[str, tuple[int, dict[str, Any]]] = {}
        """Per job: the attempt and the storage credentials the actor holds for it."""

    def register_signals(self, job_id: str, attempt: int, token_hash: str, prefix: str) -> None:
        if self.signals_down:
            raise RuntimeError("rcp-job-signals is unreachable")
        self.calls.append(f"register {job_id}-{attempt}")
        self.registered.append((job_id, attempt, token_hash, prefix))
        sig = self.signals.setdefault(job_id, {})
        if sig.get("attempt") != attempt:  # the actor starts the attempt's record afresh
            sig.update({"attempt": attempt, "started_ranks": [], "in_place": []})
            sig.pop("credentials_expire_unix_s", None)
            self.credentials.pop(job_id, None)

    def put_storage_credentials(
        self, job_id: str, attempt: int, credentials: dict[str, Any]
    ) -> bool:
        if self.signals_down:
            raise RuntimeError("rcp-job-signals is unreachable")
        self.calls.append(f"put-credentials {job_id}-{attempt}")
        sig = self.signals.get(job_id)
        if not sig or sig.get("attempt") != attempt:
            return False
        self.credentials[job_id] = (attempt, dict(credentials))
        sig["credentials_expire_unix_s"] = credentials["expires_unix_s"]
        return True

    def submit(self, sid: str, entrypoint: str, runtime_env: dict[str, Any]) -> None:
        self.calls.append(f"submit {sid}")
        if sid in self.jobs:
            return
        self.jobs[sid] = RayJobStatus.PENDING
        self.submitted.append((sid, entrypoint, runtime_env))

    def status(self, sid: str) -> RayJobStatus:
        return self.jobs.get(sid, RayJobStatus.MISSING)

    def stop(self, sid: str) -> None:
        self.stopped.append(sid)
        self.jobs[sid] = RayJobStatus.STOPPED

    def logs(self, sid: str) -> str:
        return f"logs of {sid}"

    def rcp_submissions(self) -> dict[str, RayJobStatus]:
        """What `RayJobs.rcp_submissions` lists: ours (all this fake holds), not ended."""
        self.calls.append("list")
        ended = (RayJobStatus.STOPPED, RayJobStatus.SUCCEEDED, RayJobStatus.FAILED)
        return {sid: st for sid, st in self.jobs.items() if st not in ended}

    def signal_status(self, job_id: str) -> dict[str, Any]:
        return self.signals.get(job_id, {})

    def request_checkpoint(self, job_id: str, at_s: float) -> None:
        self.requests.append(job_id)

    def clear_request(self, job_id: str) -> None:
        pass

    def start_workers(self, job_id: str, attempt: int, n: int) -> None:
        self.signals.setdefault(job_id, {})
        workers = {r: {"pid": 1000 + r, "node_id": f"{r:02x}" * 4} for r in range(n)}
        self.signals[job_id].update(
            {"attempt": attempt, "started_ranks": list(range(n)), "workers": workers}
        )

    def report_progress(self, job_id: str, step: int, at_s: float, **stats: Any) -> None:
        """What the signals actor holds after rank 0 reported `step` (grown at `at_s`)."""
        sig = self.signals[job_id]
        last = sig.get("progress") or {}
        grew = not last or step > last["step"]
        sig["progress"] = {
            "step": step,
            "at_s": at_s,
            "step_at_s": at_s if grew else last["step_at_s"],
            **stats,
        }

    def worker_stack(self, pid: int, node_id: str) -> str:
        raise RuntimeError("this fake has no dashboard")

    def memory_tier_jobs(self) -> set[str]:
        return {name.partition("/")[0] for name in self.holders}

    def kill_memory_tier(self, job_id: str) -> int:
        mine = [n for n in self.holders if n.partition("/")[0] == job_id]
        self.holders -= set(mine)
        self.killed_holders += mine
        return len(mine)


def fake_mint(_job_id: str, _prefix: StorageUri) -> StorageCredentials:
    """Scoped storage credentials without STS (for configs on the embedded store, whose STS
    is not running in unit tests)."""
    return StorageCredentials(
        access_key_id="ASIAFAKE",
        secret_access_key="fake-secret",
        session_token="fake-token",
        expires_unix_s=1e10,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def env(tmp_path: Path) -> tuple[Store, Config, FakeRay, Clock, JobRunner]:
    cfg = load_config(
        None,
        [
            f"state_dir={tmp_path}",
            f"storage.uri=file://{tmp_path}/store",
            "storage.embedded=false",
            "jobs.gang_start_timeout_s=60",
            "jobs.backoff_initial_s=5",
            "jobs.backoff_max_s=12",
            "jobs.max_start_attempts=4",
        ],
    )
    clock = Clock()
    store = Store(tmp_path / "db.sqlite", clock=clock)
    fake = FakeRay()
    return store, cfg, fake, clock, JobRunner(store, cfg, fake, clock=clock)


def submit(store: Store, **over: Any) -> str:
    spec = JobSpec(name="j", entrypoint="pkg.mod:train", num_workers=2, gpus_per_worker=1, **over)
    return store.submit(spec).job.job_id


def admit(runner: JobRunner, job_id: str) -> None:
    runner.admit(
        AdmitJob(
            job_id, (WorkerPlacement("n1", 2),), num_workers=2, gpus_per_worker=1, reason="fits"
        )
    )


def test_admit_records_the_attempt_before_submitting_and_is_idempotent(env: Any) -> None:
    store, cfg, fake, _clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    admit(runner, job_id)  # the same action again next tick: nothing new
    job = store.get(job_id)
    assert job.state is JobState.ADMITTED
    assert job.info["submission_id"] == f"{job_id}-1"
    assert job.info["placement"] == {"n1": 2}
    assert [s[0] for s in fake.submitted] == [f"{job_id}-1"]
    sid, entrypoint, runtime_env = fake.submitted[0]
    assert entrypoint.endswith("-m jobs.launcher pkg.mod:train")
    envv = runtime_env["env_vars"]
    assert envv["RCP_JOB_ID"] == job_id and envv["RCP_NUM_WORKERS"] == "2"
    assert envv["RCP_STORAGE_PATH"] == str(cfg.train_storage_path)
    assert envv["RCP_NODE_IDS"] == "n1"  # the gang may only start where it was admitted


def test_gang_running_once_every_worker_started(env: Any) -> None:
    store, _cfg, fake, _clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    fake.start_workers(job_id, 1, 1)
    reconcile(runner)
    assert store.get(job_id).state is JobState.ADMITTED
    fake.start_workers(job_id, 1, 2)
    reconcile(runner)
    assert store.get(job_id).state is JobState.RUNNING
    fake.jobs[f"{job_id}-1"] = RayJobStatus.SUCCEEDED
    reconcile(runner)
    assert store.get(job_id).state is JobState.SUCCEEDED


def test_gang_start_timeout_requeues_with_doubling_backoff_then_fails(env: Any) -> None:
    store, _cfg, fake, clock, runner = env
    job_id = submit(store)
    backoffs = []
    for attempt in range(1, 5):
        admit(runner, job_id)
        clock.now += 61
        reconcile(runner)
        job = store.get(job_id)
        assert f"{job_id}-{attempt}" in fake.stopped
        if attempt < 4:
            assert job.state is JobState.QUEUED
            assert "gang-start-timeout" in store.history(job_id)[-1].reason
            backoffs.append(job.info["not_before_s"] - clock.now)
    assert backoffs == [5, 10, 12]  # doubling, capped at backoff_max_s
    assert store.get(job_id).state is JobState.FAILED


def prefix_of(cfg: Config, job_id: str) -> str:
    """The job's checkpoint prefix under the test's file:// storage."""
    return f"{cfg.storage.uri}/jobs/{job_id}"


def commit(cfg: Config, job_id: str, step: int, created_s: float = 1000.0) -> str:
    """Write step `step`'s manifest under the job's prefix (the commit); returns the step URI."""
    from jobs.checkpoint.layout import Manifest, RankRecord, manifest_key, step_dir

    root = Path(prefix_of(cfg, job_id).removeprefix("file://"))
    path = root / manifest_key(step)
    path.parent.mkdir(parents=True, exist_ok=True)
    ranks = (RankRecord(0, f"{step_dir(step)}/rank-00000.index.json", "00000000", 0),)
    path.write_bytes(Manifest(step, 1, ranks, created_s).to_json_bytes())
    return f"{prefix_of(cfg, job_id)}/{step_dir(step)}"


def hint(cfg: Config, job_id: str, step: int, *, answers: bool, attempt: int = 1) -> dict[str, Any]:
    """The signals actor's record of a ``checkpointed`` report."""
    return {
        "attempt": attempt,
        "step": step,
        "path": f"{prefix_of(cfg, job_id)}/step-{step:08d}",
        "at_s": 0.0,
        "answers_request": answers,
    }


def running(store: Store, fake: FakeRay, runner: JobRunner, **over: Any) -> str:
    job_id = submit(store, **over)
    admit(runner, job_id)
    fake.start_workers(job_id, 1, 2)
    reconcile(runner)
    assert store.get(job_id).state is JobState.RUNNING
    return job_id


def test_preemption_stops_the_gang_once_the_answering_manifest_is_in_storage(env: Any) -> None:
    store, cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)
    runner.preempt(PreemptJob(job_id, reason="preempt-for-priority: x", for_job_id="x"))
    assert fake.requests == [job_id]
    reconcile(runner)
    assert fake.stopped == [] and store.get(job_id).state is JobState.RUNNING
    # The loop says it checkpointed step 7 for the request; the manifest is not in storage yet.
    fake.signals[job_id]["checkpoint"] = hint(cfg, job_id, 7, answers=True)
    clock.now += 5
    reconcile(runner)
    assert fake.stopped == [], "a hint without its manifest in storage stopped the gang"
    uri = commit(cfg, job_id, 7, created_s=clock.now - 100)  # the job's clock may lag
    clock.now += 1
    reconcile(runner)
    assert fake.stopped == [f"{job_id}-1"]
    job = store.get(job_id)
    assert job.info["checkpoint"] == {
        "step": 7,
        "uri": uri,
        "committed_unix_s": clock.now - 101,
        "read_s": clock.now,
    }
    reconcile(runner)  # Ray reports STOPPED
    job = store.get(job_id)
    assert job.state is JobState.QUEUED and job.num_preemptions == 1
    assert [t.to_state for t in store.history(job_id)][-2:] == [JobState.PREEMPTED, JobState.QUEUED]
    assert "at step 7" in store.history(job_id)[-2].reason
    assert "restarts" not in job.info  # a preemption spends no restart
    assert job.info["attempts"][-1]["kind"] == "preempted"
    assert job.info["attempts"][-1]["checkpoint_step"] == 7  # structured, not parsed back
    # The next attempt restores the newest committed step from its prefix by itself.
    admit(runner, job_id)
    envv = fake.submitted[-1][2]["env_vars"]
    assert envv["RCP_CHECKPOINT_URI"] == prefix_of(cfg, job_id)
    assert "RCP_RESUME_FROM" not in envv and "RCP_CHECKPOINT_PREFIX" not in envv
    assert store.get(job_id).info["start_step"] == 7


def test_preemption_accepts_any_step_committed_after_the_request(env: Any) -> None:
    store, cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)
    commit(cfg, job_id, 3, created_s=clock.now - 50)  # a periodic checkpoint from before
    runner.preempt(PreemptJob(job_id, reason="preempt", for_job_id="x"))
    clock.now += 2
    reconcile(runner)
    assert fake.stopped == []  # committed before the request: not an answer
    assert store.get(job_id).info["checkpoint"]["step"] == 3
    commit(cfg, job_id, 4, created_s=clock.now)
    clock.now += 1
    reconcile(runner)
    assert fake.stopped == [f"{job_id}-1"]
    assert store.get(job_id).info["preempt_checkpoint"] == 4


def test_a_hint_without_a_manifest_waits_for_the_deadline(env: Any) -> None:
    store, cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)
    runner.preempt(PreemptJob(job_id, reason="preempt", for_job_id="x"))
    fake.signals[job_id]["checkpoint"] = hint(cfg, job_id, 9, answers=True)
    deadline = store.get(job_id).spec.checkpoint.preempt_deadline_s
    clock.now += deadline - 1
    reconcile(runner)
    assert fake.stopped == []
    clock.now += 2
    reconcile(runner)
    assert fake.stopped == [f"{job_id}-1"]
    reconcile(runner)
    assert store.get(job_id).state is JobState.QUEUED
    assert "preempt-deadline-passed" in store.history(job_id)[-2].reason
    assert "checkpoint" not in store.get(job_id).info


def test_a_health_move_that_fails_while_preempting_spends_no_restart(env: Any) -> None:
    store, _cfg, fake, _clock, runner = env
    job_id = running(store, fake, runner)
    runner.preempt(PreemptJob(job_id, reason="checkpoint and restart elsewhere: hot gpu"))
    fake.jobs[f"{job_id}-1"] = RayJobStatus.FAILED  # the node went down under it
    reconcile(runner)
    job = store.get(job_id)
    assert job.state is JobState.QUEUED and "restarts" not in job.info
    assert job.info["attempts"][-1]["kind"] == "health"
    assert "not_before_s" not in job.info


def test_a_preemption_for_serving_ends_the_attempt_as_preempted_not_as_health(env: Any) -> None:
    """Serving's reclaim names no job: its attempt still ends ``preempted`` (users read the
    kind in ``rcp status``; ``health`` would blame a node)."""
    store, _cfg, fake, _clock, runner = env
    job_id = running(store, fake, runner)
    runner.preempt(PreemptJob(job_id, reason="serving-reclaims: x", for_serving=True))
    fake.jobs[f"{job_id}-1"] = RayJobStatus.STOPPED
    reconcile(runner)
    job = store.get(job_id)
    assert job.state is JobState.QUEUED and "restarts" not in job.info
    assert job.info["attempts"][-1]["kind"] == "preempted"


def test_a_restarted_runner_resubmits_a_lost_submission_under_the_same_id(env: Any) -> None:
    store, cfg, fake, clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    fake.jobs.clear()  # the crash came between recording and submitting
    fresh = JobRunner(store, cfg, fake, clock=clock)
    reconcile(fresh)
    assert [s[0] for s in fake.submitted] == [f"{job_id}-1", f"{job_id}-1"]
    assert store.get(job_id).info["attempt"] == 1


def test_cancelled_running_job_gets_its_ray_job_stopped(env: Any) -> None:
    store, _cfg, fake, _clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    store.transition(job_id, JobState.CANCELLED, "user")
    reconcile(runner)
    assert fake.stopped == [f"{job_id}-1"]
    reconcile(runner)
    assert store.get(job_id).info["ray_done"] is True


@pytest.mark.parametrize(
    "entrypoint, expected",
    [
        ("pkg.mod:fn", "/py -m jobs.launcher pkg.mod:fn"),
        ("python train.py --lr 1", "/py -m jobs.launcher --command -- /py train.py --lr 1"),
        ("bash run.sh", "/py -m jobs.launcher --command -- bash run.sh"),
    ],
    ids=["module-function", "python-command", "other-command"],
)
def test_entrypoint_command(entrypoint: str, expected: str) -> None:
    assert entrypoint_command(entrypoint, python="/py") == expected


def test_snapshot_subtracts_gangs_the_store_holds_and_marks_preempting(env: Any) -> None:
    store, _cfg, _fake, _clock, runner = env
    held = submit(store)
    admit(runner, held)
    store.update_info(held, {"preempting": True})
    waiting = submit(store)
    store.update_info(waiting, {"not_before_s": 2000.0})
    rows = [
        NodeRow("n1", "cluster", "a", "ALIVE", 4, 4, 8, 8),  # Ray does not see the gang yet
        NodeRow("n2", "cluster", "b", "ALIVE", 4, 1, 8, 8),  # a Serve replica holds 3
        NodeRow("n3", "cluster", "c", "DEAD", 4, 0, 8, 0),
    ]
    snap = build_snapshot(1000.0, rows, store.list_jobs())
    free = {n.node_id: (n.gpus_free, n.healthy) for n in snap.nodes}
    assert free == {"n1": (2, True), "n2": (1, True), "n3": (0, False)}
    assert [g.job_id for g in snap.running] == [held] and snap.running[0].preempting
    assert [q.job_id for q in snap.queued] == [waiting]
    assert snap.queued[0].not_before_s == 2000.0


def test_a_running_job_whose_ray_job_vanished_is_requeued(env: Any) -> None:
    store, _cfg, fake, _clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    fake.start_workers(job_id, 1, 2)
    reconcile(runner)
    fake.jobs.clear()  # a new cluster after `rcp down` / `rcp up`
    reconcile(runner)
    job = store.get(job_id)
    assert job.state is JobState.QUEUED and job.num_preemptions == 0
    assert "gang-lost" in store.history(job_id)[-1].reason
    assert job.info["attempts"][-1]["kind"] == "lost" and "restarts" not in job.info


def test_a_job_past_its_max_runtime_is_stopped_and_failed(env: Any) -> None:
    store, _cfg, fake, clock, runner = env
    job_id = submit(store, max_runtime_s=30.0)
    admit(runner, job_id)
    fake.start_workers(job_id, 1, 2)
    reconcile(runner)
    clock.now += 20
    reconcile(runner)
    assert store.get(job_id).state is JobState.RUNNING
    clock.now += 11
    reconcile(runner)
    assert store.get(job_id).state is JobState.FAILED
    assert fake.stopped == [f"{job_id}-1"]
    assert "max-runtime-exceeded" in store.history(job_id)[-1].reason


# -- job signals: a per-attempt token, and checkpoints only under the job's own prefix ----------


def _token_of(fake: FakeRay, attempt: int = 1) -> str:
    return str(fake.submitted[attempt - 1][2]["env_vars"]["RCP_SIGNAL_TOKEN"])


def test_each_attempt_gets_a_fresh_signal_token_registered_before_the_gang_is_submitted(
    env: Any,
) -> None:
    store, cfg, fake, clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    token = _token_of(fake)
    prefix = prefix_of(cfg, job_id)
    assert len(token) >= 32
    assert fake.registered == [(job_id, 1, token_sha256(token), prefix)]
    assert fake.calls == [f"register {job_id}-1", f"submit {job_id}-1"]
    envv = fake.submitted[0][2]["env_vars"]
    assert envv["RCP_CHECKPOINT_URI"] == prefix
    # The second attempt's token is another one; the first stops working with it.
    clock.now += 61
    reconcile(runner)  # gang-start timeout: re-queued
    clock.now += 100
    admit(runner, job_id)
    assert _token_of(fake, 2) != token
    assert fake.registered[-1] == (job_id, 2, token_sha256(_token_of(fake, 2)), prefix)


def test_the_signal_token_is_not_in_the_api_view_events_or_history(env: Any) -> None:
    store, _cfg, fake, _clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    token = _token_of(fake)
    shown = json.dumps(job_to_json(store.get(job_id), store.history(job_id)))
    shown += json.dumps([e.__dict__ for e in store.events(job_id=job_id)], default=str)
    assert token not in shown and token_sha256(token) not in shown


def test_no_gang_is_submitted_when_the_signals_actor_cannot_register_it(env: Any) -> None:
    store, _cfg, fake, _clock, runner = env
    fake.signals_down = True
    job_id = submit(store)
    admit(runner, job_id)
    assert fake.submitted == []
    job = store.get(job_id)
    assert job.state is JobState.QUEUED
    assert "job signals unavailable" in store.history(job_id)[-1].reason


def test_a_signals_actor_that_lost_the_attempt_is_told_it_again(env: Any) -> None:
    store, _cfg, fake, _clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    fake.signals.clear()  # the actor restarted (or was replaced) and holds nothing
    reconcile(runner)
    assert len(fake.registered) == 2 and fake.registered[1] == fake.registered[0]


def _outside(cfg: Config, job_id: str, tmp_path: Path) -> dict[str, str]:
    """Hint paths that are not under the job's prefix, each with a committed manifest there."""
    prefix = prefix_of(cfg, job_id)
    commit(cfg, "job-other", 9)
    root = Path(prefix.removeprefix("file://"))
    root.mkdir(parents=True, exist_ok=True)
    link = root / "step-00000002"
    if not link.exists():
        link.symlink_to(Path(prefix_of(cfg, "job-other").removeprefix("file://")))
    return {
        "another-job": f"{prefix_of(cfg, 'job-other')}/step-000000000009",
        "dot-dot": f"{prefix}/../job-other/step-000000000009",
        "symlink-out": f"file://{link}",
        "sibling-with-longer-id": f"{prefix}0/step-000000000009",
        "the-prefix-itself": prefix,
        "elsewhere": f"file://{tmp_path}/attacker/step-000000000009",
        "a-uri": f"s3://bucket/{job_id}/step-000000000009",
        "relative": f"{job_id}/step-000000000009",
    }


@pytest.mark.parametrize(
    "case",
    [
        "another-job",
        "dot-dot",
        "symlink-out",
        "sibling-with-longer-id",
        "the-prefix-itself",
        "elsewhere",
        "a-uri",
        "relative",
    ],
)
def test_a_hint_outside_the_jobs_prefix_never_stops_the_gang(
    env: Any, tmp_path: Path, case: str
) -> None:
    store, cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)
    runner.preempt(PreemptJob(job_id, reason="preempt", for_job_id="x"))
    fake.signals[job_id]["checkpoint"] = {
        **hint(cfg, job_id, 9, answers=True),
        "path": _outside(cfg, job_id, tmp_path)[case],
    }
    clock.now += 1
    reconcile(runner)
    assert fake.stopped == []
    assert "checkpoint" not in store.get(job_id).info


# -- submission off the tick thread (issue 12) -------------------------------------------------


class HangingRay(FakeRay):
    """A FakeRay whose submit blocks until `release` is set (a wedged dashboard)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.hung: list[str] = []

    def submit(self, sid: str, entrypoint: str, runtime_env: dict[str, Any]) -> None:
        self.hung.append(sid)
        self.release.wait(30)
        super().submit(sid, entrypoint, runtime_env)


def hanging_runner(env: Any, timeout_s: float = 0.2) -> tuple[HangingRay, JobRunner]:
    store, cfg, _fake, clock, _runner = env
    cfg.jobs.submit_timeout_s = timeout_s
    ray = HangingRay()
    return ray, JobRunner(store, cfg, ray, clock=clock)


def wait_until(cond: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_hanging_submission_blocks_the_tick_at_most_the_timeout(env: Any) -> None:
    store, _cfg, _fake, clock, _runner = env
    ray, runner = hanging_runner(env)
    job_id = submit(store)
    started = time.monotonic()
    admit(runner, job_id)
    assert time.monotonic() - started < 2.0  # 0.2 s timeout, generous margin for CI
    job = store.get(job_id)
    assert job.state is JobState.QUEUED  # a start failure with backoff
    assert job.info["start_failures"] == 1 and job.info["not_before_s"] == clock.now + 5
    assert "did not accept the submission within 0.2s" in job.info["message"]
    # Ray accepts the abandoned submission late: the runner stops it (no second gang).
    ray.release.set()
    wait_until(lambda: f"{job_id}-1" in ray.stopped)
    clock.now += 6
    admit(runner, job_id)
    assert store.get(job_id).state is JobState.ADMITTED
    assert [s[0] for s in ray.submitted] == [f"{job_id}-1", f"{job_id}-2"]
    assert ray.status(f"{job_id}-1") is RayJobStatus.STOPPED
    assert ray.status(f"{job_id}-2") is RayJobStatus.PENDING


def test_while_a_submission_hangs_the_next_fails_at_once(env: Any) -> None:
    store, *_ = env
    ray, runner = hanging_runner(env, timeout_s=0.5)
    first, second = submit(store), submit(store)
    admit(runner, first)
    started = time.monotonic()
    admit(runner, second)
    assert time.monotonic() - started < 0.4  # no second wait while Ray is wedged
    assert ray.hung == [f"{first}-1"]
    job = store.get(second)
    assert job.state is JobState.QUEUED and "not answered" in job.info["message"]
    ray.release.set()
    wait_until(lambda: f"{first}-1" in ray.stopped)


def test_reconcile_resubmitting_a_lost_submission_is_bounded_too(env: Any) -> None:
    store, _cfg, fake, _clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    del fake.jobs[f"{job_id}-1"]  # the cluster lost it: reconcile resubmits
    ray, hanging = hanging_runner(env)
    started = time.monotonic()
    reconcile(hanging)
    assert time.monotonic() - started < 2.0
    assert ray.hung == [f"{job_id}-1"]
    assert store.get(job_id).state is JobState.QUEUED
    ray.release.set()


class FakeJobClient:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def submit_job(self, **kwargs: Any) -> str:
        self.calls.append(kwargs)
        return str(kwargs["submission_id"])


def test_every_entrypoint_asks_for_the_job_driver_resource(env: Any) -> None:
    _store, cfg, *_ = env
    jobs = RayJobs(cfg)
    client = FakeJobClient()
    jobs._client = client
    jobs.submit("j-1", "python -m x", {"env_vars": {}})
    assert client.calls[0]["entrypoint_resources"] == {"rcp_job_driver": 1}
    assert client.calls[0]["submission_id"] == "j-1"


# -- a row that no longer validates can still be cancelled and stopped (issue 12) -------------


def test_cancelling_an_invalid_running_row_stops_its_gang_by_id(env: Any) -> None:
    store, cfg, fake, _clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    fake.start_workers(job_id, 1, 2)
    reconcile(runner)
    assert store.get(job_id).state is JobState.RUNNING
    make_invalid(store, job_id)
    reconcile(runner)  # the tick skips it: nobody supervises that gang
    assert fake.stopped == []
    view = JobService(store, cfg).cancel(job_id)
    assert view["state"] == "CANCELLED" and view["invalid"] and view["id"] == job_id
    assert view["ray_job_id"] == f"{job_id}-1" and "signal_token" not in json.dumps(view)
    reconcile(runner)
    assert fake.stopped == [f"{job_id}-1"]
    reconcile(runner)  # stopped: ray_done, no second stop
    assert fake.stopped == [f"{job_id}-1"] and store.raw_info(job_id)["ray_done"] is True
    assert store.scan_jobs(states=[JobState.CANCELLED], unsettled_only=True).invalid == []
    with pytest.raises(ApiError) as info:
        JobService(store, cfg).cancel(job_id)
    assert info.value.status == 409


def test_an_invalid_row_without_submission_id_uses_the_attempt(env: Any) -> None:
    store, _cfg, fake, _clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    make_invalid(store, job_id)
    store.cancel_invalid(job_id, "cancelled by the user")
    store.merge_raw_info(job_id, {"submission_id": None})  # only the attempt is left
    reconcile(runner)
    assert fake.stopped == [f"{job_id}-1"]


# -- orphan sweep: Ray Jobs of ours that no job attempt owns (issue 12) -------------------------


def test_the_orphan_sweep_stops_ray_jobs_no_active_attempt_owns(env: Any) -> None:
    store, cfg, fake, clock, _runner = env
    live, queued, done = submit(store), submit(store), submit(store)
    runner = JobRunner(store, cfg, fake, clock=clock)
    admit(runner, live)
    # A submission abandoned across a restart: the job went back to the queue (attempt 1
    # failed to start in time), Ray accepted it late, and the controller that would have
    # stopped it is gone.
    fake.jobs[f"{queued}-1"] = RayJobStatus.RUNNING
    fake.jobs[f"{live}-0"] = RayJobStatus.PENDING  # an older attempt of a live job
    fake.jobs[f"{done}-1"] = RayJobStatus.SUCCEEDED  # ended: nothing to stop
    restarted = JobRunner(store, cfg, fake, clock=clock)
    reconcile(restarted)  # the first reconcile sweeps
    assert sorted(fake.stopped) == sorted([f"{queued}-1", f"{live}-0"])
    assert fake.status(f"{live}-1") is RayJobStatus.PENDING  # the current attempt runs on
    events = store.events(kind_prefix="job.orphan_stopped")
    assert {e.data["submission_id"] for e in events} == {f"{queued}-1", f"{live}-0"}


def test_the_orphan_sweep_runs_at_start_then_every_few_minutes(env: Any) -> None:
    store, cfg, fake, clock, _runner = env
    runner = JobRunner(store, cfg, fake, clock=clock)
    for _ in range(5):
        reconcile(runner)
        clock.now += 10
    assert fake.calls.count("list") == 1
    clock.now += ORPHAN_SWEEP_INTERVAL_S
    reconcile(runner)
    assert fake.calls.count("list") == 2


def test_the_orphan_sweep_spares_preempting_and_invalid_running_rows(env: Any) -> None:
    store, cfg, fake, clock, runner = env
    preempting, invalid = submit(store), submit(store)
    for job_id in (preempting, invalid):
        admit(runner, job_id)
        fake.start_workers(job_id, 1, 2)
    reconcile(runner)
    runner.preempt(PreemptJob(preempting, for_job_id="x", checkpoint_first=True, reason="r"))
    make_invalid(store, invalid)
    assert runner.sweep_orphans() == []
    assert fake.stopped == []


class ListingClient:
    def __init__(self, jobs: list[Any]) -> None:
        self.jobs = jobs

    def list_jobs(self) -> list[Any]:
        return self.jobs


def test_ray_jobs_lists_only_its_own_live_submissions(env: Any) -> None:
    from types import SimpleNamespace as NS

    _store, cfg, *_ = env
    jobs = RayJobs(cfg)
    jobs._client = ListingClient(
        [
            NS(submission_id="j-1", status="JobStatus.RUNNING", metadata={"rcp_job": "j"}),
            NS(submission_id="j-2", status="SUCCEEDED", metadata={"rcp_job": "j"}),
            NS(submission_id="mine", status="RUNNING", metadata={}),
            NS(submission_id="raw", status="PENDING", metadata=None),
        ]
    )
    assert jobs.rcp_submissions() == {"j-1": RayJobStatus.RUNNING}


def test_a_failing_upkeep_step_keeps_back_neither_the_plan_nor_the_other_steps(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The credentials refresh runs after the lifecycle plan in `apply`: when it raises, the
    gang still goes RUNNING, stranded preemptions are still re-queued, and `apply` returns
    (the loop's act phase goes on to admission's plan)."""
    store, _cfg, fake, _clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    fake.start_workers(job_id, 1, 2)

    def broken(*args: Any) -> None:
        raise RuntimeError("STS is down")

    monkeypatch.setattr(runner._credentials, "refresh", broken)
    stranded: list[str] = []
    monkeypatch.setattr(runner._preemption, "requeue_stranded", lambda j: stranded.append(j))
    other = submit(store)
    admit(runner, other)
    store.transition(other, JobState.PREEMPTED, "a crash mid-preemption")
    reconcile(runner)
    assert store.get(job_id).state is JobState.RUNNING
    assert len(stranded) == 1
