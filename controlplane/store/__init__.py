"""The control plane's durable memory: jobs, their state history, events, and policy state.

Owns: one SQLite database in WAL mode at a path the caller passes in (``state_dir/store.db``
by default), its schema, and the rules of a job's life:

- states QUEUED, ADMITTED, RUNNING, SUCCEEDED, FAILED, PREEMPTED, CANCELLED, and which
  transitions between them are allowed (`ALLOWED_TRANSITIONS`); every transition is recorded
  with its time and reason, and emits an event;
- idempotent submission: a client-supplied idempotency key makes a retried submit return the
  job it already created instead of a second one (keys are per owner);
- attempt notes: text the control plane adds to one attempt's log (a hung gang's stacks);
- the API's users: a stable id, role, the queues each may submit to, the SHA-256 of their
  token (never the token), and which job each submitted (``owner``, ``owner_id``); at least
  one admin who can sign in, and the break-glass recovery when none can (`recover_admin`);
- an event log (what ``rcp events`` shows) and a key-value table for the policy actor's
  desired state and policy state (JSON values);
- which jobs are *active*: QUEUED, ADMITTED, RUNNING, PREEMPTED, and finished jobs whose Ray
  Job may still run (a ``submission_id`` in their info and no ``ray_done``). Reads of active
  jobs go through indexes (``jobs_by_state`` and the partial ``jobs_unsettled``) and never
  parse a finished job; `prune_jobs` and `prune_events` delete what retention no longer keeps;
- rows that no longer validate (a spec older validation accepted): every read skips them,
  logs them and records a ``job.invalid`` event once, and `scan_jobs` lists them, so one bad
  row is never fatal to a tick or a listing; `get` raises `InvalidJob`;
- a file that is not a readable SQLite database raises `CorruptStore`, naming the file and
  what to do (see docs/operations.md, "The job store").

Every write is one transaction, committed with ``synchronous=FULL``: once a call returns, a
crash or restart of the control plane neither loses it nor applies it twice. The store is safe
to share between threads (one connection behind a lock) and between processes on one machine
(SQLite's locking, with a busy timeout).

Must not: talk to Ray, decide anything, or read the wall clock directly: time comes from the
injectable `clock` (``time.time`` unless a test passes another).

`Store` below is all of its tables on one connection; every name here is importable from
``controlplane.store`` (each from the module its import names).

Beside `Store`, not part of it, pure over its records and config: `reliability` (the
fleet's MTBF), `pruning` (when the controller prunes, how much at once), `job_info` (what
the runner writes in a job's info: reason codes, attempt-end kinds, and the typed readers of
it).
"""

from __future__ import annotations

from controlplane.store.errors import (
    CheckpointClaimConflict,
    CorruptStore,
    IdempotencyConflict,
    IllegalTransition,
    InvalidJob,
    LastAdmin,
    StaleState,
    StoreError,
    UnknownJob,
    UnknownUser,
    UserExists,
)
from controlplane.store.events import EventLog
from controlplane.store.notes import AttemptNotes
from controlplane.store.records import (
    Event,
    InvalidRow,
    JobRecord,
    JobScan,
    SubmitResult,
    Transition,
    UserRecord,
)
from controlplane.store.retention import Retention
from controlplane.store.schema import SCHEMA_VERSION
from controlplane.store.states import (
    ACTIVE_STATES,
    ALLOWED_TRANSITIONS,
    TERMINAL_STATES,
    JobState,
)
from controlplane.store.transitions import Lifecycle
from controlplane.store.users import ADMIN_ROLE, RECOVER_ADMIN_EVENT, UserTable
from controlplane.store.values import Values

__all__ = [
    "ACTIVE_STATES",
    "ADMIN_ROLE",
    "ALLOWED_TRANSITIONS",
    "RECOVER_ADMIN_EVENT",
    "SCHEMA_VERSION",
    "TERMINAL_STATES",
    "CheckpointClaimConflict",
    "CorruptStore",
    "Event",
    "IdempotencyConflict",
    "IllegalTransition",
    "InvalidJob",
    "InvalidRow",
    "JobRecord",
    "JobScan",
    "JobState",
    "LastAdmin",
    "StaleState",
    "Store",
    "StoreError",
    "SubmitResult",
    "Transition",
    "UnknownJob",
    "UnknownUser",
    "UserExists",
    "UserRecord",
]


class Store(Lifecycle, EventLog, AttemptNotes, Values, Retention, UserTable):
    """The durable store. Open one per process; share it between threads freely."""
