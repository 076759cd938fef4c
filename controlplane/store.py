"""The control plane's durable memory: jobs, their state history, events, and policy state.

Owns: one SQLite database in WAL mode at a path the caller passes in (``state_dir/store.db``
by default), its schema, and the rules of a job's life:

- states QUEUED, ADMITTED, RUNNING, SUCCEEDED, FAILED, PREEMPTED, CANCELLED, and which
  transitions between them are allowed (`ALLOWED_TRANSITIONS`); every transition is recorded
  with its time and reason, and emits an event;
- idempotent submission: a client-supplied idempotency key makes a retried submit return the
  job it already created instead of a second one;
- attempt notes: text the control plane adds to one attempt's log (a hung gang's stacks);
- an event log (what ``rcp events`` shows) and a key-value table for the policy actor's
  desired state and policy state (JSON values);
- which jobs are *active*: QUEUED, ADMITTED, RUNNING, PREEMPTED, and finished jobs whose Ray
  Job may still run (a ``submission_id`` in their info and no ``ray_done``). Reads of active
  jobs go through indexes (``jobs_by_state`` and the partial ``jobs_unsettled``) and never
  parse a finished job; `prune_jobs` and `prune_events` delete what retention no longer keeps;
- rows that no longer validate (a spec older validation accepted): every read skips them,
  logs them and records a ``job.invalid`` event once, and `scan_jobs` lists them, so one bad
  row is never fatal to a tick or a listing; `get` raises `InvalidJob`;
- a file that is not a readable SQLite database raises `CorruptStore`, naming the file and
  what to do (see docs/operations.md, "The job store").

Every write is one transaction, committed with ``synchronous=FULL``: once a call returns, a
crash or restart of the control plane neither loses it nor applies it twice. The store is safe
to share between threads (one connection behind a lock) and between processes on one machine
(SQLite's locking, with a busy timeout).

Must not: talk to Ray, decide anything, or read the wall clock directly: time comes from the
injectable `clock` (``time.time`` unless a test passes another).
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from controlplane.statefiles import create_private, narrow_private
from jobs.spec import JobSpec

__all__ = [
    "ACTIVE_STATES",
    "ALLOWED_TRANSITIONS",
    "TERMINAL_STATES",
    "CorruptStore",
    "Event",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidJob",
    "InvalidRow",
    "JobRecord",
    "JobScan",
    "JobState",
    "StaleState",
    "Store",
    "StoreError",
    "SubmitResult",
    "Transition",
    "UnknownJob",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1


class JobState(str, Enum):
    QUEUED = "QUEUED"
    """Waiting for its whole gang to fit."""
    ADMITTED = "ADMITTED"
    """The policy granted the GPUs; the runner is starting the gang."""
    RUNNING = "RUNNING"
    """Every worker is up."""
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    """Stopped (after a checkpoint) to make room; re-queued next."""
    CANCELLED = "CANCELLED"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE_STATES = frozenset(set(JobState) - TERMINAL_STATES)

ALLOWED_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.ADMITTED, JobState.CANCELLED, JobState.FAILED}),
    # ADMITTED -> QUEUED: the gang did not fully start in time; released and re-queued.
    JobState.ADMITTED: frozenset(
        {
            JobState.RUNNING,
            JobState.QUEUED,
            JobState.PREEMPTED,
            JobState.FAILED,
            JobState.CANCELLED,
        }
    ),
    # RUNNING -> QUEUED: the gang crashed, hung or was lost; it runs again as a new attempt.
    JobState.RUNNING: frozenset(
        {
            JobState.SUCCEEDED,
            JobState.FAILED,
            JobState.PREEMPTED,
            JobState.CANCELLED,
            JobState.QUEUED,
        }
    ),
    JobState.PREEMPTED: frozenset({JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class StoreError(Exception):
    """Base of the store's errors; each message says what to do."""


class UnknownJob(StoreError, KeyError):
    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id

    def __str__(self) -> str:
        return f"no job with id {self.job_id!r} (see `rcp queue` or `rcp status` for known ids)"


class IllegalTransition(StoreError, ValueError):
    """The transition is not in `ALLOWED_TRANSITIONS`."""


