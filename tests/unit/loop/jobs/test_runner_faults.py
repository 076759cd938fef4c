"""Faults that must not stall the control loop (issue 12): a dashboard that never answers, a
submission that hangs, a stalled tick behind /healthz, a replaced signals actor, retention's
forget calls and log reads over many attempts. No Ray is started: a real HTTP server on
127.0.0.1 stands in for a hung dashboard, and the signals actor is faked.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import ray

from controlplane.adapters.ray_jobs import RayJobs
from controlplane.api.jobs import JobService
from controlplane.api.routes import ApiServer
from controlplane.config import load_config
from controlplane.loop.act.jobs.runner import JobRunner
from controlplane.loop.tick import TICK_STALL_MIN_S, TICK_STALL_TICKS, tick_stalled
from controlplane.store import JobState, Store
from controlplane.store.pruning import DAY_S, Retention
from jobs import launcher
from jobs.checkpointing import Checkpointing
from jobs.signals import handle as signals_handle
from jobs.signals.environment import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_INTERVAL_S,
    ENV_CHECKPOINT_URI,
    ENV_JOB_ID,
    ENV_SIGNAL_POLL_S,
    ENV_SIGNAL_TOKEN,
)
from tests.unit.jobs.test_job_signals import admin, make_signals, status
from tests.unit.loop.jobs.test_runner import Clock, FakeRay, admit, fake_mint, submit

# -- a dashboard that accepts connections and never answers ------------------------------------


class _HungDashboard(BaseHTTPRequestHandler):
    """Answers Ray's version check (so the client can be built) and then nothing, ever."""

    release: threading.Event

    def do_GET(self) -> None:
        if self.path == "/api/version":
            body = json.dumps({"version": "4", "ray_version": ray.__version__}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.release.wait(60)

    do_POST = do_GET

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def hung_dashboard() -> Iterator[str]:
    release = threading.Event()
    handler = type("Handler", (_HungDashboard,), {"release": release})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def _returns_within(fn: Callable[[], Any], limit_s: float) -> tuple[bool, BaseException | None]:
    """(whether `fn` returned or raised within `limit_s`, what it raised)."""
    out: dict[str, BaseException | None] = {"error": None}

    def call() -> None:
        try:
            fn()
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(limit_s)
    return not t.is_alive(), out["error"]


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda j: j.status("job-1"), id="status"),
        pytest.param(lambda j: j.stop("job-1"), id="stop"),
        pytest.param(lambda j: j.log_tail("job-1", 1024), id="log_tail"),
        pytest.param(lambda j: j.log_slice("job-1", 0, 1024), id="log_slice"),
        pytest.param(lambda j: j.rcp_submissions(), id="list_jobs"),
        pytest.param(lambda j: j.submit("job-1", "python x.py", {}), id="submit"),
    ],
)
def test_every_dashboard_call_gives_up_on_a_dashboard_that_never_answers(
    tmp_path: Path, hung_dashboard: str, call: Callable[[RayJobs], Any]
) -> None:
    jobs = RayJobs(load_config(None, [f"state_dir={tmp_path}"]))
    jobs.dashboard_url = hung_dashboard
    jobs.http_timeout_s = (2.0, 0.5)
    returned, error = _returns_within(lambda: call(jobs), 15)
    assert returned, "the call still hangs on a dashboard that never answers"
    assert error is not None and "timed out" in str(error).lower()


# -- a submission that hangs is not the next job's failure ---------------------------------------


