"""Checkpoint interval: how often a training job should checkpoint, from what it costs and
how often the job fails.

This module owns the choice of the interval between checkpoints. It is pure: the job's
runner measures the training-visible stall per checkpoint, the background persist time
and the cluster's failure history, and passes numbers in; nothing here reads a clock,
touches Ray or does I/O.

The model. A checkpoint that stalls training for ``C`` seconds, taken every ``T`` seconds
of training, in a job whose mean time between failures is ``M``, loses about ``C / T`` to
stalls and ``T / 2`` (plus the time the newest checkpoint spends uploading, plus the
restart) to recomputation per failure. Young (1974) minimizes the sum: ``T = sqrt(2 C M)``.
Daly (2006) refines it for costs that are not small against ``M``::

    T = sqrt(2 C M) * (1 + sqrt(C / (2 M)) / 3 + (C / (2 M)) / 9) - C    if C < 2 M
    T = M                                                                otherwise

With asynchronous checkpoints ``C`` is the snapshot stall, not the upload, which is why
they can be taken often. The interval is then bounded: never below the persist time (a
save arriving while the last one still uploads would wait or be skipped), and within the
configured ``[min_interval_s, max_interval_s]``.

Worked example (numbers from the issue: a 7B model whose async stall is 6.3 s, a job that
fails every 3 h = 10,800 s, uploads taking 40 s):

    Young:  sqrt(2 * 6.3 * 10800) = sqrt(136080)              = 368.89 s
    Daly:   x = 6.3 / 21600 = 0.000292; 368.89 * (1 + 0.005693 + 0.000032) - 6.3
                                                              = 364.70 s
    bounds: max(60, 40) <= 364.70 <= 21600                    -> 364.70 s, reason daly
    waste:  6.3 / 364.70 + (364.70 / 2 + 40 + 0) / 10800      = 0.0173 + 0.0206 = 3.8 %

A synchronous checkpoint of the same model (148.8 s stall) gives T = 1,695 s and 16.6 %
waste: the stall, not the upload, is what makes checkpointing expensive.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class IntervalFormula(str, Enum):
    """Which optimum to use."""

    YOUNG = "young"
    DALY = "daly"


class IntervalReason(str, Enum):
    """Why the interval is what it is (ends up in the job's event log)."""

    YOUNG = "young"
    DALY = "daly"
    COST_EXCEEDS_MTBF = "cost_exceeds_mtbf"
    """Daly's regime C >= 2M: checkpoint once per MTBF."""
    BOUNDED_BY_PERSIST = "bounded_by_persist"
    """The optimum is shorter than one upload; checkpoint as soon as the last one lands."""
    BOUNDED_BY_MIN = "bounded_by_min"
    BOUNDED_BY_MAX = "bounded_by_max"


@dataclass(frozen=True)
class IntervalConfig:
    """Bounds and formula for the checkpoint interval."""

    min_interval_s: float = 60.0
    """Never checkpoint more often than this."""
    max_interval_s: float = 6 * 3600.0
    """Never go longer than this without a checkpoint, however reliable the cluster."""
    formula: IntervalFormula = IntervalFormula.DALY

    def __post_init__(self) -> None:
        if not (0 < self.min_interval_s <= self.max_interval_s):
            raise ValueError(
                "IntervalConfig needs 0 < min_interval_s <= max_interval_s, got "
                f"min_interval_s={self.min_interval_s}, max_interval_s={self.max_interval_s}"
            )


@dataclass(frozen=True)
class IntervalInputs:
    """What the runner measured."""

    stall_s: float
    """Training-visible cost of one checkpoint (e.g. the median of recent saves)."""
    mtbf_s: float
    """Mean time between failures of this job (all its nodes together)."""
    persist_s: float = 0.0
    """Background time from snapshot to commit."""
    restart_s: float = 0.0
    """Time to detect a failure, reschedule and restore (only affects the waste estimate)."""

    def __post_init__(self) -> None:
        for name in ("stall_s", "persist_s", "restart_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"IntervalInputs.{name} must be finite and >= 0, got {value}")
        if not (math.isfinite(self.mtbf_s) and self.mtbf_s > 0):
            raise ValueError(f"IntervalInputs.mtbf_s must be finite and > 0, got {self.mtbf_s}")


@dataclass(frozen=True)
class IntervalDecision:
    """The interval to use, the unbounded optimum, why, and the expected waste."""

    interval_s: float
    optimum_s: float
    reason: IntervalReason
    expected_waste_fraction: float
    """Share of wall time lost to stalls and recomputation at `interval_s` (first order)."""


def young_interval_s(stall_s: float, mtbf_s: float) -> float:
    """Young's optimum, sqrt(2 C M)."""
    return math.sqrt(2.0 * stall_s * mtbf_s)


def daly_interval_s(stall_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum; equals M once the cost reaches 2 M."""
    if stall_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = stall_s / (2.0 * mtbf_s)
    return young_interval_s(stall_s, mtbf_s) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - stall_s


def expected_waste_fraction(interval_s: float, inputs: IntervalInputs) -> float:
    """First-order share of time lost: stalls, plus recomputation and restart per failure."""
    stall_share = inputs.stall_s / interval_s
    failure_share = (interval_s / 2.0 + inputs.persist_s + inputs.restart_s) / inputs.mtbf_s
    return stall_share + failure_share


def checkpoint_interval(inputs: IntervalInputs, config: IntervalConfig) -> IntervalDecision:
    """The interval between checkpoints for the measured cost and failure rate."""
    if config.formula is IntervalFormula.YOUNG:
        optimum_s, reason = young_interval_s(inputs.stall_s, inputs.mtbf_s), IntervalReason.YOUNG
    elif inputs.stall_s >= 2.0 * inputs.mtbf_s:
        optimum_s, reason = inputs.mtbf_s, IntervalReason.COST_EXCEEDS_MTBF
    else:
        optimum_s, reason = daly_interval_s(inputs.stall_s, inputs.mtbf_s), IntervalReason.DALY
    interval_s = optimum_s
    floor_s = max(config.min_interval_s, inputs.persist_s)
    if interval_s > config.max_interval_s:
        interval_s, reason = config.max_interval_s, IntervalReason.BOUNDED_BY_MAX
    if interval_s < floor_s:
        interval_s = floor_s
        reason = (
            IntervalReason.BOUNDED_BY_PERSIST
            if inputs.persist_s > config.min_interval_s
            else IntervalReason.BOUNDED_BY_MIN
        )
    return IntervalDecision(
        interval_s=interval_s,
        optimum_s=optimum_s,
        reason=reason,
        expected_waste_fraction=expected_waste_fraction(interval_s, inputs),
    )


def job_mtbf_s(node_mtbf_s: float, num_nodes: int) -> float:
    """A job on `num_nodes` independent nodes fails `num_nodes` times as often as one."""
    if not (math.isfinite(node_mtbf_s) and node_mtbf_s > 0):
        raise ValueError(f"node_mtbf_s must be finite and > 0, got {node_mtbf_s}")
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be >= 1, got {num_nodes}")
    return node_mtbf_s / num_nodes


def estimate_mtbf_s(num_failures: int, observed_s: float, *, prior_mtbf_s: float) -> float:
    """MTBF from a failure history, with one pseudo-failure at `prior_mtbf_s`.

    (observed_s + prior_mtbf_s) / (num_failures + 1): the prior dominates a short or
    failure-free history, the history dominates a long one. Example: 2 failures in 20 h
    with a 7.9 h prior give (72000 + 28440) / 3 = 33480 s = 9.3 h.
    """
    if num_failures < 0:
        raise ValueError(f"num_failures must be >= 0, got {num_failures}")
    if not (math.isfinite(observed_s) and observed_s >= 0):
        raise ValueError(f"observed_s must be finite and >= 0, got {observed_s}")
    if not (math.isfinite(prior_mtbf_s) and prior_mtbf_s > 0):
        raise ValueError(f"prior_mtbf_s must be finite and > 0, got {prior_mtbf_s}")
    return (observed_s + prior_mtbf_s) / (num_failures + 1)


def typical_stall_s(samples_s: Sequence[float]) -> float:
    """The median of recent stall measurements (robust to one slow outlier)."""
    if not samples_s:
        raise ValueError("typical_stall_s needs at least one stall measurement")
    if any(not (math.isfinite(s) and s >= 0) for s in samples_s):
        raise ValueError(f"stall measurements must be finite and >= 0, got {list(samples_s)}")
    return float(statistics.median(samples_s))
