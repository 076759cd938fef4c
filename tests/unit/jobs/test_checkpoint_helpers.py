"""The training loop's checkpointing helper (`jobs.checkpointing.Checkpointing`), without Ray.

The signals actor is the real `_JobSignals` class called in-process (`ActorHandle` stands in
for the Ray handle), Ray Train's context is faked where a test says so, the clock is a list,
and agreement across ranks runs on a real gloo process group of 2 processes on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray.train
import torch.distributed as dist
import torch.multiprocessing as mp
from prometheus_client import REGISTRY

from jobs import checkpointing
from jobs.checkpoint.layout import keep_key, manifest_key, shard_key
from jobs.checkpointing import (
    Checkpointing,
    Gang,
    PreemptedError,
    detect_gang,
    settings_from_env,
)
from jobs.signals.mailbox import _JobSignals
from jobs.signals.trust import token_sha256
from policies.checkpointing import IntervalConfig
from tests.unit.jobs.test_checkpoint_engine import assert_state_equal, make_state
from tests.unit.jobs.test_job_signals import ADMIN, admin, status

TOKEN = "attempt-token"


# -- builders -----------------------------------------------------------------------------------


class ActorHandle:
    """`SignalsHandle` for a `_JobSignals` in this process: same `call`, no Ray."""

    def __init__(self, actor: _JobSignals) -> None:
        self.actor = actor
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def call(self, method: str, *args: Any, timeout_s: float) -> Any:
        self.calls.append((method, args))
        return getattr(self.actor, method)(*args)

    def named(self, method: str) -> list[tuple[Any, ...]]:
        return [args for name, args in self.calls if name == method]


def registered(prefix: str, attempt: int = 1) -> _JobSignals:
    actor = _JobSignals(ADMIN)
    admin(actor, "register", "job-a", attempt, token_sha256(TOKEN), prefix)
    return actor


def job_env(uri: str | None, **extra: str) -> dict[str, str]:
    env = {"RCP_JOB_ID": "job-a", "RCP_ATTEMPT": "1", "RCP_SIGNAL_TOKEN": TOKEN}
    if uri is not None:
        env["RCP_CHECKPOINT_URI"] = uri
    env.update(extra)
    return env


def gauge(name: str, run: str) -> float:
    value = REGISTRY.get_sample_value(name, {"run": run})
    assert value is not None, f"{name}{{run={run!r}}} was never set"
    return value


class Clock:
    def __init__(self, now_s: float = 1000.0) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def helper(
    env: dict[str, str], clock: Clock | None = None, actor: _JobSignals | None = None, **kw: Any
) -> tuple[Checkpointing, ActorHandle | None]:
    handle = ActorHandle(actor) if actor is not None else None
    clock = clock or Clock()

    def sleep(seconds: float) -> None:
        clock.now_s += seconds

    return Checkpointing(env=env, signals=handle, clock=clock, sleep=sleep, **kw), handle


# -- where the process is -----------------------------------------------------------------------


class _TrainContext:
    def get_world_rank(self) -> int:
        return 3

    def get_world_size(self) -> int:
        return 4

    def get_experiment_name(self) -> str:
        return "run-7"


@pytest.mark.parametrize(
    ("env", "gang"),
    [
        pytest.param({}, Gang(0, 1, False), id="alone"),
        pytest.param({"RANK": "2", "WORLD_SIZE": "4"}, Gang(2, 4, False), id="torchrun-env"),
        pytest.param({"WORLD_SIZE": "2"}, Gang(0, 2, False), id="no-rank-is-0"),
    ],
)
def test_a_plain_process_takes_rank_from_torchruns_environment(
    env: dict[str, str], gang: Gang
) -> None:
    assert detect_gang(env) == gang


def test_a_ray_train_worker_takes_rank_from_the_train_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ray.train, "get_context", lambda: _TrainContext())
    # Ray Train's context wins over a stray torchrun environment.
    assert detect_gang({"RANK": "0", "WORLD_SIZE": "1"}) == Gang(3, 4, True, "run-7")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param({"RANK": "2", "WORLD_SIZE": "2"}, "RANK must be below", id="rank-too-big"),
        pytest.param({"WORLD_SIZE": "two"}, "WORLD_SIZE must be an integer", id="not-a-number"),
        pytest.param({"RANK": "-1"}, "RANK must be in", id="negative-rank"),
    ],
)
def test_a_malformed_torchrun_environment_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        detect_gang(env)


# -- what the control plane said ----------------------------------------------------------------


def test_settings_come_from_the_runners_variables() -> None:
    s = settings_from_env(
        job_env(
            "s3://b/jobs/job-a",
            RCP_STORAGE_ENDPOINT_URL="http://127.0.0.1:9000",
            RCP_STORAGE_REGION="eu-west-1",
            RCP_CHECKPOINT_INTERVAL_S="600",
            RCP_CHECKPOINT_KEEP_LAST="2",
            RCP_MTBF_S="36000",
            RCP_STEP_REPORT_S="5",
            RCP_SIGNAL_POLL_S="0.2",
        )
    )
    assert (s.job_id, s.attempt, s.uri, s.enabled) == ("job-a", 1, "s3://b/jobs/job-a", True)
    assert (s.endpoint_url, s.region) == ("http://127.0.0.1:9000", "eu-west-1")
    assert (s.interval_s, s.keep_last, s.mtbf_s) == (600.0, 2, 36000.0)
    assert (s.step_report_s, s.signal_poll_s) == (5.0, 0.2)
    assert TOKEN not in repr(s)


def test_the_longest_mtbf_and_interval_the_control_plane_passes_are_accepted() -> None:
    # reliability.MAX_MTBF_S is 10 years; a spec's checkpoint.interval_s has no upper bound.
    s = settings_from_env(
        job_env("s3://b/p", RCP_MTBF_S="315360000.0", RCP_CHECKPOINT_INTERVAL_S="1e9")
    )
    assert (s.mtbf_s, s.interval_s) == (315360000.0, 1e9)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RCP_CHECKPOINT_INTERVAL_S", "nan"),
        ("RCP_CHECKPOINT_INTERVAL_S", "inf"),
        ("RCP_CHECKPOINT_INTERVAL_S", "0"),
        ("RCP_MTBF_S", "-5"),
        ("RCP_STEP_REPORT_S", "1e300"),
        ("RCP_MTBF_S", "1e11"),
        ("RCP_SIGNAL_POLL_S", "soon"),
        ("RCP_CHECKPOINT_KEEP_LAST", "0"),
        ("RCP_CHECKPOINT_ENABLED", "yes"),
        ("RCP_ATTEMPT", "first"),
    ],
)
def test_a_bad_variable_is_refused_by_name(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        settings_from_env(job_env("s3://b/p", **{name: value}))


# -- when to checkpoint -------------------------------------------------------------------------


def due_steps(ckpt: Checkpointing, clock: Clock, steps: int, step_s: float) -> list[int]:
    """Run `steps` steps of `step_s` seconds each, saving whenever asked to."""
    saved = []
    for step in range(steps):
        clock.now_s += step_s
        if ckpt.should_checkpoint(step):
            ckpt.save(step, make_state(step))
            saved.append(step)
    ckpt.finish()
    return saved


@pytest.mark.parametrize(
    ("kwargs", "env", "saved"),
    [
        pytest.param({"every_n_steps": 3}, {}, [2, 5, 8], id="every-3-steps"),
        pytest.param({}, {"RCP_CHECKPOINT_INTERVAL_S": "25"}, [2, 5, 8], id="fixed-interval-env"),
        pytest.param(
            {"interval_s": 40.0},
            {"RCP_CHECKPOINT_INTERVAL_S": "25"},
            [3, 7],
            id="argument-beats-env",
        ),
        pytest.param(
            {"every_n_steps": 4},
            {"RCP_CHECKPOINT_INTERVAL_S": "25"},
            [3, 7],
            id="steps-beat-interval",
        ),
        pytest.param({}, {"RCP_CHECKPOINT_ENABLED": "0"}, [], id="disabled"),
    ],
)
def test_cadence(
    tmp_path: Path, kwargs: dict[str, Any], env: dict[str, str], saved: list[int]
) -> None:
    clock = Clock()
    ckpt, _ = helper({"RCP_CHECKPOINT_URI": tmp_path.as_uri(), **env}, clock, **kwargs)
    assert due_steps(ckpt, clock, 10, step_s=10.0) == saved


@pytest.mark.parametrize(
    ("mtbf_s", "interval_s"),
    [
        # sqrt(2 x stall x 30 days) is above 9 s for any stall above 16 us: capped at the max.
        pytest.param(30 * 86400.0, 9.0, id="reliable-capped-at-max"),
        # A stall of at least twice the MTBF: Daly's T = M = 1 ns, raised to the min.
        pytest.param(1e-9, 3.0, id="flaky-raised-to-min"),
    ],
)
def test_young_daly_sets_the_interval_from_the_measured_stall(
    tmp_path: Path, mtbf_s: float, interval_s: float
) -> None:
    bounds = IntervalConfig(min_interval_s=3.0, max_interval_s=9.0)
    ckpt, _ = helper(
        {"RCP_CHECKPOINT_URI": tmp_path.as_uri(), "RCP_MTBF_S": "1"},
        interval_bounds=bounds,
        mtbf_s=mtbf_s,
    )
    assert ckpt.interval_s == 3.0  # nothing measured yet: the lower bound
    ckpt.save(0, make_state(0))
    assert ckpt.interval_s == interval_s
    assert ckpt.stats()["checkpoint_interval_s"] == interval_s
    assert gauge("rcp_checkpoint_interval_seconds", "local") == interval_s
    ckpt.finish()


def test_checkpointing_is_off_without_a_uri_and_still_reports_steps(tmp_path: Path) -> None:
    actor = registered(tmp_path.as_uri())
    ckpt, _ = helper(job_env(None), actor=actor)
    assert ckpt.engine is None and not ckpt.enabled
    assert ckpt.restore() is None
    assert not ckpt.should_checkpoint(0)
    assert ckpt.save(0, make_state(0)) is None
    assert status(actor)["progress"]["step"] == 0  # the hang watchdog still sees steps


# -- checkpoint-now -----------------------------------------------------------------------------


def test_a_request_is_saved_kept_committed_reported_and_stops_the_loop(tmp_path: Path) -> None:
    uri = tmp_path.as_uri()
    actor = registered(uri)
    clock = Clock()
    ckpt, handle = helper(job_env(uri, RCP_CHECKPOINT_INTERVAL_S="3600"), clock, actor)
    assert not ckpt.should_checkpoint(0)
    admin(actor, "request_checkpoint", "job-a", 1234.0)
    clock.now_s += 1.0  # past the poll interval
    assert ckpt.should_checkpoint(1)
    ckpt.save(1, make_state(1))
    # Committed before save() returned (the manifest exists), and exempt from retention.
    assert (tmp_path / manifest_key(1)).exists() and (tmp_path / keep_key(1)).exists()
    assert ckpt.preempted
    reported = status(actor)["checkpoint"]
    assert reported["step"] == 1 and reported["answers_request"] is True
    assert reported["path"] == f"{uri}/step-000000000001"
    # Still asked, but already answered: no checkpoint for every step until the gang stops.
    clock.now_s += 1.0
    assert not ckpt.should_checkpoint(2)
    assert handle is not None and len(handle.named("checkpointed")) == 1
    # The controller withdrew the request, then asked again: a new checkpoint.
    admin(actor, "clear_request", "job-a")
    clock.now_s += 1.0
    assert not ckpt.should_checkpoint(3) and not ckpt.preempted
    admin(actor, "request_checkpoint", "job-a", 1240.0)
    clock.now_s += 1.0
    assert ckpt.should_checkpoint(4)
    ckpt.save(4, make_state(4))
    assert ckpt.preempted and status(actor)["checkpoint"]["step"] == 4
    with pytest.raises(PreemptedError, match="checkpoint-now request"):
        ckpt.finish()


def test_finish_after_a_preemption_waits_to_be_stopped_then_fails(tmp_path: Path) -> None:
    uri = tmp_path.as_uri()
    actor = registered(uri)
    clock = Clock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now_s += seconds

    ckpt = Checkpointing(
        env=job_env(uri),
        signals=ActorHandle(actor),
        clock=clock,
        sleep=sleep,
        preempted_wait_s=30.0,
    )
    admin(actor, "request_checkpoint", "job-a", 1.0)
    assert ckpt.should_checkpoint(0)
    ckpt.save(0, make_state(0))
    with pytest.raises(PreemptedError):
        ckpt.finish()
    assert 29.0 <= sum(slept) <= 31.0  # the gang was never stopped: it waited it out


def test_a_request_withdrawn_while_waiting_ends_the_wait(tmp_path: Path) -> None:
    uri = tmp_path.as_uri()
    actor = registered(uri)
    clock = Clock()
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now_s += seconds
        admin(actor, "clear_request", "job-a")

    ckpt = Checkpointing(env=job_env(uri), signals=ActorHandle(actor), clock=clock, sleep=sleep)
    admin(actor, "request_checkpoint", "job-a", 1.0)
    assert ckpt.should_checkpoint(0)
    ckpt.save(0, make_state(0))
    with pytest.raises(PreemptedError):
        ckpt.finish()
    assert sum(slept) <= 1.0


def test_a_checkpoint_outside_the_registered_prefix_is_refused(tmp_path: Path) -> None:
    actor = registered((tmp_path / "job-a").as_uri())
    ckpt, _ = helper(job_env((tmp_path / "job-b").as_uri()), actor=actor)
    admin(actor, "request_checkpoint", "job-a", 1.0)
    assert ckpt.should_checkpoint(0)
    ckpt.save(0, make_state(0))
    assert status(actor)["checkpoint"] is None
    assert status(actor)["rejected_calls"] == 1


class _Draining:
    pass


def test_ray_trains_preemption_signal_saves_and_keeps_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class OneRank(_TrainContext):
        def get_world_rank(self) -> int:
            return 0

        def get_world_size(self) -> int:
            return 1

    reports: list[dict[str, Any]] = []
    monkeypatch.setattr(ray.train, "get_context", lambda: OneRank())
    monkeypatch.setattr(ray.train, "get_preemption_info", lambda: _Draining())
    monkeypatch.setattr(ray.train, "report", lambda metrics, **_kw: reports.append(metrics))
    clock = Clock()
    ckpt, _ = helper({"RCP_CHECKPOINT_URI": tmp_path.as_uri()}, clock, every_n_steps=100)
    assert ckpt.should_checkpoint(0)
    ckpt.save(0, make_state(0))
    assert (tmp_path / manifest_key(0)).exists() and (tmp_path / keep_key(0)).exists()
    assert not ckpt.preempted  # Ray Train restarts the run itself when the node goes
    clock.now_s += 1.0
    assert not ckpt.should_checkpoint(1)  # once per signal
    ckpt.report(1, {"loss": 0.5})
    assert reports[-1]["loss"] == 0.5 and reports[-1]["step"] == 1
    assert reports[-1]["checkpoint_saves"] == 1.0
    assert reports[-1]["checkpoint_last_committed_step"] == 0.0
    ckpt.finish()


def test_ray_train_reports_are_spaced_so_they_never_block_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray Train keeps one report per worker until its controller polls (every 2 s): a report
    per step would block each step that long, so the helper sends one every
    RAY_TRAIN_REPORT_INTERVAL_S (the first at once)."""

    class OneRank(_TrainContext):
        def get_world_rank(self) -> int:
            return 0

        def get_world_size(self) -> int:
            return 1

    reports: list[dict[str, Any]] = []
    monkeypatch.setattr(ray.train, "get_context", lambda: OneRank())
    monkeypatch.setattr(ray.train, "report", lambda metrics, **_kw: reports.append(metrics))
    clock = Clock(100.0)
    ckpt, _ = helper({"RCP_CHECKPOINT_URI": tmp_path.as_uri()}, clock, every_n_steps=1000)
    interval = checkpointing.RAY_TRAIN_REPORT_INTERVAL_S
    for step, dt in enumerate((0.0, 1.0, 2.0, interval - 0.1, interval, interval + 1.0)):
        clock.now_s = 100.0 + dt
        ckpt.report(step, {"loss": float(step)})
    assert [r["step"] for r in reports] == [0, 4]
    ckpt.finish()


