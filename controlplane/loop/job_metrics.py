"""The controller's recovery gauges: each active job's checkpoints and restarts, and the fleet's
GPU MTBF, exported through Ray's metrics pipeline (Prometheus sees them with a ``ray_`` prefix).

Owns: `job_gauges` (pure: one job's gauge values from what the control plane itself recorded,
`job_info.job_facts`, whatever the job's own code does), `GpuHoursMeter` (the cluster-pool
GPU-seconds watched, written to the fleet's failure record at most every `flush_interval_s`,
and the fleet's GPU MTBF) and `JobMetrics` (sets the gauges once per tick).

Series and cardinality: labels ``job_id``, ``name`` and ``queue`` only. A job has series
while the controller's tick lists it (QUEUED, ADMITTED, RUNNING) and once it has started at
least once; the running-only gauges only while it is RUNNING. Ray's metrics agent drops a
gauge series nobody sets for two report intervals (20 s by default), so an ended job's
series go on their own. The alert rules in ``infra/prometheus/rules.yml`` read these.

Must not: read or write the store beyond the fleet record, or decide anything.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from controlplane.config import Config
from controlplane.store import JobRecord, JobState, Store, recoveries, reliability
from controlplane.store.job_info import job_facts

__all__ = ["GpuHoursMeter", "JobGauges", "JobMetrics", "job_gauges"]

FLUSH_INTERVAL_S = 60.0
"""How often the GPU-hours watched go to the store: one kv write a minute, not one a tick."""
MAX_TICK_GAP_S = 60.0
"""The most seconds one tick may add: a longer gap (a tick hung, the host slept) is time
nobody watched the GPUs, so it does not count as failure-free GPU time."""

_TAGS = ("job_id", "name", "queue")


@dataclass(frozen=True)
class JobGauges:
    """One job's gauge values; None: no series for that gauge."""

    job_id: str
    name: str
    queue: str
    restarts: int
    hangs: int
    max_restarts: int
    running_since_s: float | None = None
    """When the job last turned RUNNING (set only while RUNNING)."""
    last_commit_s: float | None = None
    last_committed_step: int | None = None
    overhead_ratio: float | None = None
    checkpoint_interval_s: float | None = None
    """The spec's checkpoint.interval_s; 0 when its Young/Daly policy picks it; None when the
    job does not checkpoint (or is not RUNNING)."""
    ettr: float | None = None
    """Productive training time over wall time since the first admission (`store.recoveries`;
    None without `now_s` or before the first admission)."""
    last_recovery_s: float | None = None
    """The newest finished recovery's failure to first new step (None: none yet)."""

    @property
    def tags(self) -> dict[str, str]:
        return {"job_id": self.job_id, "name": self.name, "queue": self.queue}


def job_gauges(job: JobRecord, now_s: float | None = None) -> JobGauges | None:
    """The gauges of `job` at `now_s`, or None when it should have no series (it never
    started).

    Example: a RUNNING job since t=1000 whose step 40 committed at t=1900, that stalled 6 s
    of 1200 s and restarted once after a hang -> running_since_s=1000, last_commit_s=1900,
    last_committed_step=40, overhead_ratio=0.005, restarts=1, hangs=1."""
    if job.state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        return None
    facts = job_facts(job.info)
    started = job.state is not JobState.QUEUED or bool(job.info.get("attempt") or facts.attempts)
    if not started:
        return None
    done = [r.seconds for r in recoveries.recoveries(job.info) if r.seconds is not None]
    running = job.state in (JobState.ADMITTED, JobState.RUNNING)
    base = JobGauges(
        job_id=job.job_id,
        name=job.spec.name,
        queue=job.spec.queue,
        restarts=facts.restarts,
        hangs=facts.hangs,
        max_restarts=job.spec.max_restarts,
        ettr=None
        if now_s is None
        else recoveries.ettr(job.info, now_s, facts.stall_wall_s(running)[0]),
        last_recovery_s=done[-1] if done else None,
    )
    if job.state is not JobState.RUNNING:
        return base
    commit = facts.commit
    ckpt = job.spec.checkpoint
    interval_s = None
    if ckpt.enabled:
        interval_s = 0.0 if ckpt.interval_s is None else float(ckpt.interval_s)
    return dataclasses.replace(
        base,
        running_since_s=job.updated_s,
        last_commit_s=None if commit is None else commit.committed_unix_s,
        last_committed_step=None if commit is None else commit.step,
        overhead_ratio=facts.overhead_ratio(attempt_running=True),
        checkpoint_interval_s=interval_s,
    )


