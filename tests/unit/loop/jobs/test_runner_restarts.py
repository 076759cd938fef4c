"""Crash recovery and the hang watchdog, against the fake Ray of `test_runner`, a real store,
file:// checkpoint storage and, for the workers' stacks, a real HTTP server on 127.0.0.1
standing in for Ray's dashboard. No Ray.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from controlplane.adapters.ray_jobs import RayJobStatus, fetch_worker_stack
from controlplane.config import load_config
from controlplane.loop.act.jobs import limits as runner_module
from controlplane.loop.act.jobs.runner import JobRunner
from controlplane.store import JobState, Store
from controlplane.store.reliability import fleet_record
from policies.plan import PreemptJob
from tests.unit.loop.jobs.test_runner import Clock, FakeRay, admit, commit, running
from tests.unit.runner_tick import reconcile

S = JobState


class CrashingRay(FakeRay):
    """`FakeRay` whose attempts' logs the test writes, and whose stacks come from a URL."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: dict[str, str] = {}
        self.dashboard: str | None = None
        self.stack_calls: list[tuple[int, str]] = []

    def logs(self, sid: str) -> str:
        return self.texts.get(sid, f"logs of {sid}\n")

    def crash(self, sid: str, text: str) -> None:
        self.texts[sid] = text
        self.jobs[sid] = RayJobStatus.FAILED

    def worker_stack(self, pid: int, node_id: str) -> str:
        self.stack_calls.append((pid, node_id))
        if self.dashboard is None:
            raise RuntimeError("no dashboard")
        return fetch_worker_stack(self.dashboard, pid, node_id, timeout_s=(2.0, 5.0))


@pytest.fixture()
def env(tmp_path: Path) -> tuple[Store, Any, CrashingRay, Clock, JobRunner]:
    cfg = load_config(
        None,
        [
            f"state_dir={tmp_path}",
            f"storage.uri=file://{tmp_path}/store",
            "storage.embedded=false",
            "jobs.restart_backoff_initial_s=10",
            "jobs.restart_backoff_max_s=25",
            "jobs.stall_timeout_s=60",
        ],
    )
    clock = Clock()
    store = Store(tmp_path / "db.sqlite", clock=clock)
    fake = CrashingRay()
    return store, cfg, fake, clock, JobRunner(store, cfg, fake, clock=clock)


def traceback(error: str, pid: int = 4242, ip: str = "10.0.0.7") -> str:
    return (
        f"2026-01-0{pid % 9 + 1} 10:1{pid % 7}:03,120 INFO starting\n"
        "Traceback (most recent call last):\n"
        '  File "train.py", line 12, in loop\n'
        f"(RayTrainWorker pid={pid}, ip={ip}) {error}\n"
    )


def next_attempt(store: Store, fake: CrashingRay, runner: JobRunner, clock: Clock) -> int:
    """Admit the re-queued job once its backoff passed; its gang starts. Returns the attempt."""
    (job,) = store.list_jobs(states=[S.QUEUED])
    clock.now = max(clock.now, float(job.info.get("not_before_s", clock.now))) + 1
    admit(runner, job.job_id)
    attempt = int(store.get(job.job_id).info["attempt"])
    fake.start_workers(job.job_id, attempt, 2)
    reconcile(runner)
    assert store.get(job.job_id).state is S.RUNNING
    return attempt


# -- crash recovery ---------------------------------------------------------------------------


