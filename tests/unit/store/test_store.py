"""The durable store: restarts lose and duplicate nothing, transitions follow the rules, WAL."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.store import (
    ALLOWED_TRANSITIONS,
    CorruptStore,
    IdempotencyConflict,
    IllegalTransition,
    InvalidJob,
    JobState,
    LastAdmin,
    StaleState,
    Store,
    UnknownJob,
    UnknownUser,
    UserExists,
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


# -- preemption in one transaction ------------------------------------------------------------


def running_job(store: Store) -> str:
    job_id = store.submit(spec()).job.job_id
    store.transition(job_id, S.ADMITTED, "fits")
    store.transition(job_id, S.RUNNING, "all workers up")
    store.update_info(job_id, {"submission_id": f"{job_id}-1", "attempt": 1})
    return job_id


def test_requeue_records_preempted_and_queued_in_one_call(store: Store) -> None:
    job_id = running_job(store)
    job = store.requeue(job_id, "checkpointed", "requeued", info={"placement": None, "x": 1})
    assert job.state is S.QUEUED and job.num_preemptions == 1 and job.info["x"] == 1
    assert [(t.to_state, t.reason) for t in store.history(job_id)][-2:] == [
        (S.PREEMPTED, "checkpointed"),
        (S.QUEUED, "requeued"),
    ]


def test_requeue_that_fails_midway_leaves_the_job_as_it_was(store: Store) -> None:
    job_id = running_job(store)
    before = (store.get(job_id), store.history(job_id), store.events())
    # The info merge (between the two transitions) fails: NaN is not JSON.
    with pytest.raises(ValueError, match="JSON"):
        store.requeue(job_id, "checkpointed", "requeued", info={"bad": float("nan")})
    assert (store.get(job_id), store.history(job_id), store.events()) == before
    assert store.get(job_id).state is S.RUNNING and store.get(job_id).num_preemptions == 0


def test_requeue_of_a_stranded_preempted_job_adds_only_the_queued_entry(store: Store) -> None:
    job_id = running_job(store)
    store.transition(job_id, S.PREEMPTED, "checkpointed")  # ... and the controller crashed
    job = store.requeue(job_id, "unused", "stranded", expected=[S.PREEMPTED])
    assert job.state is S.QUEUED and job.num_preemptions == 1
    assert [t.to_state for t in store.history(job_id)][-2:] == [S.PREEMPTED, S.QUEUED]
    with pytest.raises(StaleState):
        store.requeue(job_id, "a", "b", expected=[S.PREEMPTED])


# -- active reads, retention ------------------------------------------------------------------


def finished_job(store: Store, state: JobState = S.SUCCEEDED, *, ray_done: bool = True) -> str:
    job_id = running_job(store)
    store.transition(job_id, state, "done", info={"ray_done": True} if ray_done else None)
    return job_id


def test_tick_reads_parse_active_rows_only(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import controlplane.store.jobs as store_module

    for _ in range(60):
        finished_job(store, S.SUCCEEDED)
        finished_job(store, S.FAILED)
        cancelled = store.submit(spec()).job.job_id
        store.transition(cancelled, S.CANCELLED, "user")
    unsettled = finished_job(store, S.FAILED, ray_done=False)  # its Ray Job may still run
    active = running_job(store)
    queued = store.submit(spec()).job.job_id
    parsed: list[str] = []
    real = store_module._job

    def counting(row: Any) -> Any:
        parsed.append(row["job_id"])
        return real(row)

    monkeypatch.setattr(store_module, "_job", counting)
    # What a tick reads: the observe phase and `JobRunner.observe` / `apply`.
    store.list_jobs(states=[S.QUEUED, S.ADMITTED, S.RUNNING])
    store.list_jobs(states=[S.ADMITTED, S.RUNNING])
    store.list_jobs(states=[S.PREEMPTED])
    ended = store.list_jobs(states=[S.CANCELLED, S.FAILED], unsettled_only=True)
    assert [j.job_id for j in ended] == [unsettled]
    assert sorted(set(parsed)) == sorted({unsettled, active, queued})
    assert len(parsed) == 4  # 181 finished jobs in the store, none of the settled ones parsed


@pytest.mark.parametrize(
    ("kwargs", "index"),
    [
        pytest.param({"states": [S.QUEUED, S.ADMITTED, S.RUNNING]}, "jobs_by_state", id="active"),
        pytest.param(
            {"states": [S.CANCELLED, S.FAILED], "unsettled_only": True},
            "jobs_unsettled",
            id="unsettled-finished",
        ),
    ],
)
def test_tick_queries_search_an_index_never_scan_the_table(
    store: Store, kwargs: dict[str, Any], index: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans: list[str] = []
    real_read = store._read

    def explaining(sql: str, params: Any = ()) -> Any:
        if sql.startswith("SELECT job_id, spec_json"):
            plans.extend(str(r["detail"]) for r in real_read("EXPLAIN QUERY PLAN " + sql, params))
        return real_read(sql, params)

    monkeypatch.setattr(store, "_read", explaining)
    store.list_jobs(**kwargs)
    assert any(f"USING INDEX {index}" in p for p in plans), plans
    assert not any(p.startswith("SCAN jobs") for p in plans), plans


def test_prune_jobs_deletes_old_settled_finished_jobs_only(
    db_path: Path,
) -> None:
    clock = FakeClock()
    store = Store(db_path, clock=clock)
    old = [finished_job(store, S.SUCCEEDED) for _ in range(3)]
    never_ran = store.submit(spec()).job.job_id
    store.transition(never_ran, S.CANCELLED, "user")
    still_stopping = finished_job(store, S.FAILED, ray_done=False)
    active = running_job(store)
    cutoff = clock.now_s + 0.5
    clock.now_s += 1000
    recent = finished_job(store, S.SUCCEEDED)
    first = store.prune_jobs(cutoff, limit=2)
    rest = store.prune_jobs(cutoff, limit=10)
    assert len(first) == 2 and sorted(first + rest) == sorted([*old, never_ran])
    left = {j.job_id for j in store.list_jobs()}
    assert left == {still_stopping, active, recent}
    for gone in old:
        with pytest.raises(UnknownJob):
            store.history(gone)
        assert store.events(job_id=gone) == []
    store.close()


def test_prune_events_is_bounded_and_oldest_first(store: Store) -> None:
    for i in range(10):
        store.record_event("test.e", f"e{i}")
    cutoff = store.events()[-1].at_s
    assert store.prune_events(cutoff, limit=4) == 4
    assert store.prune_events(cutoff, limit=100) == 5
    assert [e.message for e in store.events()] == ["e9"]


# -- rows that no longer validate ---------------------------------------------------------------


BAD_SPECS = [
    pytest.param('{"name": "x", "entrypoint": "e", "num_workers": 0}', id="zero-workers"),
    pytest.param('{"name": "x", "entrypoint": "e", "max_runtime_s": NaN}', id="nan"),
    pytest.param('{"name": "x", "entrypoint": "e", "from_the_future": 1}', id="unknown-field"),
    pytest.param("not json", id="not-json"),
]


@pytest.mark.parametrize("spec_json", BAD_SPECS)
def test_rows_that_no_longer_validate_are_reported_once_and_skipped(
    db_path: Path, spec_json: str
) -> None:
    store = Store(db_path, clock=FakeClock())
    good = store.submit(spec("good")).job.job_id
    bad = store.submit(spec("bad")).job.job_id
    raw = sqlite3.connect(db_path)
    raw.execute("UPDATE jobs SET spec_json = ? WHERE job_id = ?", (spec_json, bad))
    raw.commit()
    raw.close()
    assert [j.job_id for j in store.list_jobs(states=[S.QUEUED])] == [good]
    scan = store.scan_jobs()
    assert [j.job_id for j in scan.jobs] == [good]
    assert [(r.job_id, r.state) for r in scan.invalid] == [(bad, "QUEUED")]
    with pytest.raises(InvalidJob, match=bad):
        store.get(bad)
    store.close()
    again = Store(db_path, clock=FakeClock())  # a restart reports it in the log, not twice
    again.list_jobs()
    assert len(again.events(job_id=bad, kind_prefix="job.invalid")) == 1
    again.close()


# -- a corrupt file ---------------------------------------------------------------------------


def test_a_file_that_is_not_a_database_is_a_clear_error_naming_it(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    db_path.write_bytes(b"this is not sqlite\n" * 500)
    with pytest.raises(CorruptStore) as caught:
        Store(db_path)
    message = str(caught.value)
    assert str(db_path) in message and "move the file aside" in message
    assert "docs/operations.md" in message


def test_a_malformed_database_is_a_clear_error_naming_it(db_path: Path) -> None:
    store = Store(db_path, clock=FakeClock())
    for i in range(300):
        store.submit(spec(f"job-{i}"))
    store.close()
    data = bytearray(db_path.read_bytes())
    page = 4096
    assert len(data) > 4 * page
    data[2 * page : len(data) - page] = b"\x5a" * (len(data) - 3 * page)  # keep page 1
    db_path.write_bytes(bytes(data))
    with pytest.raises(CorruptStore, match=str(db_path)):
        Store(db_path)


def test_scan_pages_cover_every_job_once_in_order(store: Store) -> None:
    ids = [store.submit(spec(f"j{i}")).job.job_id for i in range(7)]
    seen: list[str] = []
    after = None
    pages = 0
    while True:
        scan = store.scan_jobs(limit=3, after=after)
        seen += [j.job_id for j in scan.jobs]
        pages += 1
        after = scan.next_after
        if after is None:
            break
    assert seen == [j.job_id for j in store.list_jobs()] and sorted(seen) == sorted(ids)
    assert pages == 3
    # an exact multiple of the page ends without an empty extra page
    assert store.scan_jobs(limit=7).next_after is None


@pytest.mark.parametrize(
    "cursor",
    ["", "x", "1.0:2.0:", "nan:1.0:job-a", "1.0:inf:job-a", "1:2"],
    ids=["empty", "word", "no-id", "nan", "inf", "short"],
)
def test_a_cursor_the_store_did_not_hand_out_is_refused(store: Store, cursor: str) -> None:
    store.submit(spec())
    with pytest.raises(ValueError, match="not a page cursor"):
        store.scan_jobs(limit=1, after=cursor)


# -- users and job owners ------------------------------------------------------------------------


def test_a_job_keeps_its_owner_and_idempotency_keys_are_per_owner(store: Store) -> None:
    """The same key from two users is two jobs; from one user, one job (a different spec
    under it is a conflict). Fails on a store whose keys are global (schema version 2)."""
    first = store.submit(spec(), idempotency_key="k", owner="alice", owner_id="u-a")
    assert (first.job.owner, first.job.owner_id) == ("alice", "u-a")
    assert store.get(first.job.job_id).owner == "alice"
    again = store.submit(spec(), idempotency_key="k", owner="alice", owner_id="u-a")
    assert (again.created, again.job.job_id) == (False, first.job.job_id)
    with pytest.raises(IdempotencyConflict, match="different spec"):
        store.submit(spec("other"), idempotency_key="k", owner="alice", owner_id="u-a")
    bobs = store.submit(spec(), idempotency_key="k", owner="bob", owner_id="u-b")
    assert bobs.created and bobs.job.job_id != first.job.job_id
    assert store.submit(spec(), idempotency_key="k", owner="bob", owner_id="u-b").job == bobs.job
    unowned = store.submit(spec(), idempotency_key="k")
    assert unowned.created and store.submit(spec(), idempotency_key="k").job == unowned.job
    assert store.owner_of(first.job.job_id) == ("alice", "u-a")
    assert store.submit(spec()).job.owner is None
    with pytest.raises(ValueError, match="both"):
        store.submit(spec(), owner="alice")


V1_JOBS_TABLE = (
    "CREATE TABLE jobs (job_id TEXT PRIMARY KEY, name TEXT NOT NULL, spec_json TEXT "
    "NOT NULL, queue TEXT NOT NULL, priority_class TEXT NOT NULL, state TEXT NOT NULL, "
    "idempotency_key TEXT UNIQUE, submitted_s REAL NOT NULL, queued_s REAL NOT NULL, "
    "updated_s REAL NOT NULL, num_preemptions INTEGER NOT NULL DEFAULT 0, info_json "
    "TEXT NOT NULL DEFAULT '{}'"
)
"""The jobs table of a version-1 file, less its closing parenthesis (version 2 added owner)."""


def test_a_version_1_file_gains_the_owner_column_and_keeps_its_jobs(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as raw:
        raw.executescript(V1_JOBS_TABLE + "); PRAGMA user_version=1;")
        raw.execute(
            "INSERT INTO jobs (job_id, name, spec_json, queue, priority_class, state, "
            "submitted_s, queued_s, updated_s) VALUES ('job-1', 'train', ?, 'default', "
            "'medium', 'QUEUED', 1, 1, 1)",
            (json.dumps(spec().to_dict(), sort_keys=True),),
        )
    with Store(db_path) as s:
        (old,) = s.list_jobs()
        assert (old.job_id, old.owner) == ("job-1", None)
        assert s.submit(spec(), owner="alice", owner_id="u-a").job.owner == "alice"
        assert s.count_users() == 0
    with Store(db_path) as s:  # opening again migrates nothing twice
        assert [j.owner for j in s.list_jobs()] == [None, "alice"]


def test_a_version_2_file_is_rebuilt_with_keys_per_owner_and_ids_for_users(
    db_path: Path,
) -> None:
    """A version-2 file: idempotency keys UNIQUE across users, users without ids, and jobs
    of a removed "alice" whose name was added again later. Opening it rebuilds the jobs table
    (history and all kept), gives every user an id, and gives each job its owner's id only
    where that user existed when the job was submitted."""
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as raw:
        raw.executescript(
            V1_JOBS_TABLE + ", owner TEXT);"
            "CREATE TABLE transitions (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT NOT "
            "NULL REFERENCES jobs (job_id), from_state TEXT, to_state TEXT NOT NULL, at_s REAL "
            "NOT NULL, reason TEXT NOT NULL);"
            "CREATE TABLE users (name TEXT PRIMARY KEY, role TEXT NOT NULL, queues_json TEXT "
            "NOT NULL, token_hash TEXT NOT NULL UNIQUE, created_s REAL NOT NULL, rotated_s "
            "REAL NOT NULL, expires_s REAL);"
            "PRAGMA user_version=2;"
        )
        spec_json = json.dumps(spec().to_dict(), sort_keys=True)
        for job_id, key, owner, at_s in (
            ("job-old-alice", "k", "alice", 10.0),  # the first alice, since removed
            ("job-bob", "k2", "bob", 30.0),
            ("job-new-alice", "k3", "alice", 60.0),
        ):
            raw.execute(
                "INSERT INTO jobs (job_id, name, spec_json, queue, priority_class, state, "
                "idempotency_key, submitted_s, queued_s, updated_s, owner) VALUES "
                "(?, 'train', ?, 'default', 'medium', 'QUEUED', ?, ?, ?, ?, ?)",
                (job_id, spec_json, key, at_s, at_s, at_s, owner),
            )
            raw.execute(
                "INSERT INTO transitions (job_id, to_state, at_s, reason) VALUES "
                "(?, 'QUEUED', ?, 'submitted')",
                (job_id, at_s),
            )
        for name, created_s in (("bob", 20.0), ("alice", 50.0)):
            raw.execute(
                "INSERT INTO users VALUES (?, 'researcher', '[]', ?, ?, ?, NULL)",
                (name, name * 8, created_s, created_s),
            )
    with Store(db_path) as s:
        ids = {u.name: u.user_id for u in s.list_users(limit=10)[0]}
        assert all(i.startswith("u-") for i in ids.values()) and len(set(ids.values())) == 2
        assert {j.job_id: j.owner_id for j in s.list_jobs()} == {
            "job-old-alice": None,
            "job-bob": ids["bob"],
            "job-new-alice": ids["alice"],
        }
        assert [t.reason for t in s.history("job-bob")] == ["submitted"]
        reused = s.submit(spec(), idempotency_key="k", owner="alice", owner_id=ids["alice"])
        assert reused.created  # the old alice's key is not the new alice's
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 3
        assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
    with Store(db_path) as s:  # opening again changes nothing
        assert len(s.list_jobs()) == 4


def test_the_first_admin_is_made_once(store: Store) -> None:
    assert store.ensure_first_admin("admin", "a" * 64) is True
    assert store.ensure_first_admin("admin", "b" * 64) is False
    assert store.get_user("admin").token_hash == "a" * 64
    assert store.get_user("admin").queues == ("*",)


def test_users_keep_one_admin_and_retire_old_hashes(store: Store) -> None:
    store.ensure_first_admin("admin", "a" * 64)
    store.add_user("bob", "researcher", ["team-b", "team-b"], "b" * 64)
    assert store.get_user("bob").queues == ("team-b",)
    with pytest.raises(UserExists):
        store.add_user("bob", "admin", [], "c" * 64)
    with pytest.raises(LastAdmin, match="last admin"):
        store.remove_user("admin")
    rotated = store.rotate_token("bob", "d" * 64, expires_s=5000.0)
    assert (rotated.token_hash, rotated.expires_s) == ("d" * 64, 5000.0)
    assert store.user_by_token_hash("b" * 64) is None
    assert store.retired_token("b" * 64) == "rotated"
    assert store.user_by_token_hash("d" * 64) == rotated
    store.remove_user("bob")
    assert store.retired_token("d" * 64) == "removed"
    with pytest.raises(UnknownUser, match="bob"):
        store.get_user("bob")
    assert store.retired_token("e" * 64) is None


def test_users_page_by_name(store: Store) -> None:
    for i, name in enumerate(["dan", "amy", "cat", "bea"]):
        store.add_user(name, "researcher", [], f"{i}" * 64)
    page, after = store.list_users(limit=3)
    assert [u.name for u in page] == ["amy", "bea", "cat"] and after == "cat"
    rest, end = store.list_users(limit=3, after=after)
    assert [u.name for u in rest] == ["dan"] and end is None
