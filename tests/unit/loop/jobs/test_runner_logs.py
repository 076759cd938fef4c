"""Job logs are read from Ray by byte range with a cap at the source, never whole (issue 26,
finding 6): the runner's log windows and failure reasons against a fake Ray whose logs are
gigabytes long and count every byte served, and the Ray Jobs adapter's ranged reads against
the dashboard agent's way of serving log files (aiohttp static files, on 127.0.0.1).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from controlplane.adapters import job_logs
from controlplane.adapters.driver_logs import DRIVER_LOG_FILE, LogSlice, read_driver_log
from controlplane.adapters.job_logs import LIVE_LOG_CACHE_S
from controlplane.adapters.ray_jobs import RayJobs, RayJobStatus
from controlplane.api.jobs import JobService
from controlplane.background_http import BackgroundHttpServer
from controlplane.config import Config, load_config
from controlplane.loop.act.jobs import limits as runner_module
from controlplane.loop.act.jobs.runner import JobRunner
from controlplane.store import JobState, Store
from jobs import launcher
from tests.unit.fake_logs import SyntheticLog
from tests.unit.loop.jobs.test_runner import Clock, FakeRay, admit, submit
from tests.unit.runner_tick import reconcile

GIB = 1 << 30


class BigLogsRay(FakeRay):
    """`FakeRay` whose driver logs are `SyntheticLog`s (any size, never held whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.driver_logs: dict[str, SyntheticLog] = {}

    def logs(self, sid: str) -> str:
        raise AssertionError(f"the whole log of {sid} was asked for")

    def _log(self, sid: str) -> SyntheticLog:
        return self.driver_logs.setdefault(sid, SyntheticLog(0))

    def log_slice(self, sid: str, start: int, max_bytes: int) -> LogSlice:
        return self._log(sid).read(start, max_bytes)

    def log_tail(self, sid: str, max_bytes: int) -> LogSlice:
        return self._log(sid).read(None, max_bytes)

    def served(self) -> int:
        return sum(log.served for log in self.driver_logs.values())


def _config(tmp_path: Path) -> Config:
    storage = [f"storage.uri=file://{tmp_path}/store", "storage.embedded=false"]
    return load_config(None, [f"state_dir={tmp_path}", *storage])


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[tuple[Store, Clock, BigLogsRay, JobRunner]]:
    cfg = _config(tmp_path)
    clock = Clock()
    store = Store(tmp_path / "db.sqlite", clock=clock)
    ray = BigLogsRay()
    yield store, clock, ray, JobRunner(store, cfg, ray, clock=clock)


def _running(store: Store, runner: JobRunner, ray: BigLogsRay) -> str:
    job_id = submit(store)
    admit(runner, job_id)
    ray.jobs[f"{job_id}-1"] = RayJobStatus.RUNNING
    return job_id


# -- a failed attempt's reason: the tail only --------------------------------------------------


def test_a_failed_attempts_reason_reads_only_the_tail_of_a_5_gib_log(env: Any) -> None:
    store, _clock, ray, runner = env
    job_id = _running(store, runner, ray)
    last = f"{launcher.GANG_FAILED_PREFIX}rank 3 on node-7 exited with code 137\n"
    ray.driver_logs[f"{job_id}-1"] = SyntheticLog(5 * GIB, tail=last.encode())
    ray.jobs[f"{job_id}-1"] = RayJobStatus.FAILED
    reconcile(runner)
    (ended,) = store.get(job_id).info["attempts"]
    assert "rank 3 on node-7 exited with code 137" in ended["reason"]
    assert ray.served() <= runner_module.FAILED_LOG_TAIL_BYTES
    assert ray.driver_logs[f"{job_id}-1"].reads == [(None, runner_module.FAILED_LOG_TAIL_BYTES)]


# -- windows of a huge log: the cap applies at the source ------------------------------------


@pytest.mark.parametrize(
    ("offset", "limit"),
    [
        pytest.param(0, 1 << 20, id="head"),
        pytest.param(17 << 20, 1 << 20, id="middle"),
        pytest.param((32 << 20) - 100, 1 << 20, id="across-the-cap"),
        pytest.param(40 << 20, 1 << 20, id="past-the-cap"),
    ],
)
def test_a_window_of_a_5_gib_log_reads_only_its_bytes(env: Any, offset: int, limit: int) -> None:
    store, _clock, ray, runner = env
    job_id = _running(store, runner, ray)
    ray.driver_logs[f"{job_id}-1"] = SyntheticLog(5 * GIB)
    text, size = runner.read_logs(store.get(job_id), offset, limit)
    header = len(f"=== attempt 1 (Ray job {job_id}-1) ===\n")
    marker = job_logs.MAX_ATTEMPT_LOG_BYTES + header
    assert size > marker and size < marker + 300  # the first 32 MiB, then the marker line
    assert ray.served() <= 1 + limit + 3  # the size probe, the window, a character's tail
    if offset < marker <= offset + limit:
        assert "log truncated here" in text
    assert len(text.encode()) <= min(limit, max(0, size - offset))


def test_a_follower_reads_each_new_byte_once(env: Any) -> None:
    """`rcp logs --follow` polls from its next offset: only the bytes written since."""
    store, clock, ray, runner = env
    job_id = _running(store, runner, ray)
    log = ray.driver_logs.setdefault(f"{job_id}-1", SyntheticLog(0))
    service = JobService(store, runner.cfg, log_window=runner.read_logs)
    offset, got = 0, []
    for grown in (10_000, 250_000, 3 << 20, (3 << 20) + 5):
        log.size = grown
        clock.now += LIVE_LOG_CACHE_S + 0.1
        while True:
            body = service.logs(job_id, str(offset))
            got.append(body["logs"])
            if body["next_offset"] == offset:
                break
            offset = body["next_offset"]
    assert offset == body["size"]
    reads = [n for start, n in log.reads if start is not None]
    probes = [n for start, n in log.reads if start is None]
    assert all(n == 1 for n in probes)
    assert log.served <= log.size + 3 * len(reads) + len(probes)
    assert "".join(got).encode()[-5:] == log._at(log.size - 5, 5)


# -- characters cut by a window ---------------------------------------------------------------


class TextRay(FakeRay):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def logs(self, sid: str) -> str:
        return self.text


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 7, 64], ids=lambda n: f"{n}-byte-windows")
def test_windows_that_cut_characters_join_into_the_whole_text(tmp_path: Path, limit: int) -> None:
    text = "héllo wörld ✓ 日本語 🙂\n" * 3
    cfg = _config(tmp_path)
    store = Store(tmp_path / "db.sqlite", clock=Clock())
    runner = JobRunner(store, cfg, TextRay(text), clock=Clock())
    job_id = submit(store)
    admit(runner, job_id)
    job = store.get(job_id)
    whole, size = runner.read_logs(job, 0, 1 << 30)
    assert whole.endswith(text) and len(whole.encode()) == size
    pieces = [runner.read_logs(job, at, limit)[0] for at in range(0, size, limit)]
    assert "".join(pieces) == whole