# -- step reports -------------------------------------------------------------------------------


def test_step_reports_are_rate_limited_and_carry_stall_and_wall(tmp_path: Path) -> None:
    uri = tmp_path.as_uri()
    actor = registered(uri)
    clock = Clock(1000.0)
    ckpt, handle = helper(job_env(uri, RCP_STEP_REPORT_S="5"), clock, actor, every_n_steps=1000)
    assert handle is not None
    sent_at = []
    for step, t in enumerate((1000.0, 1001.0, 1004.9, 1005.0, 1006.0, 1010.1)):
        clock.now_s = t
        before = len(handle.named("progress"))
        ckpt.report(step)
        if len(handle.named("progress")) > before:
            sent_at.append(t)
        if step == 2:
            ckpt.save(step, make_state(step)).result()  # type: ignore[union-attr]
    assert sent_at == [1000.0, 1005.0, 1010.1]  # the first step, then every 5 s
    progress = status(actor)["progress"]
    assert progress["step"] == 5
    assert progress["wall_s"] == pytest.approx(10.1)
    assert progress["saves"] == 1.0 and progress["committed_step"] == 2.0
    assert 0 < progress["stall_s"] == pytest.approx(ckpt.stats()["checkpoint_stall_total_s"])
    assert gauge("rcp_checkpoint_started_unix_seconds", "job-a") > 0
    ckpt.finish()


