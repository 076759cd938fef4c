"""The discrete-event engine: a time-ordered queue of events, deterministic on ties.

Owns: `Event` (a time, a kind, a payload) and `EventQueue`, which hands out events in order of
time, then of the kind's rank (world changes before the timers that only ask the scheme to
decide again), then of insertion. Equal inputs give the same order on every run: nothing
here depends on hashing, addresses or the wall clock.

Must not: know what an event means (`controlplane.simulate.run` does).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["Event", "EventKind", "EventQueue"]


class EventKind(str, Enum):
    """What happens; listed in the order ties are broken at one instant."""

    NODE_FAIL = "node_fail"
    NODE_BACK = "node_back"
    FAULT_START = "fault_start"
    FAULT_END = "fault_end"
    REPLICA_READY = "replica_ready"
    REPLICA_GONE = "replica_gone"
    EXTERNAL_NODE_UP = "external_node_up"
    EXTERNAL_IDLE = "external_idle"
    RECLAIM_NOTICE = "reclaim_notice"
    """A spot provider gives notice that it takes one of its nodes back (the trace's)."""
    NODE_RECLAIMED = "node_reclaimed"
    """A reclaim's notice ran out: the node goes."""
    JOB_RELEASED = "job_released"
    JOB_END = "job_end"
    JOB_ARRIVAL = "job_arrival"
    DEMAND_STEP = "demand_step"
    WAKE = "wake"
    """A scheme's own timer (a policy's delay, a pacing interval, a clock schedule)."""
    SAMPLE = "sample"
    """The report's time series."""


_RANK = {kind: i for i, kind in enumerate(EventKind)}


@dataclass(frozen=True, order=True)
class Event:
    at_s: float
    rank: int
    seq: int
    kind: EventKind = field(compare=False)
    subject: str = field(default="", compare=False)
    """The node, job, replica or model the event is about."""
    version: int = field(default=0, compare=False)
    """The subject's version when scheduled; a stale event (the subject changed since) is
    dropped by whoever handles it."""


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0
        self.handled = 0

    def push(self, at_s: float, kind: EventKind, subject: str = "", version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, Event(at_s, _RANK[kind], self._seq, kind, subject, version))

    def __len__(self) -> int:
        return len(self._heap)

    def peek_time(self) -> float | None:
        return self._heap[0].at_s if self._heap else None

    def pop_instant(self) -> list[Event]:
        """Every event at the earliest time, in order."""
        if not self._heap:
            return []
        first = heapq.heappop(self._heap)
        out = [first]
        while self._heap and self._heap[0].at_s == first.at_s:
            out.append(heapq.heappop(self._heap))
        self.handled += len(out)
        return out
