"""Retention: deleting finished jobs and old events in bounded batches.

Owns: `Retention`: `prune_jobs` (finished jobs with their history, events and attempt notes,
never one whose Ray Job may still run) and `prune_events`.

Must not: decide what to keep or when to prune (``jobs.retention_days`` and the controller's
retention step do).
"""

from __future__ import annotations

from controlplane.store.database import Database
from controlplane.store.schema import UNSETTLED
from controlplane.store.states import TERMINAL_STATES

__all__ = ["Retention"]


class Retention(Database):
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
                    f"AND updated_s < ? AND NOT ({UNSETTLED}) ORDER BY updated_s LIMIT ?",
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