# -- restore ------------------------------------------------------------------------------------


def test_restore_is_bit_exact_and_resumes_saving_after_it(tmp_path: Path) -> None:
    env = {"RCP_CHECKPOINT_URI": tmp_path.as_uri()}
    first, _ = helper(env, every_n_steps=1)
    first.save(4, make_state(4))
    first.finish()
    second, _ = helper(env, every_n_steps=1)
    restored = second.restore()
    assert restored is not None and restored.step == 4 and restored.source == "storage"
    assert_state_equal(restored.state, make_state(4))
    with pytest.raises(ValueError, match="not after"):
        second.save(4, make_state(4))
    second.save(5, make_state(5))
    second.finish()


def test_rank_0_tells_the_control_plane_what_it_restored_and_from_where(tmp_path: Path) -> None:
    uri = tmp_path.as_uri()
    actor = registered(uri)
    first, _ = helper(job_env(uri), actor=actor, every_n_steps=1)
    first.save(6, make_state(6))
    first.finish()
    assert status(actor)["restore"] is None  # a fresh start restored nothing
    second, handle = helper(job_env(uri), actor=actor, every_n_steps=1)
    assert second.restore() is not None
    assert handle is not None and len(handle.named("restored")) == 1
    report = status(actor)["restore"]
    assert (report["step"], report["source"]) == (6, "storage") and report["restore_s"] >= 0
    second.finish()


