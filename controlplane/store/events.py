"""The event log: what ``rcp events`` shows.

Owns: `EventLog`: `record_event` and `events` (following by seq, filtered by job, kind
prefix, or to one user's audit events). Job state changes add their own events (`Database._record_transition`); old events
are deleted by `controlplane.store.retention`.

Must not: interpret an event's kind or data.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any

from controlplane.store.database import Database
from controlplane.store.records import Event

__all__ = ["EventLog"]


class EventLog(Database):
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

    def events(
        self,
        *,
        after_seq: int = 0,
        job_id: str | None = None,
        kind_prefix: str | None = None,
        limit: int | None = None,
        only_audit_of: str | None = None,
    ) -> list[Event]:
        """Events with ``seq > after_seq``, oldest first (pass the last seq seen to follow).
        With `only_audit_of` (a user id), of the ``audit.*`` events only those whose
        ``data.user_id`` is that id; other kinds are all kept."""
        sql = "SELECT * FROM events WHERE seq > ?"
        params: list[Any] = [after_seq]
        if only_audit_of is not None:
            sql += " AND (kind NOT LIKE 'audit.%' OR json_extract(data_json, '$.user_id') = ?)"
            params.append(only_audit_of)
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


def _event(row: sqlite3.Row) -> Event:
    return Event(
        seq=row["seq"],
        at_s=row["at_s"],
        kind=row["kind"],
        message=row["message"],
        job_id=row["job_id"],
        data=json.loads(row["data_json"]),
    )
