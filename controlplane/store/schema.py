"""The database's tables and indexes, their version, and the JSON in its columns.

Owns: `SCHEMA` (created on open, idempotently) and `SCHEMA_VERSION`; `UNSETTLED`, the one
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
    "JOB_COLUMNS",
    "MIGRATIONS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "UNSETTLED",
    "dumps",
    "is_corruption",
    "plain_info",
]


SCHEMA_VERSION = 2
"""2: users, retired_tokens, jobs.owner (`MIGRATIONS` adds the column to a version-1 file)."""

SCHEMA = """
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
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY,
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

MIGRATIONS: tuple[tuple[str, str, str], ...] = (
    ("jobs", "owner", "ALTER TABLE jobs ADD COLUMN owner TEXT"),
)
"""(table, column, statement): run on open when the table lacks the column (a file an older
version wrote). A job from before users has no owner (NULL): only operators and admins may
cancel it."""

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
    "idempotency_key, info_json, owner"
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
