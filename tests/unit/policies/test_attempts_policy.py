"""`policies.attempts`: every transition the job runner made, as a table.

Each row is one line of the module doc's table (the number in its id), with the variants the
runner had before the table replaced its decisions (4a5c56f's
`controlplane/service/runner`: `job_runner._reconcile_one`, `preemption.preempting`,
`watchdog.watch` and `stopping`, `ends.start_failed` and `gang_failed`, `_stop_ended`),
listed from that code before it was deleted.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.attempts import (
    AttemptConfig,
    AttemptEnd,
    EndedGang,
    EndJob,
    GangStatus,
    GangView,
    InPlaceRestart,
    MarkRunning,
    Preempting,
    RecordInPlaceRestart,
    RequeueGang,
    ResubmitGang,
    StopGang,
    StopHungGang,
    decide,
    settle,
    start_failure,
)
from policies.restarts import RestartLimits, RestartRecord

CONFIG = AttemptConfig(
    gang_start_timeout_s=120.0, max_start_attempts=3, backoff_initial_s=5.0, backoff_max_s=300.0
)
NOW = 10_000.0
S = GangStatus


def gang(**kw: object) -> GangView:
    base = GangView(
        job_id="j",
        running=True,
        status=S.RUNNING,
        now_s=NOW,
        admitted_s=NOW - 60.0,
        num_workers=2,
        stall_timeout_s=600.0,
        restart_limits=RestartLimits(max_restarts=2, backoff_initial_s=10.0, backoff_max_s=600.0),
    )
    return replace(base, **kw)  # type: ignore[arg-type]


PREEMPT = Preempting(deadline_s=NOW + 30.0, reason="for job k")
IN_PLACE = InPlaceRestart(1, NOW - 5.0, "rank 1: its worker process died", "died")

ROWS = [
    # 1: preempting, SUCCEEDED
    (
        "1-preempting-succeeded",
        gang(preempting=PREEMPT, status=S.SUCCEEDED),
        EndJob(
            "j",
            "ray-job-succeeded while preempting",
            True,
            AttemptEnd.SUCCEEDED,
            clear_request=True,
        ),
    ),
    (
        "1-preempting-succeeded-while-admitted",
        gang(preempting=PREEMPT, status=S.SUCCEEDED, running=False),
        EndJob(
            "j",
            "ray-job-succeeded while preempting",
            True,
            AttemptEnd.SUCCEEDED,
            mark_running=True,
            clear_request=True,
        ),
    ),
    # 2: preempting, gone: why = storage's checkpoint, the deadline's stop, or the end
    (
        "2-preempted-checkpoint-verified",
        gang(preempting=replace(PREEMPT, verified_step=40), status=S.STOPPED, stop_sent=True),
        RequeueGang(
            "j",
            "checkpointed-for-preemption at step 40 (its manifest is in storage); for job k",
            AttemptEnd.PREEMPTED,
            preempted=True,
        ),
    ),
    (
        "2-preempted-deadline",
        gang(preempting=PREEMPT, status=S.STOPPED, stop_sent=True),
        RequeueGang(
            "j",
            "preempt-deadline-passed: stopped without a new committed checkpoint; for job k",
            AttemptEnd.PREEMPTED,
            preempted=True,
        ),
    ),
    (
        "2-preempted-gang-ended-itself",
        gang(preempting=PREEMPT, status=S.FAILED),
        RequeueGang(
            "j",
            "gang-ended-while-preempting (FAILED), before a new checkpoint; for job k",
            AttemptEnd.PREEMPTED,
            preempted=True,
        ),
    ),
    (
        "2-health-move-missing",
        gang(preempting=replace(PREEMPT, health=True), status=S.MISSING),
        RequeueGang(
            "j",
            "gang-ended-while-preempting (MISSING), before a new checkpoint; for job k",
            AttemptEnd.HEALTH,
            preempted=True,
        ),
    ),
    # 3: preempting, running: stop once the checkpoint is in storage or at the deadline
    (
        "3-preempting-checkpoint-in-storage",
        gang(preempting=replace(PREEMPT, verified_step=40)),
        StopGang("j", "preempted: its checkpoint is in storage"),
    ),
    (
        "3-preempting-deadline",
        gang(preempting=replace(PREEMPT, deadline_s=NOW)),
        StopGang("j", "preempted: its deadline"),
    ),
    ("3-preempting-waits", gang(preempting=PREEMPT), None),
    (
        "3-preempting-stop-sent",
        gang(preempting=replace(PREEMPT, deadline_s=0.0), stop_sent=True),
        None,
    ),
    # 4-6: a hung gang being stopped
    (
        "4-hung-succeeded",
        gang(hang_reason="no new step", status=S.SUCCEEDED),
        EndJob("j", "ray-job-succeeded", True, AttemptEnd.SUCCEEDED),
    ),
    (
        "5-hung-ended-restart",
        gang(hang_reason="no new step", status=S.STOPPED, step=7),
        RequeueGang(
            "j",
            "gang-hung: restart 1 of 2 in 10s after hang: no new step",
            AttemptEnd.HANG,
            attempt_reason="hang: no new step",
            not_before_s=NOW + 10.0,
            message="no new step",
            restarts=RestartRecord(1, "hang without progress", None),
        ),
    ),
    (
        "5-hung-missing-give-up",
        gang(hang_reason="no new step", status=S.MISSING, restarts=RestartRecord(2, "x", None)),
        EndJob(
            "j",
            "gang-hung: gave up after 2 restart(s) (max_restarts=2); last failure: "
            "hang: no new step",
            False,
            AttemptEnd.FAILED,
            message="no new step",
            restarts=RestartRecord(2, "hang without progress", None),
        ),
    ),
    ("6-hung-stop", gang(hang_reason="no new step"), StopGang("j", "hung: no new step")),
    ("6-hung-stop-sent", gang(hang_reason="no new step", stop_sent=True), None),
    # 7: a node the gang was placed on is gone
    (
        "7-node-lost-requeues-and-stops-without-a-restart",
        gang(lost_nodes=("0123456789abcdef",), in_place=IN_PLACE),
        RequeueGang(
            "j", "node-lost: the gang's node is gone: 0123456789ab", AttemptEnd.LOST, stop=True
        ),
    ),
    (
        # Its peers saw the dead node's workers die first: the run restarted in place (a
        # restart spent) and never stepped again; that restart is given back.
        "7-node-lost-after-the-restart-in-place-it-caused",
        gang(lost_nodes=("n1",), restarted_in_place_s=NOW - 3.0, restarts=RestartRecord(2, "x", 7)),
        RequeueGang(
            "j",
            "node-lost: the gang's node is gone: n1; the restart in place its loss caused is "
            "given back",
            AttemptEnd.LOST,
            stop=True,
            restarts=RestartRecord(1, "x", 7),
        ),
    ),
    (
        "7-node-lost-after-a-restart-in-place-that-trained-spends-nothing-back",
        gang(
            lost_nodes=("n1",),
            restarted_in_place_s=None,
            step_at_s=NOW - 1.0,
            restarts=RestartRecord(2, "x", 7),
        ),
        RequeueGang("j", "node-lost: the gang's node is gone: n1", AttemptEnd.LOST, stop=True),
    ),
    (
        "7-node-lost-while-starting",
        gang(running=False, status=S.PENDING, lost_nodes=("n1", "n2")),
        RequeueGang("j", "node-lost: the gang's node is gone: n1, n2", AttemptEnd.LOST, stop=True),
    ),
    (
        "7-a-gang-that-succeeded-before-its-node-went-succeeded",
        gang(status=S.SUCCEEDED, lost_nodes=("n1",)),
        EndJob("j", "ray-job-succeeded", True, AttemptEnd.SUCCEEDED),
    ),
    (
        "7-preempting-wins-over-a-lost-node",
        gang(preempting=PREEMPT, lost_nodes=("n1",)),
        None,
    ),
    # 8: a restart in place, recorded as a restart spent, or the job given up
    (
        "8-in-place-restart-recorded",
        gang(in_place=IN_PLACE, step=40, committed_step=30),
        RecordInPlaceRestart(
            "j",
            "restarted-in-place: rank 1: its worker process died",
            IN_PLACE,
            RestartRecord(1, "died", 30),
            count_crash=True,
        ),
    ),
    (
        "8-in-place-the-failed-runs-step-counts-not-the-new-runs-silence",
        gang(in_place=replace(IN_PLACE, step=40)),
        RecordInPlaceRestart(
            "j",
            "restarted-in-place: rank 1: its worker process died",
            replace(IN_PLACE, step=40),
            RestartRecord(1, "died", None),
            count_crash=True,
        ),
    ),
    (
        "8-in-place-before-its-first-step-not-counted-for-the-fleet",
        gang(in_place=IN_PLACE),
        RecordInPlaceRestart(
            "j",
            "restarted-in-place: rank 1: its worker process died",
            IN_PLACE,
            RestartRecord(1, "died", None),
        ),
    ),
    (
        "8-in-place-even-while-ray-says-failed",  # record it before the attempt's end
        gang(in_place=IN_PLACE, status=S.FAILED, step=40),
        RecordInPlaceRestart(
            "j",
            "restarted-in-place: rank 1: its worker process died",
            IN_PLACE,
            RestartRecord(1, "died", None),
            count_crash=True,
        ),
    ),
    (
        "8-in-place-same-failure-twice-gives-up-and-stops",
        gang(in_place=IN_PLACE, restarts=RestartRecord(1, "died", 30), committed_step=30),
        EndJob(
            "j",
            "gang-failed: same failure twice before any progress: crash: rank 1: its worker "
            "process died",
            False,
            AttemptEnd.FAILED,
            attempt_reason="crash: rank 1: its worker process died",
            stop=True,
            message="rank 1: its worker process died",
            restarts=RestartRecord(1, "died", 30),
        ),
    ),
    (
        "8-in-place-past-max-restarts-gives-up",
        gang(in_place=IN_PLACE, restarts=RestartRecord(2, "other", None), step=3),
        EndJob(
            "j",
            "gang-failed: gave up after 2 restart(s) (max_restarts=2); last failure: crash: "
            "rank 1: its worker process died",
            False,
            AttemptEnd.FAILED,
            attempt_reason="crash: rank 1: its worker process died",
            stop=True,
            message="rank 1: its worker process died",
            restarts=RestartRecord(2, "died", None),
            count_crash=True,
        ),
    ),
    (
        "8-preempting-wins-over-in-place",
        gang(in_place=IN_PLACE, preempting=PREEMPT),
        None,
    ),
    # 9: SUCCEEDED
    (
        "9-succeeded",
        gang(status=S.SUCCEEDED),
        EndJob("j", "ray-job-succeeded", True, AttemptEnd.SUCCEEDED),
    ),
    (
        "9-succeeded-before-marked-running",
        gang(status=S.SUCCEEDED, running=False),
        EndJob("j", "ray-job-succeeded", True, AttemptEnd.SUCCEEDED, mark_running=True),
    ),
    # 10: a start failure (ADMITTED, Ray Job FAILED or STOPPED): backoff, then give up
    (
        "10-start-failed-backoff",
        gang(running=False, status=S.FAILED, failure_message="ImportError", start_failures=1),
        RequeueGang(
            "j",
            "ray-job-failed: ImportError; retry in 10s",
            AttemptEnd.START_FAILED,
            attempt_reason="ray-job-failed: ImportError",
            not_before_s=NOW + 10.0,
            message="ray-job-failed: ImportError",
            start_failures=2,
        ),
    ),
    (
        "10-start-stopped-give-up",
        gang(running=False, status=S.STOPPED, failure_message="no logs", start_failures=2),
        EndJob(
            "j",
            "ray-job-stopped-outside-control-plane: no logs; gave up after 3 attempts",
            False,
            AttemptEnd.START_FAILED,
            attempt_reason="ray-job-stopped-outside-control-plane: no logs",
            message="ray-job-stopped-outside-control-plane: no logs",
            start_failures=3,
        ),
    ),
    # 11: RUNNING, stopped outside the control plane
    (
        "11-stopped-outside",
        gang(status=S.STOPPED, failure_message="killed"),
        EndJob(
            "j",
            "ray-job-stopped-outside-control-plane: killed",
            False,
            AttemptEnd.FAILED,
            message="killed",
        ),
    ),
    # 12: a crash: restart (counted in the fleet's record once it trained) or give up
    (
        "12-crash-restart-after-training",
        gang(status=S.FAILED, failure_message="rank 1 exit 1", failure_signature="sig", step=5),
        RequeueGang(
            "j",
            "gang-failed: restart 1 of 2 in 10s after crash: rank 1 exit 1",
            AttemptEnd.CRASH,
            attempt_reason="crash: rank 1 exit 1",
            not_before_s=NOW + 10.0,
            message="rank 1 exit 1",
            restarts=RestartRecord(1, "sig", None),
            count_crash=True,
        ),
    ),
    (
        "12-crash-same-twice-no-progress",
        gang(
            status=S.FAILED,
            failure_message="boom",
            failure_signature="sig",
            restarts=RestartRecord(1, "sig", None),
        ),
        EndJob(
            "j",
            "gang-failed: same failure twice before any progress: crash: boom",
            False,
            AttemptEnd.FAILED,
            message="boom",
            restarts=RestartRecord(1, "sig", None),
        ),
    ),
    # 13: over max_runtime_s: FAILED, the gang stopped (settled once Ray says it ended)
    (
        "13-max-runtime",
        gang(max_runtime_s=30.0),
        EndJob("j", "max-runtime-exceeded (30s)", False, AttemptEnd.MAX_RUNTIME, stop=True),
    ),
    ("13-within-max-runtime", gang(max_runtime_s=61.0), None),
    (
        "13-max-runtime-while-admitted",
        gang(max_runtime_s=30.0, running=False, status=S.PENDING),
        EndJob("j", "max-runtime-exceeded (30s)", False, AttemptEnd.MAX_RUNTIME, stop=True),
    ),
    # 14: RUNNING, the cluster lost the Ray Job: re-queued, no restart spent
    (
        "14-lost",
        gang(status=S.MISSING),
        RequeueGang(
            "j", "gang-lost: Ray no longer knows its job (cluster restarted?)", AttemptEnd.LOST
        ),
    ),
    # 15: a restart in place that never trained again (its node gone, say)
    (
        "15-in-place-restart-stuck-requeues-and-stops",
        gang(restarted_in_place_s=NOW - 121.0),
        RequeueGang(
            "j",
            "restart-in-place-stuck: no step 121s after restarting in place "
            "(gang_start_timeout_s=120)",
            AttemptEnd.LOST,
            stop=True,
        ),
    ),
    ("15-in-place-restart-still-starting", gang(restarted_in_place_s=NOW - 60.0), None),
    (
        "15-in-place-restart-trained-again",
        gang(restarted_in_place_s=NOW - 500.0, step=3, step_at_s=NOW - 1.0),
        None,
    ),
    # 13-15: ADMITTED
    (
        "16-all-started",
        gang(running=False, status=S.RUNNING, started_ranks=2),
        MarkRunning("j", "gang-running: all 2 workers started"),
    ),
    ("16-some-started", gang(running=False, status=S.RUNNING, started_ranks=1), None),
    ("16-pending", gang(running=False, status=S.PENDING), None),
    (
        "17-submission-lost",
        gang(running=False, status=S.MISSING),
        ResubmitGang("j", "admitted, but Ray has no Ray Job for it (lost)"),
    ),
    (
        "18-start-timeout",
        gang(running=False, status=S.PENDING, admitted_s=NOW - 121.0, started_ranks=1),
        RequeueGang(
            "j",
            "gang-start-timeout: 1 of 2 workers running after 120s; retry in 5s",
            AttemptEnd.START_FAILED,
            attempt_reason="gang-start-timeout: 1 of 2 workers running after 120s",
            not_before_s=NOW + 5.0,
            stop=True,
            message="gang-start-timeout: 1 of 2 workers running after 120s",
            start_failures=1,
        ),
    ),
    (
        "18-within-start-timeout",
        gang(running=False, status=S.PENDING, admitted_s=NOW - 120.0),
        None,
    ),
    # 19: the hang watchdog, armed once a step was reported
    ("19-unarmed", gang(), None),
    ("19-stepping", gang(step=3, step_at_s=NOW - 600.0), None),
    (
        "19-hung",
        gang(step=3, step_at_s=NOW - 601.0),
        StopHungGang("j", "no new step for 601s at step 3 (stall_timeout_s=600)", 3, 601.0, 600.0),
    ),
    (
        "19-hung-job-timeout",
        gang(step=3, step_at_s=NOW - 61.0, stall_timeout_s=60.0),
        StopHungGang("j", "no new step for 61s at step 3 (stall_timeout_s=60)", 3, 61.0, 60.0),
    ),
]


@pytest.mark.parametrize(("observed", "expected"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_decide(observed: GangView, expected: object) -> None:
    assert decide(observed, CONFIG) == expected


def test_rows_cover_every_line_of_the_table() -> None:
    import re

    import policies.attempts

    table = re.findall(r"^ ?(\d+)  ", policies.attempts.__doc__ or "", re.MULTILINE)
    assert {int(r[0].split("-")[0]) for r in ROWS} == {int(n) for n in table} == set(range(1, 20))


def test_preemption_comes_before_everything_else() -> None:
    # A preempting gang over its runtime and unarmed is still the preemption's to settle.
    observed = gang(preempting=PREEMPT, max_runtime_s=1.0, status=S.MISSING)
    action = decide(observed, CONFIG)
    assert isinstance(action, RequeueGang) and action.preempted


@pytest.mark.parametrize(
    ("status", "stop_sent", "stop"),
    [
        (S.SUCCEEDED, False, False),
        (S.FAILED, True, False),
        (S.STOPPED, True, False),
        (S.MISSING, False, False),
        (S.RUNNING, False, True),
        (S.PENDING, False, True),
        (S.RUNNING, True, None),
    ],
)
def test_settle(status: GangStatus, stop_sent: bool, stop: bool | None) -> None:
    action = settle(EndedGang("j", status, stop_sent, cancelled=True))
    if stop is None:
        assert action is None
    else:
        assert action is not None and action.stop is stop and action.cancelled


@pytest.mark.parametrize(
    ("failures_before", "expected"),
    [
        (
            0,
            RequeueGang(
                "j",
                "start-failed: job signals unavailable; retry in 5s",
                AttemptEnd.START_FAILED,
                attempt_reason="start-failed: job signals unavailable",
                not_before_s=NOW + 5.0,
                message="start-failed: job signals unavailable",
                start_failures=1,
            ),
        ),
        (
            2,
            EndJob(
                "j",
                "start-failed: job signals unavailable; gave up after 3 attempts",
                False,
                AttemptEnd.START_FAILED,
                attempt_reason="start-failed: job signals unavailable",
                message="start-failed: job signals unavailable",
                start_failures=3,
            ),
        ),
    ],
)
def test_admitting_that_fails_is_a_start_failure(failures_before: int, expected: object) -> None:
    """The launcher's failures (signals actor, credentials, the submission) go through the
    same rule as row 8: a backoff that doubles, FAILED after ``max_start_attempts``."""
    reason = "start-failed: job signals unavailable"
    assert start_failure("j", failures_before, NOW, reason, CONFIG) == expected
