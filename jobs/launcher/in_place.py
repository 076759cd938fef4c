"""Restarting a function gang's workers inside the same run, and telling the control plane.

Owns: ``RCP_RESTARTS_IN_PLACE`` (how many times Ray Train may restart the worker group inside
the run: the restarts the job has left, set by the runner), `failure_reason` (a failed
worker's exception as one line a user can read) and `InPlaceReporter`, the Ray Train callback
that tells the job's signals actor each time the group is about to restart in place
(`_JobSignals.restarting_in_place`), so the control plane records the failure as an
attempt's end, spends a restart and times the recovery.

How a restart in place runs: a worker raises or its process dies; Ray Train's controller
sees it on its next poll (about a second), calls `InPlaceReporter.after_exception`, stops the
other workers, starts a new worker group on the same admitted nodes and calls the training
function again, which restores from the last committed checkpoint (the memory tier's copy
when its checksums match the manifest, else object storage: `jobs.checkpointing`). Past
``RCP_RESTARTS_IN_PLACE`` failures the run fails, the Ray Job ends FAILED and the control
plane's own restart (a new attempt, through the queue) takes over.

Must not: import `controlplane`; be imported where no gang runs (it imports Ray Train: the
launcher imports it inside `jobs.launcher.gang.gang_configs`); let an unreachable signals
actor fail the run (a report that cannot be made is printed and dropped).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ray.train.v2.api.callback import UserCallback

from jobs.signals.environment import (
    ENV_ATTEMPT,
    ENV_JOB_ID,
    ENV_RESTARTS_IN_PLACE,
    ENV_SIGNAL_TOKEN,
)
from jobs.signals.handle import SignalsHandle
from jobs.signals.reports import MAX_REASON_CHARS

__all__ = ["ENV_RESTARTS_IN_PLACE", "MAX_REASON_CHARS", "InPlaceReporter", "failure_reason"]


def failure_reason(worker_exceptions: Mapping[int, BaseException]) -> str:
    """The failed ranks' first error as one line: ``rank 1: ValueError: bad shape`` (a dead
    worker process: ``rank 1: its worker process died``)."""
    if not worker_exceptions:
        return "a worker failed"
    rank = min(worker_exceptions)
    error = worker_exceptions[rank]
    cause: BaseException = error
    while cause.__cause__ is not None:
        cause = cause.__cause__
    text = str(cause).strip().splitlines()
    if "health check failed" in str(error) or "died" in type(cause).__name__.lower():
        what = "its worker process died"
    else:
        what = f"{type(cause).__name__}: {text[-1] if text else ''}".rstrip(": ")
    others = sorted(worker_exceptions)[1:]
    more = f" (and rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))})"
    return f"rank {rank}: {what}{more if others else ''}"[:MAX_REASON_CHARS]


class InPlaceReporter(UserCallback):
    """Ray Train callback: one signals call per restart in place.

    It runs in Ray Train's controller; it carries the attempt's id and token from the
    driver's environment. The ``n``-th failure with ``n <= max_restarts`` is a restart in
    place; a later one ends the run, which the control plane sees as the Ray Job failing.
    """

    def __init__(self, env: Mapping[str, str]) -> None:
        self.job_id = env.get(ENV_JOB_ID, "")
        self.attempt = int(env.get(ENV_ATTEMPT, "0"))
        self._token = env.get(ENV_SIGNAL_TOKEN, "")
        self.max_restarts = restarts_in_place(env)
        self.failures = 0

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        self.failures += 1
        if self.failures > self.max_restarts or not self.job_id:
            return
        reason = failure_reason(worker_exceptions)
        try:
            SignalsHandle().call(
                "restarting_in_place",
                self.job_id,
                self.attempt,
                self.failures,
                reason,
                self._token,
                timeout_s=10,
            )
        except Exception as exc:  # the restart goes on; the control plane sees it late
            print(f"rcp: could not report restart in place: {exc!r}", file=sys.stderr)


def restarts_in_place(env: Mapping[str, str]) -> int:
    """``RCP_RESTARTS_IN_PLACE`` as a count (0 when unset or not a whole number >= 0)."""
    try:
        return max(0, int(env.get(ENV_RESTARTS_IN_PLACE, "0")))
    except ValueError:
        return 0
