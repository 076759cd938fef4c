"""A gang's life after admission: what to do next with an attempt, from what was observed.

Owns: the pure decision `decide(gang, config) -> GangAction | None` the control loop's decide
phase makes for every job that holds a gang (ADMITTED or RUNNING), `settle(ended)` for a job
that ended without its gang (cancelled, over its runtime), and `decide_all(view, config)`, the
tick's whole lifecycle plan. It reads no clock (``GangView.now_s``), no Ray and no store: the observe phase fills
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
 7  a node the gang was placed on is gone (not ALIVE     `RequeueGang` lost, the gang stopped, no
    in Ray's list), its Ray Job not ended                 restart spent (a restart in place the
                                                          loss caused, with no step since, is
                                                          given back)
 8  a restart in place not recorded yet (the oldest)      `RecordInPlaceRestart`, or `EndJob` FAILED
                                                          (the gang stopped) when
                                                          `policies.restarts` gives up
 9  SUCCEEDED                                             `EndJob` SUCCEEDED (marked RUNNING first
                                                          when still ADMITTED)
10  FAILED or STOPPED, ADMITTED                           a start failure: `RequeueGang` after a
                                                          backoff, FAILED after
                                                          ``max_start_attempts``
11  STOPPED, RUNNING (stopped outside the control plane)  `EndJob` FAILED
12  FAILED, RUNNING (a crash)                             restart or FAILED (`policies.restarts`)
13  past ``max_runtime_s`` since admission                `EndJob` FAILED, the gang stopped
14  MISSING, RUNNING (the cluster lost it)                `RequeueGang` lost, no restart spent
15  RUNNING, restarted in place, no step for              `RequeueGang` lost, the gang stopped, no
    ``gang_start_timeout_s`` since (its node gone?)       restart spent again
16  ADMITTED, every worker of this attempt started        `MarkRunning`
17  ADMITTED, MISSING (the submission was lost)           `ResubmitGang`
18  ADMITTED past ``gang_start_timeout_s``                 a start failure (row 10), the gang stopped
19  RUNNING, no new step for its stall timeout            `StopHungGang` (stacks kept, then row 6)
==  ===================================================  ===========================================

An ended job (`EndedGang`): `settle` says `SettleEnded` to record that its Ray Job ended (a
cancelled job's attempt ends ``cancelled``) once Ray says so, else to stop it, once.

A start failure's backoff is ``min(backoff_max_s, backoff_initial_s * 2 ** (failures - 1))``
(`start_failure`, which the launcher also asks when admitting fails: the signals actor, the
credentials or the submission); a crash's or hang's is `policies.restarts.decide_restart`'s. Anything else: no action (the gang
runs, or starts). Every action is level-triggered: the actuator does nothing when its effect
is already in the store, so a repeated tick, or a restarted controller, is harmless.

`view` holds what was observed (`GangView`, `EndedGang`, `JobsView`), the vocabulary
(`GangStatus`, `Reason`, `AttemptEnd`) and the plan's items; this module, the table.

Must not: read a clock, call Ray or the store, or hold state.
"""

from __future__ import annotations

from policies.attempts.view import (
    ENDED,
    AttemptConfig,
    AttemptEnd,
    EndedGang,
    EndJob,
    GangAction,
    GangStatus,
    GangView,
    InPlaceRestart,
    JobAction,
    JobsView,
    MarkRunning,
    Preempting,
    Reason,
    RecordInPlaceRestart,
    RequeueGang,
    ResubmitGang,
    SettleEnded,
    StopGang,
    StopHungGang,
)
from policies.restarts import (
    AttemptFailure,
    FailureKind,
    GiveUp,
    Restart,
    RestartRecord,
    decide_restart,
)

__all__ = [
    "ENDED",
    "AttemptConfig",
    "AttemptEnd",
    "EndJob",
    "EndedGang",
    "GangAction",
    "GangStatus",
    "GangView",
    "InPlaceRestart",
    "JobAction",
    "JobsView",
    "MarkRunning",
    "Preempting",
    "Reason",
    "RecordInPlaceRestart",
    "RequeueGang",
    "ResubmitGang",
    "SettleEnded",
    "StopGang",
    "StopHungGang",
    "decide",
    "decide_all",
    "settle",
    "start_failure",
]


