"""`JobRunner`: the job actuator's entry points, what Ray, the signals actor and storage say.

Owns the entry points, idempotent and working from the store alone, so a restarted
controller carries on where the last one stopped:

* `observe` (the observe phase): every job that holds a gang (ADMITTED, RUNNING) as a
  `policies.attempts.GangView` (Ray's status of its Ray Job, the signals actor's word with
  any restart in place the run reported, the end of its log when Ray says it failed, the
  committed steps read from storage), and every
  ended job whose Ray Job may still run (cancelled, over its runtime) as an `EndedGang`;
* `apply` (the act phase): `policies.attempts`' plan, then the upkeep: scoped storage
  credentials kept fresh, stranded preemptions re-queued, and every
  `limits.ORPHAN_SWEEP_INTERVAL_S` the sweeps (`sweep_orphans`, `sweep_memory_tiers`);
* `admit` and `preempt`: admission's plan items (`launching`, `preemption`);
* `read_logs`, `forget` and `forget_many` for the API and retention.

Must not: call Ray but through the Ray Jobs adapter (`adapters.ray_jobs.RayJobs`), decide what
a gang's observed state calls for (`policies.attempts`), or who runs (`policies.admission`).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controlplane.adapters.checkpoints import CheckpointReader
from controlplane.adapters.job_logs import AttemptLogs, tail_of
from controlplane.adapters.ray_jobs import RayJobs, RayJobsApi, RayJobStatus
from controlplane.config import Config
from controlplane.loop.act.jobs import limits
from controlplane.loop.act.jobs.background import Background, Submissions
from controlplane.loop.act.jobs.checkpoint_reads import CommittedReads, ReadResult
from controlplane.loop.act.jobs.credentials import JobCredentials, Mint
from controlplane.loop.act.jobs.ends import AttemptEnds
from controlplane.loop.act.jobs.launching import Launcher
from controlplane.loop.act.jobs.preemption import Preemption
from controlplane.loop.act.jobs.watchdog import Watchdog
from controlplane.policy_config import restart_limits
from controlplane.store import (
    TERMINAL_STATES,
    IllegalTransition,
    InvalidJob,
    JobRecord,
    JobState,
    StaleState,
    Store,
    UnknownJob,
    recoveries,
)
from controlplane.store.job_info import (
    ATTEMPT_REASON_CHARS,
    PROGRESS_INFO_KEYS,
    SIGNAL_TOKEN_INFO,
    AttemptEnd,
    as_count,
    as_finite,
    as_mapping,
    attempt_end,
    info_step,
    progress_of,
    submission_id,
)
from policies.attempts import (
    EndedGang,
    EndJob,
    GangView,
    InPlaceRestart,
    JobAction,
    JobsView,
    MarkRunning,
    Preempting,
    RequeueGang,
    ResubmitGang,
    SettleEnded,
    StopGang,
    StopHungGang,
)
from policies.plan import AdmitJob, PreemptJob
from policies.restarts import RestartRecord, failure_signature

__all__ = ["JobRunner"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Seen:
    """What the last `JobRunner.observe` read, for `JobRunner.apply` in the same tick: each
    observed job's record and signals, and the tick's deadline for background work."""

    jobs: Mapping[str, tuple[JobRecord, Mapping[str, Any]]] = field(default_factory=dict)
    deadline_s: float = 0.0
    committed: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """What storage showed of each job's committed steps, for its info
    (`checkpoint_reads.CommittedReads.read`)."""


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
        self._submissions = Submissions()
        pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="rcp-runner-io")
        self._stacks_work: Background[str] = Background(pool)
        self._reads_work: Background[ReadResult] = Background(pool)
        self._ends = AttemptEnds(store, cfg, ray_jobs, clock)
        self._credentials = JobCredentials(cfg, ray_jobs, clock, Background(pool), mint)
        self._launcher = Launcher(
            store, cfg, ray_jobs, clock, self._submissions, self._ends, self._credentials
        )
        self._preemption = Preemption(store, ray_jobs, clock, self._ends)
        self._watchdog = Watchdog(store, ray_jobs, self._stacks_work)
        self._reads = CommittedReads(store, cfg, clock, self.checkpoints, self._reads_work)
        self._logs = AttemptLogs(store, ray_jobs, clock)
        self._last_sweep_s: float | None = None
        self._seen = _Seen()

    # -- act ---------------------------------------------------------------------------------

    def admit(self, action: AdmitJob) -> None:
        self._launcher.admit(action)

    def preempt(self, action: PreemptJob) -> None:
        self._preemption.preempt(action)

    def read_logs(self, job: JobRecord, offset: int, limit: int) -> tuple[str, int]:
        """``(text, size)`` (`job_logs.AttemptLogs.read`). Thread-safe."""
        return self._logs.read(job, offset, limit)

    def forget(self, job_id: str) -> None:
        self._ends.forget(job_id)

    def forget_many(self, job_ids: Sequence[str]) -> None:
        self._ends.forget_many(job_ids)

    # -- observe -------------------------------------------------------------------------

    def observe(self) -> JobsView:
        """See the module doc. Reads active jobs only (by index); waits at most
        `limits.TICK_WAIT_S` for storage reads, all jobs together. Writes nothing: `apply`
        records the committed steps read in the jobs' info. One job's error is logged and
        never stops the others."""
        deadline_s = time.monotonic() + limits.TICK_WAIT_S
        jobs = self.store.list_jobs(states=[JobState.ADMITTED, JobState.RUNNING])
        sigs = {job.job_id: self._signals(job) for job in jobs}
        jobs, committed = self._reads.read(jobs, sigs, deadline_s)
        live = {job.job_id for job in jobs}
        for work in (self._reads_work, self._stacks_work):
            work.drop(lambda key: key[1] in live)
        self._reads.forget_others(live)
        now = self.clock()
        gangs = []
        for job in jobs:
            try:
                gangs.append(self._gang_view(job, sigs[job.job_id], now))
            except Exception:
                log.exception("observing job %s failed; observed again next tick", job.job_id)
        seen = {job.job_id: (job, sigs[job.job_id]) for job in jobs}
        self._seen = _Seen(seen, deadline_s, committed)
        return JobsView(tuple(gangs), tuple(self._ended()))

    def _gang_view(self, job: JobRecord, sig: Mapping[str, Any], now: float) -> GangView:
        info, spec = job.info, job.spec
        sid = info["submission_id"]
        attempt = int(info["attempt"])
        progress = progress_of(sig, attempt)
        status = self.ray.status(sid)
        started = sig.get("started_ranks") or [] if sig.get("attempt") == attempt else []
        preempting = None
        if info.get("preempting"):
            preempting = Preempting(
                deadline_s=as_finite(info.get("preempt_deadline_s")) or 0.0,
                reason=str(info.get("preempt_reason") or "preempted"),
                health=info.get("preempt_kind") == AttemptEnd.HEALTH.value,
                verified_step=as_count(info.get("preempt_checkpoint")),
            )
        stopping = info.get("stopping")
        hang_reason = None
        if stopping:
            hang_reason = str(stopping.get("reason")) if isinstance(stopping, Mapping) else "hung"
        message = signature = ""
        if status in (RayJobStatus.FAILED, RayJobStatus.STOPPED) and not (preempting or stopping):
            text = self._log_text(sid)
            message = tail_of(text, ATTEMPT_REASON_CHARS)
            signature = failure_signature(
                tail_of(text, limits.SIGNATURE_TAIL_CHARS), (sid, job.job_id)
            )
        in_place = self._in_place(job, sig, attempt, (sid, job.job_id))
        recovering = as_mapping(info.get("recovering"))
        restarted_s = None
        if recovering.get("in_place") is True and progress is None:
            restarted_s = as_finite(recovering.get("failed_s"))
        recorded = as_mapping(info.get("progress"))
        last = as_mapping(info.get("last_failure"))
        signature_before = last.get("signature")
        failures = info.get("start_failures", 0)
        return GangView(
            job_id=job.job_id,
            running=job.state is JobState.RUNNING,
            status=status,
            now_s=now,
            admitted_s=float(info["admitted_s"]),
            num_workers=spec.num_workers,
            started_ranks=len(started),
            max_runtime_s=spec.max_runtime_s,
            stall_timeout_s=spec.stall_timeout_s or self.cfg.jobs.stall_timeout_s,
            # The watchdog is armed by this tick's progress only; a failure's step falls back
            # to the one recorded (the signals actor may be unavailable now).
            step=progress["step"] if progress else as_count(recorded.get("step")),
            step_at_s=progress["step_at_s"] if progress else None,
            preempting=preempting,
            hang_reason=hang_reason,
            stop_sent=bool(info.get("stop_sent")),
            start_failures=failures if isinstance(failures, int) else 0,
            failure_message=message,
            failure_signature=signature,
            restarts=RestartRecord(
                restarts=as_count(info.get("restarts")) or 0,
                last_signature=signature_before if isinstance(signature_before, str) else None,
                committed_at_last_failure=as_count(last.get("committed_step")),
            ),
            restart_limits=restart_limits(self.cfg, spec.max_restarts),
            committed_step=info_step(info.get("checkpoint")),
            start_step=as_count(info.get("start_step")),
            in_place=in_place,
            restarted_in_place_s=restarted_s,
        )

    @staticmethod
    def _in_place(
        job: JobRecord, sig: Mapping[str, Any], attempt: int, literals: tuple[str, ...]
    ) -> InPlaceRestart | None:
        """The oldest restart in place this attempt's run reported that is not recorded yet."""
        if sig.get("attempt") != attempt or not isinstance(sig.get("in_place"), list):
            return None
        recorded = as_count(job.info.get("in_place_recorded")) or 0
        for r in sig["in_place"]:
            r = as_mapping(r)
            index, at_s, reason = (
                as_count(r.get("index")),
                as_finite(r.get("at_s")),
                r.get("reason"),
            )
            if index and index > recorded and at_s is not None and isinstance(reason, str):
                signature = failure_signature(reason, literals)
                return InPlaceRestart(index, at_s, reason, signature, as_count(r.get("step")))
        return None

    def _ended(self) -> list[EndedGang]:
        """Ended jobs whose Ray Job may still run (cancelled, over their runtime), and rows
        that no longer validate (cancelled by id, `Store.cancel_invalid`), read raw."""
        ended = []
        scan = self.store.scan_jobs(
            states=[JobState.CANCELLED, JobState.FAILED], unsettled_only=True
        )
        rows = [(j.job_id, j.info, j.state is JobState.CANCELLED, False) for j in scan.jobs]
        rows += [(b.job_id, self.store.raw_info(b.job_id), True, True) for b in scan.invalid]
        for job_id, info, cancelled, invalid in rows:
            sid = submission_id(job_id, info)
            try:
                status = RayJobStatus.MISSING if sid is None else self.ray.status(sid)
            except Exception as exc:  # one bad row must not stop the others
                log.warning("reading the Ray Job of ended job %s failed: %s", job_id, exc)
                continue
            stop_sent = bool(info.get("stop_sent"))
            ended.append(EndedGang(job_id, status, stop_sent, cancelled, invalid))
        return ended

    # -- act -------------------------------------------------------------------------------

    def apply(self, plan: Sequence[JobAction], failed: Callable[[], None]) -> None:
        """First record what `observe` read (each gang's progress, its committed steps: an
        attempt's end records both), then every plan item, each on its own (a failure is
        logged and counted by `failed`), then the upkeep (see the module doc)."""
        seen = self._seen
        for job, sig in seen.jobs.values():
            try:
                self._record_observed(job, sig, seen.committed.get(job.job_id) or {})
            except UnknownJob:
                continue  # pruned meanwhile
            except Exception:
                log.exception("recording what job %s reported failed", job.job_id)
        for action in plan:
            try:
                self._apply_one(action, seen)
            except (StaleState, IllegalTransition):
                continue  # someone (a cancel) moved it meanwhile; the next tick sees it
            except Exception:
                failed()
                log.exception("acting on %r failed; decided again next tick", action)
        self._upkeep(seen)

    def _record_observed(
        self, job: JobRecord, sig: Mapping[str, Any], committed: Mapping[str, Any]
    ) -> None:
        updates = dict(committed)
        progress = progress_of(sig, job.info.get("attempt"))
        if progress is not None:
            shown = {k: progress[k] for k in PROGRESS_INFO_KEYS}
            if shown != job.info.get("progress"):
                updates["progress"] = shown
            restore = sig.get("restore") if isinstance(sig.get("restore"), Mapping) else None
            updates.update(recoveries.observed(job.info, progress, restore))
        if updates:
            self.store.update_info(job.job_id, updates)

    def _apply_one(self, action: JobAction, seen: _Seen) -> None:
        if isinstance(action, SettleEnded):
            self._settle(action)
            return
        job = self.store.get(action.job_id)
        if job.state not in (JobState.ADMITTED, JobState.RUNNING):
            return  # it moved on since observed (cancelled, say)
        if isinstance(action, MarkRunning):
            # The message was about the wait or the last failure; the job runs now.
            self.store.transition(
                job.job_id,
                JobState.RUNNING,
                action.reason,
                expected=JobState.ADMITTED,
                info={"message": None},
            )
        elif isinstance(action, ResubmitGang):
            self._launcher.submit(job)
        elif isinstance(action, StopGang):
            if not job.info.get("stop_sent"):
                self.ray.stop(job.info["submission_id"])
                self.store.update_info(job.job_id, {"stop_sent": self.clock()})
        elif isinstance(action, StopHungGang):
            sig = seen.jobs[job.job_id][1] if job.job_id in seen.jobs else {}
            workers = sig.get("workers")
            workers = workers if isinstance(workers, Mapping) else {}
            self._watchdog.stop_hung(job, action, workers, self.clock(), seen.deadline_s)
        elif isinstance(action, EndJob):
            self._ends.end(job, action)
        elif isinstance(action, RequeueGang):
            self._ends.requeue(job, action)
        else:
            self._ends.restarted_in_place(job, action)

    def _settle(self, action: SettleEnded) -> None:
        """An ended job's gang: stop it once, or, once Ray says it ended, record that (a
        cancelled job's attempt ends ``cancelled``) and forget the job's signals and memory
        tier. A row that no longer validates is written raw, no spec needed."""
        job_id = action.job_id
        info = self.store.raw_info(job_id) if action.invalid else self.store.get(job_id).info
        if action.stop:
            sid = submission_id(job_id, info)
            if sid is not None:
                self.ray.stop(sid)
            self._merge_info(action, {"stop_sent": self.clock()})
            return
        done: dict[str, Any] = {"ray_done": True, "placement": None}
        if action.cancelled and not action.invalid:
            job = self.store.get(job_id)
            done.update(attempt_end(job, AttemptEnd.CANCELLED, "cancelled", self.clock()))
        self._merge_info(action, done)
        self._ends.forget(job_id)
        self._ends.clear_memory_tier(job_id)

    def _merge_info(self, action: SettleEnded, info: Mapping[str, Any]) -> None:
        if action.invalid:
            self.store.merge_raw_info(action.job_id, dict(info))
        else:
            self.store.update_info(action.job_id, dict(info))

    def _upkeep(self, seen: _Seen) -> None:
        jobs = [job for job, _ in seen.jobs.values()]
        sigs = {job_id: sig for job_id, (_, sig) in seen.jobs.items()}
        try:  # one failing step of the upkeep never keeps the others (or admission) back
            self._credentials.refresh(jobs, sigs, seen.deadline_s)
            self._credentials.forget_others(set(seen.jobs))
        except Exception:
            log.exception("keeping jobs' storage credentials fresh failed; tried next tick")
        try:
            stranded = self.store.list_jobs(states=[JobState.PREEMPTED])
        except Exception:
            log.exception("reading stranded preemptions failed; tried next tick")
            stranded = []
        for job in stranded:
            try:
                self._preemption.requeue_stranded(job)
            except (StaleState, IllegalTransition):
                continue
            except Exception:
                log.exception("re-queueing stranded job %s failed", job.job_id)
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

    # -- sweeps ----------------------------------------------------------------------------

    def sweep_orphans(self) -> list[str]:
        """Stop every live Ray Job of ours (metadata ``rcp_job``) that is not the current
        attempt of an ADMITTED or RUNNING job (preempting ones included) in the store: e.g. a
        submission Ray accepted after the runner gave up on it while the controller restarted,
        so nothing was left to stop it. Rows that no longer validate keep their gang (their
        attempt is read from the raw info); cancel them to stop it. Returns the ids stopped."""
        scan = self.store.scan_jobs(states=[JobState.ADMITTED, JobState.RUNNING])
        keep = {submission_id(j.job_id, j.info) for j in scan.jobs}
        keep |= {submission_id(b.job_id, self.store.raw_info(b.job_id)) for b in scan.invalid}
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

    def _log_text(self, sid: str) -> str:
        """The end of the attempt's driver log (`limits.FAILED_LOG_TAIL_BYTES`), never the
        whole: the launcher's gang-failed line is its last line. "" when Ray cannot say."""
        try:
            tail = self.ray.log_tail(sid, limits.FAILED_LOG_TAIL_BYTES)
        except Exception:
            return ""
        return tail.data.decode("utf-8", errors="replace")