def test_a_crashed_gang_restarts_after_a_backoff_with_its_attempts_recorded(env: Any) -> None:
    store, cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)
    fake.report_progress(job_id, 5, clock.now, stall_s=0.5, wall_s=50.0)
    reconcile(runner)
    commit(cfg, job_id, 4)
    clock.now += 31  # past jobs.checkpoint_scan_interval_s: step 4 is read
    reconcile(runner)
    assert store.get(job_id).info["checkpoint"]["step"] == 4
    fake.crash(f"{job_id}-1", traceback("RuntimeError: CUDA error: an illegal memory access"))
    reconcile(runner)
    job = store.get(job_id)
    assert job.state is S.QUEUED and job.num_preemptions == 0
    assert job.info["not_before_s"] == clock.now + 10
    assert job.info["restarts"] == 1 and "progress" not in job.info
    assert job.info["stall_s_total"] == 0.5 and job.info["wall_s_total"] == 50.0
    (entry,) = job.info["attempts"]
    assert entry["attempt"] == 1 and entry["kind"] == "crash" and entry["step"] == 5
    assert entry["checkpoint_step"] == 4  # the committed step attempt 2 resumes from
    assert entry["ended_s"] == clock.now and entry["admitted_s"] == 1000.0
    assert "illegal memory access" in entry["reason"]
    # The message while it waits is the crash: the exception's own line, not a cut.
    assert job.info["message"] == (
        "(RayTrainWorker pid=4242, ip=10.0.0.7) RuntimeError: CUDA error: an illegal memory access"
    )
    last = store.history(job_id)[-1]
    assert (last.from_state, last.to_state) == (S.RUNNING, S.QUEUED)
    assert last.reason.startswith("gang-failed: restart 1 of 3 in 10s after crash:")
    assert fleet_record(store, clock.now)["by_kind"]["gang-crash"] == pytest.approx(1.0)
    # Attempt 2 resumes from the committed step and crashes after training further.
    assert next_attempt(store, fake, runner, clock) == 2
    assert store.get(job_id).info["start_step"] == 4
    assert store.get(job_id).info.get("message") is None  # running again: the crash is history
    fake.report_progress(job_id, 9, clock.now, stall_s=0.25, wall_s=10.0)
    reconcile(runner)
    fake.crash(f"{job_id}-2", traceback("RuntimeError: CUDA error: an illegal memory access"))
    reconcile(runner)
    job = store.get(job_id)
    assert job.info["restarts"] == 2 and job.info["not_before_s"] == clock.now + 20
    assert job.info["stall_s_total"] == 0.75 and job.info["wall_s_total"] == 60.0
    assert [a["attempt"] for a in job.info["attempts"]] == [1, 2]


def test_restarts_exhausted_fail_the_job_naming_the_count_and_the_last_failure(
    env: Any,
) -> None:
    store, _cfg, fake, clock, runner = env
    job_id = running(store, fake, runner, max_restarts=2)
    backoffs = []
    for attempt, error in enumerate(["KeyError: 'a'", "KeyError: 'b'", "OSError: disk full"], 1):
        if attempt > 1:
            assert next_attempt(store, fake, runner, clock) == attempt
        fake.crash(f"{job_id}-{attempt}", traceback(error))
        reconcile(runner)
        if attempt < 3:
            backoffs.append(store.get(job_id).info["not_before_s"] - clock.now)
    assert backoffs == [10, 20]
    job = store.get(job_id)
    assert job.state is S.FAILED and job.info["restarts"] == 2
    reason = store.history(job_id)[-1].reason
    assert "gave up after 2 restart(s) (max_restarts=2)" in reason and "disk full" in reason
    assert [a["kind"] for a in job.info["attempts"]] == ["crash", "crash", "failed"]
    assert job.info["ray_done"] is True


def test_the_same_failure_twice_before_any_progress_fails_at_once(env: Any) -> None:
    store, _cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)  # max_restarts 3
    fake.crash(f"{job_id}-1", traceback("NameError: name 'lr' is not defined", 4242, "10.0.0.7"))
    reconcile(runner)
    assert store.get(job_id).state is S.QUEUED
    next_attempt(store, fake, runner, clock)
    fake.crash(f"{job_id}-2", traceback("NameError: name 'lr' is not defined", 977, "10.0.0.9"))
    reconcile(runner)
    job = store.get(job_id)
    assert job.state is S.FAILED and job.info["restarts"] == 1
    reason = store.history(job_id)[-1].reason
    assert "same failure twice before any progress" in reason and "NameError" in reason
    # A typo never trained: it is not a failure of the fleet.
    assert "gang-crash" not in fleet_record(store, clock.now)["by_kind"]


