"""Counter arithmetic: the increase of a cumulative counter between two reads.

Owns: `counter_delta` (wrap and reset) and `CounterRates` (per-second rates keyed by name).
Must not: read counters or know what they mean.

A counter that went down either wrapped at its width or was reset (driver reload, GPU reset,
port reset, an exporter restart). The rule: if the counter has a known width W (bits) and the
value before was in the upper half of its range while the wrapped increase
``2**W - before + after`` is below half the range, it wrapped; otherwise it was reset and the
increase is ``after`` (it counted up from zero). A counter whose width is unknown is tried at
32 then 64 bits (sysfs shows 32-bit legacy or 64-bit extended IB data counters).
A counter at the top of its range is saturated (InfiniBand error counters stop there rather
than wrap): its increase reads 0; the InfiniBand reader reports it as a problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["CounterChange", "CounterRates", "Delta", "counter_delta"]


class CounterChange(str, Enum):
    FIRST = "first"
    """No earlier value: no increase yet."""
    NORMAL = "normal"
    WRAPPED = "wrapped"
    RESET = "reset"


@dataclass(frozen=True)
class Delta:
    increase: int
    change: CounterChange


def counter_delta(before: int, after: int, width_bits: int | None = None) -> Delta:
    """The increase from `before` to `after` of a counter `width_bits` wide (None: 32 or 64)."""
    if before < 0 or after < 0:
        raise ValueError(f"counters are non-negative, got before={before}, after={after}")
    if after >= before:
        return Delta(after - before, CounterChange.NORMAL)
    for width in (width_bits,) if width_bits else (32, 64):
        top = 1 << width
        if before < top and before >= top >> 1:
            wrapped = top - before + after
            if wrapped < top >> 1:
                return Delta(wrapped, CounterChange.WRAPPED)
    return Delta(after, CounterChange.RESET)


class CounterRates:
    """Per-second rates of named counters from successive reads (one instance per agent)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}
        self.changes: dict[str, CounterChange] = {}
        """How each counter changed at its latest update (for display and tests)."""

    def update(
        self, key: str, value: int, t_s: float, width_bits: int | None = None
    ) -> float | None:
        """Record `value` at `t_s`; the rate since the previous read, or None on the first
        read or when time did not move forward."""
        previous = self._last.get(key)
        self._last[key] = (t_s, value)
        if previous is None:
            self.changes[key] = CounterChange.FIRST
            return None
        t0, v0 = previous
        delta = counter_delta(v0, value, width_bits)
        self.changes[key] = delta.change
        if t_s <= t0:
            return None
        return delta.increase / (t_s - t0)

    def increase(self, key: str, value: int, width_bits: int | None = None) -> int:
        """The plain increase since the previous `increase` call for `key` (0 the first time)."""
        previous = self._last.get(key)
        self._last[key] = (0.0, value)
        if previous is None:
            self.changes[key] = CounterChange.FIRST
            return 0
        delta = counter_delta(previous[1], value, width_bits)
        self.changes[key] = delta.change
        return delta.increase

    def forget_except(self, keys: set[str]) -> None:
        """Drop counters not read any more (a port or GPU that went away)."""
        for key in set(self._last) - keys:
            del self._last[key]
            self.changes.pop(key, None)
