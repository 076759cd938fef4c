"""A job's recoveries and its effective training time (ETTR), kept in its info.

Owns the info keys that time each recovery, and the pure functions that write and read them:

* ``recovering``: a failure the gang has not recovered from yet, ``{"failed_s", "kind",
  "in_place", "step"}`` (``step``: the last step reported before it), written by `failed` when
  a gang that ran is stopped and will run again (a crash, a hang, a lost node, a preemption
  or a move by node health: each one's wait counts against ETTR) or the run restarts its
  workers in place;
* ``recoveries``: each recovery, newest last (at most `MAX_RECOVERIES_KEPT`), ``{"failed_s",
  "resumed_s", "seconds", "kind", "in_place", "step", "restored_step", "source",
  "caught_up_s"}``: ``seconds`` from the failure to the first new step, ``source`` the tier
  the restore read (``memory`` or ``storage``, as the job reported it; None when it started
  fresh or did not say), ``caught_up_s`` when the job passed the step it had reached before
  the failure (`observed` writes both as the job reports progress);
* ``first_admitted_s``: when the job's gang was first admitted (`admitted`);
* a job that ended well caught up with every failure by its end (`finished`).

ETTR (`ettr`) is productive training time over wall time since the first admission:
``(wall - lost - stall) / wall``, where ``lost`` is the time from each failure until the job
caught up with the step it had reached (the restart, the restore and the steps done again; an
open one counts until now; overlapping ones once) and ``stall`` is the checkpoint stall. Example: admitted 1,000 s ago,
one crash that took 20 s to the first new step and 30 s more to catch up, 5 s of checkpoint
stall: (1000 - 50 - 5) / 1000 = 0.945.

Must not: read or write the store, or call Ray (pure functions of info and what was read).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.store.job_info import as_count, as_finite, as_mapping
from jobs.signals.reports import RESTORE_SOURCES

__all__ = [
    "MAX_RECOVERIES_KEPT",
    "RESTORE_SOURCES",
    "Recovery",
    "admitted",
    "ettr",
    "failed",
    "finished",
    "observed",
    "recoveries",
]

MAX_RECOVERIES_KEPT = 100


def admitted(info: Mapping[str, Any], now_s: float) -> dict[str, Any]:
    """``first_admitted_s`` at the job's first admission ({} after)."""
    return (
        {} if as_finite(info.get("first_admitted_s")) is not None else {"first_admitted_s": now_s}
    )


def failed(
    info: Mapping[str, Any],
    failed_s: float,
    kind: str,
    in_place: bool,
    step: int | None = None,
) -> dict[str, Any]:
    """Start timing a recovery; `step` is the last step the failed run reported (default: the
    recorded progress's). A failure while the gang is still recovering from an earlier one (a
    restart in place that never trained, say) goes on timing that one, from its failure and
    its step, as this failure's kind."""
    open_ = as_mapping(info.get("recovering"))
    if as_finite(open_.get("failed_s")) is not None:
        return {"recovering": {**open_, "kind": kind, "in_place": in_place}}
    if step is None:
        step = as_count(as_mapping(info.get("progress")).get("step"))
    return {"recovering": {"failed_s": failed_s, "kind": kind, "in_place": in_place, "step": step}}


def finished(info: Mapping[str, Any], end_s: float) -> dict[str, Any]:
    """The job ended well: a recovery not yet marked caught up was by `end_s` at the latest
    (the steps after it may have run between two reads of the job's progress). {} when none."""
    kept = _entries(info.get("recoveries"))
    if not any(e.get("caught_up_s") is None for e in kept):
        return {}
    for e in kept:
        if e.get("caught_up_s") is None:
            e["caught_up_s"] = end_s
    return {"recoveries": kept}