def test_restore_reads_only_the_jobs_own_prefix(tmp_path: Path) -> None:
    other, _ = helper({"RCP_CHECKPOINT_URI": (tmp_path / "job-b").as_uri()})
    other.save(9, make_state(9))
    other.finish()
    mine, _ = helper({"RCP_CHECKPOINT_URI": (tmp_path / "job-a").as_uri()})
    assert mine.restore() is None
    mine.save(0, make_state(0))  # a fresh start may save any step
    mine.finish()


def test_restore_from_s3_is_bit_exact() -> None:
    from tests.integration.test_checkpoint_s3 import REGION, MotoS3

    s3 = MotoS3()
    try:
        bucket = s3.create_bucket("helper-unit")
        env = {
            "RCP_CHECKPOINT_URI": f"s3://{bucket}/jobs/job-a",
            "RCP_STORAGE_ENDPOINT_URL": s3.endpoint_url,
            "RCP_STORAGE_REGION": REGION,
            "RCP_CHECKPOINT_KEEP_LAST": "1",
        }
        first, _ = helper(env)
        first.save(1, make_state(1))
        first.save(2, make_state(2))
        first.finish()
        keys = s3.client.list_objects_v2(Bucket=bucket)["Contents"]
        assert not any("step-000000000001" in k["Key"] for k in keys)  # keep_last=1
        restored = helper(env)[0].restore()
        assert restored is not None and restored.step == 2
        assert_state_equal(restored.state, make_state(2))
    finally:
        s3.stop()


