"""Attempt notes: text the control plane adds to one attempt's log (a hung gang's stacks).

Owns: `AttemptNotes`: `put_attempt_note` and `attempt_note`. Notes are deleted with their
job (`controlplane.store.retention`).

Must not: bound the note's size (the caller does).
"""

from __future__ import annotations

from controlplane.store.database import Database
from controlplane.store.errors import UnknownJob

__all__ = ["AttemptNotes"]


class AttemptNotes(Database):
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
