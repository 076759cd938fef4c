"""What the signals actor returns and counts: the reports jobs send and why it refused a call.

Owns: the shapes of a job's status (`JobStatus`, `NotRegistered`), of what its workers and
rank 0 report (`WorkerReport`, `ProgressReport` with its `PROGRESS_KEYS`, `CheckpointReport`),
and the reasons a call is refused (`Rejection`).

Must not: import Ray or hold state (the actor in `jobs.signals.mailbox` keeps these).
"""

from __future__ import annotations

from enum import Enum
from typing import Literal, TypedDict

__all__ = [
    "MAX_REASON_CHARS",
    "PROGRESS_KEYS",
    "RESTORE_SOURCES",
    "CheckpointReport",
    "InPlaceReport",
    "JobStatus",
    "NotRegistered",
    "ProgressKey",
    "ProgressReport",
    "Rejection",
    "RestoreReport",
    "WorkerReport",
]

ProgressKey = Literal["stall_s", "wall_s", "saves", "committed_step"]
PROGRESS_KEYS: tuple[ProgressKey, ...] = ("stall_s", "wall_s", "saves", "committed_step")
"""What a job may report with its step (`_JobSignals.progress`), each a finite number >= 0:
the attempt's checkpoint stall and wall seconds so far, saves taken, the step it last saw
committed (a hint: the controller reads committed steps from storage)."""


class Rejection(str, Enum):
    """Why the signals actor refused a call (counted per reason in `status`)."""

    UNKNOWN_JOB = "unknown-job"
    STALE_ATTEMPT = "stale-attempt"
    BAD_TOKEN = "bad-token"
    PATH_OUTSIDE_PREFIX = "path-outside-prefix"
    BAD_ADMIN_KEY = "bad-admin-key"
    BAD_VALUE = "bad-value"
    REPLAYED_NONCE = "replayed-or-stale-nonce"


class WorkerReport(TypedDict, total=False):
    """A started worker's process, as far as it named it (`_JobSignals.worker_started`)."""

    pid: int
    node_id: str
    """Hex Ray node id."""


class _ProgressReportRequired(TypedDict):
    step: int
    at_s: float
    """When the actor took the report (its clock)."""
    step_at_s: float
    """When `step` last grew (the actor's clock): what the hang watchdog reads."""


class ProgressReport(_ProgressReportRequired, total=False):
    """The job's latest step report (`_JobSignals.progress`); the `PROGRESS_KEYS` it sent."""

    stall_s: float
    wall_s: float
    saves: float
    committed_step: float


class CheckpointReport(TypedDict):
    """The latest checkpoint a job reported (`_JobSignals.checkpointed`)."""

    attempt: int
    step: int
    path: str
    at_s: float
    answers_request: bool
    """Taken while a checkpoint-now request was pending."""


MAX_REASON_CHARS = 500
"""The longest restart-in-place reason the actor keeps."""
RESTORE_SOURCES = frozenset({"memory", "storage"})
"""Where a restore may say it read the checkpoint from (`_JobSignals.restored`)."""


class InPlaceReport(TypedDict):
    """A restart of the run's workers inside the run (`_JobSignals.restarting_in_place`)."""

    index: int
    at_s: float
    """When the actor took the report (its clock)."""
    reason: str
    step: int | None
    """The last step the failed workers reported (None: none)."""


class RestoreReport(TypedDict):
    """What rank 0 restored in this run (`_JobSignals.restored`)."""

    step: int
    source: str
    restore_s: float
    at_s: float


class JobStatus(TypedDict):
    """What `_JobSignals.status` returns for a registered job."""

    attempt: int
    checkpoint_prefix: str
    started_ranks: list[int]
    workers: dict[int, WorkerReport]
    progress: ProgressReport | None
    checkpoint: CheckpointReport | None
    requested_at_s: float | None
    rejected_calls: int
    credentials_expire_unix_s: float | None
    """When the storage credentials the actor holds for this attempt expire (None: none)."""
    in_place: list[InPlaceReport]
    """This attempt's restarts in place, oldest first."""
    restore: RestoreReport | None
    """What this run (since the last restart in place) restored, if anything."""


class NotRegistered(TypedDict):
    """`_JobSignals.status` of a job it does not hold: ``{}``."""
