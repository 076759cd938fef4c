"""Counter deltas: normal growth, wrap at the counter's width, jitter, resets, bad readings."""

from __future__ import annotations

import pytest

from controlplane.telemetry.counters import CounterChange, CounterRates, counter_delta

C = CounterChange


@pytest.mark.parametrize(
    ("before", "after", "width", "increase", "change"),
    [
        pytest.param(10, 25, 32, 15, C.NORMAL, id="grows"),
        pytest.param(7, 7, 16, 0, C.NORMAL, id="unchanged"),
        pytest.param(2**32 - 10, 5, 32, 15, C.WRAPPED, id="wraps-at-32-bits"),
        pytest.param(2**16 - 1, 3, 16, 4, C.WRAPPED, id="wraps-at-16-bits"),
        pytest.param(2**64 - 100, 50, 64, 150, C.WRAPPED, id="wraps-at-64-bits"),
        pytest.param(1_000_000, 40, 32, None, C.RESET, id="reset-low-before-has-no-increase"),
        pytest.param(2**32 - 10, 2**31 + 5, 32, None, C.RESET, id="too-far-to-be-a-wrap"),
        pytest.param(2**31, 5, 32, None, C.RESET, id="mid-range-is-not-near-the-top"),
        pytest.param(2**40, 2**40 - 3, 64, 0, C.JITTER, id="jitter-is-no-increase"),
        pytest.param(2**40, 2**40 - 3, None, 0, C.JITTER, id="jitter-unknown-width"),
        pytest.param(1000, 990, 64, 0, C.JITTER, id="one-percent-is-jitter"),
        pytest.param(1000, 989, 64, None, C.RESET, id="more-than-one-percent-is-a-reset"),
        pytest.param(255, 253, 8, 0, C.JITTER, id="near-top-but-too-far-to-wrap-is-jitter"),
        pytest.param(-1, 5, 32, None, C.NEGATIVE, id="negative-before"),
        pytest.param(5, -1, 32, None, C.NEGATIVE, id="negative-after"),
        pytest.param(2**32 - 8, 12, None, 20, C.WRAPPED, id="unknown-width-tries-32"),
        pytest.param(2**64 - 50, 9, None, 59, C.WRAPPED, id="unknown-width-tries-64"),
        pytest.param(2**40, 3, None, None, C.RESET, id="unknown-width-reset"),
    ],
)
def test_counter_delta(
    before: int, after: int, width: int | None, increase: int | None, change: CounterChange
) -> None:
    d = counter_delta(before, after, width)
    assert (d.increase, d.change) == (increase, change)


def test_a_negative_value_is_a_bad_reading_not_an_exception() -> None:
    rates = CounterRates()
    assert rates.update("x", 40, 1.0) is None
    assert rates.update("x", -3, 2.0) is None
    assert rates.changes["x"] is C.NEGATIVE and rates.bad_readings == 1
    assert rates.take_problems() == ["counter x: negative value -3; reading ignored"]
    assert rates.update("x", 41, 3.0) == pytest.approx(0.5)  # 40 stayed the baseline
    assert rates.increase("y", -1) == 0 and rates.bad_readings == 2


def test_jitter_reads_as_zero_not_billions_per_second() -> None:
    rates = CounterRates()
    rates.update("x", 2**40, 1.0, 64)
    assert rates.update("x", 2**40 - 2, 2.0, 64) == 0.0
    assert rates.changes["x"] is C.JITTER
    # The higher value stays the baseline: the dip is not counted again on the way back up.
    assert rates.update("x", 2**40 + 1, 3.0, 64) == pytest.approx(1.0)


def test_a_rate_above_the_ceiling_is_discarded_and_counted() -> None:
    rates = CounterRates()
    rates.update("x", 99, 1.0, 32, max_per_s=1e6)
    assert rates.update("x", 5_000_000, 2.0, 32, max_per_s=1e6) is None
    assert rates.changes["x"] is C.IMPLAUSIBLE and rates.bad_readings == 1
    assert "above the plausible 1e+06/s" in rates.take_problems()[0]
    assert rates.take_problems() == []
    assert rates.update("x", 40, 3.0, 32, max_per_s=1e6) is None  # reset: no rate
    assert rates.changes["x"] is C.RESET
    assert rates.update("x", 41, 4.0, 32, max_per_s=1e6) == pytest.approx(1.0)


def test_rates_per_second_across_a_wrap_and_a_reset() -> None:
    rates = CounterRates()
    assert rates.update("x", 2**32 - 100, 10.0, 32) is None
    assert rates.changes["x"] is C.FIRST
    assert rates.update("x", 100, 12.0, 32) == pytest.approx(100.0)  # 200 over 2 s
    assert rates.changes["x"] is C.WRAPPED
    assert rates.update("x", 30, 13.0, 32) is None  # reset: no rate for that interval
    assert rates.changes["x"] is C.RESET
    assert rates.update("x", 40, 14.0, 32) == pytest.approx(10.0)  # counted from the reset
    assert rates.update("x", 50, 14.0, 32) is None  # time did not move


def test_forget_except_drops_counters_that_went_away() -> None:
    rates = CounterRates()
    rates.update("a", 1, 1.0)
    rates.update("b", 1, 1.0)
    rates.forget_except({"a"})
    assert rates.update("b", 5, 2.0) is None  # b starts afresh
    assert rates.update("a", 5, 2.0) == pytest.approx(4.0)