@pytest.mark.parametrize(
    "between",
    ["another-error", "a-new-commit", "steps-reported"],
)
def test_a_repeated_failure_with_progress_or_another_error_keeps_restarting(
    env: Any, between: str
) -> None:
    store, cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)
    fake.crash(f"{job_id}-1", traceback("ValueError: bad batch"))
    reconcile(runner)
    next_attempt(store, fake, runner, clock)
    second = "ValueError: bad batch"
    if between == "another-error":
        second = "ValueError: nan loss"
    elif between == "a-new-commit":
        commit(cfg, job_id, 3)
        clock.now += 31
        reconcile(runner)
    else:
        fake.report_progress(job_id, 2, clock.now)
        reconcile(runner)
    fake.crash(f"{job_id}-2", traceback(second))
    reconcile(runner)
    job = store.get(job_id)
    assert job.state is S.QUEUED and job.info["restarts"] == 2


def test_a_job_stopped_outside_the_control_plane_fails_without_a_restart(env: Any) -> None:
    store, _cfg, fake, _clock, runner = env
    job_id = running(store, fake, runner)
    fake.jobs[f"{job_id}-1"] = RayJobStatus.STOPPED  # `ray job stop` by an operator
    reconcile(runner)
    job = store.get(job_id)
    assert job.state is S.FAILED and "restarts" not in job.info
    assert "ray-job-stopped-outside-control-plane" in store.history(job_id)[-1].reason


# -- the hang watchdog ---------------------------------------------------------------------------


class _Dashboard(BaseHTTPRequestHandler):
    """``/worker/traceback``: py-spy's dump of the pid asked for."""

    seen: list[dict[str, list[str]]]
    release: threading.Event

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        self.seen.append(query)
        if url.path != "/worker/traceback":
            self.send_error(404)
            return
        self.release.wait(30)
        pid = query["pid"][0]
        body = (
            f"Process {pid}: python train.py\n"
            f"Thread {pid} (idle): MainThread\n"
            "    all_reduce (torch/distributed/distributed_c10d.py:2050)\n"
            "    train_step (train.py:42)\n"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def dashboard() -> Iterator[tuple[str, list[dict[str, list[str]]], threading.Event]]:
    seen: list[dict[str, list[str]]] = []
    release = threading.Event()
    release.set()
    handler = type("Handler", (_Dashboard,), {"seen": seen, "release": release})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen, release
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def test_a_hung_gang_is_detected_at_the_timeout_its_stacks_logged_and_restarted(
    env: Any, dashboard: Any
) -> None:
    store, cfg, fake, clock, runner = env
    fake.dashboard, seen, _release = dashboard
    job_id = running(store, fake, runner)
    fake.report_progress(job_id, 10, clock.now, stall_s=1.0, wall_s=30.0)
    t0 = clock.now
    reconcile(runner)
    clock.now = t0 + 60  # exactly the stall timeout: not yet
    fake.report_progress(job_id, 10, clock.now)  # reports keep coming; the step does not grow
    reconcile(runner)
    assert fake.stopped == [] and store.get(job_id).state is S.RUNNING
    clock.now = t0 + 61  # one tick later
    started = time.monotonic()
    reconcile(runner)
    assert time.monotonic() - started < runner_module.TICK_WAIT_S + 1
    assert fake.stopped == [f"{job_id}-1"]
    assert sorted(q["pid"][0] for q in seen) == ["1000", "1001"]
    assert all(q["subprocesses"] == ["1"] for q in seen)
    assert sorted(q["node_id"][0] for q in seen) == ["00000000", "01010101"]
    job = store.get(job_id)
    assert job.info["hangs"] == 1 and job.state is S.RUNNING  # until Ray says it stopped
    (event,) = store.events(job_id=job_id, kind_prefix="job.hung")
    assert event.data["step"] == 10 and event.data["stalled_s"] == 61
    assert fleet_record(store, clock.now)["by_kind"]["gang-hang"] == pytest.approx(1.0)
    text, size = runner.read_logs(store.get(job_id), 0, 1 << 40)
    header = "=== attempt 1: hang: stacks of the workers (py-spy via Ray) ==="
    assert header in text and text.index(header) > text.index(f"logs of {job_id}-1")
    assert "--- rank 0 (pid 1000, node 00000000) ---" in text and "train.py:42" in text
    assert "--- rank 1 (pid 1001, node 01010101) ---" in text and size == len(text)
    reconcile(runner)  # Ray reports STOPPED: a restart
    job = store.get(job_id)
    assert job.state is S.QUEUED and job.info["restarts"] == 1
    assert job.info["attempts"][-1]["kind"] == "hang" and job.info["attempts"][-1]["step"] == 10
    assert "gang-hung: restart 1 of 3" in store.history(job_id)[-1].reason
    # The stacks stay in the log of attempt 1 once attempt 2 runs; windows add up.
    next_attempt(store, fake, runner, clock)
    job = store.get(job_id)
    whole, size = runner.read_logs(job, 0, 1 << 40)
    assert header in whole and f"logs of {job_id}-2" in whole
    for offset in range(0, size, 97):
        assert runner.read_logs(job, offset, 97) == (whole[offset : offset + 97], size)


def test_the_watchdog_is_not_armed_before_the_first_step(env: Any) -> None:
    store, _cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)
    clock.now += 10_000
    reconcile(runner)
    assert fake.stopped == [] and store.get(job_id).state is S.RUNNING