class StaleState(StoreError, ValueError):
    """The job is no longer in the state the caller expected (someone else moved it)."""


class IdempotencyConflict(StoreError, ValueError):
    """The idempotency key was already used for a different spec."""


class CorruptStore(StoreError):
    """The database file is not a readable SQLite database (garbage, truncated, malformed)."""


class InvalidJob(StoreError, ValueError):
    """A stored job row that no longer validates (its spec, state or info)."""

    def __init__(self, job_id: str, error: str) -> None:
        super().__init__(job_id, error)
        self.job_id = job_id
        self.error = error

    def __str__(self) -> str:
        return (
            f"job {self.job_id}: its stored row no longer validates ({self.error}); the "
            "controller skips it (see docs/operations.md, 'The job store')"
        )


@dataclass(frozen=True)
class InvalidRow:
    """A job row every read skips, and why."""

    job_id: str
    state: str
    """The stored state, as stored (it may itself be what is invalid)."""
    error: str


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    spec: JobSpec
    state: JobState
    submitted_s: float
    """When the job was first submitted."""
    queued_s: float
    """When it last entered QUEUED (equal to submitted_s until it is re-queued)."""
    updated_s: float
    """When its state last changed."""
    num_preemptions: int = 0
    idempotency_key: str | None = None
    info: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """Free-form facts the runner records (Ray job id, last checkpoint, attempt, ...). Left
    out of the repr: it holds the attempt's signal token (``signal_token``)."""

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class JobScan:
    """What a listing found: the jobs that validate, and the rows skipped because they do not."""

    jobs: list[JobRecord]
    invalid: list[InvalidRow]
    next_after: str | None = None
    """With a `limit`: where the next page starts (`scan_jobs(after=...)`), None at the end."""


@dataclass(frozen=True)
class SubmitResult:
    job: JobRecord
    created: bool
    """False when the idempotency key matched an existing job (a retry)."""


@dataclass(frozen=True)
class Transition:
    seq: int
    job_id: str
    from_state: JobState | None
    """None for the first entry (submission)."""
    to_state: JobState
    at_s: float
    reason: str


@dataclass(frozen=True)
class Event:
    seq: int
    at_s: float
    kind: str
    message: str
    job_id: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    spec_json TEXT NOT NULL,
    queue TEXT NOT NULL,
    priority_class TEXT NOT NULL,
    state TEXT NOT NULL,
    idempotency_key TEXT UNIQUE,
    submitted_s REAL NOT NULL,
    queued_s REAL NOT NULL,
    updated_s REAL NOT NULL,
    num_preemptions INTEGER NOT NULL DEFAULT 0,
    info_json TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state, queued_s);
CREATE INDEX IF NOT EXISTS jobs_by_state_updated ON jobs (state, updated_s);
CREATE INDEX IF NOT EXISTS jobs_unsettled ON jobs (state) WHERE {unsettled};
CREATE TABLE IF NOT EXISTS transitions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL REFERENCES jobs (job_id),
    from_state TEXT,
    to_state TEXT NOT NULL,
    at_s REAL NOT NULL,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS transitions_by_job ON transitions (job_id, seq);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at_s REAL NOT NULL,
    kind TEXT NOT NULL,
    job_id TEXT,
    message TEXT NOT NULL,
    data_json TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id, seq);
