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

An ended job (`EndedGang`): `settle` says `SettleEnded` to record that its Ray Job ended (a
cancelled job's attempt ends ``cancelled``) once Ray says so, else to stop it, once.

A start failure's backoff is ``min(backoff_max_s, backoff_initial_s * 2 ** (failures - 1))``
(`start_failure`, which the launcher also asks when admitting fails: the signals actor, the
credentials or the submission); a crash's or hang's is `policies.restarts.decide_restart`'s. Anything else: no action (the gang
runs, or starts). Every action is level-triggered: the actuator does nothing when its effect
is already in the store, so a repeated tick, or a restarted controller, is harmless.

Modules: `view` - what was observed (`GangView`, `EndedGang`, `JobsView`), the vocabulary
(`GangStatus`, `Reason`, `AttemptEnd`) and the plan's items; `decision` - the table.

Must not: read a clock, call Ray or the store, or hold state.
"""

from __future__ import annotations

from policies.attempts.decision import decide, decide_all, settle, start_failure
from policies.attempts.view import (
    ENDED,
    AttemptConfig,
    AttemptEnd,
    EndedGang,
    EndJob,
    GangAction,
    GangStatus,
    GangView,
    JobAction,
    JobsView,
    MarkRunning,
    Preempting,
    Reason,
    RequeueGang,
    ResubmitGang,
    SettleEnded,
    StopGang,
    StopHungGang,
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
    "JobAction",
    "JobsView",
    "MarkRunning",
    "Preempting",
    "Reason",
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
