"""What serving's forecast leaves training, slot by slot (issue 28, item 4).

Owns: `ForecastRoom`, built once per `decide` from the `policies.forecast.ServingForecast`
the loop passes: per slot of the horizon, the GPUs a new gang may still hold (the cluster
pool's capacity, less the GPUs serving's forecast needs there, less the gangs still running
then, each until its ``started_s + max_runtime_s``, without one for good); `hold`, the
`WaitJob` reason for a gang whose run would hold GPUs serving's forecast needs back; and
`take`, an admitted gang's GPUs out of every slot of its run.

The rule (in `policies.admission`'s docstring too): a gang whose run (``max_runtime_s``; none:
the whole horizon) overlaps a slot without room for it waits with a ``serving-forecast``
reason that says when it is expected to start (the first start whose whole run has room), and
shorter work, which ends before the peak, is admitted meanwhile. Once every other job had its
turn, a held gang still gets GPUs nobody else wanted if serving needs them back later than
``idle_hold_s`` (idle GPUs until then would cost more than the checkpoint and restore the
peak asks of it); nearer the peak they stay idle for serving. A gang that could never
avoid the peak (its run spans the horizon and it is bigger than the capacity the peak leaves)
is not held: it runs, and serving reclaims from it at the peak, checkpoint first, as before.

Must not: read a clock or do I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from policies.admission.reasons import Why
from policies.forecast import ServingForecast, duration
from policies.snapshot import QueuedJob, RunningGang

__all__ = ["ForecastRoom", "Held"]


@dataclass(frozen=True)
class Held:
    """A gang serving's forecast holds back: the reason it waits, and in how many seconds
    (whole slots) serving needs the GPUs its run would hold."""

    reason: str
    needed_in_s: float
    """Seconds (whole slots) until the first slot of its run without room for it."""
    peak: str
    """What the forecast needs at the tightest slot of its run (the reason's middle, for an
    admission that goes ahead anyway)."""


class ForecastRoom:
    """Per slot of `forecast`, the GPUs a new gang may hold (see the module doc)."""

    def __init__(
        self,
        forecast: ServingForecast,
        now_s: float,
        capacity: int,
        gangs: Iterable[tuple[RunningGang, int]],
    ) -> None:
        """`gangs`: each holding gang with the GPUs it holds on live nodes."""
        self.forecast = forecast
        self.now_s = now_s
        self.capacity = capacity
        n = len(forecast.need_gpus)
        ending = [0] * (n + 1)
        running = 0
        for gang, gpus in gangs:
            running += gpus
            end = gang.expected_end_s
            if end is not None:
                ending[self._first_slot_after(end)] += gpus
        self.room: list[int] = []
        for k in range(n):
            running -= ending[k]
            self.room.append(capacity - forecast.need_gpus[k] - running)

    def _first_slot_after(self, end_s: float) -> int:
        """The first slot that starts at or after `end_s` (a gang ending then no longer holds
        GPUs in it); at least 1 (an overdue gang still holds its GPUs now), at most the
        horizon."""
        k = math.ceil((end_s - self.forecast.start_s) / self.forecast.bin_s)
        return min(len(self.forecast.need_gpus), max(1, k))

    def window(self, max_runtime_s: float | None) -> int:
        """How many slots from now a run of `max_runtime_s` covers (None: all)."""
        n = len(self.forecast.need_gpus)
        if max_runtime_s is None:
            return n
        return min(n, self._first_slot_after(self.now_s + max_runtime_s))

    def take(self, job: QueuedJob) -> None:
        """An admitted gang's GPUs out of every slot of its run."""
        for k in range(self.window(job.max_runtime_s)):
            self.room[k] -= job.gpus_total

    def hold(self, job: QueuedJob) -> Held | None:
        """Why `job` is held back (a ``serving-forecast`` reason, and how soon serving needs the
        GPUs), or None if its run fits beside serving's forecast (or could never avoid it)."""
        need = job.gpus_total
        span = self.window(job.max_runtime_s)
        short = [k for k in range(span) if self.room[k] < need]
        if not short:
            return None
        n = len(self.room)
        forecast = self.forecast
        peak = max(forecast.need_gpus[:span])
        if span == n and need > self.capacity - peak:
            return None  # no start avoids the peak: it runs, and serving reclaims at the peak
        k = min(short, key=lambda i: (self.room[i], i))
        # Offsets in whole slots: the reason changes when the slot does, not every tick.
        at = k * forecast.bin_s
        start = self.earliest_start(need, span)
        run = (
            "with no max runtime"
            if job.max_runtime_s is None
            else (f"of up to {duration(job.max_runtime_s)}")
        )
        when = (
            f"expected to start in about {duration(start * forecast.bin_s)}, "
            "when its run no longer overlaps that peak"
            if start is not None
            else f"no start within the next {duration(n * forecast.bin_s)} clears it; shorter "
            "work runs there meanwhile"
        )
        peak_text = (
            f"its run {run} would hold GPUs that serving's forecast needs back "
            f"{'now' if at <= 0 else 'in ' + duration(at)}: {forecast.need_gpus[k]} cluster "
            f"GPU(s) (most for model {forecast.peak_model!r}) that the providers cannot host"
        )
        return Held(
            f"{Why.SERVING_FORECAST.value}: {peak_text}, leaving {max(0, self.room[k])} GPU(s) "
            f"for a new gang; {when}",
            short[0] * forecast.bin_s,
            peak_text,
        )

    def earliest_start(self, need: int, span: int) -> int | None:
        """The first slot from which `span` slots in a row have room for `need` GPUs, within
        the horizon (a run that starts later counts the gangs that will have ended by then);
        None if there is none. A run as long as the horizon starts where every later slot has
        room (the profile repeats daily, and beyond the horizon only more gangs have ended)."""
        if span >= len(self.room):
            start = None
            for k in range(len(self.room) - 1, -1, -1):
                if self.room[k] < need:
                    break
                start = k
            return start
        run = 0
        for k, room in enumerate(self.room):
            run = run + 1 if room >= need else 0
            if run >= span:
                return k - span + 1
        return None