def test_a_job_spec_stall_timeout_overrides_the_clusters(env: Any) -> None:
    store, _cfg, fake, clock, runner = env
    job_id = running(store, fake, runner, stall_timeout_s=300.0)
    fake.report_progress(job_id, 1, clock.now)
    clock.now += 100
    reconcile(runner)
    assert fake.stopped == []
    clock.now += 201
    reconcile(runner)
    assert fake.stopped == [f"{job_id}-1"]
    assert "no stack: no dashboard" in runner.read_logs(store.get(job_id), 0, 1 << 40)[0]


def test_a_hang_survives_a_controller_restart_without_counting_twice(env: Any) -> None:
    store, cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)
    fake.report_progress(job_id, 3, clock.now)
    clock.now += 61
    reconcile(runner)
    assert store.get(job_id).info["hangs"] == 1
    fake.jobs[f"{job_id}-1"] = RayJobStatus.RUNNING  # the stop is still under way
    fresh = JobRunner(store, cfg, fake, clock=clock)
    reconcile(fresh)
    assert store.get(job_id).info["hangs"] == 1 and len(store.events(kind_prefix="job.hung")) == 1
    fake.jobs[f"{job_id}-1"] = RayJobStatus.STOPPED
    reconcile(fresh)
    assert store.get(job_id).state is S.QUEUED


def test_slow_stack_fetches_never_hold_the_tick_for_long(
    env: Any, dashboard: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _cfg, fake, clock, runner = env
    fake.dashboard, _seen, release = dashboard
    release.clear()  # the dashboard does not answer
    monkeypatch.setattr(runner_module, "STACKS_DEADLINE_S", 3.0)
    monkeypatch.setattr(runner_module, "TICK_WAIT_S", 0.5)
    job_id = running(store, fake, runner)
    fake.report_progress(job_id, 3, clock.now)
    clock.now += 61
    started = time.monotonic()
    reconcile(runner)
    assert time.monotonic() - started < 1.5
    assert fake.stopped == []  # still fetching
    deadline = time.monotonic() + 10
    while not fake.stopped and time.monotonic() < deadline:
        time.sleep(0.2)
        reconcile(runner)
    assert fake.stopped == [f"{job_id}-1"]
    text = runner.read_logs(store.get(job_id), 0, 1 << 40)[0]
    assert "(no stack: no answer within 3s)" in text
    release.set()


BAD_PROGRESS = {
    "huge-step": {"step": 10**30, "step_at_s": 0.0},
    "negative-step": {"step": -1, "step_at_s": 0.0},
    "bool-step": {"step": True, "step_at_s": 0.0},
    "float-step": {"step": 3.5, "step_at_s": 0.0},
    "string-step": {"step": "7", "step_at_s": 0.0},
    "nan-time": {"step": 3, "step_at_s": math.nan},
    "inf-time": {"step": 3, "step_at_s": math.inf},
    "negative-time": {"step": 3, "step_at_s": -5.0},
    "string-time": {"step": 3, "step_at_s": "yesterday"},
    "no-time": {"step": 3},
    "a-list": [1, 2, 3],
    "a-string": "progress",
    "nan-stats": {"step": 3, "step_at_s": 1.0, "stall_s": math.nan, "wall_s": -1.0},
    "huge-committed": {"step": 3, "step_at_s": 1.0, "committed_step": 10**40},
}


@pytest.mark.parametrize("case", sorted(BAD_PROGRESS))
def test_malformed_progress_never_breaks_the_tick(env: Any, case: str) -> None:
    store, _cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)
    other = running(store, fake, runner)
    fake.signals[job_id]["progress"] = BAD_PROGRESS[case]
    fake.signals[job_id]["workers"] = "not a mapping"
    fake.signals[job_id]["checkpoint"] = {"attempt": 1, "step": math.inf, "path": 7}
    clock.now += 10_000
    fake.jobs[f"{other}-1"] = RayJobStatus.SUCCEEDED
    reconcile(runner)
    assert store.get(other).state is S.SUCCEEDED  # the other job moved on
    progress = store.get(job_id).info.get("progress")
    if case in ("nan-stats", "huge-committed"):  # a sane step: shown, bad numbers dropped
        assert progress == {"step": 3, "step_at_s": 1.0, "stall_s": 0.0, "wall_s": 0.0}
        assert fake.stopped == [f"{job_id}-1"]  # and the watchdog works on it
        assert (
            "(no stacks: no worker reported its pid)"
            in runner.read_logs(store.get(job_id), 0, 1 << 40)[0]
        )
    else:
        assert progress is None and fake.stopped == []
    reconcile(runner)


