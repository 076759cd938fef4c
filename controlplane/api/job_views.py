"""The job API's JSON views of a job, a stored row that no longer validates, and an event (the
SDK's `Job` reads exactly these keys).

Must not: read the store or check anything (`controlplane.api.jobs.JobService` does both and
hands these the records it read).
"""

from __future__ import annotations

import time
from typing import Any

from controlplane.store import (
    TERMINAL_STATES,
    Event,
    InvalidRow,
    JobRecord,
    JobState,
    Transition,
    recoveries,
)
from controlplane.store.job_info import job_facts

__all__ = ["event_to_json", "invalid_to_json", "job_to_json"]


def job_to_json(
    job: JobRecord, history: list[Transition] | None = None, *, now_s: float | None = None
) -> dict[str, Any]:
    """The API's view of a job: named keys of the runner's info only, never info itself (it
    holds the attempt's signal token); the recovery keys through `job_info.job_facts`, ages
    as of `now_s` (default: now). The one-job view (`history` given) adds every attempt's
    end (``attempts``) and every recovery (``recoveries``, `store.recoveries`); a listing
    leaves them out, so a page stays small."""
    info = dict(job.info)
    now = time.time() if now_s is None else now_s
    out: dict[str, Any] = {
        "id": job.job_id,
        "name": job.spec.name,
        "state": job.state.value,
        "queue": job.spec.queue,
        "owner": job.owner,
        "priority_class": job.spec.priority_class,
        "num_workers": job.spec.num_workers,
        "gpus_per_worker": job.spec.gpus_per_worker,
        "submitted_s": job.submitted_s,
        "queued_s": job.queued_s,
        "updated_s": job.updated_s,
        "num_preemptions": job.num_preemptions,
        "attempt": int(info.get("attempt", 0)),
        "ray_job_id": info.get("submission_id"),
        "message": info.get("message"),
        "not_before_s": info.get("not_before_s"),
        "spec": job.spec.to_dict(),
        **_recovery_json(job, now),
    }
    if history is not None:
        out["attempts"] = [
            {
                "attempt": a.attempt,
                "admitted_s": a.admitted_s,
                "ended_s": a.ended_s,
                "kind": a.kind,
                "reason": a.reason,
                "step": a.step,
                "checkpoint_step": a.checkpoint_step,
                "in_place": a.in_place,
            }
            for a in job_facts(job.info).attempts
        ]
        out["recoveries"] = [
            {
                "failed_s": r.failed_s,
                "kind": r.kind,
                "in_place": r.in_place,
                "seconds": r.seconds,
                "source": r.source,
                "restored_step": r.restored_step,
            }
            for r in recoveries.recoveries(job.info)
        ]
        out["history"] = [
            {
                "from": None if t.from_state is None else t.from_state.value,
                "to": t.to_state.value,
                "at_s": t.at_s,
                "reason": t.reason,
            }
            for t in history
        ]
    return out


def _recovery_json(job: JobRecord, now_s: float) -> dict[str, Any]:
    """The job view's checkpoint and restart keys (see `job_to_json`)."""
    facts = job_facts(job.info)
    running = job.state in (JobState.ADMITTED, JobState.RUNNING)
    stall_s, wall_s = facts.stall_wall_s(running)
    ratio = facts.overhead_ratio(running)
    commit, progress = facts.commit, facts.progress
    # ETTR to now while the job runs or waits, to its last change once it ended.
    ettr_at_s = job.updated_s if job.state in TERMINAL_STATES else now_s
    return {
        "checkpoint_uri": facts.checkpoint_uri,
        "last_checkpoint": None
        if commit is None
        else {
            "step": commit.step,
            "uri": commit.uri,
            "committed_unix_s": commit.committed_unix_s,
            "age_s": commit.age_s(now_s),
        },
        "checkpoint_stall_s": stall_s,
        "checkpoint_wall_s": wall_s,
        "checkpoint_overhead_pct": None if ratio is None else 100.0 * ratio,
        "restarts": facts.restarts,
        "max_restarts": job.spec.max_restarts,
        "hangs": facts.hangs,
        "ettr": recoveries.ettr(job.info, ettr_at_s, stall_s),
        "progress": None
        if progress is None or not running
        else {
            "step": progress.step,
            "step_at_s": progress.step_at_s,
            "step_age_s": None
            if progress.step_at_s is None
            else max(0.0, now_s - progress.step_at_s),
            "stall_s": progress.stall_s,
            "wall_s": progress.wall_s,
        },
    }


def invalid_to_json(row: InvalidRow) -> dict[str, Any]:
    """A stored job that no longer validates, as listings report it (the tick skips it)."""
    return {"id": row.job_id, "state": row.state, "error": row.error}


def event_to_json(e: Event) -> dict[str, Any]:
    return {
        "seq": e.seq,
        "at_s": e.at_s,
        "kind": e.kind,
        "job_id": e.job_id,
        "message": e.message,
        "data": dict(e.data),
    }