CREATE TABLE IF NOT EXISTS attempt_notes (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    text TEXT NOT NULL,
    at_s REAL NOT NULL,
    PRIMARY KEY (job_id, attempt)
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value_json TEXT NOT NULL,
    updated_s REAL NOT NULL
);
"""

_UNSETTLED = (
    "json_extract(info_json, '$.submission_id') IS NOT NULL "
    "AND json_extract(info_json, '$.ray_done') IS NULL"
)
"""A job whose Ray Job may still run: it was submitted and the runner has not seen it end.
The partial index ``jobs_unsettled`` holds exactly these rows (SQLite uses a partial index
only for a query that repeats its WHERE term, so both use this one string)."""
_SCHEMA = _SCHEMA.replace("{unsettled}", _UNSETTLED)

_JOB_COLUMNS = (
    "job_id, spec_json, state, submitted_s, queued_s, updated_s, num_preemptions, "
    "idempotency_key, info_json"
)


def _page_key(after: str) -> tuple[float, float, str]:
    """The order key a `JobScan.next_after` cursor names (ValueError if it is not one)."""
    queued, _, rest = after.partition(":")
    submitted, _, job_id = rest.partition(":")
    try:
        key = (float(queued), float(submitted), job_id)
    except ValueError:
        key = (math.nan, math.nan, "")
    if not (math.isfinite(key[0]) and math.isfinite(key[1]) and key[2]):
        raise ValueError(f"{after[:80]!r} is not a page cursor this listing handed out")
    return key


def _new_job_id() -> str:
    return f"job-{uuid.uuid4().hex[:12]}"


class Store:
    """The durable store. Open one per process; share it between threads freely."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Callable[[], float] = time.time,
        new_job_id: Callable[[], str] = _new_job_id,
        busy_timeout_s: float = 10.0,
    ) -> None:
        self.path = Path(path).expanduser()
        # 0600 before SQLite opens it (the rows hold users' env vars); WAL files follow it.
        # Files an older version left wider are narrowed, the WAL's included.
        create_private(self.path)
        for suffix in ("-wal", "-shm"):
            narrow_private(self.path.with_name(self.path.name + suffix))
        self._clock = clock
        self._new_job_id = new_job_id
        self._lock = threading.RLock()
        self._reported_invalid: set[str] = set()
        try:
            self._db = sqlite3.connect(
                str(self.path),
                timeout=busy_timeout_s,
                isolation_level=None,  # autocommit; transactions are explicit below
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the job store at {str(self.path)!r}: {exc}") from exc
        self._db.row_factory = sqlite3.Row
        try:
            self._open()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            if _is_corruption(exc):
                raise self._corrupt(exc) from exc
            raise StoreError(f"cannot open the job store at {str(self.path)!r}: {exc}") from exc
        except BaseException:
            self._db.close()
            raise

    def _open(self) -> None:
        """Check the file, switch to WAL, create or check the schema."""
        with self._lock:
            # quick_check reads every page once (well under a second for 100k jobs): a corrupt
            # file fails here, at start, with a clear error, instead of in some later tick.
            problems = [str(r[0]) for r in self._db.execute("PRAGMA quick_check(5)")]
            if problems != ["ok"]:
                raise CorruptStore(self._corrupt_message("; ".join(problems)))
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"the job store at {str(self.path)!r} could not switch to WAL mode "
                    f"(got {mode!r}); put state_dir on a local file system"
                )
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"the job store at {str(self.path)!r} has schema version {version}, newer "
                    f"than this control plane's {SCHEMA_VERSION}; upgrade the control plane"
                )
            with self._tx():
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    # -- plumbing --------------------------------------------------------------------------

    def _corrupt_message(self, detail: str) -> str:
        p = str(self.path)
        return (
            f"the job store at {p!r} is not a readable SQLite database ({detail}). Stop the "
            f"controller, move the file aside with its -wal and -shm files (mv {p} "
            f"{p}.corrupt), then either restore a backup to {p} or start again for an empty "
            "store (running jobs' Ray Jobs are then unknown to it: stop them with `ray job "
            "stop`); see docs/operations.md, 'The job store'"
        )

    def _corrupt(self, exc: sqlite3.DatabaseError) -> CorruptStore:
        return CorruptStore(self._corrupt_message(str(exc)))

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken with the write lock up front (no upgrade deadlocks)."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            except sqlite3.DatabaseError as exc:
                if _is_corruption(exc):
                    raise self._corrupt(exc) from exc
                raise

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return list(self._db.execute(sql, tuple(params)).fetchall())
            except sqlite3.DatabaseError as exc:
                if _is_corruption(exc):
                    raise self._corrupt(exc) from exc
                raise

    def _parse(self, rows: Iterable[sqlite3.Row]) -> JobScan:
        """Rows to records; a row that no longer validates is reported and skipped."""
        jobs: list[JobRecord] = []
        invalid: list[InvalidRow] = []
        for row in rows:
            try:
                jobs.append(_job(row))
            except Exception as exc:  # whatever a bad row raises, it must not stop the read
                bad = InvalidRow(str(row["job_id"]), str(row["state"]), _describe(exc))
                invalid.append(bad)
                self._report_invalid(bad)
        return JobScan(jobs, invalid)

    def _report_invalid(self, bad: InvalidRow) -> None:
        """A log line once per process, and a ``job.invalid`` event once per job."""
        if bad.job_id in self._reported_invalid:
            return
        self._reported_invalid.add(bad.job_id)
        log.warning(
            "job %s (%s): stored row no longer validates, skipped: %s",
            bad.job_id,
            bad.state,
            bad.error,
        )
        try:
            with self._tx() as db:
                seen = db.execute(
                    "SELECT 1 FROM events WHERE job_id = ? AND kind = 'job.invalid' LIMIT 1",
                    (bad.job_id,),
                ).fetchone()
                if seen is None:
                    self._insert_event(
                        db,
                        self._clock(),
                        "job.invalid",
                        f"job {bad.job_id}: stored row no longer validates, skipped: {bad.error}",
                        bad.job_id,
                        {"state": bad.state, "error": bad.error},
                    )
        except (StoreError, sqlite3.Error) as exc:  # reporting must not fail the read
            log.warning("recording job.invalid for %s failed: %s", bad.job_id, exc)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def journal_mode(self) -> str:
        return str(self._read("PRAGMA journal_mode")[0][0]).lower()

    # -- jobs ------------------------------------------------------------------------------

    def submit(
        self,
        spec: JobSpec,
        *,
        idempotency_key: str | None = None,
        reason: str = "submitted",
    ) -> SubmitResult:
        """Queue a new job, or return the one already created with this idempotency key.

        Raises IdempotencyConflict if the key was used for a different spec.
        """
        if idempotency_key is not None and not idempotency_key.strip():
            raise ValueError("idempotency_key: must be a non-empty string or None")
        spec_json = json.dumps(spec.to_dict(), sort_keys=True, allow_nan=False)
        with self._tx() as db:
            if idempotency_key is not None:
                row = db.execute(
                    f"SELECT {_JOB_COLUMNS} FROM jobs WHERE idempotency_key = ?",
                    (idempotency_key,),
                ).fetchone()
                if row is not None:
                    if row["spec_json"] != spec_json:
                        raise IdempotencyConflict(
                            f"idempotency key {idempotency_key!r} was already used for job "
                            f"{row['job_id']} with a different spec; use a new key for a new job"
                        )
                    return SubmitResult(_job(row), created=False)
            now = self._clock()
            job_id = self._new_job_id()
            db.execute(
                "INSERT INTO jobs (job_id, name, spec_json, queue, priority_class, state, "
                "idempotency_key, submitted_s, queued_s, updated_s) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    spec.name,
                    spec_json,
                    spec.queue,
                    spec.priority_class,
                    JobState.QUEUED.value,
                    idempotency_key,
                    now,
                    now,
                    now,
                ),
            )
            self._record_transition(db, job_id, None, JobState.QUEUED, now, reason)
            row = db.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)
            ).fetchone()
            return SubmitResult(_job(row), created=True)

    def get(self, job_id: str) -> JobRecord:
        """The job; InvalidJob if its row no longer validates (reported, as every read does)."""
        rows = self._read(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,))
        if not rows:
            raise UnknownJob(job_id)
        scan = self._parse(rows)
        if scan.invalid:
            raise InvalidJob(job_id, scan.invalid[0].error)
        return scan.jobs[0]

    def list_jobs(
        self,
        *,
        states: Iterable[JobState] | None = None,
        queue: str | None = None,
        limit: int | None = None,
        unsettled_only: bool = False,
    ) -> list[JobRecord]:
        """Jobs oldest first (by when they last entered the queue), filtered if asked; rows
        that no longer validate are skipped (see `scan_jobs`)."""
        return self.scan_jobs(
            states=states, queue=queue, limit=limit, unsettled_only=unsettled_only
        ).jobs

    def scan_jobs(
        self,
        *,
        states: Iterable[JobState] | None = None,
        queue: str | None = None,
        limit: int | None = None,
        unsettled_only: bool = False,
        after: str | None = None,
    ) -> JobScan:
        """`list_jobs`, plus the rows skipped because they no longer validate.

        `unsettled_only`: only jobs whose Ray Job may still run (submitted, no ``ray_done``),
        read through the partial index ``jobs_unsettled``; with `states` naming finished states
        this is what a tick needs of finished jobs, however many there are.

        Paging: with a `limit`, `next_after` names where the next page starts (the listing's
        order key of the last row read, valid or not); pass it back as `after`. A job re-queued
        between two pages may show on both or neither (its place in the order moved).
        ValueError for an `after` this store did not hand out.
        """
        sql = f"SELECT {_JOB_COLUMNS} FROM jobs"
        where: list[str] = []
        params: list[Any] = []
        if states is not None:
            wanted = [JobState(s).value for s in states]
            if not wanted:
                return JobScan([], [])
            where.append(f"state IN ({', '.join('?' for _ in wanted)})")
            params += wanted
        if unsettled_only:
            where.append(_UNSETTLED)
        if queue is not None:
            where.append("queue = ?")
            params.append(queue)
        if after is not None:
            where.append("(queued_s, submitted_s, job_id) > (?, ?, ?)")
            params += list(_page_key(after))
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY queued_s, submitted_s, job_id"
        if limit is None:
            return self._parse(self._read(sql, params))
        sql += " LIMIT ?"
        params.append(int(limit) + 1)  # one more tells whether a next page exists
        rows = self._read(sql, params)
        page, more = rows[: int(limit)], len(rows) > int(limit)
        scan = self._parse(page)
        if more and page:
            last = page[-1]
            cursor = f"{float(last['queued_s'])!r}:{float(last['submitted_s'])!r}:{last['job_id']}"
            return JobScan(scan.jobs, scan.invalid, cursor)
        return scan

    def transition(
        self,
        job_id: str,
        to_state: JobState,
        reason: str,
        *,
        expected: JobState | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> JobRecord:
        """Move a job to `to_state`, recording why. Atomic with its history entry, its event
        and the `info` merge (as `update_info`), if one is given.

        `expected` makes it a compare-and-set: StaleState if the job has moved on meanwhile.
        Raises IllegalTransition for a move `ALLOWED_TRANSITIONS` does not allow.
        """
        to_state = JobState(to_state)
        _check_reason(reason)
        with self._tx() as db:
            current = self._state_in(db, job_id)
            if expected is not None and current is not JobState(expected):
                raise StaleState(
                    f"job {job_id} is {current.value}, not {JobState(expected).value}; "
                    "re-read it and decide again"
                )
            self._move(db, job_id, current, to_state, reason)
            if info:
                self._merge_info(db, job_id, info)
            return self._row_in(db, job_id)

    def requeue(
        self,
        job_id: str,
        preempted_reason: str,
        queued_reason: str,
        *,
        info: Mapping[str, Any] | None = None,
        expected: Iterable[JobState] = (JobState.ADMITTED, JobState.RUNNING, JobState.PREEMPTED),
    ) -> JobRecord:
        """A preempted (or lost) gang back to the queue in one transaction: -> PREEMPTED (unless
        it already is), merge `info`, PREEMPTED -> QUEUED. Both history entries, or neither: a
        crash or an error midway leaves the job as it was.

        StaleState if the job is in none of the `expected` states.
        """
        _check_reason(preempted_reason)
        _check_reason(queued_reason)
        wanted = {JobState(s) for s in expected}
        with self._tx() as db:
            current = self._state_in(db, job_id)
            if current not in wanted:
                names = ", ".join(sorted(s.value for s in wanted))
                raise StaleState(
                    f"job {job_id} is {current.value}, not one of {names}; "
                    "re-read it and decide again"
                )
            if current is not JobState.PREEMPTED:
                self._move(db, job_id, current, JobState.PREEMPTED, preempted_reason)
            if info:
                self._merge_info(db, job_id, info)
            self._move(db, job_id, JobState.PREEMPTED, JobState.QUEUED, queued_reason)
            return self._row_in(db, job_id)

    def _state_in(self, db: sqlite3.Connection, job_id: str) -> JobState:
        row = db.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            raise UnknownJob(job_id)
        return JobState(row["state"])

    def _row_in(self, db: sqlite3.Connection, job_id: str) -> JobRecord:
        row = db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return _job(row)

    def _move(
        self,
        db: sqlite3.Connection,
        job_id: str,
        current: JobState,
        to_state: JobState,
        reason: str,
    ) -> None:
        """One checked state change with its history entry and event, inside `db`'s transaction."""
        allowed = ALLOWED_TRANSITIONS[current]
        if to_state not in allowed:
            options = ", ".join(sorted(s.value for s in allowed)) or "none (it is final)"
            raise IllegalTransition(
                f"job {job_id} cannot go from {current.value} to {to_state.value}; "
                f"allowed from {current.value}: {options}"
            )
        now = self._clock()
        sets = ["state = ?", "updated_s = ?"]
        params: list[Any] = [to_state.value, now]
        if to_state is JobState.QUEUED:
            sets.append("queued_s = ?")
            params.append(now)
        if to_state is JobState.PREEMPTED:
            sets.append("num_preemptions = num_preemptions + 1")
        db.execute(f"UPDATE jobs SET {', '.join(sets)} WHERE job_id = ?", (*params, job_id))
        self._record_transition(db, job_id, current, to_state, now, reason)

    def _merge_info(self, db: sqlite3.Connection, job_id: str, info: Mapping[str, Any]) -> None:
        row = db.execute("SELECT info_json FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            raise UnknownJob(job_id)
        merged = dict(json.loads(row["info_json"]))
        for key, value in info.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        db.execute(
            "UPDATE jobs SET info_json = ? WHERE job_id = ?",
            (_dumps(merged, f"info of job {job_id}"), job_id),
        )

    def update_info(self, job_id: str, info: Mapping[str, Any]) -> JobRecord:
        """Merge `info` (JSON values) into the job's free-form facts; None deletes a key."""
        with self._tx() as db:
            self._merge_info(db, job_id, info)
            return self._row_in(db, job_id)

    # -- rows that no longer validate: managed by id, spec unread -----------------------------

    def cancel_invalid(self, job_id: str, reason: str) -> dict[str, Any]:
        """Cancel a job whose stored row no longer validates, by id alone: its spec is never
        parsed. The runner then stops its Ray Job from the info (`raw_info`). Returns the
        row's plain columns and info. IllegalTransition if it has already ended; a stored
        state that is itself invalid counts as not ended."""
        _check_reason(reason)
        with self._tx() as db:
            row = db.execute(
                "SELECT job_id, name, queue, priority_class, state, submitted_s, queued_s, "
                "num_preemptions, info_json FROM jobs WHERE job_id = ?",
                (job_id,),
            ).fetchone()
            if row is None:
                raise UnknownJob(job_id)
            try:
                current: JobState | None = JobState(row["state"])
            except ValueError:
                current = None
            if current in TERMINAL_STATES:
                raise IllegalTransition(f"job {job_id} is already {row['state']}; nothing to do")
            now = self._clock()
            db.execute(
                "UPDATE jobs SET state = ?, updated_s = ? WHERE job_id = ?",
                (JobState.CANCELLED.value, now, job_id),
            )
            self._record_transition(db, job_id, current, JobState.CANCELLED, now, reason)
            columns = ("job_id", "name", "queue", "priority_class", "submitted_s", "queued_s")
            out: dict[str, Any] = {k: row[k] for k in (*columns, "num_preemptions")}
            out.update(state=JobState.CANCELLED.value, updated_s=now)
            out["info"] = _plain_info(row["info_json"])
            return out

    def raw_info(self, job_id: str) -> dict[str, Any]:
        """A job's info without validating its row ({} when the info itself is unreadable)."""
        rows = self._read("SELECT info_json FROM jobs WHERE job_id = ?", (job_id,))
        if not rows:
            raise UnknownJob(job_id)
        return _plain_info(rows[0]["info_json"])

    def merge_raw_info(self, job_id: str, info: Mapping[str, Any]) -> None:
        """`update_info` for a row that may no longer validate (nothing is parsed back)."""
        with self._tx() as db:
            self._merge_info(db, job_id, info)

    def prune_jobs(self, before_s: float, limit: int = 1000) -> list[str]:
        """Delete up to `limit` finished jobs last changed before `before_s`, oldest first,
        with their history and events; never one whose Ray Job may still run. Returns their
        ids (so the caller can forget them elsewhere)."""
        terminal = sorted(s.value for s in TERMINAL_STATES)
        with self._tx() as db:
            ids = [
                str(r["job_id"])
                for r in db.execute(
                    f"SELECT job_id FROM jobs WHERE state IN ({', '.join('?' for _ in terminal)}) "
                    f"AND updated_s < ? AND NOT ({_UNSETTLED}) ORDER BY updated_s LIMIT ?",
                    (*terminal, before_s, int(limit)),
                )
            ]
            for i in range(0, len(ids), 500):  # SQLite's bound-parameter limit
                chunk = ids[i : i + 500]
                marks = ", ".join("?" for _ in chunk)
                db.execute(f"DELETE FROM transitions WHERE job_id IN ({marks})", chunk)
                db.execute(f"DELETE FROM events WHERE job_id IN ({marks})", chunk)
                db.execute(f"DELETE FROM attempt_notes WHERE job_id IN ({marks})", chunk)
                db.execute(f"DELETE FROM jobs WHERE job_id IN ({marks})", chunk)
            self._reported_invalid.difference_update(ids)
            return ids

    def history(self, job_id: str) -> list[Transition]:
        """Every state the job went through, oldest first."""
        rows = self._read(
            "SELECT seq, job_id, from_state, to_state, at_s, reason FROM transitions "
            "WHERE job_id = ? ORDER BY seq",
            (job_id,),
        )
        if not rows:
            self.get(job_id)  # raises UnknownJob
        return [
            Transition(
                seq=r["seq"],
                job_id=r["job_id"],
                from_state=None if r["from_state"] is None else JobState(r["from_state"]),
                to_state=JobState(r["to_state"]),
                at_s=r["at_s"],
                reason=r["reason"],
            )
            for r in rows
        ]

    def _record_transition(
        self,
        db: sqlite3.Connection,
        job_id: str,
        from_state: JobState | None,
        to_state: JobState,
        at_s: float,
        reason: str,
    ) -> None:
        db.execute(
            "INSERT INTO transitions (job_id, from_state, to_state, at_s, reason) "
            "VALUES (?, ?, ?, ?, ?)",
            (
                job_id,
                None if from_state is None else from_state.value,
                to_state.value,
                at_s,
                reason,
            ),
        )
        arrow = to_state.value if from_state is None else f"{from_state.value} -> {to_state.value}"
        self._insert_event(
            db,
            at_s,
            "job.state",
            f"job {job_id}: {arrow}: {reason}",
            job_id,
            {"from": None if from_state is None else from_state.value, "to": to_state.value},
        )

    # -- attempt notes: what the control plane adds to an attempt's log ----------------------

    def put_attempt_note(self, job_id: str, attempt: int, text: str) -> None:
        """Keep `text` with `attempt` of `job_id` (replacing an earlier note of that attempt),
        e.g. the workers' stacks of a hung gang, which its log shows after the attempt's own
        lines. Deleted with the job (`prune_jobs`). The caller bounds the size."""
        with self._tx() as db:
            if db.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job_id,)).fetchone() is None:
                raise UnknownJob(job_id)
            db.execute(
                "INSERT INTO attempt_notes (job_id, attempt, text, at_s) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (job_id, attempt) DO UPDATE SET text = excluded.text, "
                "at_s = excluded.at_s",
                (job_id, int(attempt), text, self._clock()),
            )

    def attempt_note(self, job_id: str, attempt: int) -> str | None:
        """The note kept with one attempt, or None."""
        rows = self._read(
            "SELECT text FROM attempt_notes WHERE job_id = ? AND attempt = ?",
            (job_id, int(attempt)),
        )
        return str(rows[0]["text"]) if rows else None

    # -- events ----------------------------------------------------------------------------

    def record_event(
        self,
        kind: str,
        message: str,
        *,
        job_id: str | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> Event:
        """Append an event (e.g. a plan action and its reason). `kind` is dotted: ``policy.admit``."""
        if not kind:
            raise ValueError("kind: must be a non-empty string such as 'policy.admit'")
        with self._tx() as db:
            seq = self._insert_event(db, self._clock(), kind, message, job_id, data or {})
            row = db.execute("SELECT * FROM events WHERE seq = ?", (seq,)).fetchone()
            return _event(row)

    def _insert_event(
        self,
        db: sqlite3.Connection,
        at_s: float,
        kind: str,
        message: str,
        job_id: str | None,
        data: Mapping[str, Any],
    ) -> int:
        cur = db.execute(
            "INSERT INTO events (at_s, kind, job_id, message, data_json) VALUES (?, ?, ?, ?, ?)",
            (at_s, kind, job_id, message, _dumps(dict(data), f"data of event {kind!r}")),
        )
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    def events(
        self,
        *,
        after_seq: int = 0,
        job_id: str | None = None,
        kind_prefix: str | None = None,
        limit: int | None = None,
    ) -> list[Event]:
        """Events with ``seq > after_seq``, oldest first (pass the last seq seen to follow)."""
        sql = "SELECT * FROM events WHERE seq > ?"
        params: list[Any] = [after_seq]
        if job_id is not None:
            sql += " AND job_id = ?"
            params.append(job_id)
        if kind_prefix is not None:
            sql += " AND kind LIKE ? ESCAPE '\\'"
            escaped = kind_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            params.append(escaped + "%")
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        return [_event(r) for r in self._read(sql, params)]

    def prune_events(self, before_s: float, limit: int | None = None) -> int:
        """Delete events older than `before_s`, oldest first, at most `limit` of them (job
        histories are kept). Returns how many."""
        with self._tx() as db:
            if limit is None:
                return int(db.execute("DELETE FROM events WHERE at_s < ?", (before_s,)).rowcount)
            return int(
                db.execute(
                    "DELETE FROM events WHERE seq IN "
                    "(SELECT seq FROM events WHERE at_s < ? ORDER BY seq LIMIT ?)",
                    (before_s, int(limit)),
                ).rowcount
            )

    # -- key-value: desired state and policy state -------------------------------------------

    def put(self, key: str, value: Any) -> None:
        """Store a JSON-serialisable value under `key` (replacing any previous one)."""
        encoded = _dumps(value, f"value for key {key!r}")
        with self._tx() as db:
            db.execute(
                "INSERT INTO kv (key, value_json, updated_s) VALUES (?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value_json = excluded.value_json, "
                "updated_s = excluded.updated_s",
                (key, encoded, self._clock()),
            )

    def get_value(self, key: str, default: Any = None) -> Any:
        rows = self._read("SELECT value_json FROM kv WHERE key = ?", (key,))
        return default if not rows else json.loads(rows[0]["value_json"])

    def delete(self, key: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM kv WHERE key = ?", (key,)).rowcount > 0

    def keys(self, prefix: str = "") -> list[str]:
        rows = self._read("SELECT key FROM kv ORDER BY key")
        return [r["key"] for r in rows if str(r["key"]).startswith(prefix)]


def _check_reason(reason: str) -> None:
    if not reason or not reason.strip():
        raise ValueError("reason: every transition needs a reason for the event log")


def _is_corruption(exc: sqlite3.DatabaseError) -> bool:
    """SQLITE_CORRUPT / SQLITE_NOTADB (not busy, locked, full or a constraint)."""
    name = str(getattr(exc, "sqlite_errorname", ""))
    if name:
        return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))
    text = str(exc)
    return "malformed" in text or "not a database" in text


def _describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 500 else text[:497] + "..."


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: must be JSON-serialisable ({exc})") from exc


def _plain_info(text: Any) -> dict[str, Any]:
    try:
        info = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return dict(info) if isinstance(info, dict) else {}


def _job(row: sqlite3.Row) -> JobRecord:
    return JobRecord(
        job_id=row["job_id"],
        spec=JobSpec.from_dict(json.loads(row["spec_json"])),
        state=JobState(row["state"]),
        submitted_s=row["submitted_s"],
        queued_s=row["queued_s"],
        updated_s=row["updated_s"],
        num_preemptions=row["num_preemptions"],
        idempotency_key=row["idempotency_key"],
        info=json.loads(row["info_json"]),
    )


def _event(row: sqlite3.Row) -> Event:
    return Event(
        seq=row["seq"],
        at_s=row["at_s"],
        kind=row["kind"],
        message=row["message"],
        job_id=row["job_id"],
        data=json.loads(row["data_json"]),
    )
