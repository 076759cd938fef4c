"""How an attempt ends: a job's gang is done with, and the job settles or goes back to wait.

Owns `AttemptEnds`, the writes every end of an attempt shares, as `policies.attempts` decided
it: `end` (`EndJob`: SUCCEEDED or FAILED; a gang that still runs is stopped and the job settled
once Ray says it ended, the runner's `SettleEnded`), `requeue` (`RequeueGang`: back to QUEUED
in one transaction with its info, a preemption's through PREEMPTED so the history shows
both), `restarted_in_place` (`RecordInPlaceRestart`: the run restarted its workers itself;
recorded as an end of the attempt and a restart spent, the job stays RUNNING), `start_failed`
(admitting a gang failed: `policies.attempts.start_failure`), the recovery timed from every
end of a gang that ran and every restart in place (`store.recoveries.failed`), a crash after
the gang trained counted in the fleet's failure record, and the best-effort calls to the
signals actor and the memory tier at an end (a failure is logged, never raised).

Must not: call Ray but through the Ray Jobs adapter (`ray_jobs.RayJobs`), or decide how an
attempt ends (`policies.attempts` does).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controlplane.adapters.ray_jobs import RayJobsApi
from controlplane.config import Config
from controlplane.policy_config import attempt_config
from controlplane.store import JobRecord, JobState, Store, recoveries, reliability
from controlplane.store.job_info import REQUEUE_INFO, Reason, attempt_end
from policies.attempts import AttemptEnd, EndJob, RecordInPlaceRestart, RequeueGang, start_failure

__all__ = ["AttemptEnds"]

log = logging.getLogger(__name__)

RECOVERED_ENDS = frozenset(
    {AttemptEnd.CRASH, AttemptEnd.HANG, AttemptEnd.LOST, AttemptEnd.HEALTH, AttemptEnd.PREEMPTED}
)
"""Ends of a gang that ran and will run again: each starts timing a recovery."""


class AttemptEnds:
    """The writes that end an attempt (see the module doc). Every method is idempotent."""

    def __init__(
        self, store: Store, cfg: Config, ray_jobs: RayJobsApi, clock: Callable[[], float]
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.ray = ray_jobs
        self.clock = clock

    def _info(
        self, job: JobRecord, a: EndJob | RequeueGang | RecordInPlaceRestart, now: float
    ) -> dict[str, Any]:
        """What every end records: the policy's fields, the attempt's end, a crash counted."""
        info: dict[str, Any] = {}
        if isinstance(a, RecordInPlaceRestart):
            kind, reason, in_place = AttemptEnd.CRASH, f"crash: {a.restart.reason}", a.restart
            info["in_place_recorded"] = a.restart.index
        else:
            kind, reason, in_place = a.kind, a.attempt_reason or a.reason, None
            if a.message is not None:
                info["message"] = a.message
            if a.start_failures is not None:
                info["start_failures"] = a.start_failures
        if a.restarts is not None:
            info["restarts"] = a.restarts.restarts
            info["last_failure"] = {
                "signature": a.restarts.last_signature,
                "committed_step": a.restarts.committed_at_last_failure,
            }
        index, step = (in_place.index, in_place.step) if in_place else (None, None)
        info.update(attempt_end(job, kind, reason, now, in_place=index, step=step))
        if kind in RECOVERED_ENDS and isinstance(a, RecordInPlaceRestart | RequeueGang):
            failed_s = in_place.at_s if in_place else now
            failure = recoveries.failed(job.info, failed_s, kind.value, index is not None, step)
            info.update(failure)
        if a.count_crash:
            # Counted for the fleet's MTBF only once the gang trained (the policy says so).
            try:
                reliability.record_failure(self.store, "gang-crash", now)
            except Exception as exc:
                log.warning("recording the crash of %s failed: %s", job.job_id, exc)
        return info

    def end(self, job: JobRecord, a: EndJob) -> None:
        """The job ends (see the module doc)."""
        now = self.clock()
        if a.mark_running and job.state is JobState.ADMITTED:
            job = self.store.transition(job.job_id, JobState.RUNNING, Reason.GANG_RUNNING.value)
        if a.clear_request:
            self.clear_request(job.job_id)
        info = self._info(job, a, now)
        info["placement"] = None
        if a.succeeded:
            info.update(recoveries.finished(job.info, now))
            info["message"] = _succeeded_message(info.get("attempts", job.info.get("attempts")))
        state = JobState.SUCCEEDED if a.succeeded else JobState.FAILED
        if a.stop:
            self.ray.stop(job.info["submission_id"])
            info["stop_sent"] = now
            self.store.transition(job.job_id, state, a.reason, info=info)
            return
        info["ray_done"] = True
        self.store.transition(job.job_id, state, a.reason, info=info)
        self.forget(job.job_id)
        self.clear_memory_tier(job.job_id)

    def requeue(self, job: JobRecord, a: RequeueGang) -> None:
        """The job waits in the queue again (see the module doc)."""
        now = self.clock()
        if a.stop:
            self.ray.stop(job.info["submission_id"])
        info = {**REQUEUE_INFO, **self._info(job, a, now)}
        if a.not_before_s is not None:
            info["not_before_s"] = a.not_before_s
        if a.preempted:
            self.clear_request(job.job_id)
            self.store.requeue(
                job.job_id, a.reason, Reason.REQUEUED.value, info=info, expected=[job.state]
            )
            return
        self.store.transition(job.job_id, JobState.QUEUED, a.reason, expected=job.state, info=info)

    def restarted_in_place(self, job: JobRecord, a: RecordInPlaceRestart) -> None:
        """The run restarted its workers (see the module doc); the job stays RUNNING."""
        self.store.update_info(job.job_id, self._info(job, a, self.clock()))
        log.info("job %s: %s", job.job_id, a.reason)

    def start_failed(self, job: JobRecord, reason: str) -> None:
        """Admitting the gang failed: retry after a backoff or FAILED, as the policy says."""
        failures = job.info.get("start_failures", 0)
        action = start_failure(
            job.job_id,
            failures if isinstance(failures, int) else 0,
            self.clock(),
            reason,
            attempt_config(self.cfg),
        )
        if isinstance(action, EndJob):
            self.end(job, action)
        else:
            self.requeue(job, action)

    def forget(self, job_id: str) -> None:
        """Tell the signals actor to drop the job (best effort: a failure is logged)."""
        try:
            self.ray.forget_signals(job_id)
        except Exception as exc:
            log.warning("job signals: forgetting %s failed: %s", job_id, exc)

    def forget_many(self, job_ids: Sequence[str]) -> None:
        """`forget` for many jobs in one actor call (e.g. every job retention pruned)."""
        if not job_ids:
            return
        try:
            self.ray.forget_signals_many(list(job_ids))
        except Exception as exc:
            log.warning("job signals: forgetting %d pruned jobs failed: %s", len(job_ids), exc)

    def clear_memory_tier(self, job_id: str) -> None:
        """Kill the job's memory-tier actors (best effort: a failure is logged; the periodic
        sweep tries again)."""
        try:
            killed = self.ray.kill_memory_tier(job_id)
        except Exception as exc:
            log.warning("memory tier of %s: cleanup failed: %s", job_id, exc)
            return
        if killed:
            log.info("memory tier of %s: %d holder actor(s) killed", job_id, killed)

    def clear_request(self, job_id: str) -> None:
        try:
            self.ray.clear_request(job_id)
        except Exception as exc:
            log.warning("job signals: clearing the request of %s failed: %s", job_id, exc)


def _succeeded_message(attempts: Any) -> str:
    """A succeeded job's message: it says so, and how many failures it came through (their
    reasons stay in the attempts, not in the message)."""
    ends = [a for a in attempts if isinstance(a, Mapping)] if isinstance(attempts, list) else []
    failed = sum(1 for a in ends if a.get("kind") not in (AttemptEnd.SUCCEEDED.value, None))
    if not failed:
        return "succeeded"
    return f"succeeded after {failed} failed or interrupted attempt end(s); see its attempts"
