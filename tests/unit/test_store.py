"""The durable store: restarts lose and duplicate nothing, transitions follow the rules, WAL."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.store import (
    ALLOWED_TRANSITIONS,
    IdempotencyConflict,
    IllegalTransition,
    JobState,
    StaleState,
    Store,
    UnknownJob,
)
from jobs.spec import JobSpec

S = JobState


class FakeClock:
    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        self.now_s += 1.0
        return self.now_s


def spec(name: str = "train", workers: int = 2) -> JobSpec:
    return JobSpec(name=name, entrypoint="python train.py", num_workers=workers, gpus_per_worker=1)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "store.db"


@pytest.fixture
def store(db_path: Path) -> Iterator[Store]:
    s = Store(db_path, clock=FakeClock())
    yield s
    s.close()


def test_wal_mode_is_on(store: Store, db_path: Path) -> None:
    assert store.journal_mode() == "wal"
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()


def test_restart_loses_and_duplicates_nothing(db_path: Path) -> None:
    clock = FakeClock()
    first = Store(db_path, clock=clock)
    a = first.submit(spec("a"), idempotency_key="key-a").job
    b = first.submit(spec("b"), idempotency_key="key-b").job
    first.transition(a.job_id, S.ADMITTED, "fits")
    first.transition(a.job_id, S.RUNNING, "all workers up")
    first.record_event("policy.admit", "admitted a", job_id=a.job_id, data={"gpus": 2})
    first.put("admission/state", {"preemptions": [{"job_id": "x", "at_s": 5.0}]})
    first.update_info(a.job_id, {"ray_job_id": "raysubmit_1"})
    before_events = first.events()
    first.close()

    second = Store(db_path, clock=clock)
    # The client retries both submissions after the restart: nothing is duplicated.
    retry_a = second.submit(spec("a"), idempotency_key="key-a")
    retry_b = second.submit(spec("b"), idempotency_key="key-b")
    assert not retry_a.created and not retry_b.created
    assert (retry_a.job.job_id, retry_b.job.job_id) == (a.job_id, b.job_id)
    assert [j.job_id for j in second.list_jobs()] == [a.job_id, b.job_id]
    assert second.get(a.job_id).state is S.RUNNING
    assert second.get(a.job_id).info == {"ray_job_id": "raysubmit_1"}
    assert second.get(b.job_id).state is S.QUEUED
    assert [t.to_state for t in second.history(a.job_id)] == [S.QUEUED, S.ADMITTED, S.RUNNING]
    assert second.events() == before_events
    assert second.get_value("admission/state") == {"preemptions": [{"job_id": "x", "at_s": 5.0}]}
    second.close()


def test_idempotent_submit_with_a_different_spec_is_refused(store: Store) -> None:
    first = store.submit(spec("a"), idempotency_key="k")
    with pytest.raises(IdempotencyConflict, match="different spec"):
        store.submit(spec("a", workers=3), idempotency_key="k")
    assert [j.job_id for j in store.list_jobs()] == [first.job.job_id]


def test_without_a_key_each_submit_is_a_new_job(store: Store) -> None:
    ids = {store.submit(spec()).job.job_id for _ in range(3)}
    assert len(ids) == 3


LEGAL_PATHS = [
    pytest.param([S.ADMITTED, S.RUNNING, S.SUCCEEDED], id="happy-path"),
    pytest.param([S.ADMITTED, S.RUNNING, S.PREEMPTED, S.QUEUED, S.ADMITTED], id="preempt-requeue"),
    pytest.param([S.ADMITTED, S.QUEUED], id="gang-start-timeout-requeue"),
    pytest.param([S.CANCELLED], id="cancel-queued"),
    pytest.param([S.ADMITTED, S.RUNNING, S.FAILED], id="fail"),
]


@pytest.mark.parametrize("path", LEGAL_PATHS)
def test_legal_paths_are_recorded_with_time_and_reason(store: Store, path: list[JobState]) -> None:
    job = store.submit(spec()).job
    for i, state in enumerate(path):
        store.transition(job.job_id, state, f"step {i}")
    history = store.history(job.job_id)
    assert [t.to_state for t in history] == [S.QUEUED, *path]
    assert [t.from_state for t in history] == [None, S.QUEUED, *path[:-1]]
    assert [t.reason for t in history[1:]] == [f"step {i}" for i in range(len(path))]
    times = [t.at_s for t in history]
    assert times == sorted(times) and len(set(times)) == len(times)
    events = store.events(job_id=job.job_id, kind_prefix="job.state")
    assert len(events) == len(history)
    assert store.get(job.job_id).num_preemptions == path.count(S.PREEMPTED)


ILLEGAL = [
    pytest.param([], S.RUNNING, id="queued-to-running-skips-admission"),
    pytest.param([], S.SUCCEEDED, id="queued-to-succeeded"),
    pytest.param([S.ADMITTED, S.RUNNING, S.SUCCEEDED], S.RUNNING, id="succeeded-is-final"),
    pytest.param([S.CANCELLED], S.QUEUED, id="cancelled-is-final"),
    pytest.param([S.ADMITTED, S.RUNNING, S.PREEMPTED], S.RUNNING, id="preempted-must-requeue"),
    pytest.param([S.ADMITTED], S.ADMITTED, id="same-state"),
]


@pytest.mark.parametrize(("path", "bad"), ILLEGAL)
def test_illegal_transitions_are_rejected(
    store: Store, path: list[JobState], bad: JobState
) -> None:
    job = store.submit(spec()).job
    for state in path:
        store.transition(job.job_id, state, "setup")
    before = store.history(job.job_id)
    with pytest.raises(IllegalTransition, match=f"to {bad.value}"):
        store.transition(job.job_id, bad, "should fail")
    assert store.history(job.job_id) == before
    assert store.get(job.job_id).state is (path[-1] if path else S.QUEUED)


def test_transition_table_has_terminal_states_with_no_exit() -> None:
    assert {s for s, nxt in ALLOWED_TRANSITIONS.items() if not nxt} == {
        S.SUCCEEDED,
        S.FAILED,
        S.CANCELLED,
    }
    assert set(ALLOWED_TRANSITIONS) == set(JobState)


def test_compare_and_set_refuses_a_stale_caller(store: Store) -> None:
    job = store.submit(spec()).job
    store.transition(job.job_id, S.ADMITTED, "fits", expected=S.QUEUED)
    with pytest.raises(StaleState, match="is ADMITTED, not QUEUED"):
        store.transition(job.job_id, S.CANCELLED, "user", expected=S.QUEUED)
    assert store.get(job.job_id).state is S.ADMITTED


def test_requeue_moves_queued_s_but_not_submitted_s(store: Store) -> None:
    job = store.submit(spec()).job
    for state in (S.ADMITTED, S.RUNNING, S.PREEMPTED, S.QUEUED):
        store.transition(job.job_id, state, "x")
    again = store.get(job.job_id)
    assert again.submitted_s == job.submitted_s
    assert again.queued_s > job.queued_s


def test_unknown_job_errors_name_the_id(store: Store) -> None:
    with pytest.raises(UnknownJob, match="job-nope"):
        store.get("job-nope")
    with pytest.raises(UnknownJob):
        store.transition("job-nope", S.CANCELLED, "x")
    with pytest.raises(UnknownJob):
        store.history("job-nope")


def test_list_filters_and_events_follow(store: Store) -> None:
    a = store.submit(spec("a")).job
    b = store.submit(JobSpec(name="b", entrypoint="e", queue="research")).job
    store.transition(a.job_id, S.ADMITTED, "fits")
    assert [j.job_id for j in store.list_jobs(states=[S.QUEUED])] == [b.job_id]
    assert [j.job_id for j in store.list_jobs(queue="research")] == [b.job_id]
    seen = store.events()
    last = seen[-1].seq
    store.record_event("policy.preempt", "x")
    new = store.events(after_seq=last)
    assert [e.kind for e in new] == ["policy.preempt"]


def test_kv_holds_json_and_rejects_what_is_not(store: Store) -> None:
    store.put("desired/serve", {"m": {"cluster": 2, "external": 1}})
    store.put("desired/serve", {"m": {"cluster": 1, "external": 2}})
    assert store.get_value("desired/serve") == {"m": {"cluster": 1, "external": 2}}
    assert store.keys("desired/") == ["desired/serve"]
    with pytest.raises(ValueError, match="JSON"):
        store.put("bad", {1, 2})
    assert store.get_value("bad", "absent") == "absent"
    assert store.delete("desired/serve") and store.get_value("desired/serve") is None


def test_concurrent_retries_from_threads_create_one_job(store: Store) -> None:
    results: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def submit(i: int) -> None:
        try:
            barrier.wait()
            for n in range(5):
                results.append(store.submit(spec(), idempotency_key=f"same-{n}").job.job_id)
                store.submit(spec(f"own-{i}-{n}"))
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(set(results)) == 5
    assert len(store.list_jobs()) == 5 + 8 * 5


def test_two_store_instances_share_one_file(db_path: Path) -> None:
    one, two = Store(db_path), Store(db_path)
    try:
        made = one.submit(spec(), idempotency_key="k").job
        again = two.submit(spec(), idempotency_key="k")
        assert not again.created and again.job.job_id == made.job_id
        two.transition(made.job_id, S.CANCELLED, "user asked")
        assert one.get(made.job_id).state is S.CANCELLED
    finally:
        one.close()
        two.close()
