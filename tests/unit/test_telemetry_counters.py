"""Counter deltas: normal growth, wrap at the counter's width, reset to zero."""

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
        pytest.param(1_000_000, 40, 32, 40, C.RESET, id="reset-low-before"),
        pytest.param(2**32 - 10, 2**31 + 5, 32, 2**31 + 5, C.RESET, id="too-far-to-be-a-wrap"),
        pytest.param(2**32 - 8, 12, None, 20, C.WRAPPED, id="unknown-width-tries-32"),
        pytest.param(2**64 - 50, 9, None, 59, C.WRAPPED, id="unknown-width-tries-64"),
        pytest.param(2**40, 3, None, 3, C.RESET, id="unknown-width-reset"),
    ],
)
def test_counter_delta(
    before: int, after: int, width: int | None, increase: int, change: CounterChange
) -> None:
    d = counter_delta(before, after, width)
    assert (d.increase, d.change) == (increase, change)


def test_negative_values_are_rejected() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        counter_delta(-1, 5)


def test_rates_per_second_across_a_wrap_and_a_reset() -> None:
    rates = CounterRates()
    assert rates.update("x", 2**32 - 100, 10.0, 32) is None
    assert rates.changes["x"] is C.FIRST
    assert rates.update("x", 100, 12.0, 32) == pytest.approx(100.0)  # 200 over 2 s
    assert rates.changes["x"] is C.WRAPPED
    assert rates.update("x", 30, 13.0, 32) == pytest.approx(30.0)  # reset: counted from 0
    assert rates.changes["x"] is C.RESET
    assert rates.update("x", 40, 13.0, 32) is None  # time did not move


def test_forget_except_drops_counters_that_went_away() -> None:
    rates = CounterRates()
    rates.update("a", 1, 1.0)
    rates.update("b", 1, 1.0)
    rates.forget_except({"a"})
    assert rates.update("b", 5, 2.0) is None  # b starts afresh
    assert rates.update("a", 5, 2.0) == pytest.approx(4.0)
