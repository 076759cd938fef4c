"""The runner after a crash and over a long life, against the fake Ray of `test_runner`: a job
stranded in PREEMPTED is re-queued, the signals actor forgets ended jobs, an ended attempt's
log is fetched once, and retention prunes in bounded batches. No Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.adapters.driver_logs import LogSlice
from controlplane.adapters.ray_jobs import RayJobStatus
from controlplane.config import load_config, to_dict
from controlplane.controller.actor import Controller
from controlplane.loop.act.jobs.runner import JobRunner
from controlplane.store import JobState, Store
from controlplane.store.pruning import DAY_S, Retention
from policies.plan import PreemptJob
from tests.unit.loop.jobs.test_runner import Clock, FakeRay, admit, submit
from tests.unit.runner_tick import reconcile

S = JobState


class RecordingRay(FakeRay):
    """`FakeRay` that also records forgotten jobs and counts log fetches."""

    def __init__(self) -> None:
        super().__init__()
        self.forgotten: list[str] = []
        self.log_fetches: list[str] = []

    def forget_signals(self, job_id: str) -> None:
        self.forgotten.append(job_id)

    def log_tail(self, sid: str, max_bytes: int) -> LogSlice:
        self.log_fetches.append(f"tail {sid}")
        return super().log_tail(sid, max_bytes)

    def log_slice(self, sid: str, start: int, max_bytes: int) -> LogSlice:
        self.log_fetches.append(f"slice {sid}")
        return super().log_slice(sid, start, max_bytes)


@pytest.fixture()
def env(tmp_path: Path) -> tuple[Store, RecordingRay, Clock, JobRunner]:
    overrides = [f"state_dir={tmp_path}", f"storage.uri=file://{tmp_path}/s", "storage.embedded=0"]
    cfg = load_config(None, overrides)
    clock = Clock()
    store = Store(tmp_path / "db.sqlite", clock=clock)
    fake = RecordingRay()
    return store, fake, clock, JobRunner(store, cfg, fake, clock=clock)


def running(store: Store, fake: RecordingRay, runner: JobRunner) -> str:
    job_id = submit(store)
    admit(runner, job_id)
    fake.start_workers(job_id, 1, 2)
    reconcile(runner)
    assert store.get(job_id).state is S.RUNNING
    return job_id


@pytest.mark.parametrize("ray_status", [RayJobStatus.STOPPED, RayJobStatus.MISSING])
def test_a_job_stranded_in_preempted_is_requeued_on_the_next_reconcile(
    env: Any, ray_status: RayJobStatus
) -> None:
    store, fake, _clock, runner = env
    job_id = running(store, fake, runner)
    # The old three-step preemption crashed after its first step: PREEMPTED, info untouched.
    store.update_info(job_id, {"preempting": True})
    store.transition(job_id, S.PREEMPTED, "checkpointed-for-preemption at step 3")
    fake.jobs[f"{job_id}-1"] = ray_status
    reconcile(runner)
    job = store.get(job_id)
    assert job.state is S.QUEUED and job.num_preemptions == 1
    assert "preempting" not in job.info and job.info["ray_done"] is True
    assert "requeued-stranded-preempted" in store.history(job_id)[-1].reason


def test_a_stranded_job_whose_gang_still_runs_is_stopped_before_requeue(env: Any) -> None:
    store, fake, _clock, runner = env
    job_id = running(store, fake, runner)
    fake.jobs[f"{job_id}-1"] = RayJobStatus.RUNNING
    store.transition(job_id, S.PREEMPTED, "checkpointed")
    reconcile(runner)
    assert fake.stopped == [f"{job_id}-1"] and store.get(job_id).state is S.PREEMPTED
    reconcile(runner)  # Ray now reports STOPPED
    assert store.get(job_id).state is S.QUEUED
    assert fake.stopped == [f"{job_id}-1"]


@pytest.mark.parametrize(
    ("path", "write"),
    [("preempt", "requeue"), ("gang-lost", "transition"), ("crash", "transition")],
)
def test_requeue_paths_write_one_transaction(
    env: Any, path: str, write: str, monkeypatch: Any
) -> None:
    store, fake, clock, runner = env
    job_id = running(store, fake, runner)
    writes: list[str] = []
    for name in ("transition", "update_info", "requeue"):
        real = getattr(store, name)

        def spy(*a: Any, _name: str = name, _real: Any = real, **kw: Any) -> Any:
            writes.append(_name)
            return _real(*a, **kw)

        monkeypatch.setattr(store, name, spy)
    if path == "preempt":
        runner.preempt(PreemptJob(job_id, reason="preempt"))
        clock.now += 10_000
        reconcile(runner)  # deadline: stop sent
        writes.clear()
        reconcile(runner)  # Ray says STOPPED: PREEMPTED -> QUEUED
    elif path == "crash":
        fake.jobs[f"{job_id}-1"] = RayJobStatus.FAILED
        reconcile(runner)
    else:
        fake.jobs.clear()
        reconcile(runner)
    assert writes == [write]
    assert store.get(job_id).state is S.QUEUED


def test_signals_forget_a_job_once_it_and_its_ray_job_have_ended(env: Any) -> None:
    store, fake, _clock, runner = env
    done = running(store, fake, runner)
    fake.jobs[f"{done}-1"] = RayJobStatus.SUCCEEDED
    cancelled = running(store, fake, runner)
    store.transition(cancelled, S.CANCELLED, "user")
    reconcile(runner)  # done: SUCCEEDED; cancelled: stop sent
    assert fake.forgotten == [done]
    reconcile(runner)  # the cancelled gang's Ray Job has stopped
    assert fake.forgotten == [done, cancelled]


@pytest.mark.parametrize("end", ["succeeded", "failed", "cancelled"])
def test_a_settled_job_loses_its_memory_tier_and_no_one_elses(env: Any, end: str) -> None:
    store, fake, _clock, runner = env
    job_id, other = running(store, fake, runner), running(store, fake, runner)
    fake.holders = {f"{job_id}/rank-00000", f"{job_id}/rank-00001", f"{other}/rank-00000"}
    if end == "cancelled":
        store.transition(job_id, S.CANCELLED, "user")
        reconcile(runner)  # stop sent; the gang still runs: its tier stays
        assert fake.killed_holders == []
    else:
        status = RayJobStatus.SUCCEEDED if end == "succeeded" else RayJobStatus.STOPPED
        fake.jobs[f"{job_id}-1"] = status
    reconcile(runner)
    assert sorted(fake.killed_holders) == [f"{job_id}/rank-00000", f"{job_id}/rank-00001"]
    assert fake.holders == {f"{other}/rank-00000"}
    job = store.get(job_id)
    assert (
        job.info["ray_done"] is True
        and job.info["attempts"][-1]["kind"]
        == {
            "succeeded": "succeeded",
            "failed": "failed",
            "cancelled": "cancelled",
        }[end]
    )


def test_the_sweep_kills_tiers_of_ended_and_pruned_jobs_only(env: Any) -> None:
    store, fake, clock, runner = env
    queued = submit(store)
    cancelled_while_queued = submit(store)
    store.transition(cancelled_while_queued, S.CANCELLED, "user")
    live = running(store, fake, runner)
    fake.holders = {
        f"{queued}/rank-00000",
        f"{cancelled_while_queued}/rank-00000",
        f"{live}/rank-00000",
        "job-pruned-long-ago/rank-00000",
    }
    assert sorted(runner.sweep_memory_tiers()) == sorted(
        [cancelled_while_queued, "job-pruned-long-ago"]
    )
    assert fake.holders == {f"{queued}/rank-00000", f"{live}/rank-00000"}


def test_the_memory_tier_sweep_runs_with_the_orphan_sweep(env: Any) -> None:
    _store, fake, clock, runner = env
    fake.holders = {"job-gone/rank-00000"}
    reconcile(runner)
    assert fake.killed_holders == ["job-gone/rank-00000"]


def test_an_ended_attempts_size_is_asked_once_and_the_live_ones_once_per_interval(
    env: Any,
) -> None:
    store, fake, clock, runner = env
    job_id = running(store, fake, runner)
    fake.jobs.clear()  # gang lost: attempt 1 ended, re-queued
    reconcile(runner)
    admit(runner, job_id)  # attempt 2 runs
    for _ in range(3):
        text = runner.read_logs(store.get(job_id), 0, 1 << 40)[0]
        clock.now += 5  # past the live attempt's cache (LIVE_LOG_CACHE_S)
    assert "logs of " + f"{job_id}-1" in text and f"logs of {job_id}-2" in text
    assert fake.log_fetches.count(f"tail {job_id}-1") == 1  # its size never changes
    assert fake.log_fetches.count(f"tail {job_id}-2") == 3  # the live attempt, once per interval
    # Each read asks for the bytes its window covers, and only those.
    assert fake.log_fetches.count(f"slice {job_id}-1") == 3


def test_retention_prunes_in_bounded_batches_and_forgets_pruned_jobs(tmp_path: Path) -> None:
    clock = Clock()
    store = Store(tmp_path / "db.sqlite", clock=clock)
    old = []
    for _ in range(5):
        job_id = submit(store)
        store.transition(job_id, S.CANCELLED, "user")
        old.append(job_id)
    store.record_event("test.old", "old event")
    clock.now += 31 * DAY_S
    fresh = submit(store)
    cfg = load_config(None, [f"state_dir={tmp_path}", "jobs.prune_batch_size=2"]).jobs
    forgotten: list[str] = []
    retention = Retention(store, cfg, forget_many=forgotten.extend)
    now = clock.now
    runs = [retention.run(now), retention.run(now), retention.run(now), retention.run(now)]
    assert [len(r.job_ids) if r else None for r in runs] == [2, 2, 1, None]
    assert [r.backlog if r else None for r in runs] == [True, True, False, None]
    assert sorted(forgotten) == sorted(old)
    assert [j.job_id for j in store.list_jobs()] == [fresh]
    assert not store.events(kind_prefix="test.old")
    assert retention.next_s == now + cfg.prune_interval_s
    assert retention.run(now + cfg.prune_interval_s) is not None  # due again an interval later


def test_retention_zero_keeps_everything(tmp_path: Path) -> None:
    clock = Clock()
    store = Store(tmp_path / "db.sqlite", clock=clock)
    job_id = submit(store)
    store.transition(job_id, S.CANCELLED, "user")
    clock.now += 1000 * DAY_S
    overrides = [f"state_dir={tmp_path}", "jobs.retention_days=0", "jobs.event_retention_days=0"]
    cfg = load_config(None, overrides).jobs
    pruned = Retention(store, cfg, forget_many=lambda _ids: None).run(clock.now)
    assert pruned is not None and pruned.job_ids == () and pruned.num_events == 0
    assert [j.job_id for j in store.list_jobs()] == [job_id]


def test_a_controller_whose_store_is_corrupt_stays_up_and_says_why(tmp_path: Path) -> None:
    cfg = load_config(None, [f"state_dir={tmp_path}"])
    cfg.jobs_db_path.parent.mkdir(parents=True, exist_ok=True)
    cfg.jobs_db_path.write_bytes(b"garbage, not SQLite\n" * 100)
    controller = Controller(to_dict(cfg), "token", start=False)  # no raw sqlite3 traceback
    problem = controller.get_store_problem()
    assert problem is not None and str(cfg.jobs_db_path) in problem
    assert "move the file aside" in problem
    controller.shutdown()


def test_attempt_notes_go_with_their_pruned_job(tmp_path: Path) -> None:
    clock = Clock()
    store = Store(tmp_path / "db.sqlite", clock=clock)
    old, kept = submit(store), submit(store)
    for job_id in (old, kept):
        store.put_attempt_note(job_id, 1, f"stacks of {job_id}")
    store.transition(old, S.CANCELLED, "user")
    clock.now += 31 * DAY_S
    assert store.prune_jobs(clock.now - 30 * DAY_S) == [old]
    assert store.attempt_note(old, 1) is None
    assert store.attempt_note(kept, 1) == f"stacks of {kept}"
    with pytest.raises(KeyError):
        store.put_attempt_note(old, 2, "for a job that is gone")