def test_a_preemption_is_not_taken_while_a_hung_gang_stops(env: Any) -> None:
    store, _cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)
    fake.report_progress(job_id, 3, clock.now)
    clock.now += 61
    reconcile(runner)
    runner.preempt(PreemptJob(job_id, reason="preempt", for_job_id="x"))
    assert fake.requests == [] and not store.get(job_id).info.get("preempting")


def test_a_queued_job_restarts_on_the_next_admission_with_a_new_token(env: Any) -> None:
    store, _cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)
    fake.crash(f"{job_id}-1", traceback("RuntimeError: x"))
    reconcile(runner)
    assert next_attempt(store, fake, runner, clock) == 2
    tokens = {s[2]["env_vars"]["RCP_SIGNAL_TOKEN"] for s in fake.submitted}
    assert len(tokens) == 2


def test_a_restart_waits_for_its_backoff(env: Any) -> None:
    from controlplane.inventory import NodeRow
    from controlplane.loop.observe import build_snapshot

    store, _cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)
    fake.crash(f"{job_id}-1", traceback("RuntimeError: x"))
    reconcile(runner)
    rows = [NodeRow("n1", "cluster", "a", "ALIVE", 4, 4, 8, 8)]
    snap = build_snapshot(clock.now, rows, store.list_jobs())
    assert snap.queued[0].not_before_s == clock.now + 10


def test_a_commit_the_job_reports_is_read_before_the_scan_interval(env: Any) -> None:
    store, cfg, fake, clock, runner = env
    job_id = running(store, fake, runner)
    reconcile(runner)  # the first read of a RUNNING job: nothing committed yet
    commit(cfg, job_id, 7)
    clock.now += 1
    reconcile(runner)
    assert "checkpoint" not in store.get(job_id).info  # not due, and no hint
    # The actor passes every progress stat on as a float.
    fake.report_progress(job_id, 8, clock.now, committed_step=7.0)
    clock.now += 1
    reconcile(runner)
    assert store.get(job_id).info["checkpoint"]["step"] == 7
    # A hint naming a step that is not in storage costs one read, not one per tick.
    reads: list[int | None] = []
    real = runner.checkpoints.newest

    def counting(prefix: str, after: int | None = None) -> Any:
        reads.append(after)
        return real(prefix, after)

    runner.checkpoints.newest = counting  # type: ignore[method-assign]
    fake.report_progress(job_id, 9, clock.now, committed_step=1e6)
    for _ in range(3):
        clock.now += 1
        reconcile(runner)
    assert reads == [7] and store.get(job_id).info["checkpoint"]["step"] == 7
