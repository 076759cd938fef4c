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
