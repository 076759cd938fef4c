"""Checkpoint interval policy: Young/Daly optimum, bounds, MTBF estimates. No Ray."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from policies.checkpointing import (
    IntervalConfig,
    IntervalFormula,
    IntervalInputs,
    IntervalReason,
    checkpoint_interval,
    daly_interval_s,
    estimate_mtbf_s,
    expected_waste_fraction,
    job_mtbf_s,
    typical_stall_s,
    young_interval_s,
)


def inputs(stall_s: float = 6.3, mtbf_s: float = 10800.0, persist_s: float = 0.0) -> IntervalInputs:
    return IntervalInputs(stall_s=stall_s, mtbf_s=mtbf_s, persist_s=persist_s)


def config(
    min_interval_s: float = 1.0,
    max_interval_s: float = 1e9,
    formula: IntervalFormula = IntervalFormula.DALY,
) -> IntervalConfig:
    return IntervalConfig(min_interval_s, max_interval_s, formula)


@pytest.mark.parametrize(
    ("stall_s", "mtbf_s", "young_s"),
    [
        pytest.param(6.3, 10800.0, math.sqrt(136080.0), id="7B-async-3h"),
        pytest.param(50.0, 100.0, 100.0, id="cost-half-mtbf"),
        pytest.param(0.5, 3600.0, 60.0, id="half-second-stall-1h"),
    ],
)
def test_young_is_sqrt_two_cost_mtbf(stall_s: float, mtbf_s: float, young_s: float) -> None:
    assert young_interval_s(stall_s, mtbf_s) == pytest.approx(young_s)


@pytest.mark.parametrize(
    ("stall_s", "mtbf_s", "expected_s"),
    [
        # The worked example in the module docstring: 364.70 s.
        pytest.param(6.3, 10800.0, 364.70, id="docstring-example"),
        # x = C/2M = 0.25: sqrt(2*50*100) * (1 + 0.5/3 + 0.25/9) - 50
        pytest.param(50.0, 100.0, 100.0 * (1 + 0.5 / 3 + 0.25 / 9) - 50.0, id="large-cost"),
        pytest.param(300.0, 100.0, 100.0, id="cost-beyond-2-mtbf-is-mtbf"),
    ],
)
def test_daly_refinement(stall_s: float, mtbf_s: float, expected_s: float) -> None:
    assert daly_interval_s(stall_s, mtbf_s) == pytest.approx(expected_s, abs=0.01)


def test_daly_approaches_young_when_cost_is_small() -> None:
    young_s = young_interval_s(0.01, 1e6)
    assert daly_interval_s(0.01, 1e6) == pytest.approx(young_s, rel=1e-3)
    assert daly_interval_s(0.01, 1e6) != young_s


@pytest.mark.parametrize(
    ("case", "cfg", "expected_s", "reason"),
    [
        pytest.param(inputs(), config(), 364.70, IntervalReason.DALY, id="daly"),
        pytest.param(
            inputs(),
            config(formula=IntervalFormula.YOUNG),
            math.sqrt(136080.0),
            IntervalReason.YOUNG,
            id="young",
        ),
        pytest.param(
            inputs(), config(min_interval_s=600.0), 600.0, IntervalReason.BOUNDED_BY_MIN, id="min"
        ),
        pytest.param(
            inputs(), config(max_interval_s=120.0), 120.0, IntervalReason.BOUNDED_BY_MAX, id="max"
        ),
        pytest.param(
            inputs(persist_s=900.0),
            config(min_interval_s=60.0),
            900.0,
            IntervalReason.BOUNDED_BY_PERSIST,
            id="slow-upload-bounds-interval",
        ),
        pytest.param(
            inputs(stall_s=500.0, mtbf_s=200.0),
            config(),
            200.0,
            IntervalReason.COST_EXCEEDS_MTBF,
            id="cost-exceeds-mtbf",
        ),
    ],
)
def test_checkpoint_interval(
    case: IntervalInputs, cfg: IntervalConfig, expected_s: float, reason: IntervalReason
) -> None:
    decision = checkpoint_interval(case, cfg)
    assert decision.interval_s == pytest.approx(expected_s, abs=0.01)
    assert decision.reason is reason
    assert decision.expected_waste_fraction == pytest.approx(
        expected_waste_fraction(decision.interval_s, case)
    )


def test_optimum_minimizes_expected_waste() -> None:
    case = inputs(stall_s=6.3, mtbf_s=10800.0)
    best = checkpoint_interval(case, config())
    for factor in (0.5, 0.8, 1.25, 2.0):
        waste = expected_waste_fraction(best.interval_s * factor, case)
        assert waste > best.expected_waste_fraction


def test_worked_example_waste_matches_docstring() -> None:
    decision = checkpoint_interval(inputs(persist_s=40.0), IntervalConfig())
    assert decision.expected_waste_fraction == pytest.approx(0.0379, abs=5e-4)


@pytest.mark.parametrize(
    ("num_failures", "observed_s", "prior_s", "expected_s"),
    [
        pytest.param(2, 72000.0, 28440.0, 33480.0, id="docstring-example"),
        pytest.param(0, 0.0, 28440.0, 28440.0, id="no-history-is-prior"),
        pytest.param(1000, 3.6e6, 28440.0, (3.6e6 + 28440.0) / 1001, id="long-history"),
    ],
)
def test_estimate_mtbf(
    num_failures: int, observed_s: float, prior_s: float, expected_s: float
) -> None:
    estimate_s = estimate_mtbf_s(num_failures, observed_s, prior_mtbf_s=prior_s)
    assert estimate_s == pytest.approx(expected_s)


def test_job_mtbf_divides_by_nodes() -> None:
    assert job_mtbf_s(8 * 3600.0, 16) == pytest.approx(1800.0)


def test_typical_stall_is_median() -> None:
    assert typical_stall_s([0.1, 0.2, 9.0]) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(lambda: IntervalInputs(-1.0, 1.0), "stall_s", id="negative-stall"),
        pytest.param(lambda: IntervalInputs(1.0, 0.0), "mtbf_s", id="zero-mtbf"),
        pytest.param(lambda: IntervalInputs(math.nan, 1.0), "stall_s", id="nan-stall"),
        pytest.param(lambda: IntervalConfig(10.0, 5.0), "min_interval_s", id="min-above-max"),
        pytest.param(lambda: job_mtbf_s(100.0, 0), "num_nodes", id="zero-nodes"),
        pytest.param(
            lambda: estimate_mtbf_s(-1, 1.0, prior_mtbf_s=1.0), "num_failures", id="neg-failures"
        ),
        pytest.param(lambda: typical_stall_s([]), "at least one", id="no-stall-samples"),
    ],
)
def test_bad_input_names_the_field(build: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()
