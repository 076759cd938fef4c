"""Committed checkpoints, read from object storage, never from the loop's word.

Owns `CommittedReads`: which jobs' committed steps to read this tick (`_read_wanted`), the
reads themselves (`checkpoints.CheckpointReader`, on worker threads: the tick waits
`limits.TICK_WAIT_S` at most, all jobs together) and what the job's info is to record of them
(`_what_to_record`: ``checkpoint`` = ``{"step", "uri", "committed_unix_s", "read_s"}``, and
while preempting ``preempt_checkpoint``), written by the runner in the act phase. A storage
error is logged and read again later, never fails the job.

Must not: write the store (the observe phase only reads), or move a job between states.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from controlplane.adapters.checkpoints import CheckpointReader, CommittedStep
from controlplane.config import Config
from controlplane.loop.act.jobs.background import Background
from controlplane.store import JobRecord, JobState, Store
from controlplane.store.job_info import as_finite, hint_step, info_step, progress_of, uri_of
from jobs.signals import trust

__all__ = ["CommittedReads", "ReadResult"]

log = logging.getLogger(__name__)

ReadResult = tuple[CommittedStep | None, CommittedStep | None]
"""One read's ``(newest step committed after the known one, the hinted step's commit)``."""


class CommittedReads:
    def __init__(
        self,
        store: Store,
        cfg: Config,
        clock: Callable[[], float],
        checkpoints: CheckpointReader,
        work: Background[ReadResult],
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.clock = clock
        self.checkpoints = checkpoints
        self._work = work
        self._next_scan_s: dict[str, float] = {}
        """When each running job's committed steps are read again (`read`)."""
        self._hint_scanned: dict[str, int] = {}
        """The step a job's hint named when it last triggered an early read."""

    def forget_others(self, live: set[str]) -> None:
        """Forget the schedules of jobs not in `live` (no longer ADMITTED or RUNNING)."""
        for table in (self._next_scan_s, self._hint_scanned):
            for job_id in set(table) - live:
                del table[job_id]

    def read(
        self, jobs: list[JobRecord], sigs: Mapping[str, Mapping[str, Any]], deadline_s: float
    ) -> tuple[list[JobRecord], dict[str, dict[str, Any]]]:
        """Start the reads that are due and wait for them until `deadline_s`; `jobs` with what
        came back in their info, and those info updates by job id."""
        now = self.clock()
        keys = []
        for job in jobs:
            key = ("scan", job.job_id)
            if self._work.pending(key):
                keys.append(key)
                continue
            wanted = self._read_wanted(job, sigs.get(job.job_id) or {}, now)
            if wanted is None:
                continue
            after, hint = wanted
            self._work.start(key, functools.partial(self._read, uri_of(self.cfg, job), after, hint))
            self._next_scan_s[job.job_id] = now + self.cfg.jobs.checkpoint_scan_interval_s
            keys.append(key)
        self._work.wait(keys, deadline_s)
        out = []
        updates: dict[str, dict[str, Any]] = {}
        for job in jobs:
            done, result, error = self._work.take(("scan", job.job_id))
            found = self._what_to_record(job, result, error, self.clock()) if done else {}
            if found:
                updates[job.job_id] = found
                job = replace(job, info={**job.info, **found})
            out.append(job)
        return out, updates

    def _read_wanted(
        self, job: JobRecord, sig: Mapping[str, Any], now: float
    ) -> tuple[int | None, int | None] | None:
        """``(known step, hinted step to check)`` when a read is due, else None: every tick
        while preempting, every ``jobs.checkpoint_scan_interval_s`` for a RUNNING job, and
        sooner once per newer step its hint names (a job that keeps lying costs one read per lie)."""
        known = info_step(job.info.get("checkpoint"))
        attempt = job.info.get("attempt")
        if job.info.get("preempting"):
            if job.info.get("stop_sent") or job.info.get("preempt_checkpoint") is not None:
                return None
            return known, self._answering_hint(job, sig)
        if job.state is not JobState.RUNNING:
            return None
        if now >= self._next_scan_s.get(job.job_id, 0.0):
            return known, None
        hinted = [hint_step(sig.get("checkpoint"), attempt)]
        progress = progress_of(sig, attempt)
        hinted.append(progress.get("committed_step") if progress else None)
        newest = max((h for h in hinted if h is not None), default=None)
        fresh = newest is not None and (known is None or newest > known)
        if fresh and newest is not None and self._hint_scanned.get(job.job_id) != newest:
            self._hint_scanned[job.job_id] = newest
            return known, None
        return None

    def _answering_hint(self, job: JobRecord, sig: Mapping[str, Any]) -> int | None:
        """The step of a checkpoint this attempt reported for the pending request (under its
        prefix), to verify in storage; None when it reported none."""
        ckpt = sig.get("checkpoint")
        if not isinstance(ckpt, Mapping) or not ckpt.get("answers_request"):
            return None
        if not trust.under_prefix(str(ckpt.get("path")), uri_of(self.cfg, job)):
            log.warning("job %s: ignoring checkpoint hint outside its prefix", job.job_id)
            return None
        return hint_step(ckpt, job.info.get("attempt"))

    def _read(self, prefix: str, after: int | None, hint: int | None) -> ReadResult:
        """(worker thread) The newest step committed after `after`, and `hint`'s commit."""
        newest = self.checkpoints.newest(prefix, after)
        hinted = None
        if hint is not None:
            hinted = newest if newest is not None and newest.step == hint else None
            hinted = hinted or self.checkpoints.committed(prefix, hint)
        return newest, hinted

    def _what_to_record(
        self, job: JobRecord, result: ReadResult | None, error: BaseException | None, now: float
    ) -> dict[str, Any]:
        """What a read tells the job's info; ``preempt_checkpoint`` is a step the job reported
        for the request whose manifest is in storage, or any committed after the request."""
        if error is not None:
            log.warning(
                "job %s: reading committed checkpoints from %s failed (read again later): %s",
                job.job_id,
                uri_of(self.cfg, job),
                error,
            )
            return {}
        assert result is not None  # a read that raised nothing returned its pair
        newest, hinted = result
        found = [c for c in (newest, hinted) if c is not None]
        updates: dict[str, Any] = {}
        best = max(found, key=lambda c: c.step, default=None)
        known = info_step(job.info.get("checkpoint"))
        if best is not None and (known is None or best.step > known):
            updates["checkpoint"] = best.to_info(now)
        if job.info.get("preempting") and job.info.get("preempt_checkpoint") is None:
            asked_s = as_finite(job.info.get("preempt_requested_s"))
            if hinted is not None:
                updates["preempt_checkpoint"] = hinted.step
            elif newest is not None and asked_s is not None and newest.committed_unix_s >= asked_s:
                updates["preempt_checkpoint"] = newest.step
        return updates