# -- agreement across a real 2-rank gloo group --------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _two_ranks(rank: int, port: int, root: str) -> None:
    """Runs in each of 2 spawned processes; writes what it saw to ``<root>/rank-<r>.json``."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out: dict[str, Any] = {}
    uri = Path(root, "ckpt").as_uri()
    # Each rank's own clock: rank 1's runs 200 s ahead, so only it finds step 0 due.
    clock = Clock(0.0)
    actor = registered(uri)  # each process holds its own; only rank 0's is ever asked
    env = job_env(uri, RCP_CHECKPOINT_INTERVAL_S="100")
    ckpt = Checkpointing(env=env, signals=ActorHandle(actor), clock=clock)
    out["gang"] = [ckpt.rank, ckpt.world_size]
    out["fresh"] = ckpt.restore() is None
    clock.now_s = 200.0 if rank == 1 else 0.0
    answers = [ckpt.should_checkpoint(0)]
    ckpt.save(0, make_state(100 * rank))
    answers.append(ckpt.should_checkpoint(1))
    if rank == 0:  # only rank 0 hears the controller
        admin(actor, "request_checkpoint", "job-a", 1.0)
        clock.now_s += 1.0
    answers.append(ckpt.should_checkpoint(2))
    ckpt.save(2, make_state(100 * rank + 2))
    out["answers"] = answers
    out["preempted"] = ckpt.preempted
    out["checkpointed"] = (status(actor)["checkpoint"] or {}).get("step")
    ckpt.preempted = False  # this test stops here instead of being stopped
    ckpt.finish()
    # Rank 1 damages its own copy of step 2: it can only verify step 0, rank 0 both.
    dist.barrier()
    if rank == 1:
        shard = Path(root, "ckpt", shard_key(2, 1, 0))
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    dist.barrier()
    again = Checkpointing(env={"RCP_CHECKPOINT_URI": uri}, every_n_steps=1)
    restored = again.restore()
    assert restored is not None
    assert_state_equal(restored.state, make_state(100 * rank))
    out["restored"] = restored.step
    again.finish()
    Path(root, f"rank-{rank}.json").write_text(json.dumps(out))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("gloo")
    mp.spawn(_two_ranks, args=(_free_port(), str(root)), nprocs=2, join=True)
    yield [json.loads((root / f"rank-{r}.json").read_text()) for r in (0, 1)]


def test_both_ranks_see_the_gang_from_torch_distributed(two_ranks: list[dict[str, Any]]) -> None:
    assert [r["gang"] for r in two_ranks] == [[0, 2], [1, 2]]
    assert all(r["fresh"] for r in two_ranks)


def test_every_rank_checkpoints_when_any_rank_finds_it_due(
    two_ranks: list[dict[str, Any]],
) -> None:
    # Step 0: only rank 1's clock was due. Step 1: nobody. Step 2: only rank 0 was asked.
    assert [r["answers"] for r in two_ranks] == [[True, False, True]] * 2
    assert [r["preempted"] for r in two_ranks] == [True, True]
    assert two_ranks[0]["checkpointed"] == 2  # rank 0 told the controller, after the commit


def test_every_rank_restores_the_newest_step_all_of_them_verify(
    two_ranks: list[dict[str, Any]],
) -> None:
    assert [r["restored"] for r in two_ranks] == [0, 0]