def test_a_hung_submission_defers_later_jobs_without_charging_them(tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [
            f"state_dir={tmp_path}",
            "jobs.submit_timeout_s=0.2",
            "jobs.max_start_attempts=3",
            "jobs.backoff_initial_s=1",
            "jobs.backoff_max_s=1",
        ],
    )
    clock = Clock()
    store = Store(tmp_path / "db", clock=clock)
    fake = FakeRay()
    release = threading.Event()
    real = fake.submit
    first = submit(store)

    def submit_hangs(sid: str, ep: str, env: dict[str, Any]) -> None:
        if sid.startswith(first):
            release.wait(30)  # a dashboard request that does not come back
        real(sid, ep, env)

    fake.submit = submit_hangs  # type: ignore[method-assign]
    runner = JobRunner(store, cfg, fake, clock=clock, mint=fake_mint)
    admit(runner, first)
    assert store.get(first).state is JobState.QUEUED  # its own timeout: a start failure
    other = submit(store)
    for _ in range(5):
        admit(runner, other)
        clock.now += 5
    job = store.get(other)
    assert job.state is JobState.QUEUED
    assert "start_failures" not in job.info and "attempt" not in job.info
    assert "submit-deferred" in str(job.info.get("message"))
    deferred = store.events(kind_prefix="job.submit_deferred")
    assert [e.job_id for e in deferred] == [other]  # said once, not once per tick
    release.set()
    deadline = time.monotonic() + 10
    while runner._submissions.hanging() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    admit(runner, other)
    job = store.get(other)
    assert job.state is JobState.ADMITTED and job.info["attempt"] == 1
    assert f"{other}-1" in fake.jobs


# -- /healthz fails while no tick starts ---------------------------------------------------------


@pytest.mark.parametrize(
    ("since_s", "tick_s", "stalled"),
    [
        pytest.param(5.0, 2.0, False, id="fresh"),
        pytest.param(TICK_STALL_MIN_S - 1, 1.0, False, id="under-floor"),
        pytest.param(TICK_STALL_MIN_S + 1, 1.0, True, id="past-floor"),
        pytest.param(TICK_STALL_TICKS * 10.0 - 1, 10.0, False, id="slow-tick-within"),
        pytest.param(TICK_STALL_TICKS * 10.0 + 1, 10.0, True, id="slow-tick-past"),
    ],
)
def test_tick_stalled(since_s: float, tick_s: float, stalled: bool) -> None:
    reason = tick_stalled(1000.0, 1000.0 + since_s, tick_s)
    assert (reason is not None) == stalled
    if reason:
        assert reason.startswith("tick-stalled")


def test_healthz_answers_503_naming_the_reason_while_liveness_fails(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    service = JobService(store, load_config(None, [f"state_dir={tmp_path}"]))
    problem: list[str | None] = [None]
    server = ApiServer(service, "t" * 32, "127.0.0.1", 0, liveness=lambda: problem[0]).start()
    try:
        with urllib.request.urlopen(f"{server.url}/healthz", timeout=10) as r:
            assert r.status == 200 and json.load(r) == {"ok": True}
        problem[0] = "tick-stalled: no control loop tick has started for 99s"
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{server.url}/healthz", timeout=10)
        assert err.value.code == 503
        assert json.load(err.value) == {"ok": False, "reason": problem[0]}
    finally:
        server.stop()
        store.close()


def test_a_controller_whose_ticks_stopped_is_not_live(tmp_path: Path) -> None:
    from controlplane.config import to_dict
    from controlplane.controller.actor import Controller

    cfg = load_config(None, [f"state_dir={tmp_path}", "policy.tick_s=1"])
    controller = Controller(to_dict(cfg), "t" * 32, start=False)
    try:
        assert controller.liveness() is None  # just started: within the limit
        controller.loop.tick_starts.append(time.time() - TICK_STALL_MIN_S - 5)
        assert str(controller.liveness()).startswith("tick-stalled")
        controller.loop.tick_starts.append(time.time())
        assert controller.liveness() is None
    finally:
        controller.shutdown()


# -- jobs find a replaced signals actor again ----------------------------------------------------


class _Ref:
    def __init__(self, actor: _Actor, value: Any) -> None:
        self.actor, self.value = actor, value


class _Method:
    def __init__(self, actor: _Actor, name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any) -> _Ref:
        self.actor.calls.append((self.name, args))
        return _Ref(self.actor, self.actor.answers.get(self.name))


class _Actor:
    def __init__(self, **answers: Any) -> None:
        self.dead = False
        self.answers = answers
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self, name)


