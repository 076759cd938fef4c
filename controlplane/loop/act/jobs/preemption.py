"""Preemption: a gang asked to checkpoint first, stopped once storage holds that checkpoint.

Owns:

* `Preemption.preempt` (PreemptJob): ask the gang to checkpoint now (signals actor), mark it
  ``preempting`` with a deadline (``checkpoint.preempt_deadline_s``);
* what follows is `policies.attempts`' (rows 1-3): the gang is stopped once storage holds a
  step that answers the request (``preempt_checkpoint``, `checkpoint_reads`), or at the
  deadline; then PREEMPTED -> QUEUED in one store transaction (`ends.AttemptEnds.requeue`);
  no restart is spent, even when it failed meanwhile;
* `Preemption.requeue_stranded`: a job found PREEMPTED (a crash of an older version
  mid-preemption) is re-queued once its Ray Job has ended.

Must not: call Ray but through the Ray Jobs adapter (`ray_jobs.RayJobs`), or believe a
checkpoint the job only reported (storage says what is committed).
"""

from __future__ import annotations

from collections.abc import Callable

from controlplane.adapters.ray_jobs import RayJobsApi, RayJobStatus
from controlplane.loop.act.jobs.ends import AttemptEnds
from controlplane.store import JobRecord, JobState, Store
from controlplane.store.job_info import REQUEUE_INFO, AttemptEnd, Reason
from policies.attempts import ENDED
from policies.plan import PreemptJob

__all__ = ["Preemption"]


class Preemption:
    """Preempts gangs (see the module doc). Every method is idempotent."""

    def __init__(
        self, store: Store, ray_jobs: RayJobsApi, clock: Callable[[], float], ends: AttemptEnds
    ) -> None:
        self.store = store
        self.ray = ray_jobs
        self.clock = clock
        self._ends = ends

    def preempt(self, action: PreemptJob) -> None:
        job = self.store.get(action.job_id)
        if job.state not in (JobState.ADMITTED, JobState.RUNNING) or job.info.get("preempting"):
            return
        if job.info.get("stopping"):
            return  # a hung gang is being stopped already; it re-queues once stopped
        now = self.clock()
        ask = (
            action.checkpoint_first
            and job.spec.checkpoint.enabled
            and job.state is JobState.RUNNING
        )
        deadline = now + (job.spec.checkpoint.preempt_deadline_s if ask else 0.0)
        # Admission names the job it frees GPUs for, or says it frees them for serving; the
        # health remediation (the only other source of PreemptJob) does neither: it moves the
        # gang off a bad node.
        kind = (
            AttemptEnd.PREEMPTED if action.for_job_id or action.for_serving else AttemptEnd.HEALTH
        )
        self.store.update_info(
            job.job_id,
            {
                "preempting": True,
                "preempt_requested_s": now,
                "preempt_deadline_s": deadline,
                "preempt_for": action.for_job_id,
                "preempt_reason": action.reason,
                "preempt_kind": kind.value,
                "preempt_checkpoint": None,
            },
        )
        if ask:
            self.ray.request_checkpoint(job.job_id, now)
        self.store.record_event(
            "job.preempt",
            f"job {job.job_id}: preempting ({'checkpoint first' if ask else 'no checkpoint'}): "
            f"{action.reason}",
            job_id=job.job_id,
            data={"for_job_id": action.for_job_id, "checkpoint_first": ask},
        )

    def requeue_stranded(self, job: JobRecord) -> None:
        """A job left PREEMPTED (the crash of a version that re-queued in three steps): once
        its Ray Job has ended, back to the queue, with why in its history."""
        sid = job.info.get("submission_id")
        if sid and not job.info.get("ray_done"):
            status = self.ray.status(sid)
            if status not in ENDED and status is not RayJobStatus.MISSING:
                if not job.info.get("stop_sent"):
                    self.ray.stop(sid)
                    self.store.update_info(job.job_id, {"stop_sent": self.clock()})
                return  # re-queue once Ray says it ended
        self._ends.clear_request(job.job_id)
        self.store.requeue(
            job.job_id,
            Reason.STRANDED.value,
            Reason.STRANDED.value,
            info=REQUEUE_INFO,
            expected=[JobState.PREEMPTED],
        )
