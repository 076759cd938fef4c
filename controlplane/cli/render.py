"""How `rcp status` and `rcp queue` print jobs: the job table and one job's recovery block.

Must not: call the API or print (the job commands do).
"""

from __future__ import annotations

import time
from typing import Any

from controlplane.inventory import text_table

__all__ = ["JOB_HEADER", "job_row", "local_time", "recovery_lines", "text_table"]


def job_row(job: Any) -> tuple[str, ...]:
    step = job.last_committed_step
    return (
        job.id,
        job.name,
        job.state,
        job.priority_class,
        job.queue,
        job.owner or "-",
        f"{job.num_workers}x{job.gpus_per_worker}",
        str(job.num_preemptions),
        f"{job.restarts}/{'-' if job.max_restarts is None else job.max_restarts}",
        "-" if step is None else str(step),
    )


def _duration(seconds: float) -> str:
    """``42s``, ``12m 5s``, ``3h 4m``, ``2d 5h``: a duration a person reads at a glance."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def local_time(t_s: float | None, none: str = "-") -> str:
    """``2024-05-01 13:02:03`` in local time; `none` for no time."""
    return none if t_s is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t_s))


def recovery_lines(job: Any) -> list[str]:
    """`rcp status ID`'s checkpoint and restart block (see `controlplane.sdk.Job`)."""
    ckpt = job.last_checkpoint
    if not ckpt:
        lines = ["checkpoint:  no checkpoint committed yet"]
    else:
        age = ckpt.get("age_s")
        when = "" if age is None else f", committed {_duration(age)} ago"
        where = f" ({ckpt['uri']})" if ckpt.get("uri") else ""
        lines = [f"checkpoint:  step {ckpt.get('step')}{when}{where}"]
    stall = float(job.raw.get("checkpoint_stall_s") or 0.0)
    wall = float(job.raw.get("checkpoint_wall_s") or 0.0)
    if job.checkpoint_overhead_pct is None:
        lines.append("overhead:    no training time measured yet")
    else:
        lines.append(
            f"overhead:    {job.checkpoint_overhead_pct:.2f}% of training time stalled on "
            f"checkpoints ({stall:.1f}s of {wall:.0f}s)"
        )
    limit = "-" if job.max_restarts is None else str(job.max_restarts)
    hangs = f" ({job.hangs} after a hang)" if job.hangs else ""
    lines.append(f"restarts:    {job.restarts} of {limit} used{hangs}")
    if job.ettr is not None:
        lines.append(
            f"ettr:        {100 * job.ettr:.1f}% of wall time since admission spent training"
        )
    progress = job.progress
    if progress:
        age = progress.get("step_age_s")
        grew = "" if age is None else f", last grew {_duration(age)} ago"
        lines.append(f"progress:    step {progress.get('step')}{grew}")
    if job.attempts:
        rows: list[tuple[str, ...]] = [
            (
                ("-" if a.attempt is None else str(a.attempt))
                + ("" if a.in_place is None else f" (in place {a.in_place})"),
                local_time(a.ended_s),
                a.kind,
                "-" if a.step is None else str(a.step),
                a.reason,
            )
            for a in job.attempts
        ]
        lines.append("attempts:")
        table = text_table(rows, ("ATTEMPT", "ENDED", "KIND", "STEP", "REASON"))
        lines += ["  " + line for line in table.splitlines()]
    if job.recoveries:
        recovered: list[tuple[str, ...]] = [
            (
                local_time(r.get("failed_s")),
                str(r.get("kind") or "-"),
                "in place" if r.get("in_place") else "re-queued",
                "recovering" if r.get("seconds") is None else f"{r['seconds']:.1f}s",
                str(r.get("source") or "-"),
                "-" if r.get("restored_step") is None else str(r["restored_step"]),
            )
            for r in job.recoveries
        ]
        lines.append("recoveries (failure -> first new step):")
        header = ("FAILED", "KIND", "HOW", "TOOK", "RESTORED FROM", "STEP")
        lines += ["  " + line for line in text_table(recovered, header).splitlines()]
    return lines


JOB_HEADER = (
    "ID", "NAME", "STATE", "PRIORITY", "QUEUE", "OWNER", "GANG", "PREEMPTED", "RESTARTS",
    "CHECKPOINT",
)  # fmt: skip