@pytest.fixture()
def actors(monkeypatch: pytest.MonkeyPatch) -> list[_Actor]:
    """The actor under the signals name is the last of this list (none when it is empty)."""
    named: list[_Actor] = []

    def get(ref: _Ref, timeout: float | None = None) -> Any:
        if ref.actor.dead:
            raise ray.exceptions.ActorDiedError()
        return ref.value

    monkeypatch.setattr(signals_handle, "get_signals", lambda: named[-1] if named else None)
    monkeypatch.setattr(signals_handle, "SIGNALS_RESOLVE_INTERVAL_S", 0.0)
    monkeypatch.setattr(ray, "get", get)
    return named


def test_a_training_loop_polls_the_actor_that_replaced_a_dead_one(
    actors: list[_Actor], tmp_path: Path
) -> None:
    env = {
        ENV_JOB_ID: "job-a",
        ENV_ATTEMPT: "1",
        ENV_SIGNAL_TOKEN: "tok",
        ENV_CHECKPOINT_URI: tmp_path.as_uri(),
        ENV_CHECKPOINT_INTERVAL_S: "3600",
        ENV_SIGNAL_POLL_S: "1",
    }
    old = _Actor(poll=False, progress=True)
    actors.append(old)
    now = [0.0]
    loop = Checkpointing(env=env, signals=signals_handle.SignalsHandle(), clock=lambda: now[0])
    assert loop.should_checkpoint(0) is False
    old.dead = True  # the controller killed it (an impostor? a lost pin) and made another
    new = _Actor(poll=True, progress=True)
    actors.append(new)
    now[0] += 1.0
    assert loop.should_checkpoint(1) is False  # the dead actor's error drops the handle
    now[0] += 1.0
    assert loop.should_checkpoint(2) is True
    assert new.calls == [("poll", ("job-a", 1, "tok"))]
    loop.finish()


def test_a_dead_handle_is_looked_up_again_at_most_every_interval() -> None:
    now = [0.0]
    lookups: list[float] = []
    handle = signals_handle.SignalsHandle(resolve_interval_s=5.0, clock=lambda: now[0])
    real = signals_handle.get_signals
    try:
        signals_handle.get_signals = lambda: lookups.append(now[0])  # type: ignore[assignment]
        for t in (0.0, 1.0, 4.9, 5.0, 6.0, 10.0):
            now[0] = t
            handle.get()
    finally:
        signals_handle.get_signals = real  # type: ignore[assignment]
    assert lookups == [0.0, 5.0, 10.0]


def test_worker_started_reaches_the_actor_that_replaced_a_dead_one(actors: list[_Actor]) -> None:
    old = _Actor(worker_started=True)
    old.dead = True
    actors.append(old)
    handle = signals_handle.SignalsHandle()
    handle.get()  # held from before the controller replaced it
    actors.append(_Actor(worker_started=True))
    assert launcher.report_started("job-a", 1, 0, "tok", deadline_s=5, handle=handle) is True
    assert actors[-1].calls == [("worker_started", ("job-a", 1, 0, "tok"))]


def test_worker_started_outside_the_control_plane_does_not_wait(actors: list[_Actor]) -> None:
    t0 = time.monotonic()
    assert launcher.report_started("job-a", 1, 0, "tok", deadline_s=30) is None
    assert time.monotonic() - t0 < 5


# -- retention forgets a batch in one call -------------------------------------------------------


def test_forget_many_is_one_signed_call() -> None:
    s = make_signals()
    assert admin(s, "forget_many", ["job-a", "job-b"]) == 1
    assert status(s) == {}
    with pytest.raises(PermissionError):
        s.forget_many(["job-a"], auth=(time.time_ns(), "0" * 64))


def _old_jobs(tmp_path: Path, n: int) -> tuple[Store, Clock, list[str]]:
    clock = Clock()
    store = Store(tmp_path / "db.sqlite", clock=clock)
    old = []
    for _ in range(n):
        job_id = submit(store)
        store.transition(job_id, JobState.CANCELLED, "user")
        old.append(job_id)
    clock.now += 31 * DAY_S
    return store, clock, old


