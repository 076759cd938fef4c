"""The hang watchdog's hands: a gang `policies.attempts` found hung is stopped, its stacks kept.

Owns `Watchdog.stop_hung` (`StopHungGang`): every rank's Python stacks are fetched through
Ray's dashboard into the attempt's log (`Store.put_attempt_note`, shown by
`JobRunner.read_logs`), event ``job.hung``, the hang counted in the job's info and in the
fleet's failure record, and the gang stopped. Once Ray says it ended, the policy restarts it
after a backoff or FAILS the job.

Must not: call Ray but through the Ray Jobs adapter (`ray_jobs.RayJobs`), or wait on the
stacks past the tick's deadline (a later tick takes them).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
from collections.abc import Mapping
from typing import Any

from controlplane.adapters.ray_jobs import STACK_MAX_CHARS, RayJobsApi
from controlplane.loop.act.jobs import limits
from controlplane.loop.act.jobs.background import Background
from controlplane.store import JobRecord, Store, reliability
from controlplane.store.job_info import AttemptEnd, as_count
from policies.attempts import StopHungGang

__all__ = ["HANG_HEADER", "Watchdog"]

log = logging.getLogger(__name__)

HANG_HEADER = "=== attempt {attempt}: hang: stacks of the workers (py-spy via Ray) ==="


class Watchdog:
    """Finds hung gangs and stops them (see the module doc). Every method is idempotent."""

    def __init__(self, store: Store, ray_jobs: RayJobsApi, work: Background[str]) -> None:
        self.store = store
        self.ray = ray_jobs
        self._work = work

    def stop_hung(
        self,
        job: JobRecord,
        action: StopHungGang,
        workers: Mapping[Any, Any],
        now: float,
        deadline_s: float,
    ) -> None:
        """Fetch every rank's stacks (waiting at most until `deadline_s`; else a later tick
        takes them: the policy repeats the action), then `hung`."""
        key = ("stacks", job.job_id, str(job.info["attempt"]))
        if not self._work.pending(key):
            log.warning("job %s: %s; fetching its stacks", job.job_id, action.reason)
            self._work.start(key, functools.partial(self.fetch_stacks, dict(workers)))
        self._work.wait([key], deadline_s)
        done, stacks, error = self._work.take(key)
        if not done:
            return  # still fetching: a later tick finishes the job
        if error is not None:
            stacks = f"(fetching the stacks failed: {error})\n"
        self.hung(job, action, str(stacks), now)

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

    def hung(self, job: JobRecord, action: StopHungGang, stacks: str, now: float) -> None:
        """Keep the stacks with the attempt's log, count the hang, and stop the gang; it is
        re-queued as a restart (or FAILED) once Ray says it ended (`stopping`). Written in
        that order, so a restarted controller neither loses the stop nor counts it twice."""
        attempt = int(job.info["attempt"])
        reason = action.reason
        note = HANG_HEADER.format(attempt=attempt) + "\n" + stacks
        self.store.put_attempt_note(job.job_id, attempt, note)
        hangs = (as_count(job.info.get("hangs")) or 0) + 1
        stopping = {"kind": AttemptEnd.HANG.value, "reason": reason, "at_s": now}
        job = self.store.update_info(job.job_id, {"stopping": stopping, "hangs": hangs})
        self.store.record_event(
            "job.hung",
            f"job {job.job_id}: hung: {reason}; the workers' stacks are in its log (attempt "
            f"{attempt}); stopping it to restart from its last committed checkpoint",
            job_id=job.job_id,
            data={
                "attempt": attempt,
                "step": action.step,
                "stalled_s": round(action.stalled_s, 3),
                "stall_timeout_s": action.timeout_s,
            },
        )
        try:
            reliability.record_failure(self.store, "gang-hang", now)
        except Exception as exc:
            log.warning("recording the hang of %s in the fleet record failed: %s", job.job_id, exc)
        self.ray.stop(job.info["submission_id"])
        self.store.update_info(job.job_id, {"stop_sent": now})
