"""The job actuator: admission's plan through the Ray Jobs adapter (the job runner).

Owns: `PreemptJob` -> `JobActions.preempt` (checkpoint first, then stop and re-queue),
`AdmitJob` -> `JobActions.admit` (the gang starts on the named nodes), `RejectJob` -> the
queued job fails with the reason, `WaitJob` -> the queued job's message says why it waits
(``rcp status``), written only when it changed. Admission's `MoveServeReplicas` is no job action: it is
the training claim, which the decide phase hands to placement (`controlplane.loop.decide`).
Each item is tried on its own; a failure is logged and counted, the rest still applied.

Must not: decide, or touch Ray itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from controlplane.loop.types import JobActions
from controlplane.store import JobState, Store
from policies.plan import AdmitJob, Plan, PreemptJob, RejectJob, WaitJob

__all__ = ["apply_admission"]

log = logging.getLogger(__name__)


def apply_admission(plan: Plan, jobs: JobActions, store: Store, failed: Callable[[], None]) -> None:
    for action in plan:
        try:
            if isinstance(action, PreemptJob):
                jobs.preempt(action)
            elif isinstance(action, AdmitJob):
                jobs.admit(action)
            elif isinstance(action, RejectJob):
                job = store.get(action.job_id)
                if job.state is JobState.QUEUED:
                    store.transition(action.job_id, JobState.FAILED, f"rejected: {action.reason}")
            elif isinstance(action, WaitJob):
                job = store.get(action.job_id)
                if job.state is JobState.QUEUED and job.info.get("message") != action.reason:
                    store.update_info(action.job_id, {"message": action.reason})
        except Exception:
            failed()
            log.exception("acting on %r failed", action)
