"""The load board's sums, on the plain class (no Ray started): ongoing requests per model
(from the backends' reports) and the ingress's request rate and CPU per request (from the
ingress's reports, those with an interval) over the fresh reports; and `InFlight`, the
counter each backend replica reports."""

from __future__ import annotations

import threading
import time

import pytest

from serve.app.load import InFlight, _LoadBoard


def test_the_ingress_traffic_sums_rates_and_weighs_cpu_by_requests() -> None:
    board = _LoadBoard()
    assert board.ingress_traffic() == (0.0, 0.0)
    board.report("a", {}, answered=100, cpu_s=0.4, interval_s=1.0)
    board.report("b", {}, answered=300, cpu_s=0.8, interval_s=2.0)
    board.report("backend-1", {"m": 3})  # a backend: counts only, no traffic
    board.report("backend-2", {"m": 1, "n": 0})
    rate_rps, cpu_ms = board.ingress_traffic()
    assert rate_rps == pytest.approx(100 / 1.0 + 300 / 2.0)
    assert cpu_ms == pytest.approx(1000 * 1.2 / 400)
    assert board.totals() == {"m": 4.0, "n": 0.0}


def test_stale_reports_count_for_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    board = _LoadBoard()
    board.report("a", {}, answered=100, cpu_s=0.4, interval_s=1.0)
    board.report("backend-1", {"m": 2})
    later = time.time() + 60
    monkeypatch.setattr(time, "time", lambda: later)
    assert board.ingress_traffic() == (0.0, 0.0)
    assert board.totals() == {}


def test_in_flight_counts_each_request_once_across_threads() -> None:
    inflight = InFlight()
    assert inflight.counts() == {}
    inside = threading.Barrier(9, timeout=10)  # 8 requests and the test
    leave = threading.Event()

    def request(model: str) -> None:
        with inflight.track(model):
            inside.wait()
            leave.wait(10)

    threads = [threading.Thread(target=request, args=("m" if i < 6 else "n",)) for i in range(8)]
    for t in threads:
        t.start()
    inside.wait()
    assert inflight.counts() == {"m": 6, "n": 2}
    leave.set()
    for t in threads:
        t.join(10)
    assert inflight.counts() == {"m": 0, "n": 0}
    with pytest.raises(ValueError), inflight.track("m"):
        raise ValueError("a request that fails is uncounted too")
    assert inflight.counts() == {"m": 0, "n": 0}


def test_a_replica_reports_its_mean_in_flight_over_the_window_not_one_instant() -> None:
    """One client sends back to back, alternating between two replicas, 1 s a request: each
    replica's reports, a second apart but at its own instant, each average 0.5 in flight,
    and their sum is the one client (a sample of one instant read 1 on each: 2)."""
    now = [0.0]
    a, b = InFlight(clock=lambda: now[0]), InFlight(clock=lambda: now[0])
    a.mean_counts(), b.mean_counts()  # open both windows at t=0

    def serve_one(replica: InFlight) -> None:
        with replica.track("m"):
            now[0] += 1.0

    serve_one(a)  # t 0-1 on a
    with b.track("m"):  # t 1-2 on b; b reports in the middle of it
        now[0] += 0.5
        assert b.counts() == {"m": 1}  # what the instant sample said
        at_b = b.mean_counts()["m"]  # window 0-1.5: in flight 0.5 s of 1.5 s
        now[0] += 0.5
    at_a = a.mean_counts()["m"]  # window 0-2: in flight 1 s of 2 s
    assert at_a == pytest.approx(0.5) and at_b == pytest.approx(1 / 3)
    assert at_a + at_b < 1.0 + 1e-9
    # An idle window reads 0; a window of zero length reads the count now.
    assert a.mean_counts() == {"m": 0.0}
    with a.track("m"):
        assert a.mean_counts() == {"m": 1.0}
