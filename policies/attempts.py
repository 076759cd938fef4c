"""A gang's life after admission: what to do next with an attempt, from what was observed.

Owns: the pure decision `decide(gang, config) -> GangAction | None` the control loop's decide
phase makes for every job that holds a gang (ADMITTED or RUNNING), and
`settle(ended)` for a job that ended without its gang (cancelled, over its
runtime). It reads no clock (``GangView.now_s``), no Ray and no store: the observe phase fills
a `GangView` from the job's record, Ray's word on its Ray Job, the signals actor's and the
end of the attempt's log; the act phase (`controlplane.loop.act.jobs`) carries the action out.

The table, first match wins (``running``: RUNNING, else ADMITTED; ``ended``: Ray says
STOPPED, SUCCEEDED or FAILED; ``gone``: ended, or MISSING):

==  ===================================================  ===========================================
 #  observed                                              action
==  ===================================================  ===========================================
 1  preempting, SUCCEEDED                                 `EndJob` SUCCEEDED (``... while preempting``)
 2  preempting, gone                                      `RequeueGang` (preempted or health), no
                                                          restart spent, why: the checkpoint
                                                          storage holds, the deadline, or the end
 3  preempting, its checkpoint committed or deadline      `StopGang` (once: not ``stop_sent``)
 4  hung gang stopping, SUCCEEDED                         `EndJob` SUCCEEDED
 5  hung gang stopping, gone                              restart or FAILED (`policies.restarts`)
 6  hung gang stopping                                    `StopGang` (once)
 7  SUCCEEDED                                             `EndJob` SUCCEEDED (marked RUNNING first
                                                          when still ADMITTED)
 8  FAILED or STOPPED, ADMITTED                           a start failure: `RequeueGang` after a
                                                          backoff, FAILED after
                                                          ``max_start_attempts``
 9  STOPPED, RUNNING (stopped outside the control plane)  `EndJob` FAILED
10  FAILED, RUNNING (a crash)                             restart or FAILED (`policies.restarts`)
11  past ``max_runtime_s`` since admission                `EndJob` FAILED, the gang stopped
12  MISSING, RUNNING (the cluster lost it)                `RequeueGang` lost, no restart spent
13  ADMITTED, every worker of this attempt started        `MarkRunning`
14  ADMITTED, MISSING (the submission was lost)           `ResubmitGang`
15  ADMITTED past ``gang_start_timeout_s``                 a start failure (row 8), the gang stopped
16  RUNNING, no new step for its stall timeout            `StopHungGang` (stacks kept, then row 6)
==  ===================================================  ===========================================

A start failure's backoff is ``min(backoff_max_s, backoff_initial_s * 2 ** (failures - 1))``;
a crash's or hang's is `policies.restarts.decide_restart`'s. Anything else: no action (the gang
runs, or starts). Every action is level-triggered: the actuator does nothing when its effect
is already in the store, so a repeated tick, or a restarted controller, is harmless.

Must not: read a clock, call Ray or the store, or hold state.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from policies.restarts import (
    AttemptFailure,
    FailureKind,
    Restart,
    RestartLimits,
    RestartRecord,
    decide_restart,
)

__all__ = [
    "AttemptConfig",
    "AttemptEnd",
    "EndJob",
    "GangAction",
    "GangStatus",
    "GangView",
    "JobAction",
    "JobsView",
    "MarkRunning",
    "Preempting",
    "Reason",
    "RequeueGang",
    "ResubmitGang",
    "EndedGang",
    "SettleEnded",
    "StopGang",
    "StopHungGang",
    "decide",
    "decide_all",
    "settle",
    "start_failure",
]


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


GangAction = MarkRunning | ResubmitGang | StopGang | StopHungGang | EndJob | RequeueGang
"""What `decide` returns for a gang; with `SettleEnded`, every item of the jobs' lifecycle plan."""


