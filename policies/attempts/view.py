"""What `policies.attempts` reads and returns: a gang as observed, and the lifecycle plan's items.

Owns: the observed views (`GangView`, `EndedGang`, `JobsView`), the vocabulary the job's
history and info use (`GangStatus`, `Reason`, `AttemptEnd`), the start bounds
(`AttemptConfig`) and the plan's items (`MarkRunning`, `ResubmitGang`, `StopGang`,
`StopHungGang`, `EndJob`, `RequeueGang`, `SettleEnded`).

Must not: carry behaviour (data only; `policies.attempts` decides).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from policies.restarts import RestartLimits, RestartRecord


class GangStatus(str, Enum):
    """Ray's word on an attempt's Ray Job (the Ray Jobs adapter's statuses)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    MISSING = "MISSING"
    """No Ray Job with that submission id (never submitted, or the cluster forgot it)."""


ENDED = frozenset({GangStatus.STOPPED, GangStatus.SUCCEEDED, GangStatus.FAILED})


class Reason(str, Enum):
    """Codes that start the reasons written to a job's state history."""

    GANG_RUNNING = "gang-running"
    GANG_START_TIMEOUT = "gang-start-timeout"
    START_FAILED = "start-failed"
    SUBMIT_DEFERRED = "submit-deferred"
    CHECKPOINTED_FOR_PREEMPTION = "checkpointed-for-preemption"
    PREEMPT_DEADLINE = "preempt-deadline-passed"
    REQUEUED = "requeued-after-preemption"
    STRANDED = "requeued-stranded-preempted: found PREEMPTED (a controller crash mid-preemption?)"
    RAY_JOB_SUCCEEDED = "ray-job-succeeded"
    RAY_JOB_FAILED = "ray-job-failed"
    RAY_JOB_STOPPED = "ray-job-stopped-outside-control-plane"
    MAX_RUNTIME = "max-runtime-exceeded"
    GANG_LOST = "gang-lost: Ray no longer knows its job (cluster restarted?)"
    GANG_FAILED = "gang-failed"
    GANG_HUNG = "gang-hung"
    PREEMPT_ENDED = "gang-ended-while-preempting"
    RESTARTED_IN_PLACE = "restarted-in-place"
    IN_PLACE_STUCK = "restart-in-place-stuck"
    NODE_LOST = "node-lost: the gang's node is gone"


class AttemptEnd(str, Enum):
    """How an attempt ended: the ``kind`` of each entry of a job's ``attempts`` info."""

    CRASH = "crash"
    HANG = "hang"
    PREEMPTED = "preempted"
    HEALTH = "health"
    START_FAILED = "start-failed"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    MAX_RUNTIME = "max-runtime"
    LOST = "lost"


@dataclass(frozen=True)
class AttemptConfig:
    """The ``jobs`` section's bounds on starting a gang."""

    gang_start_timeout_s: float
    max_start_attempts: int
    backoff_initial_s: float
    backoff_max_s: float


@dataclass(frozen=True)
class Preempting:
    """A preemption in progress (asked to checkpoint first, or not)."""

    deadline_s: float
    reason: str
    """Why it was preempted (admission's or remediation's reason)."""
    health: bool = False
    """The health remediation moves the gang off a bad node (else: for a job or serving)."""
    verified_step: int | None = None
    """The step storage holds that answers the request (None: none yet)."""


@dataclass(frozen=True)
class InPlaceRestart:
    """A restart of the gang's workers inside its run (`jobs.launcher.in_place`) that the job
    reported and the control plane has not recorded yet."""

    index: int
    """Which restart of this attempt's run it is (1, 2, ...)."""
    at_s: float
    """When the run reported it (the failure, within Ray Train's poll)."""
    reason: str
    """The failed rank's error as one line (``rank 1: ValueError: bad shape``)."""
    signature: str
    """`policies.restarts.failure_signature` of `reason`."""
    step: int | None = None
    """The last step the failed workers reported (None: none)."""


@dataclass(frozen=True)
class GangView:
    """One admitted or running gang, as observed this tick."""

    job_id: str
    running: bool
    """RUNNING (else ADMITTED)."""
    status: GangStatus
    now_s: float
    admitted_s: float
    num_workers: int
    started_ranks: int = 0
    """Workers of this attempt that reported they started."""
    max_runtime_s: float | None = None
    stall_timeout_s: float = 600.0
    step: int | None = None
    """The attempt's newest reported step (None: none yet; the hang watchdog is unarmed)."""
    step_at_s: float | None = None
    preempting: Preempting | None = None
    hang_reason: str | None = None
    """Set while a hung gang is being stopped: why it counts as hung."""
    stop_sent: bool = False
    start_failures: int = 0
    failure_message: str = ""
    """What the end of the attempt's log says failed it (read only once Ray says it ended)."""
    failure_signature: str = ""
    restarts: RestartRecord = RestartRecord()
    restart_limits: RestartLimits = RestartLimits(0, 0.0, 0.0)
    committed_step: int | None = None
    """The newest step storage holds (what a restart resumes from)."""
    start_step: int | None = None
    """The committed step this attempt started from."""
    in_place: InPlaceRestart | None = None
    """The oldest restart in place not recorded yet."""
    lost_nodes: tuple[str, ...] = ()
    """Nodes the gang was placed on that the cluster no longer has alive."""
    restarted_in_place_s: float | None = None
    """When the run last restarted in place, while the new worker group has reported no
    step since (None: it has, or the run never restarted in place)."""


@dataclass(frozen=True)
class MarkRunning:
    """ADMITTED -> RUNNING."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class ResubmitGang:
    """Submit the attempt's Ray Job again under its id (Ray refuses a second one)."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class StopGang:
    """Ask Ray to stop the attempt's Ray Job, once (the job records ``stop_sent``)."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class StopHungGang:
    """Keep every rank's stacks with the attempt's log, count the hang, stop the gang."""

    job_id: str
    reason: str
    step: int
    stalled_s: float
    timeout_s: float


@dataclass(frozen=True)
class EndJob:
    """The job ends: SUCCEEDED or FAILED, with how its attempt ended."""

    job_id: str
    reason: str
    succeeded: bool
    kind: AttemptEnd
    attempt_reason: str = ""
    """The attempt's end as its ``attempts`` entry says it ("" : `reason`)."""
    mark_running: bool = False
    """Still ADMITTED: RUNNING first, so the history shows the gang ran."""
    stop: bool = False
    """The gang still runs: stop it; the job is settled once Ray says it ended."""
    message: str | None = None
    start_failures: int | None = None
    restarts: RestartRecord | None = None
    clear_request: bool = False
    """Withdraw the checkpoint request from the signals actor (a preemption's)."""
    count_crash: bool = False
    """A crash after the gang trained: counted in the fleet's failure record (its MTBF)."""


@dataclass(frozen=True)
class RequeueGang:
    """The gang is done with; the job waits in the queue again, from its last checkpoint."""

    job_id: str
    reason: str
    kind: AttemptEnd
    attempt_reason: str = ""
    not_before_s: float | None = None
    stop: bool = False
    """The gang still runs (a start timeout): stop it first."""
    message: str | None = None
    start_failures: int | None = None
    restarts: RestartRecord | None = None
    preempted: bool = False
    """Through PREEMPTED (the history shows both steps), a preemption's checkpoint request
    withdrawn."""
    count_crash: bool = False
    """A crash after the gang trained: counted in the fleet's failure record (its MTBF)."""


@dataclass(frozen=True)
class RecordInPlaceRestart:
    """The gang restarted inside its run: record the failure as an end of the attempt (kind
    ``crash``, its restart index), spend a restart, and time the recovery."""

    job_id: str
    reason: str
    restart: InPlaceRestart
    restarts: RestartRecord
    count_crash: bool = False
    """A crash after the gang trained: counted in the fleet's failure record (its MTBF)."""


GangAction = (
    MarkRunning
    | ResubmitGang
    | StopGang
    | StopHungGang
    | EndJob
    | RequeueGang
    | RecordInPlaceRestart
)
"""What `decide` returns for a gang; with `SettleEnded`, every item of the jobs' lifecycle plan."""


@dataclass(frozen=True)
class EndedGang:
    """A job that ended (cancelled, failed over its runtime) while its Ray Job may still
    run, or a row that no longer validates (``invalid``: cancelled by id, read raw)."""

    job_id: str
    status: GangStatus
    stop_sent: bool
    cancelled: bool = False
    invalid: bool = False


@dataclass(frozen=True)
class SettleEnded:
    """Settle an ended job: Ray says its gang ended (``stop`` False: record that, forget its
    signals and memory tier), or ask Ray to stop the gang, once (``stop``)."""

    job_id: str
    reason: str
    stop: bool
    cancelled: bool = False
    invalid: bool = False


@dataclass(frozen=True)
class JobsView:
    """Every job that holds a gang, and every ended one whose gang may still run, as observed
    this tick (the runner's `observe`)."""

    gangs: tuple[GangView, ...] = ()
    ended: tuple[EndedGang, ...] = ()


JobAction = GangAction | SettleEnded
"""An item of the jobs' lifecycle plan."""
