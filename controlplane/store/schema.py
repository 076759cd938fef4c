"""The database's tables and indexes, their version, and the JSON in its columns.

Owns: `SCHEMA` (created on open, idempotently), `SCHEMA_VERSION` and what opening an older
file changes (`MIGRATIONS`, `MIGRATED_INDEXES`, `JOBS_TABLE` to rebuild the jobs table, the
`BACKFILLS` of version 3); `UNSETTLED`, the one
WHERE term of jobs whose Ray Job may still run (the partial index and its queries share it);
`JOB_COLUMNS`; encoding values as JSON (`dumps`) and reading info back without trusting it
(`plain_info`); telling a corrupt file from other SQLite errors (`is_corruption`).

Must not: open a connection or run a query.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

__all__ = [
    "BACKFILLS",
    "JOBS_COLUMNS_ALL",
    "JOBS_TABLE",
    "JOB_COLUMNS",
    "MIGRATED_INDEXES",
    "MIGRATIONS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "UNSETTLED",
    "dumps",
    "is_corruption",
    "plain_info",
]


SCHEMA_VERSION = 3
"""2: users, retired_tokens, jobs.owner (`MIGRATIONS` adds the column to a version-1 file).
3: users.user_id and jobs.owner_id (a job belongs to the user, not to the name: a name removed
and added again is a new user), idempotency keys unique per owner rather than globally (the
jobs table is rebuilt without its old UNIQUE column constraint, `JOBS_TABLE`)."""

JOBS_TABLE = """
CREATE TABLE IF NOT EXISTS {name} (
    job_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    spec_json TEXT NOT NULL,
    queue TEXT NOT NULL,
    priority_class TEXT NOT NULL,
    state TEXT NOT NULL,
    idempotency_key TEXT,
    submitted_s REAL NOT NULL,
    queued_s REAL NOT NULL,
    updated_s REAL NOT NULL,
    num_preemptions INTEGER NOT NULL DEFAULT 0,
    info_json TEXT NOT NULL DEFAULT '{{}}',
    owner TEXT,
    owner_id TEXT
)"""
"""The jobs table under a name: ``jobs``, or the copy a version-2 file is rebuilt into.
``owner`` is the submitter's name as it was (shown), ``owner_id`` their `users.user_id`
(what ownership and idempotency compare); both NULL for a job from before users."""
JOBS_COLUMNS_ALL = (
    "job_id, name, spec_json, queue, priority_class, state, idempotency_key, submitted_s, "
    "queued_s, updated_s, num_preemptions, info_json, owner, owner_id"
)

SCHEMA = (
    JOBS_TABLE.format(name="jobs")
    + """;
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
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY,
    user_id TEXT,
    role TEXT NOT NULL,
    queues_json TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_s REAL NOT NULL,
    rotated_s REAL NOT NULL,
    expires_s REAL
);
CREATE TABLE IF NOT EXISTS retired_tokens (
    token_hash TEXT PRIMARY KEY,
    why TEXT NOT NULL,
    at_s REAL NOT NULL
);
"""
)

MIGRATIONS: tuple[tuple[str, str, str], ...] = (
    ("jobs", "owner", "ALTER TABLE jobs ADD COLUMN owner TEXT"),
    ("jobs", "owner_id", "ALTER TABLE jobs ADD COLUMN owner_id TEXT"),
    ("users", "user_id", "ALTER TABLE users ADD COLUMN user_id TEXT"),
)
"""(table, column, statement): run on open when the table lacks the column (a file an older
version wrote). A job from before users has no owner (NULL): only operators and admins may
cancel it."""

MIGRATED_INDEXES = """
CREATE UNIQUE INDEX IF NOT EXISTS users_by_id ON users (user_id);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_by_owner_key
    ON jobs (IFNULL(owner_id, ''), idempotency_key) WHERE idempotency_key IS NOT NULL;
"""
"""Indexes on columns `MIGRATIONS` may have just added: created after them. An idempotency
key is unique per owner (``''`` for jobs submitted with none)."""

BACKFILLS = (
    "UPDATE users SET user_id = 'u-' || lower(hex(randomblob(8))) WHERE user_id IS NULL",
    # A job is its named owner's only if that user existed when it was submitted: a job of a
    # removed user whose name was added again stays with nobody (operators cancel it).
    "UPDATE jobs SET owner_id = (SELECT u.user_id FROM users u WHERE u.name = jobs.owner "
    "AND u.created_s <= jobs.submitted_s) WHERE owner_id IS NULL AND owner IS NOT NULL",
)
"""Run once, when a file older than version 3 is opened: a user id for every user, and each
job's owner id where its owner's name still names the user who submitted it."""

UNSETTLED = (
    "json_extract(info_json, '$.submission_id') IS NOT NULL "
    "AND json_extract(info_json, '$.ray_done') IS NULL"
)
"""A job whose Ray Job may still run: it was submitted and the runner has not seen it end.
The partial index ``jobs_unsettled`` holds exactly these rows (SQLite uses a partial index
only for a query that repeats its WHERE term, so both use this one string)."""
SCHEMA = SCHEMA.replace("{unsettled}", UNSETTLED)

JOB_COLUMNS = (
    "job_id, spec_json, state, submitted_s, queued_s, updated_s, num_preemptions, "
    "idempotency_key, info_json, owner, owner_id"
)


def is_corruption(exc: sqlite3.DatabaseError) -> bool:
    """SQLITE_CORRUPT / SQLITE_NOTADB (not busy, locked, full or a constraint)."""
    name = str(getattr(exc, "sqlite_errorname", ""))
    if name:
        return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))
    text = str(exc)
    return "malformed" in text or "not a database" in text


def dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: must be JSON-serialisable ({exc})") from exc


def plain_info(text: Any) -> dict[str, Any]:
    try:
        info = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return dict(info) if isinstance(info, dict) else {}
