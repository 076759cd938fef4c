"""The store's errors; each message says what to do.

Owns: `StoreError` and its kinds (an unknown job, an illegal or stale transition, a reused
idempotency key, a corrupt file, a row that no longer validates; a user change that would
break the users table: an unknown or duplicate user, removing or demoting the last admin).

Must not: touch the database.
"""

from __future__ import annotations

__all__ = [
    "CorruptStore",
    "CheckpointClaimConflict",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidJob",
    "LastAdmin",
    "StaleState",
    "StoreError",
    "UnknownJob",
    "UnknownUser",
    "UserExists",
]


class StoreError(Exception):
    """Base of the store's errors; each message says what to do."""


class UnknownJob(StoreError, KeyError):
    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id

    def __str__(self) -> str:
        return f"no job with id {self.job_id!r} (see `rcp queue` or `rcp status` for known ids)"


class IllegalTransition(StoreError, ValueError):
    """The transition is not in `ALLOWED_TRANSITIONS`."""


class StaleState(StoreError, ValueError):
    """The job is no longer in the state the caller expected (someone else moved it)."""


class IdempotencyConflict(StoreError, ValueError):
    """The idempotency key was already used for a different spec."""


class CheckpointClaimConflict(StoreError, ValueError):
    """The job's explicit ``checkpoint.uri`` overlaps one another user's job named first: an
    explicit checkpoint prefix belongs to the user whose job named it first."""


class CorruptStore(StoreError):
    """The database file is not a readable SQLite database (garbage, truncated, malformed)."""


class InvalidJob(StoreError, ValueError):
    """A stored job row that no longer validates (its spec, state or info)."""

    def __init__(self, job_id: str, error: str) -> None:
        super().__init__(job_id, error)
        self.job_id = job_id
        self.error = error

    def __str__(self) -> str:
        return (
            f"job {self.job_id}: its stored row no longer validates ({self.error}); the "
            "controller skips it (see docs/operations.md, 'The job store')"
        )


class UnknownUser(StoreError, KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"no user named {self.name!r}; `rcp users list` shows them"


class UserExists(StoreError, ValueError):
    """A user by that name exists already."""


class LastAdmin(StoreError, ValueError):
    """The change would leave no admin: nobody could manage users any more."""