# -- the live attempt's size: one probe per interval, however many follow -------------------


def test_followers_of_a_live_attempt_cost_one_size_probe_per_interval(env: Any) -> None:
    store, clock, ray, runner = env
    job_id = _running(store, runner, ray)
    log = ray.driver_logs.setdefault(f"{job_id}-1", SyntheticLog(1000))
    job = store.get(job_id)
    for _ in range(20):  # twenty followers polling within the interval
        runner.read_logs(job, 0, 1 << 20)
    assert [r for r in log.reads if r[0] is None] == [(None, 1)]
    log.size = 2000
    clock.now += LIVE_LOG_CACHE_S + 0.1
    assert runner.read_logs(job, 0, 1 << 20)[1] > 2000
    assert len([r for r in log.reads if r[0] is None]) == 2


def test_concurrent_readers_of_a_live_attempt_wait_for_one_probe(env: Any) -> None:
    store, _clock, ray, runner = env
    job_id = _running(store, runner, ray)
    release = threading.Event()
    probes: list[str] = []
    real = ray.log_tail

    def slow_tail(sid: str, max_bytes: int) -> LogSlice:
        probes.append(sid)
        release.wait(10)
        return real(sid, max_bytes)

    ray.log_tail = slow_tail  # type: ignore[method-assign]
    job = store.get(job_id)
    out: list[str] = []
    threads = [
        threading.Thread(target=lambda: out.append(runner.read_logs(job, 0, 1 << 20)[0]))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    time.sleep(0.1)
    release.set()
    for t in threads:
        t.join(10)
    assert len(out) == 8 and probes == [f"{job_id}-1"]


def test_an_attempts_log_past_the_cap_keeps_its_head_and_says_it_was_cut(
    env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _clock, ray, runner = env
    monkeypatch.setattr(job_logs, "MAX_ATTEMPT_LOG_BYTES", 1000)
    job_id = _running(store, runner, ray)
    ray.driver_logs[f"{job_id}-1"] = SyntheticLog(6000, line=b"x")
    text = runner.read_logs(store.get(job_id), 0, 1 << 20)[0]
    body = text.split("\n", 1)[1]  # after the attempt's header line
    assert body.startswith("x" * 1000 + "\n[rcp: log truncated")
    assert "1000 bytes" in body and f"{job_id}-1" in body
    assert ray.served() <= 1 + 1000


def test_the_default_cap_is_32_mib() -> None:
    assert job_logs.MAX_ATTEMPT_LOG_BYTES == 32 << 20


# -- the Ray Jobs adapter: ranged reads from the dashboard agent --------------------------------


class _AgentLogs(BackgroundHttpServer):
    """A node's dashboard agent as far as logs go: its logs directory served at ``/logs``
    with aiohttp's static files, as Ray's ``LogAgent`` does; records what each answer sent."""

    def __init__(self, log_dir: Path) -> None:
        self.sent: list[tuple[int, int | None, str | None]] = []
        app = web.Application()
        app.router.add_static("/logs", log_dir, show_index=True)

        async def record(_request: web.Request, response: web.StreamResponse) -> None:
            rng = response.headers.get("Content-Range")
            self.sent.append((response.status, response.content_length, rng))

        app.on_response_prepare.append(record)
        super().__init__(app, "127.0.0.1", 0, thread_name="fake-dashboard-agent")
        self._start(30)


class _JobInfoClient:
    """What `RayJobs` asks of ``JobSubmissionClient`` for a log: the job's driver agent."""

    def __init__(self, agents: dict[str, str | None]) -> None:
        self.agents = agents
        self.asked: list[str] = []
        self._headers = {"Authorization": "Bearer ray-token"}

    def get_job_info(self, sid: str) -> Any:
        self.asked.append(sid)
        if sid not in self.agents:
            raise RuntimeError(f"Job {sid} does not exist")
        return type("JobDetails", (), {"driver_agent_http_address": self.agents[sid]})()


@pytest.fixture()
def agent(tmp_path: Path) -> Iterator[tuple[_AgentLogs, Path]]:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    server = _AgentLogs(log_dir)
    try:
        yield server, log_dir
    finally:
        server.stop()


def _ray_jobs(tmp_path: Path, client: _JobInfoClient) -> RayJobs:
    jobs = RayJobs(load_config(None, [f"state_dir={tmp_path}"]))
    jobs._client = client  # type: ignore[assignment]
    return jobs


SIZE = 8 << 20


@pytest.mark.parametrize(
    ("start", "max_bytes", "want"),
    [
        pytest.param(None, 64 << 10, slice(SIZE - (64 << 10), SIZE), id="tail-64-kib"),
        pytest.param(None, 1, slice(SIZE - 1, SIZE), id="size-probe"),
        pytest.param(1000, 100, slice(1000, 1100), id="middle"),
        pytest.param(SIZE - 10, 100, slice(SIZE - 10, SIZE), id="to-the-end"),
        pytest.param(SIZE, 100, slice(SIZE, SIZE), id="at-the-end"),
        pytest.param(None, 2 * SIZE, slice(0, SIZE), id="tail-longer-than-the-log"),
    ],
)
def test_ray_jobs_reads_a_driver_log_by_range_from_its_agent(
    tmp_path: Path, agent: Any, start: int | None, max_bytes: int, want: slice
) -> None:
    server, log_dir = agent
    data = bytes(range(256)) * (SIZE // 256)
    (log_dir / DRIVER_LOG_FILE.format(submission_id="job-1-1")).write_bytes(data)
    jobs = _ray_jobs(tmp_path, _JobInfoClient({"job-1-1": server.url}))
    got = (
        jobs.log_tail("job-1-1", max_bytes)
        if start is None
        else jobs.log_slice("job-1-1", start, max_bytes)
    )
    assert (got.data, got.start, got.size) == (data[want], want.start, SIZE)
    assert sum(n or 0 for _status, n, _range in server.sent) == want.stop - want.start
    assert all(status in (206, 416) for status, _n, _range in server.sent)


def test_ray_jobs_asks_for_the_driver_agent_once_per_attempt(tmp_path: Path, agent: Any) -> None:
    server, log_dir = agent
    (log_dir / DRIVER_LOG_FILE.format(submission_id="job-1-1")).write_bytes(b"hello\n")
    client = _JobInfoClient({"job-1-1": server.url, "job-2-1": None})
    jobs = _ray_jobs(tmp_path, client)
    assert jobs.log_slice("job-1-1", 0, 100).data == b"hello\n"
    assert jobs.log_tail("job-1-1", 3).data == b"lo\n"
    assert client.asked == ["job-1-1"]
    # No driver yet, no such job, no log file yet: an empty log, not an error.
    assert jobs.log_tail("job-2-1", 10) == LogSlice(b"", 0, 0)
    assert jobs.log_tail("job-9-1", 10) == LogSlice(b"", 0, 0)
    client.agents["job-3-1"] = server.url
    assert jobs.log_slice("job-3-1", 5, 10) == LogSlice(b"", 5, 0)


def test_a_server_that_ignores_the_range_is_not_read_whole(tmp_path: Path) -> None:
    big = b"y" * (4 << 20)

    async def whole(_request: web.Request) -> web.Response:
        return web.Response(body=big)

    app = web.Application()
    app.router.add_get("/logs/{name}", whole)
    server = BackgroundHttpServer(app, "127.0.0.1", 0, thread_name="ignores-ranges")
    server._start(30)
    try:
        with pytest.raises(RuntimeError, match="ignored the range"):
            read_driver_log(server.url, "job-1-1", start=None, max_bytes=1024)
        with pytest.raises(RuntimeError, match="HTTP 200"):
            read_driver_log(server.url, "job-1-1", start=10, max_bytes=1024)
        head = read_driver_log(server.url, "job-1-1", start=0, max_bytes=1024)
        assert (len(head.data), head.size) == (1024, len(big))
    finally:
        server.stop()


def test_the_driver_log_name_is_rays() -> None:
    from ray.dashboard.modules.job.common import JOB_LOGS_PATH_TEMPLATE

    assert DRIVER_LOG_FILE == JOB_LOGS_PATH_TEMPLATE


def test_an_ended_job_with_a_huge_log_reads_no_more_than_its_windows(env: Any) -> None:
    store, _clock, ray, runner = env
    job_id = _running(store, runner, ray)
    ray.driver_logs[f"{job_id}-1"] = SyntheticLog(3 * GIB)
    ray.jobs[f"{job_id}-1"] = RayJobStatus.SUCCEEDED
    reconcile(runner)
    job = store.get(job_id)
    assert job.state is JobState.SUCCEEDED
    for offset in (0, 1 << 20, 2 << 20):
        runner.read_logs(job, offset, 1 << 20)
    assert ray.served() <= 1 + 3 * ((1 << 20) + 3)