def decide(gang: GangView, config: AttemptConfig) -> GangAction | None:
    """The next action for `gang` (see the module doc's table), or None."""
    if gang.preempting is not None:
        return _preempting(gang, gang.preempting)
    if gang.hang_reason is not None:
        return _hung_stopping(gang, gang.hang_reason)
    status = gang.status
    if status is GangStatus.SUCCEEDED:
        return _succeeded(gang)
    if status in (GangStatus.FAILED, GangStatus.STOPPED):
        return _ended_by_itself(gang, config)
    limit = gang.max_runtime_s
    if limit is not None and gang.now_s - gang.admitted_s > limit:
        reason = f"{Reason.MAX_RUNTIME.value} ({limit:g}s)"
        return EndJob(gang.job_id, reason, False, AttemptEnd.MAX_RUNTIME, stop=True)
    if gang.running and status is GangStatus.MISSING:
        lost = Reason.GANG_LOST.value
        return RequeueGang(gang.job_id, lost, AttemptEnd.LOST)
    if not gang.running:
        return _starting(gang, config)
    return _watch(gang)


def _succeeded(gang: GangView, suffix: str = "", clear_request: bool = False) -> EndJob:
    return EndJob(
        gang.job_id,
        Reason.RAY_JOB_SUCCEEDED.value + suffix,
        True,
        AttemptEnd.SUCCEEDED,
        mark_running=not gang.running,
        clear_request=clear_request,
    )


def _preempting(gang: GangView, p: Preempting) -> GangAction | None:
    status = gang.status
    if status is GangStatus.SUCCEEDED:
        return _succeeded(gang, " while preempting", clear_request=True)
    if status in ENDED or status is GangStatus.MISSING:
        if p.verified_step is not None:
            why = (
                f"{Reason.CHECKPOINTED_FOR_PREEMPTION.value} at step {p.verified_step} "
                "(its manifest is in storage)"
            )
        elif gang.stop_sent:
            why = f"{Reason.PREEMPT_DEADLINE.value}: stopped without a new committed checkpoint"
        else:
            why = f"{Reason.PREEMPT_ENDED.value} ({status.value}), before a new checkpoint"
        kind = AttemptEnd.HEALTH if p.health else AttemptEnd.PREEMPTED
        return RequeueGang(gang.job_id, f"{why}; {p.reason}", kind, preempted=True)
    if not gang.stop_sent and (p.verified_step is not None or gang.now_s >= p.deadline_s):
        why = "its checkpoint is in storage" if p.verified_step is not None else "its deadline"
        return StopGang(gang.job_id, f"preempted: {why}")
    return None


def _hung_stopping(gang: GangView, reason: str) -> GangAction | None:
    status = gang.status
    if status is GangStatus.SUCCEEDED:
        return _succeeded(gang)
    if status in ENDED or status is GangStatus.MISSING:
        return _failed(gang, FailureKind.HANG, reason, "hang without progress")
    if not gang.stop_sent:
        return StopGang(gang.job_id, f"hung: {reason}")
    return None


def _ended_by_itself(gang: GangView, config: AttemptConfig) -> GangAction:
    message = gang.failure_message
    if not gang.running:
        why = Reason.RAY_JOB_FAILED if gang.status is GangStatus.FAILED else Reason.RAY_JOB_STOPPED
        return _start_failed(gang, config, f"{why.value}: {message}")
    if gang.status is GangStatus.STOPPED:
        reason = f"{Reason.RAY_JOB_STOPPED.value}: {message}"
        return EndJob(gang.job_id, reason, False, AttemptEnd.FAILED, message=message)
    return _failed(gang, FailureKind.CRASH, message, gang.failure_signature)


def _starting(gang: GangView, config: AttemptConfig) -> GangAction | None:
    if gang.started_ranks >= gang.num_workers:
        reason = f"{Reason.GANG_RUNNING.value}: all {gang.num_workers} workers started"
        return MarkRunning(gang.job_id, reason)
    if gang.status is GangStatus.MISSING:
        return ResubmitGang(gang.job_id, "admitted, but Ray has no Ray Job for it (lost)")
    timeout_s = config.gang_start_timeout_s
    if gang.now_s - gang.admitted_s > timeout_s:
        reason = (
            f"{Reason.GANG_START_TIMEOUT.value}: {gang.started_ranks} of {gang.num_workers} "
            f"workers running after {timeout_s:g}s"
        )
        return _start_failed(gang, config, reason, stop=True)
    return None


def _start_failed(
    gang: GangView, config: AttemptConfig, reason: str, stop: bool = False
) -> GangAction:
    return start_failure(gang.job_id, gang.start_failures, gang.now_s, reason, config, stop)


