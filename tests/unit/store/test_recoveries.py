"""`controlplane.store.recoveries`: each recovery timed from the job's reports, and ETTR."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.store import recoveries
from controlplane.store.recoveries import ettr, failed, observed


def apply(info: dict[str, Any], updates: dict[str, Any]) -> dict[str, Any]:
    return {**info, **updates}


def progress(step: int, at_s: float) -> dict[str, Any]:
    return {"step": step, "step_at_s": at_s}


def test_a_crash_in_place_is_timed_to_the_first_new_step_and_caught_up_past_the_old_one() -> None:
    info: dict[str, Any] = {"first_admitted_s": 0.0, "progress": progress(40, 95.0)}
    info = apply(info, failed(info, 100.0, "crash", in_place=True))
    assert info["recovering"] == {"failed_s": 100.0, "kind": "crash", "in_place": True, "step": 40}
    # A report from before the failure changes nothing.
    assert observed(info, progress(40, 95.0), None) == {}
    restore = {"step": 35, "source": "memory", "restore_s": 0.6}
    info = apply(info, observed(info, progress(36, 104.5), restore))
    assert info["recovering"] is None
    [entry] = info["recoveries"]
    assert entry["seconds"] == pytest.approx(4.5) and entry["source"] == "memory"
    assert (entry["restored_step"], entry["in_place"], entry["caught_up_s"]) == (35, True, None)
    assert observed(info, progress(40, 110.0), None) == {}  # not past step 40 yet
    info = apply(info, observed(info, progress(41, 111.0), None))
    assert info["recoveries"][0]["caught_up_s"] == 111.0
    assert observed(info, progress(50, 120.0), None) == {}  # nothing left to time
    # Admitted at 0, lost 100 -> 111 (11 s), 2 s of checkpoint stall, now 200.
    assert ettr(info, 200.0, stall_s=2.0) == pytest.approx((200 - 11 - 2) / 200)


def test_an_open_failure_counts_until_now_and_a_second_one_extends_it() -> None:
    info: dict[str, Any] = {"first_admitted_s": 0.0}
    info = apply(info, failed(info, 50.0, "crash", in_place=True))
    assert ettr(info, 100.0) == pytest.approx(0.5)
    # The restart in place never trained: the gang is re-queued, still the same recovery.
    info = apply(info, failed(info, 60.0, "lost", in_place=False))
    [open_] = recoveries.recoveries(info)
    assert (open_.failed_s, open_.kind, open_.in_place, open_.seconds) == (
        50.0,
        "lost",
        False,
        None,
    )


def test_a_restore_source_the_job_made_up_is_not_shown() -> None:
    info = {"recovering": {"failed_s": 1.0, "kind": "crash", "in_place": False, "step": None}}
    updates = observed(info, progress(3, 5.0), {"step": 2, "source": "<script>"})
    assert updates["recoveries"][0]["source"] is None
    assert updates["recoveries"][0]["caught_up_s"] == 5.0  # no step before it: caught up


BAD = {
    "not-a-list": {"recoveries": "x"},
    "entries-not-mappings": {"recoveries": [1, "a", None]},
    "no-failure-time": {"recoveries": [{"seconds": 3}]},
    "nan": {"recoveries": [{"failed_s": float("nan")}]},
    "open-not-mapping": {"recovering": 7},
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_malformed_info_reads_as_no_recovery(case: str) -> None:
    assert recoveries.recoveries(BAD[case]) == ()


@pytest.mark.parametrize(
    ("info", "now_s", "want"),
    [
        ({}, 10.0, None),
        ({"first_admitted_s": 10.0}, 10.0, None),
        ({"first_admitted_s": "x"}, 10.0, None),
        ({"first_admitted_s": 0.0}, 10.0, 1.0),
        ({"first_admitted_s": 0.0, "recovering": {"failed_s": 0.0}}, 10.0, 0.0),
    ],
    ids=["never-admitted", "no-wall-time", "malformed", "no-failure", "down-since-admission"],
)
def test_ettr(info: dict[str, Any], now_s: float, want: float | None) -> None:
    assert ettr(info, now_s) == want


def test_admitted_keeps_the_first_admission() -> None:
    assert recoveries.admitted({}, 5.0) == {"first_admitted_s": 5.0}
    assert recoveries.admitted({"first_admitted_s": 5.0}, 9.0) == {}


def test_the_list_is_bounded() -> None:
    entries = [{"failed_s": float(i), "caught_up_s": float(i)} for i in range(150)]
    info = {"recoveries": entries, "recovering": {"failed_s": 500.0, "step": None}}
    updates = observed(info, progress(1, 501.0), None)
    kept = updates["recoveries"]
    assert len(kept) == recoveries.MAX_RECOVERIES_KEPT and kept[-1]["failed_s"] == 500.0


def test_overlapping_failures_count_once_and_a_late_record_keeps_the_failed_runs_step() -> None:
    """A restart in place recorded only after the new run reported step 27 still times the
    catch-up from the failed run's step (15, as the run reported it); a hang at step 27 before
    that catch-up overlaps it, and the lost time is the union of the two spans."""
    info: dict[str, Any] = {"first_admitted_s": 0.0, "progress": progress(27, 60.0)}
    info = apply(info, failed(info, 40.0, "crash", in_place=True, step=15))
    assert info["recovering"]["step"] == 15
    info = apply(info, observed(info, progress(27, 61.0), None))  # resumed, and past 15
    assert info["recoveries"][0]["caught_up_s"] == 61.0
    info = apply(info, failed(info, 70.0, "hang", in_place=False))
    info = apply(info, observed(info, progress(25, 90.0), None))  # resumed, not past 27 yet
    # Ended well at 100 without a read past step 27: caught up by then at the latest.
    info = apply(info, recoveries.finished(info, 100.0))
    assert [r.caught_up_s for r in recoveries.recoveries(info)] == [61.0, 100.0]
    assert ettr(info, 100.0) == pytest.approx((100 - 21 - 30) / 100)
    assert recoveries.finished(info, 120.0) == {}  # nothing left open


def test_spans_that_overlap_are_counted_once() -> None:
    info = {
        "first_admitted_s": 0.0,
        "recoveries": [
            {"failed_s": 10.0, "caught_up_s": 50.0},
            {"failed_s": 20.0, "caught_up_s": 40.0},
            {"failed_s": 45.0, "caught_up_s": 60.0},
        ],
    }
    assert ettr(info, 100.0) == pytest.approx((100 - 50) / 100)  # lost 10..60
