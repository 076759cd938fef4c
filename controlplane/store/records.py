"""What the store hands back: frozen records of jobs, transitions and events.

Owns: `JobRecord`, `JobScan` (a listing with the rows it skipped, `InvalidRow`, and its page
cursor), `SubmitResult`, `Transition`, `Event` and `UserRecord`.

Must not: touch the database or parse rows (the tables' modules do).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from controlplane.store.states import JobState
from jobs.spec import JobSpec

__all__ = [
    "Event",
    "InvalidRow",
    "JobRecord",
    "JobScan",
    "SubmitResult",
    "Transition",
    "UserRecord",
]


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
    owner: str | None = None
    """The name of the user who submitted it; None for a job from before users (schema
    version 1) or one submitted straight to the store."""
    owner_id: str | None = None
    """That user's id (`UserRecord.user_id`): what ownership compares, so a name removed and
    added again does not own the old user's jobs. None where `owner` is, and for a job whose
    named owner was gone when version 3 first opened the store."""


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


@dataclass(frozen=True)
class UserRecord:
    """A user of the API. The token itself is never stored: only its hash, never shown."""

    name: str
    role: str
    """``researcher``, ``operator`` or ``admin`` (`controlplane.api.access.Role`)."""
    queues: tuple[str, ...]
    """The queues the user may submit to; ``*`` is every queue."""
    created_s: float
    rotated_s: float
    """When the current token was issued (equal to created_s until a rotation)."""
    expires_s: float | None = None
    """When the current token stops working; None: never."""
    token_hash: str = field(default="", repr=False)
    user_id: str = ""
    """Stable and never reused (``u-`` and 16 hex digits): jobs are owned by it, not by the
    name, which may be removed and given to someone else."""
