"""Job rows: submission (idempotent), reads, listings and pages, and the info merge.

Owns: `JobTable`: `submit`, `get`, `list_jobs` and `scan_jobs` (active reads through the
indexes, never parsing a finished job; paging by `JobScan.next_after`), `update_info`; rows
that no longer validate: every read skips them, logs them and records a ``job.invalid``
event once, and `cancel_invalid`, `owner_of`, `raw_info` and `merge_raw_info` manage them by
id without parsing their spec. Ownership (and an idempotency key) follows ``owner_id``, not
the name (`JobRecord.owner_id`).

Must not: change a job's state except through `cancel_invalid` (the rest is
`controlplane.store.transitions`).
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from controlplane.store.database import Database
from controlplane.store.errors import (
    CheckpointClaimConflict,
    IdempotencyConflict,
    IllegalTransition,
    InvalidJob,
    StoreError,
    UnknownJob,
)
from controlplane.store.records import InvalidRow, JobRecord, JobScan, SubmitResult
from controlplane.store.schema import (
    JOB_COLUMNS,
    UNSETTLED,
    dumps,
    plain_info,
)
from controlplane.store.states import TERMINAL_STATES, JobState, check_reason
from jobs.spec import JobSpec
from jobs.storage_uri import StorageUriError, parse_storage_uri

__all__ = ["JobTable"]

log = logging.getLogger(__name__)


class JobTable(Database):
    def submit(
        self,
        spec: JobSpec,
        *,
        idempotency_key: str | None = None,
        reason: str = "submitted",
        owner: str | None = None,
        owner_id: str | None = None,
    ) -> SubmitResult:
        """Queue a new job owned by user `owner` (their name) with id `owner_id` (both or
        neither), or return the one this owner already created with this idempotency key.

        Keys are the owner's own: another user's job under the same key is not seen, and a
        new job is made. Raises IdempotencyConflict if the owner used the key for a different
        spec.
        """
        if idempotency_key is not None and not idempotency_key.strip():
            raise ValueError("idempotency_key: must be a non-empty string or None")
        if (owner is None) != (owner_id is None):
            raise ValueError("owner and owner_id: give both (a user's name and id) or neither")
        spec_json = json.dumps(spec.to_dict(), sort_keys=True, allow_nan=False)
        with self._tx() as db:
            if idempotency_key is not None:
                row = db.execute(
                    f"SELECT {JOB_COLUMNS} FROM jobs WHERE IFNULL(owner_id, '') = ? "
                    "AND idempotency_key = ?",
                    (owner_id or "", idempotency_key),
                ).fetchone()
                if row is not None:
                    if row["spec_json"] != spec_json:
                        raise IdempotencyConflict(
                            f"idempotency key {idempotency_key!r} was already used for job "
                            f"{row['job_id']} with a different spec; use a new key for a new "
                            "job"
                        )
                    return SubmitResult(_job(row), created=False)
            if spec.checkpoint.uri and owner_id is not None:
                _check_checkpoint_claim(db, spec.checkpoint.uri, owner_id)
            now = self._clock()
            job_id = self._new_job_id()
            db.execute(
                "INSERT INTO jobs (job_id, name, spec_json, queue, priority_class, state, "
                "idempotency_key, submitted_s, queued_s, updated_s, owner, owner_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    owner,
                    owner_id,
                ),
            )
            self._record_transition(db, job_id, None, JobState.QUEUED, now, reason)
            return SubmitResult(self._row_in(db, job_id), created=True)

    def get(self, job_id: str) -> JobRecord:
        """The job; InvalidJob if its row no longer validates (reported, as every read does)."""
        rows = self._read(f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,))
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
        sql = f"SELECT {JOB_COLUMNS} FROM jobs"
        where: list[str] = []
        params: list[Any] = []
        if states is not None:
            wanted = [JobState(s).value for s in states]
            if not wanted:
                return JobScan([], [])
            where.append(f"state IN ({', '.join('?' for _ in wanted)})")
            params += wanted
        if unsettled_only:
            where.append(UNSETTLED)
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

    def _row_in(self, db: sqlite3.Connection, job_id: str) -> JobRecord:
        row = db.execute(f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return _job(row)

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
            (dumps(merged, f"info of job {job_id}"), job_id),
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
        check_reason(reason)
        with self._tx() as db:
            row = db.execute(
                "SELECT job_id, name, queue, priority_class, state, submitted_s, queued_s, "
                "num_preemptions, info_json, owner FROM jobs WHERE job_id = ?",
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
            out: dict[str, Any] = {k: row[k] for k in (*columns, "num_preemptions", "owner")}
            out.update(state=JobState.CANCELLED.value, updated_s=now)
            out["info"] = plain_info(row["info_json"])
            return out

    def owner_of(self, job_id: str) -> tuple[str | None, str | None]:
        """Who submitted the job, without validating its row: (their name, their user id).
        (None, None): from before users; (name, None): a user removed before version 3 whose
        name now belongs to someone else, or no longer exists."""
        rows = self._read("SELECT owner, owner_id FROM jobs WHERE job_id = ?", (job_id,))
        if not rows:
            raise UnknownJob(job_id)
        owner, owner_id = rows[0]["owner"], rows[0]["owner_id"]
        return (None if owner is None else str(owner)), (
            None if owner_id is None else str(owner_id)
        )

    def raw_info(self, job_id: str) -> dict[str, Any]:
        """A job's info without validating its row ({} when the info itself is unreadable)."""
        rows = self._read("SELECT info_json FROM jobs WHERE job_id = ?", (job_id,))
        if not rows:
            raise UnknownJob(job_id)
        return plain_info(rows[0]["info_json"])

    def merge_raw_info(self, job_id: str, info: Mapping[str, Any]) -> None:
        """`update_info` for a row that may no longer validate (nothing is parsed back)."""
        with self._tx() as db:
            self._merge_info(db, job_id, info)


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
        owner=row["owner"],
        owner_id=row["owner_id"],
    )


def _describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 500 else text[:497] + "..."


def _check_checkpoint_claim(db: sqlite3.Connection, uri: str, owner_id: str) -> None:
    """Refuse an explicit ``checkpoint.uri`` that overlaps (is, lies in, or contains) one a job
    of another user named: the prefix belongs to the user whose job named it first, so two
    jobs share one only when one user submits both. Checked in the submission's transaction,
    so two users naming one prefix at once cannot both get it. Jobs of no user (submitted to
    the store directly, not through the API) neither claim nor are checked."""
    mine = parse_storage_uri(uri)
    rows = db.execute(
        "SELECT job_id, json_extract(spec_json, '$.checkpoint.uri') AS uri FROM jobs "
        "WHERE owner_id IS NOT NULL AND owner_id != ? "
        "AND json_extract(spec_json, '$.checkpoint.uri') IS NOT NULL",
        (owner_id,),
    )
    for row in rows:
        try:
            theirs = parse_storage_uri(row["uri"])
        except StorageUriError:
            continue  # stored before URIs were parsed; names nothing a job can open now
        if mine.overlaps(theirs):
            raise CheckpointClaimConflict(
                f"checkpoint.uri {mine} overlaps {theirs}, the checkpoint prefix of another "
                f"user's job ({row['job_id']}); a prefix belongs to the user whose job named it "
                "first: choose one of your own, or leave checkpoint.uri out for the job's own "
                "area"
            )
