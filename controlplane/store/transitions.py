"""A job's state changes and its history.

Owns: `Lifecycle`: `transition` (checked against `ALLOWED_TRANSITIONS`, optionally a
compare-and-set, atomic with its history entry, event and info merge), `requeue` (a gang back
to the queue through PREEMPTED in one transaction) and `history`.

Must not: decide when a job should move (the runner and the loop do).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from controlplane.store.errors import IllegalTransition, StaleState, UnknownJob
from controlplane.store.jobs import JobTable
from controlplane.store.records import JobRecord, Transition
from controlplane.store.states import ALLOWED_TRANSITIONS, JobState, check_reason

__all__ = ["Lifecycle"]


class Lifecycle(JobTable):
    """A job's state changes, each checked against `ALLOWED_TRANSITIONS`, and its history."""

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
        check_reason(reason)
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
        check_reason(preempted_reason)
        check_reason(queued_reason)
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
