"""Counter arithmetic: the increase of a cumulative counter between two reads.

Owns: `counter_delta` (wrap, reset, jitter, bad values) and `CounterRates` (per-second rates
keyed by name, with a plausibility ceiling and a count of bad readings).
Must not: read counters or know what they mean.

A counter that went down is judged against its width and against what is plausible:

1. A negative value is a bad reading (`NEGATIVE`): no increase, the previous value stays the
   baseline, and nothing else of the sample is lost (no exception).
2. A wrap (`WRAPPED`): the counter has a width W (bits), the value before was in the top
   quarter of its range (``before >= 3/4 * 2**W``) and the wrapped increase
   ``2**W - before + after`` is below a quarter of the range. A counter whose width is unknown
   is tried at 32 then 64 bits (sysfs shows 32-bit legacy or 64-bit extended IB counters).
3. Jitter (`JITTER`): the value kept at least ``1 - JITTER_RATIO`` (99%) of what it was. A
   reset starts near zero; a counter that loses a hair (float rounding of a big value in an
   exporter, two readers racing) did not reset. Read as no increase, not as a reset worth
   ``after`` counts (which at 2**40 is a trillion errors in one interval).
4. Anything else is a reset (`RESET`: driver reload, GPU or port reset, exporter restart): no
   increase is known for that interval (None), so no rate; the next interval counts from the
   new value.

`CounterRates` also drops a rate above the caller's plausibility ceiling (`IMPLAUSIBLE`: a
wrap or a glitch that would mean more errors per second than any link moves flits or symbols)
and counts it, like a negative value, as a bad reading (`bad_readings`, `take_problems`).

A counter at the top of its range is saturated (InfiniBand error counters stop there rather
than wrap): its increase reads 0; the InfiniBand reader reports it as a problem.

Worked example (32-bit counter, one read per second, ceiling 1e6/s): 4294967200 -> 100 is a
wrap (+196/s); 100 -> 99 is jitter (0/s); 99 -> 5_000_000 is +4,999,901 in 1 s, above the
ceiling: discarded, one bad reading, 5,000,000 becomes the baseline; 5_000_000 -> 40 is a
reset (no rate); 40 -> -3 is a bad reading (no rate, 40 stays the baseline); 40 -> 41: 1/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["JITTER_RATIO", "CounterChange", "CounterRates", "Delta", "counter_delta"]

JITTER_RATIO = 0.01
"""A decrease of at most this fraction of the value before is jitter, not a reset."""


class CounterChange(str, Enum):
    FIRST = "first"
    """No earlier value: no increase yet."""
    NORMAL = "normal"
    WRAPPED = "wrapped"
    JITTER = "jitter"
    """A small decrease: no increase."""
    RESET = "reset"
    """Counted up again from near zero: no increase known for the interval."""
    NEGATIVE = "negative"
    """A negative value: a bad reading."""
    IMPLAUSIBLE = "implausible"
    """A rate above the plausibility ceiling: a bad reading (only `CounterRates` says so)."""


@dataclass(frozen=True)
class Delta:
    increase: int | None
    """None when no increase is known: a reset or a bad reading."""
    change: CounterChange


def counter_delta(before: int, after: int, width_bits: int | None = None) -> Delta:
    """The increase from `before` to `after` of a counter `width_bits` wide (None: 32 or 64)."""
    if before < 0 or after < 0:
        return Delta(None, CounterChange.NEGATIVE)
    if after >= before:
        return Delta(after - before, CounterChange.NORMAL)
    for width in (width_bits,) if width_bits else (32, 64):
        top = 1 << width
        quarter = top >> 2
        if top - quarter <= before < top:
            wrapped = top - before + after
            if wrapped < quarter:
                return Delta(wrapped, CounterChange.WRAPPED)
    if after >= before * (1.0 - JITTER_RATIO):
        return Delta(0, CounterChange.JITTER)
    return Delta(None, CounterChange.RESET)


class CounterRates:
    """Per-second rates of named counters from successive reads (one instance per agent)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}
        self.changes: dict[str, CounterChange] = {}
        """How each counter changed at its latest update (for display and tests)."""
        self.bad_readings = 0
        """Negative values and implausible rates seen since the agent started."""
        self._problems: list[str] = []

    def _bad(self, key: str, change: CounterChange, text: str) -> None:
        self.changes[key] = change
        self.bad_readings += 1
        self._problems.append(f"counter {key}: {text}")

    def take_problems(self) -> list[str]:
        """What went wrong since the last call (bad readings), for the sample's problems."""
        problems, self._problems = self._problems, []
        return problems

    def _advance(
        self, key: str, value: int, t_s: float, width_bits: int | None
    ) -> tuple[float, int, Delta] | None:
        """Record `value` read at `t_s`: (time and value read before, the change), or None
        for a bad (negative) value and for the first read of `key`."""
        previous = self._last.get(key)
        if value < 0:
            self._bad(key, CounterChange.NEGATIVE, f"negative value {value}; reading ignored")
            return None
        if previous is None:
            self._last[key] = (t_s, value)
            self.changes[key] = CounterChange.FIRST
            return None
        t0, v0 = previous
        delta = counter_delta(v0, value, width_bits)
        # Jitter keeps the higher value as the baseline, so the dip is not counted twice.
        self._last[key] = (t_s, v0 if delta.change is CounterChange.JITTER else value)
        self.changes[key] = delta.change
        return t0, v0, delta

    def update(
        self,
        key: str,
        value: int,
        t_s: float,
        width_bits: int | None = None,
        max_per_s: float | None = None,
    ) -> float | None:
        """Record `value` at `t_s`; the rate since the previous read, or None on the first
        read, when time did not move forward, after a reset, or for a bad reading (a negative
        value, or a rate above `max_per_s`)."""
        step = self._advance(key, value, t_s, width_bits)
        if step is None:
            return None
        t0, v0, delta = step
        if t_s <= t0 or delta.increase is None:
            return None
        rate = delta.increase / (t_s - t0)
        if max_per_s is not None and rate > max_per_s:
            self._bad(
                key,
                CounterChange.IMPLAUSIBLE,
                f"{v0} -> {value} is {rate:.3g}/s, above the plausible {max_per_s:g}/s; "
                "rate discarded",
            )
            return None
        return rate

    def increase(self, key: str, value: int, width_bits: int | None = None) -> int:
        """The plain increase since the previous `increase` call for `key` (0 the first time,
        after a reset and for a bad reading)."""
        step = self._advance(key, value, 0.0, width_bits)
        return 0 if step is None else step[2].increase or 0

    def forget_except(self, keys: set[str]) -> None:
        """Drop counters not read any more (a port or GPU that went away)."""
        for key in set(self._last) - keys:
            del self._last[key]
            self.changes.pop(key, None)
