"""How an attempt ends: a job's gang is done with, and the job settles or goes back to wait.

Owns `AttemptEnds`, the writes every end of an attempt shares:

* `finish`: the job ends with its Ray Job (SUCCEEDED, FAILED), the attempt's end recorded,
  the signals actor told to forget the job, its memory-tier actors killed;
* `start_failed`: a gang that never ran goes back to QUEUED with exponential backoff
  (``jobs.backoff_*``), FAILED after ``jobs.max_start_attempts``;
* `gang_failed`: a RUNNING gang that crashed or hung is restarted after a backoff (RUNNING ->
  QUEUED in one transaction) or FAILED, as `policies.restarts` decides, and counted in the
  fleet's failure record (`reliability.record_failure`);
* the best-effort calls to the signals actor and the memory tier at an end (`forget`,
  `forget_many`, `clear_request`, `clear_memory_tier`): a failure is logged, never raised.

Must not: call Ray but through the Ray Jobs adapter (`ray_jobs.RayJobs`), or decide when an
attempt has ended (the reconcile does, `runner`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controlplane.adapters.ray_jobs import RayJobsApi
from controlplane.config import Config
from controlplane.policy_config import restart_limits
from controlplane.store import JobRecord, JobState, Store, reliability
from controlplane.store.attempt_info import (
    _REQUEUE_INFO,
    AttemptEnd,
    Reason,
    _count,
    _info_step,
    attempt_end,
)
from policies.restarts import (
    AttemptFailure,
    FailureKind,
    Restart,
    RestartRecord,
    decide_restart,
)

__all__ = ["AttemptEnds"]

log = logging.getLogger(__name__)


class AttemptEnds:
    """The writes that end an attempt (see the module doc). Every method is idempotent."""

    def __init__(
        self, store: Store, cfg: Config, ray_jobs: RayJobsApi, clock: Callable[[], float]
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.ray = ray_jobs
        self.clock = clock

    def finish(
        self,
        job: JobRecord,
        state: JobState,
        reason: str,
        kind: AttemptEnd | None,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        """The job ends with its Ray Job: `state`, the attempt's end (`kind`), the signals
        actor forgets it and its memory tier goes."""
        merged: dict[str, Any] = {**(info or {}), "ray_done": True, "placement": None}
        if kind is not None:
            merged.update(attempt_end(job, kind, reason, self.clock()))
        self.store.transition(job.job_id, state, reason, info=merged)
        self.forget(job.job_id)
        self.clear_memory_tier(job.job_id)

    def start_failed(self, job: JobRecord, reason: str) -> None:
        failures = int(job.info.get("start_failures", 0)) + 1
        j = self.cfg.jobs
        now = self.clock()
        end = attempt_end(job, AttemptEnd.START_FAILED, reason, now)
        if failures >= j.max_start_attempts:
            info = {"start_failures": failures, "message": reason, **end}
            self.finish(
                job, JobState.FAILED, f"{reason}; gave up after {failures} attempts", None, info
            )
            return
        backoff = min(j.backoff_max_s, j.backoff_initial_s * 2 ** (failures - 1))
        self.store.transition(
            job.job_id,
            JobState.QUEUED,
            f"{reason}; retry in {backoff:g}s",
            expected=JobState.ADMITTED,
            info={
                "start_failures": failures,
                "not_before_s": now + backoff,
                "placement": None,
                "message": reason,
                "ray_done": True,
                "progress": None,
                **end,
            },
        )

    def gang_failed(
        self, job: JobRecord, kind: FailureKind, message: str, signature: str, now: float
    ) -> None:
        """A RUNNING gang crashed or hung: restart it after a backoff (RUNNING -> QUEUED, one
        transaction with its info) or FAIL the job, as `policies.restarts` decides."""
        progress = job.info.get("progress") if isinstance(job.info.get("progress"), Mapping) else {}
        failure = AttemptFailure(
            kind=kind,
            message=message,
            signature=signature,
            committed_step=_info_step(job.info.get("checkpoint")),
            start_step=_count(job.info.get("start_step")),
            reported_step=_count((progress or {}).get("step")),
        )
        last = job.info.get("last_failure")
        last = last if isinstance(last, Mapping) else {}
        record = RestartRecord(
            restarts=_count(job.info.get("restarts")) or 0,
            last_signature=last.get("signature")
            if isinstance(last.get("signature"), str)
            else None,
            committed_at_last_failure=_count(last.get("committed_step")),
        )
        limits = restart_limits(self.cfg, job.spec.max_restarts)
        decision, record = decide_restart(failure, record, limits)
        if kind is FailureKind.CRASH and failure.reported_step is not None:
            # Counted for the fleet's MTBF only once the gang trained: a script that fails
            # before its first step is the script's fault, not the cluster's.
            try:
                reliability.record_failure(self.store, "gang-crash", now)
            except Exception as exc:
                log.warning("recording the crash of %s failed: %s", job.job_id, exc)
        info: dict[str, Any] = {
            "restarts": record.restarts,
            "last_failure": {
                "signature": record.last_signature,
                "committed_step": record.committed_at_last_failure,
            },
            "message": message,
        }
        why = Reason.GANG_HUNG if kind is FailureKind.HANG else Reason.GANG_FAILED
        if isinstance(decision, Restart):
            end = AttemptEnd.HANG if kind is FailureKind.HANG else AttemptEnd.CRASH
            info.update(_REQUEUE_INFO)
            info.update(attempt_end(job, end, f"{kind.value}: {message}", now))
            info["not_before_s"] = now + decision.after_s
            self.store.transition(
                job.job_id,
                JobState.QUEUED,
                f"{why.value}: {decision.reason}",
                expected=JobState.RUNNING,
                info=info,
            )
            return
        self.finish(
            job, JobState.FAILED, f"{why.value}: {decision.reason}", AttemptEnd.FAILED, info
        )

    def forget(self, job_id: str) -> None:
        """Tell the signals actor to drop the job (best effort: a failure is logged)."""
        try:
            self.ray.forget_signals(job_id)
        except Exception as exc:
            log.warning("job signals: forgetting %s failed: %s", job_id, exc)

    def forget_many(self, job_ids: Sequence[str]) -> None:
        """`forget` for many jobs in one actor call, e.g. every job retention pruned (most
        were forgotten when they ended already; one call bounds what the rest costs). Best
        effort: a failure is logged, never raised."""
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
