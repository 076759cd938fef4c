"""Ongoing requests per model, as the replicas working on them see them, and the ingress's own
traffic, for the demand and ingress scaling policies.

Owns: `LoadBoard`, a small detached actor (``rcp-serve-load`` in namespace ``rcp``) that every
serving replica reports to about once a second, `InFlight`, the thread-safe counter a replica
keeps, `read_load`, which sums the fresh in-flight means, and `read_ingress_traffic`, the
requests per second and CPU milliseconds per request over the ingress's fresh reports. Two
kinds of report share the one ``report`` call:

* a backend replica's (`serve.app.backend`): ``{model: mean requests in flight over its last
  second}`` (`InFlight.mean_counts`) and nothing else (``interval_s`` 0). Every request is
  counted once, by the replica working on it, whether it came through the ingress (a handle
  call) or straight from the edge (HTTP);
* an ingress replica's (`serve.app.ingress`): ``{}`` counts, and how many requests it answered
  and how much CPU its process spent during ``interval_s`` (> 0), the ingress scaling policy's
  input. `ingress_traffic` reads only reports with ``interval_s > 0``.

The control plane's serving loop reads it each tick; Serve's own autoscaling metrics are not
used because no ``autoscaling_config`` is set (the control plane owns replica targets).

Must not: decide anything. A report older than `max_age_s` is ignored (its replica is gone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

import ray
from ray import serve

LOAD_ACTOR = "rcp-serve-load"
NAMESPACE = "rcp"
REPORT_INTERVAL_S = 1.0


class _Report(NamedTuple):
    at_s: float
    counts: dict[str, float]
    """Mean requests in flight per model over the reporter's last second (a backend
    replica's, `InFlight.mean_counts`); an ingress replica reports {}."""
    answered: int
    """Requests answered during `interval_s` (an ingress replica's; 0 from a backend)."""
    cpu_s: float
    """CPU seconds the reporter's process spent during `interval_s` (an ingress replica's)."""
    interval_s: float
    """Seconds since the reporter's previous report; 0: a backend's report (counts only)."""


class InFlight:
    """Requests in flight per model in one replica, safe to count from several threads (Serve
    may run a replica's sync methods in a thread pool): the count now, and its mean over
    time since the last report (`mean_counts`), which is what a replica reports."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._counts: dict[str, int] = {}
        self._area: dict[str, float] = {}
        """Per model, requests x seconds in flight since `_since`."""
        self._since = self._folded = clock()

    def _fold(self) -> None:
        """Add the time since the last change at the current counts (under the lock)."""
        now = self._clock()
        dt = max(0.0, now - self._folded)
        for model, n in self._counts.items():
            self._area[model] = self._area.get(model, 0.0) + n * dt
        self._folded = now

    @contextmanager
    def track(self, model: str) -> Iterator[None]:
        """Count one request of `model` for the length of the ``with`` block."""
        with self._lock:
            self._fold()
            self._counts[model] = self._counts.get(model, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._fold()
                self._counts[model] -= 1

    def counts(self) -> dict[str, int]:
        """A copy of the counts now (a model seen once stays, at 0 when idle)."""
        with self._lock:
            return dict(self._counts)

    def mean_counts(self) -> dict[str, float]:
        """Per model, the mean requests in flight since the last call (time-weighted), and
        start the next window. The demand signal: every replica reports this once a second,
        at its own instant, and the board sums the reports. Summed samples of single
        instants counted a client twice when its back-to-back requests went to two replicas
        sampled a moment apart (three clients read as four); means over each replica's last
        second add up to the requests in flight on average."""
        with self._lock:
            self._fold()
            span = self._folded - self._since
            out = {
                m: (self._area.get(m, 0.0) / span if span > 0 else float(n))
                for m, n in self._counts.items()
            }
            self._area = {}
            self._since = self._folded
            return out


class _LoadBoard:
    def __init__(self) -> None:
        self._reports: dict[str, _Report] = {}

    def report(
        self,
        reporter: str,
        counts: Mapping[str, float],
        answered: int = 0,
        cpu_s: float = 0.0,
        interval_s: float = 0.0,
    ) -> None:
        """Replace `reporter`'s report: a backend sends `counts` alone, an ingress ``{}`` and
        its traffic (see the module doc)."""
        self._reports[reporter] = _Report(
            time.time(),
            {str(m): float(n) for m, n in counts.items()},
            int(answered),
            float(cpu_s),
            float(interval_s),
        )

    def _fresh(self, max_age_s: float) -> list[_Report]:
        now = time.time()
        for reporter, r in list(self._reports.items()):
            if now - r.at_s > max_age_s:
                del self._reports[reporter]
        return list(self._reports.values())

    def totals(self, max_age_s: float = 5.0) -> dict[str, float]:
        """Requests in flight per model over the fresh reports."""
        out: dict[str, float] = {}
        for r in self._fresh(max_age_s):
            for model, n in r.counts.items():
                out[model] = out.get(model, 0.0) + n
        return out

    def ingress_traffic(self, max_age_s: float = 5.0) -> tuple[float, float]:
        """(requests per second, CPU ms per request) over the fresh ingress reports (those
        with ``interval_s > 0``); (0, 0) if none."""
        timed = [r for r in self._fresh(max_age_s) if r.interval_s > 0]
        rate_rps = sum(r.answered / r.interval_s for r in timed)
        answered = sum(r.answered for r in timed)
        cpu_ms = 1000.0 * sum(r.cpu_s for r in timed) / answered if answered else 0.0
        return rate_rps, cpu_ms


def in_replica() -> bool:
    """True inside a Serve replica, where a reporter may start (not when a test builds a
    replica's class directly)."""
    try:
        serve.get_replica_context()
    except Exception:
        return False
    return True


LoadBoard = ray.remote(num_cpus=0, max_restarts=-1)(_LoadBoard)
"""The actor class; `board` creates its one detached actor."""


def board() -> Any:
    """The load board's handle, created on first use (detached, on the head). Any: Ray does
    not type calls of an actor handle's methods."""
    return LoadBoard.options(
        name=LOAD_ACTOR,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        resources={"pool_head": 0.001},
    ).remote()


def read_load(timeout_s: float = 5.0) -> dict[str, float]:
    """Ongoing requests per model summed over the backends' fresh reports ({} if none)."""
    return dict(ray.get(board().totals.remote(), timeout=timeout_s))


def read_ingress_traffic(timeout_s: float = 5.0) -> tuple[float, float]:
    """(requests per second, CPU ms per request) of the ingress replicas ((0, 0) if none)."""
    rate_rps, cpu_ms = ray.get(board().ingress_traffic.remote(), timeout=timeout_s)
    return float(rate_rps), float(cpu_ms)
