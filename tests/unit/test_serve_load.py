"""The load board's sums, on the plain class (no Ray started): ongoing requests per model and
the ingress's request rate and CPU per request over the fresh reports."""

from __future__ import annotations

import time

import pytest

from serve.load import _LoadBoard


def test_the_ingress_traffic_sums_rates_and_weighs_cpu_by_requests() -> None:
    board = _LoadBoard()
    assert board.ingress_traffic() == (0.0, 0.0)
    board.report("a", {"m": 2}, answered=100, cpu_s=0.4, interval_s=1.0)
    board.report("b", {"m": 1}, answered=300, cpu_s=0.8, interval_s=2.0)
    board.report("c", {"m": 1})  # an older ingress: in-flight counts only
    rate_rps, cpu_ms = board.ingress_traffic()
    assert rate_rps == pytest.approx(100 / 1.0 + 300 / 2.0)
    assert cpu_ms == pytest.approx(1000 * 1.2 / 400)
    assert board.totals() == {"m": 4.0}


def test_stale_reports_count_for_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    board = _LoadBoard()
    board.report("a", {"m": 2}, answered=100, cpu_s=0.4, interval_s=1.0)
    later = time.time() + 60
    monkeypatch.setattr(time, "time", lambda: later)
    assert board.ingress_traffic() == (0.0, 0.0)
    assert board.totals() == {}