def decide(gang: GangView, config: AttemptConfig) -> GangAction | None:
    """The next action for `gang` (see the table above), or None."""
    if gang.preempting is not None:
        return _preempting(gang, gang.preempting)
    if gang.hang_reason is not None:
        return _hung_stopping(gang, gang.hang_reason)
    if gang.lost_nodes and gang.status not in ENDED:
        return _lost_nodes(gang)
    if gang.in_place is not None:
        return _restarted_in_place(gang, gang.in_place)
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
    since_s = gang.restarted_in_place_s
    if gang.running and since_s is not None and gang.step_at_s is None:
        timeout_s = config.gang_start_timeout_s
        if gang.now_s - since_s > timeout_s:
            reason = (
                f"{Reason.IN_PLACE_STUCK.value}: no step {gang.now_s - since_s:.0f}s after "
                f"restarting in place (gang_start_timeout_s={timeout_s:g})"
            )
            return RequeueGang(gang.job_id, reason, AttemptEnd.LOST, stop=True)
    if not gang.running:
        return _starting(gang, config)
    return _watch(gang)


def _lost_nodes(gang: GangView) -> RequeueGang:
    """Row 7. The workers on the dead node die first, and their peers' errors may restart the
    run in place before Ray marks the node dead: that restart (recorded, spent, and no step
    since) was the node's loss, so it is given back."""
    reason = f"{Reason.NODE_LOST.value}: {', '.join(n[:12] for n in gang.lost_nodes)}"
    spent = gang.restarts
    if gang.restarted_in_place_s is None or gang.step_at_s is not None or spent.restarts < 1:
        return RequeueGang(gang.job_id, reason, AttemptEnd.LOST, stop=True)
    refund = RestartRecord(
        spent.restarts - 1, spent.last_signature, spent.committed_at_last_failure
    )
    reason += "; the restart in place its loss caused is given back"
    return RequeueGang(gang.job_id, reason, AttemptEnd.LOST, stop=True, restarts=refund)


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


def _restart(
    gang: GangView, kind: FailureKind, message: str, signature: str, step: int | None
) -> tuple[Restart | GiveUp, RestartRecord, bool]:
    """`policies.restarts`' word on a failure of a gang that ran whose run reached `step`, the
    restart record to store, and whether the fleet's failure record counts it (a script that
    fails before its first step is the script's fault, not the cluster's)."""
    failure = AttemptFailure(kind, message, signature, gang.committed_step, gang.start_step, step)
    decision, record = decide_restart(failure, gang.restarts, gang.restart_limits)
    return decision, record, kind is FailureKind.CRASH and step is not None


def _gave_up(
    gang: GangView,
    reason: str,
    message: str,
    record: RestartRecord,
    count_crash: bool,
    *,
    attempt_reason: str = "",
    stop: bool = False,
) -> EndJob:
    """The job FAILS: `policies.restarts` gave up (`reason`); `stop` the gang if it runs."""
    return EndJob(
        gang.job_id,
        reason,
        False,
        AttemptEnd.FAILED,
        attempt_reason=attempt_reason,
        stop=stop,
        message=message,
        restarts=record,
        count_crash=count_crash,
    )


def _failed(gang: GangView, kind: FailureKind, message: str, signature: str) -> GangAction:
    """A gang that ran crashed or hung: restart it after a backoff, or FAIL the job, as
    `policies.restarts` decides."""
    decision, record, count_crash = _restart(gang, kind, message, signature, gang.step)
    why = Reason.GANG_HUNG if kind is FailureKind.HANG else Reason.GANG_FAILED
    reason = f"{why.value}: {decision.reason}"
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
    return _gave_up(gang, reason, message, record, count_crash)


def _restarted_in_place(gang: GangView, r: InPlaceRestart) -> EndJob | RecordInPlaceRestart:
    """The run restarted its workers itself: spend a restart as `policies.restarts` says (the
    same failure twice before any progress gives up, and the gang is stopped)."""
    step = r.step if r.step is not None else gang.step
    decision, record, count_crash = _restart(gang, FailureKind.CRASH, r.reason, r.signature, step)
    if isinstance(decision, Restart):
        reason = f"{Reason.RESTARTED_IN_PLACE.value}: {r.reason}"
        return RecordInPlaceRestart(gang.job_id, reason, r, record, count_crash)
    reason = f"{Reason.GANG_FAILED.value}: {decision.reason}"
    return _gave_up(
        gang, reason, r.reason, record, count_crash, attempt_reason=f"crash: {r.reason}", stop=True
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
