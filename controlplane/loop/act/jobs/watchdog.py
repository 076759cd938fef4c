"""The hang watchdog: a RUNNING gang whose step stopped growing is hung, and restarted.

Owns:

* `Watchdog.watch`: a RUNNING gang whose step has not grown for its ``stall_timeout_s``
  (armed once the attempt reported a step) is hung: every rank's Python stacks are fetched
  through Ray's dashboard (`ray_jobs.RayJobs.worker_stack`, on worker threads,
  `limits.STACKS_DEADLINE_S` in all) into the attempt's log (`Store.put_attempt_note`, shown
  by `JobRunner.read_logs`), event ``job.hung``, the hang counted in the job's info and in
  the fleet's failure record, and the gang stopped;
* `Watchdog.stopping`: once Ray says the hung gang ended, a restart after a backoff or FAILED
  (`ends.AttemptEnds.gang_failed`).

Must not: call Ray but through the Ray Jobs adapter (`ray_jobs.RayJobs`), or wait on the
stacks past the tick's deadline (a later tick takes them).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
from collections.abc import Mapping
from typing import Any

from controlplane.adapters.ray_jobs import _ENDED, STACK_MAX_CHARS, RayJobsApi, RayJobStatus
from controlplane.config import Config
from controlplane.loop.act.jobs import limits
from controlplane.loop.act.jobs.background import _Background
from controlplane.loop.act.jobs.ends import AttemptEnds
from controlplane.store import JobRecord, JobState, Store, reliability
from controlplane.store.attempt_info import AttemptEnd, Reason, _count
from policies.restarts import FailureKind

__all__ = ["HANG_HEADER", "Watchdog"]

log = logging.getLogger(__name__)

HANG_HEADER = "=== attempt {attempt}: hang: stacks of the workers (py-spy via Ray) ==="


class Watchdog:
    """Finds hung gangs and stops them (see the module doc). Every method is idempotent."""

    def __init__(
        self,
        store: Store,
        cfg: Config,
        ray_jobs: RayJobsApi,
        work: _Background[str],
        ends: AttemptEnds,
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.ray = ray_jobs
        self._work = work
        self._ends = ends

    def watch(
        self,
        job: JobRecord,
        sig: Mapping[str, Any],
        progress: Mapping[str, Any] | None,
        now: float,
        deadline_s: float,
    ) -> None:
        """A RUNNING gang whose step has not grown for its stall timeout is hung: fetch every
        rank's stacks (worker threads, `limits.STACKS_DEADLINE_S` in all; the tick waits for them at
        most until `deadline_s` and takes them on a later tick otherwise), then `hung`.
        Armed once the attempt reported a step."""
        if progress is None:
            return
        timeout_s = job.spec.stall_timeout_s or self.cfg.jobs.stall_timeout_s
        stalled_s = now - float(progress["step_at_s"])
        key = ("stacks", job.job_id, str(job.info["attempt"]))
        if stalled_s <= timeout_s:
            return
        if not self._work.pending(key):
            log.warning(
                "job %s: no new step for %.0fs (stall_timeout_s=%g); fetching its stacks",
                job.job_id,
                stalled_s,
                timeout_s,
            )
            workers = sig.get("workers")
            workers = dict(workers) if isinstance(workers, Mapping) else {}
            self._work.start(key, functools.partial(self.fetch_stacks, workers))
        self._work.wait([key], deadline_s)
        done, stacks, error = self._work.take(key)
        if not done:
            return  # still fetching: a later tick finishes the job
        if error is not None:
            stacks = f"(fetching the stacks failed: {error})\n"
        self.hung(job, int(progress["step"]), stalled_s, timeout_s, str(stacks), now)

    def fetch_stacks(self, workers: Mapping[Any, Any]) -> str:
        """(worker thread) Every rank's stacks through Ray (`RayJobs.worker_stack`), in
        parallel, `limits.STACKS_DEADLINE_S` in all; one block per rank, lowest rank first."""
        ranks: list[tuple[int, Mapping[str, Any]]] = []
        for rank, worker in workers.items():
            try:
                number = int(rank)
            except (TypeError, ValueError):
                continue
            ranks.append((number, worker if isinstance(worker, Mapping) else {}))
        ranks.sort(key=lambda rw: rw[0])
        fetched, skipped = ranks[: limits.STACK_MAX_RANKS], ranks[limits.STACK_MAX_RANKS :]
        pool = concurrent.futures.ThreadPoolExecutor(
            max(1, min(limits.STACK_FETCH_THREADS, len(fetched))), thread_name_prefix="rcp-stacks"
        )
        futures: dict[int, concurrent.futures.Future[str]] = {}
        for rank, worker in fetched:
            pid, node_id = worker.get("pid"), worker.get("node_id")
            if isinstance(pid, int) and not isinstance(pid, bool) and isinstance(node_id, str):
                futures[rank] = pool.submit(self.ray.worker_stack, pid, node_id)
        concurrent.futures.wait(futures.values(), timeout=limits.STACKS_DEADLINE_S)
        pool.shutdown(wait=False, cancel_futures=True)
        blocks = []
        for rank, worker in fetched:
            future = futures.get(rank)
            if future is None:
                text = "(no stack: the worker reported no pid and node)"
            elif not future.done():
                text = f"(no stack: no answer within {limits.STACKS_DEADLINE_S:g}s)"
            elif future.exception() is not None:
                text = f"(no stack: {future.exception()})"
            else:
                text = future.result()[:STACK_MAX_CHARS]
            where = f"pid {worker.get('pid')}, node {worker.get('node_id')}"
            blocks.append(f"--- rank {rank} ({where}) ---\n{text.rstrip()}\n")
        if not ranks:
            blocks.append("(no stacks: no worker reported its pid)\n")
        if skipped:
            blocks.append(
                f"({len(skipped)} more ranks not fetched: at most {limits.STACK_MAX_RANKS})\n"
            )
        return "".join(blocks)

    def hung(
        self,
        job: JobRecord,
        step: int,
        stalled_s: float,
        timeout_s: float,
        stacks: str,
        now: float,
    ) -> None:
        """Keep the stacks with the attempt's log, count the hang, and stop the gang; it is
        re-queued as a restart (or FAILED) once Ray says it ended (`stopping`). Written in
        that order, so a restarted controller neither loses the stop nor counts it twice."""
        attempt = int(job.info["attempt"])
        reason = f"no new step for {stalled_s:.0f}s at step {step} (stall_timeout_s={timeout_s:g})"
        note = HANG_HEADER.format(attempt=attempt) + "\n" + stacks
        self.store.put_attempt_note(job.job_id, attempt, note)
        hangs = (_count(job.info.get("hangs")) or 0) + 1
        stopping = {"kind": AttemptEnd.HANG.value, "reason": reason, "at_s": now}
        job = self.store.update_info(job.job_id, {"stopping": stopping, "hangs": hangs})
        self.store.record_event(
            "job.hung",
            f"job {job.job_id}: hung: {reason}; the workers' stacks are in its log (attempt "
            f"{attempt}); stopping it to restart from its last committed checkpoint",
            job_id=job.job_id,
            data={
                "attempt": attempt,
                "step": step,
                "stalled_s": round(stalled_s, 3),
                "stall_timeout_s": timeout_s,
            },
        )
        try:
            reliability.record_failure(self.store, "gang-hang", now)
        except Exception as exc:
            log.warning("recording the hang of %s in the fleet record failed: %s", job.job_id, exc)
        self.ray.stop(job.info["submission_id"])
        self.store.update_info(job.job_id, {"stop_sent": now})

    def stopping(self, job: JobRecord, status: RayJobStatus, now: float) -> None:
        """A hung gang being stopped: once Ray says it ended, a restart (or FAILED)."""
        stopping = job.info.get("stopping")
        reason = str(stopping.get("reason")) if isinstance(stopping, Mapping) else "hung"
        if status is RayJobStatus.SUCCEEDED:
            self._ends.finish(
                job, JobState.SUCCEEDED, Reason.RAY_JOB_SUCCEEDED.value, AttemptEnd.SUCCEEDED
            )
        elif status in _ENDED or status is RayJobStatus.MISSING:
            self._ends.gang_failed(job, FailureKind.HANG, reason, "hang without progress", now)
        elif not job.info.get("stop_sent"):
            self.ray.stop(job.info["submission_id"])
            self.store.update_info(job.job_id, {"stop_sent": now})
