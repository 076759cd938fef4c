"""One SQLite connection in WAL mode and its transactions: the base every table builds on.

Owns: opening the file (0600, quick_check, WAL, ``synchronous=FULL``, the schema, its
version and the migrations of an older file: columns, the jobs table's rebuild, backfills),
the one lock that makes the connection safe to share between threads, write
transactions (`_tx`, taken ``BEGIN IMMEDIATE``) and reads (`_read`), turning a corrupt file's
errors into `CorruptStore` with what to do, and the two writes every table shares: an event
(`_insert_event`) and a job's history entry with its ``job.state`` event
(`_record_transition`).

Must not: know the rules of a job's life (`controlplane.store.transitions`) or read the wall
clock directly (time comes from the injectable `clock`).
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

from controlplane.statefiles import create_private, narrow_private
from controlplane.store.errors import CorruptStore, StoreError
from controlplane.store.schema import (
    BACKFILLS,
    JOBS_COLUMNS_ALL,
    JOBS_TABLE,
    MIGRATED_INDEXES,
    MIGRATIONS,
    SCHEMA,
    SCHEMA_VERSION,
    dumps,
    is_corruption,
)
from controlplane.store.states import JobState

__all__ = ["Database"]


def _new_job_id() -> str:
    return f"job-{uuid.uuid4().hex[:12]}"


def _run(db: sqlite3.Connection, script: str) -> None:
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def _rebuild_jobs(db: sqlite3.Connection) -> None:
    """Copy the jobs table into one without a UNIQUE constraint on ``idempotency_key`` alone
    (versions 1 and 2 had one: a key was global across users), when it has that constraint.
    SQLite cannot drop a column constraint, so this is its documented rebuild: new table,
    copy, drop, rename; the caller recreates the indexes and checks foreign keys."""
    unique_key = False
    for index in db.execute("PRAGMA index_list(jobs)").fetchall():
        if index["unique"] and index["origin"] == "u":
            columns = [r["name"] for r in db.execute(f"PRAGMA index_info({index['name']!r})")]
            unique_key = unique_key or columns == ["idempotency_key"]
    if not unique_key:
        return
    db.execute(JOBS_TABLE.format(name="jobs_rebuilt"))
    db.execute(f"INSERT INTO jobs_rebuilt ({JOBS_COLUMNS_ALL}) SELECT {JOBS_COLUMNS_ALL} FROM jobs")
    db.execute("DROP TABLE jobs")
    db.execute("ALTER TABLE jobs_rebuilt RENAME TO jobs")
    _run(db, SCHEMA)  # the jobs indexes went with the old table


class Database:
    """The connection and its transactions; the tables' classes add the operations."""

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
            if is_corruption(exc):
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
                raise self._corrupt("; ".join(problems))
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"the job store at {str(self.path)!r} could not switch to WAL mode "
                    f"(got {mode!r}); put state_dir on a local file system"
                )
            self._db.execute("PRAGMA synchronous=FULL")
            version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"the job store at {str(self.path)!r} has schema version {version}, newer "
                    f"than this control plane's {SCHEMA_VERSION}; upgrade the control plane"
                )
            # Foreign keys stay off until the schema is settled: rebuilding the jobs table
            # (`_rebuild_jobs`) drops the table transitions refer to, SQLite's own procedure.
            self._db.execute("PRAGMA foreign_keys=OFF")
            with self._tx():
                _run(self._db, SCHEMA)
                for table, column, statement in MIGRATIONS:
                    columns = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
                    if column not in columns:
                        self._db.execute(statement)
                if version < 3:
                    _rebuild_jobs(self._db)
                    for statement in BACKFILLS:
                        self._db.execute(statement)
                _run(self._db, MIGRATED_INDEXES)
                broken = self._db.execute("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise StoreError(
                        f"the job store at {str(self.path)!r}: {len(broken)} rows refer to "
                        "rows that do not exist (first: table "
                        f"{broken[0][0]!r}); restore a backup (docs/operations.md, 'The job "
                        "store')"
                    )
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self._db.execute("PRAGMA foreign_keys=ON")

    # -- plumbing --------------------------------------------------------------------------

    def _corrupt(self, detail: object) -> CorruptStore:
        """`CorruptStore` naming the file, what is wrong and what to do."""
        p = str(self.path)
        return CorruptStore(
            f"the job store at {p!r} is not a readable SQLite database ({detail}). Stop the "
            f"controller, move the file aside with its -wal and -shm files (mv {p} "
            f"{p}.corrupt), then either restore a backup to {p} or start again for an empty "
            "store (running jobs' Ray Jobs are then unknown to it: stop them with `ray job "
            "stop`); see docs/operations.md, 'The job store'"
        )

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
                if is_corruption(exc):
                    raise self._corrupt(exc) from exc
                raise

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            try:
                return list(self._db.execute(sql, tuple(params)).fetchall())
            except sqlite3.DatabaseError as exc:
                if is_corruption(exc):
                    raise self._corrupt(exc) from exc
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def journal_mode(self) -> str:
        return str(self._read("PRAGMA journal_mode")[0][0]).lower()

    # -- writes every table shares: a history entry and an event ----------------------------

    def _record_transition(
        self,
        db: sqlite3.Connection,
        job_id: str,
        from_state: JobState | None,
        to_state: JobState,
        at_s: float,
        reason: str,
    ) -> None:
        before, after = (None if from_state is None else from_state.value), to_state.value
        db.execute(
            "INSERT INTO transitions (job_id, from_state, to_state, at_s, reason) "
            "VALUES (?, ?, ?, ?, ?)",
            (job_id, before, after, at_s, reason),
        )
        arrow = after if before is None else f"{before} -> {after}"
        message = f"job {job_id}: {arrow}: {reason}"
        self._insert_event(db, at_s, "job.state", message, job_id, {"from": before, "to": after})

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
            (at_s, kind, job_id, message, dumps(dict(data), f"data of event {kind!r}")),
        )
        assert cur.lastrowid is not None
        return int(cur.lastrowid)
