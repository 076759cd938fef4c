"""Retention: which steps' objects to delete and which unfinished uploads to abort.

`plan_retention` is a pure function of the keys in storage; the engine applies its plan.
The rules: keep the newest `keep_last` committed steps and every step marked keep; delete
older committed steps (manifest first, so a step stops being visible before its data
goes); delete uncommitted steps older than the newest committed one (their writers have
provably moved on: ranks persist in order and the newest commit needed every rank);
leave newer uncommitted steps alone (they may still be uploading). Keys outside the layout
(not ``step-<S>/...`` right below the root: another job's prefix nested below it) are never
deleted or aborted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from jobs.checkpoint.layout import KEEP_NAME, MANIFEST_NAME, manifest_key, step_of_key


@dataclass(frozen=True)
class RetentionPlan:
    """Steps to drop, and the keys to delete in order (manifests before data)."""

    kept_steps: tuple[int, ...]
    deleted_committed_steps: tuple[int, ...]
    deleted_partial_steps: tuple[int, ...]
    keys_in_order: tuple[str, ...]
    newest_committed_step: int | None


def plan_retention(keys: Iterable[str], *, keep_last: int) -> RetentionPlan:
    """What to delete so that `keep_last` committed steps (plus keep-marked ones) remain."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    by_step: dict[int, list[str]] = {}
    committed: set[int] = set()
    marked: set[int] = set()
    for key in keys:
        step = step_of_key(key)
        if step is None:
            continue
        by_step.setdefault(step, []).append(key)
        name = key.rsplit("/", 1)[-1]
        if name == MANIFEST_NAME:
            committed.add(step)
        elif name == KEEP_NAME:
            marked.add(step)
    newest_first = sorted(committed, reverse=True)
    kept = set(newest_first[:keep_last]) | (marked & committed)
    newest = newest_first[0] if newest_first else None
    drop_committed = sorted(committed - kept)
    drop_partial = sorted(
        s for s in by_step if s not in committed and newest is not None and s < newest
    )
    ordered: list[str] = [manifest_key(s) for s in drop_committed]
    for step in drop_committed + drop_partial:
        ordered.extend(sorted(k for k in by_step[step] if k != manifest_key(step)))
    return RetentionPlan(
        kept_steps=tuple(sorted(kept)),
        deleted_committed_steps=tuple(drop_committed),
        deleted_partial_steps=tuple(drop_partial),
        keys_in_order=tuple(ordered),
        newest_committed_step=newest,
    )


def should_abort_upload(
    key: str, age_s: float, *, newest_committed_step: int | None, max_upload_age_s: float
) -> bool:
    """An unfinished upload is abandoned if its step predates the newest commit or it is old.

    Only uploads of this job's own layout (``step-<S>/...`` right below the storage root) are
    ever abandoned: anything else under the root (another job's prefix below it, a user's own
    files) belongs to someone else, however old."""
    step = step_of_key(key)
    if step is None:
        return False
    if newest_committed_step is not None and step < newest_committed_step:
        return True
    return age_s > max_upload_age_s
