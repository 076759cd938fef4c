"""The simulated training job: its phase and its work, restore and checkpoint arithmetic.

Owns: `JobPhase` and `JobRun` (a job restores, then trains in cycles of ``interval_s`` of work
and one checkpoint stall; `JobRun.at` says how much work is done and committed at any time,
`end_s` when the current run finishes if nothing stops it), and the per-job counts the report
reads (preemptions, failures, work lost to each, stall and restore seconds, the seconds held
restarting after failures, and the time behind: from each failure until the job's done work
is back where it was, `fell_behind` and `caught_up`, what the control plane's ETTR counts as
lost, `controlplane.store.recoveries`).

Must not: hold GPUs or move a job between phases on its own (`controlplane.simulate.world.World`
admits, preempts, fails and finishes runs), or draw random numbers (the trace holds them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from controlplane.simulate.trace import JobSpec

__all__ = ["JobPhase", "JobRun"]


class JobPhase(str, Enum):
    QUEUED = "queued"
    RUNNING = "running"
    CHECKPOINTING_OUT = "checkpointing_out"
    DONE = "done"
    REJECTED = "rejected"


@dataclass
class JobRun:
    spec: JobSpec
    interval_s: float
    stall_s: float
    restore_s: float
    phase: JobPhase = JobPhase.QUEUED
    placement: dict[str, int] = field(default_factory=dict)
    queued_s: float = 0.0
    not_before_s: float | None = None
    admitted_s: float = 0.0
    committed_s: float = 0.0
    """Work (seconds) safely in a checkpoint."""
    base_s: float = 0.0
    """Work committed when this run started."""
    compute_start_s: float = 0.0
    first_admit_s: float | None = None
    finish_s: float | None = None
    version: int = 0
    preemptions: int = 0
    failures: int = 0
    lost_failure_s: float = 0.0
    lost_preempt_s: float = 0.0
    stall_total_s: float = 0.0
    restore_total_s: float = 0.0
    failure_restart_s: float = 0.0
    """Seconds the gang held its GPUs restarting after a failure: in place, on a
    replacement node, or restoring at the re-admission that follows a failure's re-queue."""
    restore_is_failure: bool = False
    """The next admission's restore follows a failure (counted in `failure_restart_s`)."""
    restarts_in_place: int = 0
    replacements: int = 0
    """Node losses after which the gang restarted at once on another node (free or
    borrowed from serving)."""
    behind_since_s: float | None = None
    """When the failure the job has not caught up from happened (None: caught up)."""
    behind_work_s: float = 0.0
    """The work done when it failed: caught up once the job's done work is back there."""
    behind_total_s: float = 0.0
    """Closed recoveries' seconds from failure to caught up."""

    @property
    def gpus(self) -> int:
        return self.spec.gpus

    def at(self, now_s: float) -> tuple[float, float, float]:
        """(work done, work committed, stall seconds) of the current run at `now_s`."""
        e = now_s - self.compute_start_s
        if e <= 0:
            return self.base_s, self.base_s, 0.0
        cycle = self.interval_s + self.stall_s
        n = math.floor(e / cycle)
        r = e - n * cycle
        done = self.base_s + n * self.interval_s + min(r, self.interval_s)
        committed = (
            self.base_s + n * self.interval_s + (self.interval_s if r >= self.interval_s else 0.0)
        )
        stalls = n * self.stall_s + max(0.0, r - self.interval_s)
        work = self.spec.work_s
        return min(done, work), min(committed, work), stalls

    def last_commit_s(self, now_s: float) -> float | None:
        """When the newest checkpoint of this run committed (None: none yet this run and
        nothing before)."""
        e = now_s - self.compute_start_s
        cycle = self.interval_s + self.stall_s
        n = math.floor(e / cycle) if e > 0 else 0
        r = e - n * cycle if e > 0 else 0.0
        if r >= self.interval_s:
            return self.compute_start_s + n * cycle + self.interval_s
        if n > 0:
            return self.compute_start_s + (n - 1) * cycle + self.interval_s
        return self.admitted_s if self.base_s > 0 else None

    def reach_s(self, work_s: float) -> float:
        """When the current run's done work reaches `work_s` (at most the job's work)."""
        w = min(work_s, self.spec.work_s) - self.base_s
        if w <= 0:
            return self.compute_start_s
        return self.compute_start_s + w + (math.ceil(w / self.interval_s) - 1) * self.stall_s

    def fell_behind(self, now_s: float, done_s: float) -> None:
        """A failure at `now_s` with `done_s` of work done (an open recovery goes on)."""
        if self.behind_since_s is None:
            self.behind_since_s, self.behind_work_s = now_s, done_s
        else:
            self.behind_work_s = max(self.behind_work_s, done_s)

    def caught_up(self, now_s: float) -> None:
        """Close the open recovery if the current (running) run got back by `now_s`."""
        if self.behind_since_s is None or self.phase is not JobPhase.RUNNING:
            return
        at = self.reach_s(self.behind_work_s)
        if at <= now_s:
            self.behind_total_s += max(0.0, at - self.behind_since_s)
            self.behind_since_s = None

    def behind_s(self, now_s: float) -> float:
        """Seconds behind after failures up to `now_s` (an open recovery counts until then)."""
        self.caught_up(now_s)
        open_s = now_s - self.behind_since_s if self.behind_since_s is not None else 0.0
        return self.behind_total_s + max(0.0, open_s)

    def end_s(self) -> float:
        """When the current run finishes if nothing stops it."""
        left = max(0.0, self.spec.work_s - self.base_s)
        checkpoints = max(0, math.ceil(left / self.interval_s) - 1)
        return self.compute_start_s + left + checkpoints * self.stall_s