def start_failure(
    job_id: str,
    start_failures: int,
    now_s: float,
    reason: str,
    config: AttemptConfig,
    stop: bool = False,
) -> EndJob | RequeueGang:
    """A gang that never ran (its Ray Job ended while ADMITTED, it timed out starting, or
    admitting it failed: the signals actor, credentials or the submission): back to the queue
    with backoff, FAILED once it used up ``max_start_attempts``."""
    failures = start_failures + 1
    if failures >= config.max_start_attempts:
        return EndJob(
            job_id,
            f"{reason}; gave up after {failures} attempts",
            False,
            AttemptEnd.START_FAILED,
            attempt_reason=reason,
            stop=stop,
            message=reason,
            start_failures=failures,
        )
    backoff_s = min(config.backoff_max_s, config.backoff_initial_s * 2 ** (failures - 1))
    return RequeueGang(
        job_id,
        f"{reason}; retry in {backoff_s:g}s",
        AttemptEnd.START_FAILED,
        attempt_reason=reason,
        not_before_s=now_s + backoff_s,
        stop=stop,
        message=reason,
        start_failures=failures,
    )


def _failed(gang: GangView, kind: FailureKind, message: str, signature: str) -> GangAction:
    """A gang that ran crashed or hung: restart it after a backoff, or FAIL the job, as
    `policies.restarts` decides."""
    failure = AttemptFailure(
        kind=kind,
        message=message,
        signature=signature,
        committed_step=gang.committed_step,
        start_step=gang.start_step,
        reported_step=gang.step,
    )
    decision, record = decide_restart(failure, gang.restarts, gang.restart_limits)
    why = Reason.GANG_HUNG if kind is FailureKind.HANG else Reason.GANG_FAILED
    reason = f"{why.value}: {decision.reason}"
    # A script that fails before its first step is the script's fault, not the cluster's.
    count_crash = kind is FailureKind.CRASH and gang.step is not None
    if isinstance(decision, Restart):
        return RequeueGang(
            gang.job_id,
            reason,
            AttemptEnd.HANG if kind is FailureKind.HANG else AttemptEnd.CRASH,
            attempt_reason=f"{kind.value}: {message}",
            not_before_s=gang.now_s + decision.after_s,
            message=message,
            restarts=record,
            count_crash=count_crash,
        )
    return EndJob(
        gang.job_id,
        reason,
        False,
        AttemptEnd.FAILED,
        message=message,
        restarts=record,
        count_crash=count_crash,
    )


def _watch(gang: GangView) -> StopHungGang | None:
    """The hang watchdog, armed once the attempt reported a step."""
    if gang.step is None or gang.step_at_s is None:
        return None
    stalled_s = gang.now_s - gang.step_at_s
    timeout_s = gang.stall_timeout_s
    if stalled_s <= timeout_s:
        return None
    reason = f"no new step for {stalled_s:.0f}s at step {gang.step} (stall_timeout_s={timeout_s:g})"
    return StopHungGang(gang.job_id, reason, gang.step, stalled_s, timeout_s)


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


def settle(ended: EndedGang) -> SettleEnded | None:
    """Settle once Ray says the gang ended (or forgot it), else stop it once; None while the
    stop is on its way."""
    e = ended
    if e.status in ENDED or e.status is GangStatus.MISSING:
        why = f"its Ray Job ended ({e.status.value})"
        return SettleEnded(e.job_id, why, False, e.cancelled, e.invalid)
    if e.stop_sent:
        return None
    return SettleEnded(e.job_id, "the job ended, its gang runs", True, e.cancelled, e.invalid)


@dataclass(frozen=True)
class JobsView:
    """Every job that holds a gang, and every ended one whose gang may still run, as observed
    this tick (the runner's `observe`)."""

    gangs: tuple[GangView, ...] = ()
    ended: tuple[EndedGang, ...] = ()


JobAction = GangAction | SettleEnded
"""An item of the jobs' lifecycle plan."""


def decide_all(view: JobsView, config: AttemptConfig) -> tuple[JobAction, ...]:
    """The lifecycle plan for one tick: `decide` for every gang, `settle` for every ended
    job, in the order observed."""
    plan: list[JobAction] = []
    for gang in view.gangs:
        action = decide(gang, config)
        if action is not None:
            plan.append(action)
    for ended in view.ended:
        settled = settle(ended)
        if settled is not None:
            plan.append(settled)
    return tuple(plan)