def test_retention_forgets_a_batch_in_one_call(tmp_path: Path) -> None:
    store, clock, old = _old_jobs(tmp_path, 5)
    calls: list[list[str]] = []
    cfg = load_config(None, [f"state_dir={tmp_path}"]).jobs
    pruned = Retention(store, cfg, forget_many=lambda ids: calls.append(list(ids))).run(clock.now)
    assert pruned is not None and sorted(pruned.job_ids) == sorted(old)
    assert [sorted(c) for c in calls] == [sorted(old)]


def test_a_failed_forget_does_not_stop_pruning(tmp_path: Path) -> None:
    store, clock, old = _old_jobs(tmp_path, 3)
    cfg = load_config(None, [f"state_dir={tmp_path}"]).jobs

    def fails(_ids: Any) -> None:
        raise TimeoutError("signals actor did not answer")

    retention = Retention(store, cfg, forget_many=fails)
    pruned = retention.run(clock.now)
    assert pruned is not None and len(pruned.job_ids) == 3
    assert store.list_jobs() == []
    assert retention.next_s == clock.now + cfg.prune_interval_s
    assert store.events(kind_prefix="store.prune")


def test_the_runner_forgets_many_in_one_call_and_never_raises(tmp_path: Path) -> None:
    cfg = load_config(None, [f"state_dir={tmp_path}"])
    store = Store(tmp_path / "db.sqlite")
    fake = FakeRay()
    seen: list[list[str]] = []
    fake.forget_signals_many = seen.append  # type: ignore[attr-defined]
    runner = JobRunner(store, cfg, fake)
    runner.forget_many(["a", "b"])
    runner.forget_many([])
    assert seen == [["a", "b"]]
    fake.forget_signals_many = lambda _ids: 1 / 0  # type: ignore[attr-defined]
    runner.forget_many(["a"])  # logged, not raised


# -- log reads fetch only the attempts their window touches -------------------------------------


class _CountingRay(FakeRay):
    """Each attempt's log is `chars` of its digit; every ranged read of it is counted."""

    def __init__(self, chars: int) -> None:
        super().__init__()
        self.chars = chars
        self.fetched: list[str] = []

    def logs(self, sid: str) -> str:
        self.fetched.append(sid)
        return (sid[-1] * self.chars)[:-1] + "\n"


def _job_with_attempts(tmp_path: Path, n: int, chars: int) -> tuple[JobRunner, _CountingRay, Any]:
    cfg = load_config(None, [f"state_dir={tmp_path}"])
    store = Store(tmp_path / "db.sqlite")
    fake = _CountingRay(chars)
    runner = JobRunner(store, cfg, fake)
    job_id = submit(store)
    store.update_info(job_id, {"attempt": n, "submission_id": f"{job_id}-{n}", "ray_done": True})
    return runner, fake, store.get(job_id)


@pytest.mark.parametrize(
    ("offset", "limit"),
    [(0, 10), (0, 10**9), (1050, 40), (1000, 3000), (4300, 100), (10**6, 5), (0, 0)],
    ids=["head", "all", "attempt-2", "spans-3", "tail", "past-end", "empty"],
)
def test_read_logs_is_the_window_of_the_whole_log(tmp_path: Path, offset: int, limit: int) -> None:
    runner, _fake, job = _job_with_attempts(tmp_path, 4, 1000)
    whole = runner.read_logs(job, 0, 1 << 40)[0]
    assert runner.read_logs(job, offset, limit) == (whole[offset : offset + limit], len(whole))


def test_a_log_read_fetches_only_the_attempts_its_window_touches(tmp_path: Path) -> None:
    runner, fake, job = _job_with_attempts(tmp_path, 6, 1000)
    size = runner.read_logs(job, 0, 10)[1]  # the first read learns each attempt's size
    assert len(fake.fetched) == 6
    fake.fetched.clear()
    service = JobService(runner.store, runner.cfg, log_window=runner.read_logs)
    body = service.logs(job.job_id, "2300", "50")  # inside attempt 3
    assert body["size"] == size and body["logs"].strip("3") == ""
    assert fake.fetched == [f"{job.job_id}-3"]
