"""A job's states and the transitions allowed between them.

Owns: `JobState`, which states are terminal and which active, and `ALLOWED_TRANSITIONS`
(the one table `controlplane.store.transitions` checks every state change against),
and that every change carries a reason for the event log (`check_reason`).

Must not: touch the database, or decide when a job should move (the runner and the loop do).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

__all__ = [
    "ACTIVE_STATES",
    "ALLOWED_TRANSITIONS",
    "TERMINAL_STATES",
    "JobState",
    "check_reason",
]


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

_STOPS = frozenset({JobState.FAILED, JobState.CANCELLED})
"""Every state that is not final may fail or be cancelled."""

ALLOWED_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    JobState.QUEUED: _STOPS | {JobState.ADMITTED},
    # ADMITTED -> QUEUED: the gang did not fully start in time; released and re-queued.
    JobState.ADMITTED: _STOPS | {JobState.RUNNING, JobState.QUEUED, JobState.PREEMPTED},
    # RUNNING -> QUEUED: the gang crashed, hung or was lost; it runs again as a new attempt.
    JobState.RUNNING: _STOPS | {JobState.SUCCEEDED, JobState.PREEMPTED, JobState.QUEUED},
    JobState.PREEMPTED: _STOPS | {JobState.QUEUED},
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


def check_reason(reason: str) -> None:
    if not reason or not reason.strip():
        raise ValueError("reason: every transition needs a reason for the event log")