def observed(
    info: Mapping[str, Any], progress: Mapping[str, Any] | None, restore: Mapping[str, Any] | None
) -> dict[str, Any]:
    """What the gang's progress says about its recoveries: the first step after the open
    failure closes it (with where the restore came from, `restore`: the signals actor's
    ``{"step", "source"}`` of this run, and the failed attempt's ``checkpoint_step`` made the
    step it restored), a step past the one reached before a failure marks it caught up. {}
    when nothing changed."""
    if progress is None:
        return {}
    step, step_at_s = as_count(progress.get("step")), as_finite(progress.get("step_at_s"))
    if step is None or step_at_s is None:
        return {}
    raw = info.get("recoveries")
    newest = as_mapping(raw[-1]) if isinstance(raw, list) and raw else {}
    if info.get("recovering") is None and (not newest or newest.get("caught_up_s") is not None):
        return {}  # the common tick: nothing to time, nothing copied
    kept = _entries(raw)
    changed = False
    open_ = as_mapping(info.get("recovering"))
    failed_s = as_finite(open_.get("failed_s"))
    updates: dict[str, Any] = {}
    if failed_s is not None and step_at_s >= failed_s:
        restore = as_mapping(restore)
        source = restore.get("source")
        kept.append(
            {
                "failed_s": failed_s,
                "resumed_s": step_at_s,
                "seconds": step_at_s - failed_s,
                "kind": str(open_.get("kind") or "crash"),
                "in_place": bool(open_.get("in_place")),
                "step": as_count(open_.get("step")),
                "restored_step": as_count(restore.get("step")),
                "source": source if source in RESTORE_SOURCES else None,
                "caught_up_s": None,
            }
        )
        updates["recovering"] = None
        updates.update(_resumed_from(info, as_count(restore.get("step"))))
        changed = True
    last = kept[-1] if kept else None
    if last is not None and last.get("caught_up_s") is None:
        before = as_count(last.get("step"))
        if before is None or step > before:
            last["caught_up_s"] = step_at_s
            changed = True
    if changed:
        updates["recoveries"] = kept[-MAX_RECOVERIES_KEPT:]
    return updates


def _resumed_from(info: Mapping[str, Any], step: int | None) -> dict[str, Any]:
    """The newest attempt end's ``checkpoint_step`` set to `step`, the step the run after it
    restored (what storage showed when it ended may lag the commit the next run found)."""
    raw = info.get("attempts")
    if step is None or not isinstance(raw, list) or not raw or not isinstance(raw[-1], Mapping):
        return {}
    if as_count(raw[-1].get("checkpoint_step")) == step:
        return {}
    return {"attempts": [*raw[:-1], {**raw[-1], "checkpoint_step": step}]}


@dataclass(frozen=True)
class Recovery:
    """One recovery, read back typed (`recoveries`)."""

    failed_s: float
    kind: str
    in_place: bool
    seconds: float | None
    """Failure to the first new step (None: not resumed yet)."""
    source: str | None
    restored_step: int | None
    caught_up_s: float | None


def recoveries(info: Mapping[str, Any]) -> tuple[Recovery, ...]:
    """Every recovery, oldest first, the open one last (never raises on a malformed entry)."""
    out = []
    entries = _entries(info.get("recoveries"))
    open_ = as_mapping(info.get("recovering"))
    if as_finite(open_.get("failed_s")) is not None:
        entries.append({**open_, "seconds": None})
    for e in entries:
        failed_s = as_finite(e.get("failed_s"))
        if failed_s is None:
            continue
        source = e.get("source")
        out.append(
            Recovery(
                failed_s=failed_s,
                kind=str(e.get("kind") or "crash")[:40],
                in_place=bool(e.get("in_place")),
                seconds=as_finite(e.get("seconds")),
                source=source if source in RESTORE_SOURCES else None,
                restored_step=as_count(e.get("restored_step")),
                caught_up_s=as_finite(e.get("caught_up_s")),
            )
        )
    return tuple(out)


def ettr(info: Mapping[str, Any], now_s: float, stall_s: float = 0.0) -> float | None:
    """Effective training time ratio at `now_s` (the job's end, once it ended) with `stall_s`
    seconds of checkpoint stall (see the module doc); None before the first admission. Lost
    time is the union of the recoveries' spans (a failure while catching up counts once)."""
    start = as_finite(info.get("first_admitted_s"))
    if start is None or now_s <= start:
        return None
    wall = now_s - start
    spans = sorted(
        (r.failed_s, min(now_s, r.caught_up_s if r.caught_up_s is not None else now_s))
        for r in recoveries(info)
    )
    lost, reached = 0.0, start
    for begin, end in spans:
        begin = max(begin, reached)
        if end > begin:
            lost += end - begin
            reached = end
    return max(0.0, min(1.0, (wall - lost - max(0.0, stall_s)) / wall))


def _entries(raw: Any) -> list[dict[str, Any]]:
    return [dict(e) for e in raw if isinstance(e, Mapping)] if isinstance(raw, list) else []
