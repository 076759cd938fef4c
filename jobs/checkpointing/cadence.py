"""Cadence: whether a step is due for a checkpoint by count or by time, and Young/Daly.

Owns: the checks of the cadence arguments (`check_cadence`), the due test (`is_due`: after
every n-th step, ``(step + 1) % n == 0``, else once `interval_s` has passed since the last
save or the start) and the Young/Daly interval (`young_daly_s`, through
`policies.checkpointing`) from the measured stalls, the last upload time and the MTBF.

Must not: agree across ranks (see `agreement`), ask the control plane (see `reporting`), or
read the environment (see `settings`). Pure: time comes in as arguments.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from jobs.checkpointing.settings import MAX_SECONDS
from policies.checkpointing import (
    IntervalConfig,
    IntervalInputs,
    checkpoint_interval,
    typical_stall_s,
)

__all__ = ["check_cadence", "is_due", "young_daly_s"]


def check_cadence(
    every_n_steps: int | None, interval_s: float | None, mtbf_s: float | None
) -> None:
    """Refuse a cadence argument that cannot work, with a message naming it."""
    if every_n_steps is not None and (
        isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1
    ):
        raise ValueError(f"every_n_steps must be an int >= 1 or None, got {every_n_steps!r}")
    for name, value in (("interval_s", interval_s), ("mtbf_s", mtbf_s)):
        if value is not None and not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
            raise ValueError(f"{name} must be a finite number in (0, {MAX_SECONDS:g}]")


def is_due(
    step: int,
    now_s: float,
    *,
    every_n_steps: int | None,
    interval_s: float | None,
    last_save_s: float,
) -> bool:
    """Whether `step` is due by count (`every_n_steps`) or by time (`interval_s`)::

    is_due(9, 0.0, every_n_steps=5, interval_s=None, last_save_s=0.0)      -> True
    is_due(9, 130.0, every_n_steps=None, interval_s=120.0, last_save_s=5.0) -> True
    """
    if every_n_steps is not None:
        return (step + 1) % every_n_steps == 0
    assert interval_s is not None
    return now_s - last_save_s >= interval_s


def young_daly_s(
    stalls_s: Iterable[float], *, mtbf_s: float, persist_s: float, bounds: IntervalConfig
) -> float:
    """The Young/Daly interval from the recent stalls, the MTBF and the last upload time."""
    return checkpoint_interval(
        IntervalInputs(stall_s=typical_stall_s(list(stalls_s)), mtbf_s=mtbf_s, persist_s=persist_s),
        bounds,
    ).interval_s