class GpuHoursMeter:
    """Cluster-pool GPU-seconds watched (`tick`, once per tick), flushed to the fleet record
    every `flush_interval_s`: a restart loses at most one interval's seconds (less
    failure-free time: the safe side for the checkpoint interval)."""

    def __init__(
        self, store: Store, cfg: Config, flush_interval_s: float = FLUSH_INTERVAL_S
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.flush_interval_s = flush_interval_s
        self.pending_gpu_s = 0.0
        self._last_s: float | None = None
        self._next_flush_s: float | None = None
        self.gpu_mtbf_hours: float | None = None
        """The fleet's mean GPU-hours between failures, as of the last flush."""

    def tick(self, gpus: int, now_s: float) -> None:
        if not math.isfinite(now_s):
            return
        if self._last_s is not None and gpus > 0:
            dt_s = min(MAX_TICK_GAP_S, max(0.0, now_s - self._last_s))
            self.pending_gpu_s += gpus * dt_s
        self._last_s = now_s
        if self._next_flush_s is None or now_s >= self._next_flush_s:
            self.flush(now_s)

    def flush(self, now_s: float) -> None:
        """Write the pending GPU-seconds (as 1 GPU for that many seconds: the same GPU-hours)
        and re-read the fleet's MTBF."""
        self._next_flush_s = now_s + self.flush_interval_s
        if self.pending_gpu_s > 0:
            reliability.accrue_gpu_hours(self.store, 1, self.pending_gpu_s, now_s)
            self.pending_gpu_s = 0.0
        rate = reliability.gpu_failure_rate_per_hour(self.store, self.cfg, now_s)
        self.gpu_mtbf_hours = 1.0 / rate


_JOB_GAUGES = (
    ("restarts", "rcp_job_restarts", "Crash and hang restarts the job has used (active jobs)."),
    ("hangs", "rcp_job_hangs", "Times the job was found hung (active jobs)."),
    (
        "max_restarts",
        "rcp_job_max_restarts",
        "The job's max_restarts (active jobs that have started).",
    ),
    (
        "running_since_s",
        "rcp_job_running_since_timestamp_seconds",
        "Unix time the job last turned RUNNING (RUNNING jobs only).",
    ),
    (
        "last_commit_s",
        "rcp_job_checkpoint_last_commit_timestamp_seconds",
        "Unix time the job's newest checkpoint committed, read from object storage "
        "(RUNNING jobs with a committed checkpoint only).",
    ),
    (
        "last_committed_step",
        "rcp_job_checkpoint_last_committed_step",
        "The job's newest committed checkpoint step (RUNNING jobs only).",
    ),
    (
        "overhead_ratio",
        "rcp_job_checkpoint_overhead_ratio",
        "Training time stalled on checkpoints over wall time, all attempts (RUNNING jobs).",
    ),
    (
        "ettr",
        "rcp_job_ettr_ratio",
        "Effective training time: productive training over wall time since the job's first "
        "admission (failures until caught up, and checkpoint stall, are not productive).",
    ),
    (
        "last_recovery_s",
        "rcp_job_last_recovery_seconds",
        "The job's newest recovery, failure to first new step (in place or re-queued).",
    ),
    (
        "checkpoint_interval_s",
        "rcp_job_checkpoint_interval_seconds",
        "The job's checkpoint.interval_s; 0 when Young/Daly picks it (RUNNING jobs that "
        "checkpoint).",
    ),
)
"""Each `JobGauges` field with a series: the gauge's name and description."""


class JobMetrics:
    """The gauges in Ray's metrics pipeline; `export` once per tick."""

    def __init__(self) -> None:
        # Deferred: ray is heavy, and the pure half of this module (tests) needs none of it.
        from ray.util.metrics import Gauge

        self.gauges: dict[str, Any] = {
            field: Gauge(name, doc, tag_keys=_TAGS) for field, name, doc in _JOB_GAUGES
        }
        self.mtbf = Gauge(
            "rcp_fleet_gpu_mtbf_hours",
            "Mean cluster-pool GPU-hours between failures (gang crashes, hangs, lost nodes, "
            "removals by health; decayed record plus the configured prior).",
            tag_keys=(),
        )

    def export(
        self, jobs: Iterable[JobRecord], gpu_mtbf_hours: float | None, now_s: float | None = None
    ) -> None:
        if gpu_mtbf_hours is not None and math.isfinite(gpu_mtbf_hours):
            self.mtbf.set(gpu_mtbf_hours)
        for job in jobs:
            g = job_gauges(job, now_s)
            if g is None:
                continue
            for field, gauge in self.gauges.items():
                value = getattr(g, field)
                if value is not None:
                    gauge.set(float(value), tags=g.tags)
