"""`JobRunner`: a job's life after admission, reconciled every tick from the store alone.

Owns the runner's one entry point per plan item and per tick, and the reconcile that moves
every job holding (or having held) a gang along from what Ray, the signals actor and object
storage say, idempotently, so a restarted controller carries on where the last one stopped:

* `admit` and `preempt` hand the plan's items to `launching.Launcher` and
  `preemption.Preemption`;
* scoped storage credentials are minted at admission and kept fresh every tick
  (`credentials.JobCredentials`);
* `reconcile` reads the active jobs (by index: ADMITTED, RUNNING, PREEMPTED, and ended jobs
  whose Ray Job may still run), their signals and their committed steps
  (`checkpoint_reads`), then per job (`_reconcile_one`): ADMITTED -> RUNNING once every
  worker has started; a gang not running within ``jobs.gang_start_timeout_s`` is stopped and
  re-queued with backoff; a RUNNING gang whose Ray Job FAILED crashed (a restart or FAILED,
  `ends`); one that stopped stepping is left to the hang watchdog (`watchdog`); a RUNNING gang
  whose Ray Job vanished (the cluster restarted) is re-queued (no restart spent); a Ray Job
  that ended sets SUCCEEDED/FAILED; a job past its ``max_runtime_s`` is stopped and FAILED;
  a CANCELLED job's Ray Job is stopped, and the job settled once it ended;
* the sweeps, every `limits.ORPHAN_SWEEP_INTERVAL_S`: live Ray Jobs of ours that are no
  job's current attempt are stopped (`sweep_orphans`), and the memory-tier actors of ended
  or pruned jobs killed (`sweep_memory_tiers`);
* `read_logs` (`logs.AttemptLogs`), `forget` and `forget_many` for the API and retention.

Must not: call Ray but through the Ray Jobs adapter (`ray_jobs.RayJobs`), or decide who runs
(that is `policies.admission`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from controlplane.adapters.checkpoints import CheckpointReader
from controlplane.adapters.job_logs import AttemptLogs, _tail_of
from controlplane.adapters.ray_jobs import _ENDED, RayJobs, RayJobsApi, RayJobStatus
from controlplane.config import Config
from controlplane.loop.act.jobs import limits
from controlplane.loop.act.jobs.background import _Background, _Submissions, io_pool
from controlplane.loop.act.jobs.checkpoint_reads import CommittedReads, ReadResult
from controlplane.loop.act.jobs.credentials import JobCredentials, Mint
from controlplane.loop.act.jobs.ends import AttemptEnds
from controlplane.loop.act.jobs.launching import Launcher
from controlplane.loop.act.jobs.preemption import Preemption
from controlplane.loop.act.jobs.watchdog import Watchdog
from controlplane.store import (
    TERMINAL_STATES,
    IllegalTransition,
    InvalidJob,
    JobRecord,
    JobState,
    StaleState,
    Store,
    UnknownJob,
)
from controlplane.store.attempt_info import (
    _REQUEUE_INFO,
    ATTEMPT_REASON_CHARS,
    PROGRESS_INFO_KEYS,
    SIGNAL_TOKEN_INFO,
    AttemptEnd,
    Reason,
    _progress_of,
    _submission_id,
    attempt_end,
    checkpoint_uri,
)
from policies.plan import AdmitJob, PreemptJob
from policies.restarts import FailureKind, failure_signature

__all__ = ["JobRunner"]

log = logging.getLogger(__name__)


class JobRunner:
    """A job's life after admission (see the package doc). Every method is idempotent."""

    def __init__(
        self,
        store: Store,
        cfg: Config,
        ray_jobs: RayJobsApi,
        clock: Callable[[], float] = time.time,
        checkpoints: CheckpointReader | None = None,
        mint: Mint | None = None,
    ) -> None:
        """`mint` makes a job's scoped storage credentials (default: STS,
        `controlplane.storage.JobCredentialMinter`; tests pass their own)."""
        self.store = store
        self.cfg = cfg
        self.ray = ray_jobs
        if isinstance(ray_jobs, RayJobs) and ray_jobs.store is None:
            ray_jobs.store = store  # where the signals actor's id is pinned
        self.clock = clock
        self.checkpoints = checkpoints or CheckpointReader(cfg)
        self._submissions = _Submissions()
        pool = io_pool()
        self._stacks_work: _Background[str] = _Background(pool)
        self._reads_work: _Background[ReadResult] = _Background(pool)
        self._ends = AttemptEnds(store, cfg, ray_jobs, clock)
        self._credentials = JobCredentials(cfg, ray_jobs, clock, _Background(pool), mint)
        self._launcher = Launcher(
            store, cfg, ray_jobs, clock, self._submissions, self._ends, self._credentials
        )
        self._preemption = Preemption(store, ray_jobs, clock, self._ends)
        self._watchdog = Watchdog(store, cfg, ray_jobs, self._stacks_work, self._ends)
        self._reads = CommittedReads(store, cfg, clock, self.checkpoints, self._reads_work)
        self._logs = AttemptLogs(store, ray_jobs, clock)
        self._last_sweep_s: float | None = None

    # -- act ---------------------------------------------------------------------------------

    def admit(self, action: AdmitJob) -> None:
        """QUEUED -> ADMITTED and the gang submitted (`launching.Launcher.admit`)."""
        self._launcher.admit(action)

    def preempt(self, action: PreemptJob) -> None:
        """Checkpoint first, then stop (`preemption.Preemption.preempt`)."""
        self._preemption.preempt(action)

    def checkpoint_uri(self, job: JobRecord) -> str:
        """The job's checkpoint prefix (`info.checkpoint_uri`)."""
        return checkpoint_uri(self.cfg, job)

    def read_logs(self, job: JobRecord, offset: int, limit: int) -> tuple[str, int]:
        """``(text, size)``: about `limit` bytes from byte `offset` of the driver logs of
        every attempt, oldest first, and their length in bytes (`logs.AttemptLogs.read`,
        which asks Ray for those bytes only). Thread-safe."""
        return self._logs.read(job, offset, limit)

    def forget(self, job_id: str) -> None:
        """Tell the signals actor to drop the job (best effort: `ends.AttemptEnds.forget`)."""
        self._ends.forget(job_id)

    def forget_many(self, job_ids: Sequence[str]) -> None:
        """`forget` for many jobs in one actor call (`ends.AttemptEnds.forget_many`)."""
        self._ends.forget_many(job_ids)

    # -- reconcile ----------------------------------------------------------------------------

    def reconcile(self) -> None:
        """Move every job that holds (or held) a gang along, from what Ray, the signals actor
        and object storage say.

        Reads active jobs only (by index): ADMITTED, RUNNING, PREEMPTED, and finished jobs
        whose Ray Job may still run. Never the finished jobs of the past. Waits at most
        `limits.TICK_WAIT_S` for storage reads and stack fetches, all jobs together. One job's error
        is logged and never stops the others.
        """
        deadline_s = time.monotonic() + limits.TICK_WAIT_S
        jobs = self.store.list_jobs(states=[JobState.ADMITTED, JobState.RUNNING])
        sigs = {job.job_id: self._signals(job) for job in jobs}
        self._credentials.refresh(jobs, sigs, deadline_s)
        jobs = self._reads.read(jobs, sigs, deadline_s)
        for job in jobs:
            try:
                self._reconcile_one(job, sigs[job.job_id], deadline_s)
            except (StaleState, IllegalTransition):
                continue  # someone (a cancel) moved it meanwhile; next tick sees it
            except Exception:
                log.exception("reconciling job %s failed; retried next tick", job.job_id)
        live = {job.job_id for job in jobs}
        for work in (self._reads_work, self._stacks_work):
            work.drop(lambda key: key[1] in live)
        self._reads.forget_others(live)
        self._credentials.forget_others(live)
        for job in self.store.list_jobs(states=[JobState.PREEMPTED]):
            try:
                self._preemption.requeue_stranded(job)
            except (StaleState, IllegalTransition):
                continue
        scan = self.store.scan_jobs(
            states=[JobState.CANCELLED, JobState.FAILED], unsettled_only=True
        )
        for job in scan.jobs:
            try:
                self._stop_ended(job)
            except Exception:
                log.exception("stopping the Ray Job of ended job %s failed", job.job_id)
        for bad in scan.invalid:  # e.g. cancelled by id (`Store.cancel_invalid`)
            try:
                self._stop_invalid(bad.job_id)
            except Exception as exc:  # one bad row must not stop the others
                log.warning("stopping the Ray Job of invalid job %s failed: %s", bad.job_id, exc)
        now = self.clock()
        if self._last_sweep_s is None or now - self._last_sweep_s >= limits.ORPHAN_SWEEP_INTERVAL_S:
            self._last_sweep_s = now
            try:
                self.sweep_orphans()
            except Exception as exc:  # retried at the next interval
                log.warning("orphan sweep failed: %s", exc)
            try:
                self.sweep_memory_tiers()
            except Exception as exc:
                log.warning("memory tier sweep failed: %s", exc)

    def sweep_orphans(self) -> list[str]:
        """Stop every live Ray Job of ours (metadata ``rcp_job``) that is not the current
        attempt of an ADMITTED or RUNNING job (preempting ones included) in the store: e.g. a
        submission Ray accepted after the runner gave up on it while the controller restarted,
        so nothing was left to stop it. Rows that no longer validate keep their gang (their
        attempt is read from the raw info); cancel them to stop it. Returns the ids stopped."""
        scan = self.store.scan_jobs(states=[JobState.ADMITTED, JobState.RUNNING])
        keep = {_submission_id(j.job_id, j.info) for j in scan.jobs}
        keep |= {_submission_id(b.job_id, self.store.raw_info(b.job_id)) for b in scan.invalid}
        stopped = []
        for sid, status in sorted(self.ray.rcp_submissions().items()):
            if sid in keep:
                continue
            log.warning(
                "Ray Job %s (%s) belongs to no active job attempt; stopping it", sid, status
            )
            self.ray.stop(sid)
            stopped.append(sid)
            self.store.record_event(
                "job.orphan_stopped",
                f"Ray Job {sid} ({status.value}) was not the current attempt of any admitted or "
                "running job (a submission abandoned across a controller restart?); stopped",
                data={"submission_id": sid},
            )
        return stopped

    def sweep_memory_tiers(self) -> list[str]:
        """Kill the memory-tier actors of jobs that have ended (SUCCEEDED, FAILED, CANCELLED)
        or that the store no longer holds (pruned): those a job left when it was cancelled
        while queued between attempts, or when the controller stopped before cleaning up at
        the job's end. At most `limits.MEMORY_TIER_SWEEP_JOBS` jobs per sweep. Returns their ids."""
        cleaned = []
        for job_id in sorted(self.ray.memory_tier_jobs())[: limits.MEMORY_TIER_SWEEP_JOBS]:
            try:
                ended = self.store.get(job_id).state in TERMINAL_STATES
            except UnknownJob:
                ended = True
            except InvalidJob:
                continue  # its state is unreadable: leave it to an operator
            if ended:
                self._ends.clear_memory_tier(job_id)
                cleaned.append(job_id)
        return cleaned

    def _signals(self, job: JobRecord) -> dict[str, Any]:
        """What the signals actor holds for this attempt. An actor that does not know the
        attempt (it restarted, or was replaced) is told it again from the store first."""
        try:
            sig: dict[str, Any] = self.ray.signal_status(job.job_id)
            if sig.get("attempt") != job.info.get("attempt") and job.info.get(SIGNAL_TOKEN_INFO):
                self._launcher.register_signals(job)
                sig = self.ray.signal_status(job.job_id)
            return sig if isinstance(sig, dict) else {}
        except Exception as exc:
            log.warning("job signals unavailable for %s: %s", job.job_id, exc)
            return {}

    # -- one job's tick -------------------------------------------------------------------

    def _reconcile_one(self, job: JobRecord, sig: Mapping[str, Any], deadline_s: float) -> None:
        now = self.clock()
        sid = job.info["submission_id"]
        attempt = int(job.info["attempt"])
        progress = _progress_of(sig, attempt)
        if progress is not None:
            shown = {k: progress[k] for k in PROGRESS_INFO_KEYS}
            if shown != job.info.get("progress"):
                job = self.store.update_info(job.job_id, {"progress": shown})
        status = self.ray.status(sid)

        if job.info.get("preempting"):
            self._preemption.preempting(job, status, now)
            return
        if job.info.get("stopping"):
            self._watchdog.stopping(job, status, now)
            return
        if status is RayJobStatus.SUCCEEDED:
            if job.state is JobState.ADMITTED:
                self.store.transition(job.job_id, JobState.RUNNING, Reason.GANG_RUNNING.value)
            self._ends.finish(
                job, JobState.SUCCEEDED, Reason.RAY_JOB_SUCCEEDED.value, AttemptEnd.SUCCEEDED
            )
            return
        if status in (RayJobStatus.FAILED, RayJobStatus.STOPPED):
            text = self._log_text(sid)
            message = _tail_of(text, ATTEMPT_REASON_CHARS)
            if job.state is JobState.ADMITTED:
                why = (
                    Reason.RAY_JOB_FAILED
                    if status is RayJobStatus.FAILED
                    else Reason.RAY_JOB_STOPPED
                )
                self._ends.start_failed(job, f"{why.value}: {message}")
            elif status is RayJobStatus.STOPPED:
                reason = f"{Reason.RAY_JOB_STOPPED.value}: {message}"
                self._ends.finish(
                    job, JobState.FAILED, reason, AttemptEnd.FAILED, {"message": message}
                )
            else:
                signature = failure_signature(
                    _tail_of(text, limits.SIGNATURE_TAIL_CHARS), (sid, job.job_id)
                )
                self._ends.gang_failed(job, FailureKind.CRASH, message, signature, now)
            return
        limit = job.spec.max_runtime_s
        if limit is not None and now - float(job.info["admitted_s"]) > limit:
            # Backfill relied on this bound: enforce it. The stop completes in the background.
            self.ray.stop(sid)
            reason = f"{Reason.MAX_RUNTIME.value} ({limit:g}s)"
            info = {"stop_sent": now, "placement": None}
            info.update(attempt_end(job, AttemptEnd.MAX_RUNTIME, reason, now))
            self.store.transition(job.job_id, JobState.FAILED, reason, info=info)
            return
        if job.state is JobState.RUNNING and status is RayJobStatus.MISSING:
            # The cluster lost the Ray Job (e.g. `rcp down` then `up`): run it again from its
            # latest checkpoint rather than leave it RUNNING forever. The cluster's doing, not
            # the job's: no restart is spent.
            info = {**_REQUEUE_INFO}
            info.update(attempt_end(job, AttemptEnd.LOST, Reason.GANG_LOST.value, now))
            self.store.transition(
                job.job_id,
                JobState.QUEUED,
                Reason.GANG_LOST.value,
                expected=JobState.RUNNING,
                info=info,
            )
            return
        if job.state is JobState.ADMITTED:
            started = sig.get("started_ranks") or []
            if sig.get("attempt") == attempt and len(started) >= job.spec.num_workers:
                self.store.transition(
                    job.job_id,
                    JobState.RUNNING,
                    f"{Reason.GANG_RUNNING.value}: all {job.spec.num_workers} workers started",
                    expected=JobState.ADMITTED,
                )
            elif status is RayJobStatus.MISSING:
                self._launcher.submit(job)  # admitted but the submission was lost (crash); resubmit
            elif now - float(job.info["admitted_s"]) > self.cfg.jobs.gang_start_timeout_s:
                self.ray.stop(sid)
                self._ends.start_failed(
                    job,
                    f"{Reason.GANG_START_TIMEOUT.value}: {len(started)} of "
                    f"{job.spec.num_workers} workers running after "
                    f"{self.cfg.jobs.gang_start_timeout_s:g}s",
                )
            return
        self._watchdog.watch(job, sig, progress, now, deadline_s)

    def _stop_ended(self, job: JobRecord) -> None:
        """Stop the Ray Job of a job that ended without it (cancelled, over its runtime);
        once Ray says it ended, the job is settled: the attempt's end recorded (cancelled),
        the signals actor told to forget it, its memory tier killed."""
        sid = job.info["submission_id"]
        status = self.ray.status(sid)
        if status in _ENDED or status is RayJobStatus.MISSING:
            info: dict[str, Any] = {"ray_done": True, "placement": None}
            if job.state is JobState.CANCELLED:
                info.update(attempt_end(job, AttemptEnd.CANCELLED, "cancelled", self.clock()))
            self.store.update_info(job.job_id, info)
            self._ends.forget(job.job_id)
            self._ends.clear_memory_tier(job.job_id)
        elif not job.info.get("stop_sent"):
            self.ray.stop(sid)
            self.store.update_info(job.job_id, {"stop_sent": self.clock()})

    def _stop_invalid(self, job_id: str) -> None:
        """`_stop_ended` for a row that no longer validates: ``<id>-<attempt>`` from its info
        alone, no spec needed."""
        info = self.store.raw_info(job_id)
        sid = _submission_id(job_id, info)
        if sid is None:
            self.store.merge_raw_info(job_id, {"ray_done": True})
            return
        status = self.ray.status(sid)
        if status in _ENDED or status is RayJobStatus.MISSING:
            self.store.merge_raw_info(job_id, {"ray_done": True, "placement": None})
            self._ends.forget(job_id)
            self._ends.clear_memory_tier(job_id)
        elif not info.get("stop_sent"):
            self.ray.stop(sid)
            self.store.merge_raw_info(job_id, {"stop_sent": self.clock()})

    def _log_text(self, sid: str) -> str:
        """The end of the attempt's driver log (`limits.FAILED_LOG_TAIL_BYTES`), never the
        whole: the launcher's gang-failed line is its last line. "" when Ray cannot say."""
        try:
            tail = self.ray.log_tail(sid, limits.FAILED_LOG_TAIL_BYTES)
        except Exception:
            return ""
        return tail.data.decode("utf-8", errors="replace")
