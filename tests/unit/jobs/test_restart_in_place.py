"""Restarting a gang in place: the launcher's side (the reason it sends, how many restarts
Ray Train may make, one report per restart) and the signals actor's record of it."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.launcher import in_place
from jobs.launcher.in_place import InPlaceReporter, failure_reason, restarts_in_place
from jobs.signals.environment import ENV_ATTEMPT, ENV_JOB_ID, ENV_SIGNAL_TOKEN
from tests.unit.jobs.test_job_signals import TOKEN, make_signals, status


class WorkerDied(Exception):
    pass


def _chained(outer: Exception, cause: Exception) -> Exception:
    outer.__cause__ = cause
    return outer


REASONS = {
    "user-error": ({1: ValueError("bad shape (3, 4)")}, "rank 1: ValueError: bad shape (3, 4)"),
    "last-line-of-a-long-message": (
        {0: RuntimeError("Traceback ...\n  File x\nCUDA error: illegal memory access")},
        "rank 0: RuntimeError: CUDA error: illegal memory access",
    ),
    "process-died": (
        {1: RuntimeError("A worker health check failed.\nWorker info: ...")},
        "rank 1: its worker process died",
    ),
    "cause-named": (
        {0: _chained(RuntimeError("training failed"), KeyError("lr"))},
        "rank 0: KeyError: 'lr'",
    ),
    "several-ranks": (
        {2: OSError("x"), 0: ValueError("first"), 1: OSError("y")},
        "rank 0: ValueError: first (and ranks 1, 2)",
    ),
    "two-ranks": ({0: ValueError("a"), 3: OSError("b")}, "rank 0: ValueError: a (and rank 3)"),
    "empty-message": ({0: ValueError()}, "rank 0: ValueError"),
    "none": ({}, "a worker failed"),
}


@pytest.mark.parametrize("case", list(REASONS), ids=list(REASONS))
def test_failure_reason_is_one_line_a_user_reads(case: str) -> None:
    errors, want = REASONS[case]
    assert failure_reason(errors) == want


def test_failure_reason_is_bounded() -> None:
    assert len(failure_reason({0: ValueError("x" * 10_000)})) == in_place.MAX_REASON_CHARS


@pytest.mark.parametrize(
    ("value", "want"), [(None, 0), ("0", 0), ("3", 3), ("-2", 0), ("two", 0), ("1.5", 0)]
)
def test_restarts_in_place_reads_a_whole_count(value: str | None, want: int) -> None:
    env = {} if value is None else {in_place.ENV_RESTARTS_IN_PLACE: value}
    assert restarts_in_place(env) == want


class FakeHandle:
    calls: list[tuple[Any, ...]] = []
    fail = False

    def call(self, method: str, *args: object, timeout_s: float) -> object:
        if FakeHandle.fail:
            raise LookupError("no actor")
        FakeHandle.calls.append((method, *args))
        return True


@pytest.fixture
def handle(monkeypatch: pytest.MonkeyPatch) -> type[FakeHandle]:
    FakeHandle.calls, FakeHandle.fail = [], False
    monkeypatch.setattr(in_place, "SignalsHandle", FakeHandle)
    return FakeHandle


ENV = {
    ENV_JOB_ID: "job-a",
    ENV_ATTEMPT: "2",
    ENV_SIGNAL_TOKEN: TOKEN,
    in_place.ENV_RESTARTS_IN_PLACE: "2",
}


def test_each_restart_in_place_is_reported_once_and_a_failure_past_the_budget_is_not(
    handle: type[FakeHandle],
) -> None:
    reporter = InPlaceReporter(ENV)
    for error in ("one", "two", "three"):
        reporter.after_exception(None, {0: ValueError(error)})
    assert handle.calls == [
        ("restarting_in_place", "job-a", 2, 1, "rank 0: ValueError: one", TOKEN),
        ("restarting_in_place", "job-a", 2, 2, "rank 0: ValueError: two", TOKEN),
    ]  # the third ends the run: the control plane sees the Ray Job fail


def test_an_unreachable_signals_actor_does_not_stop_the_restart(
    handle: type[FakeHandle], capsys: pytest.CaptureFixture[str]
) -> None:
    handle.fail = True
    InPlaceReporter(ENV).after_exception(None, {0: ValueError("x")})
    assert "could not report restart in place" in capsys.readouterr().err
    assert TOKEN not in capsys.readouterr().err


def test_outside_the_control_plane_nothing_is_reported(handle: type[FakeHandle]) -> None:
    InPlaceReporter({in_place.ENV_RESTARTS_IN_PLACE: "2"}).after_exception(None, {0: OSError()})
    assert handle.calls == []


# -- the signals actor's record -----------------------------------------------------------------


def test_the_actor_records_each_restart_once_and_forgets_the_old_workers_and_progress() -> None:
    s = make_signals(attempt=1)
    assert s.worker_started("job-a", 1, 0, TOKEN, 101, "aa")
    assert s.progress("job-a", 1, 40, {}, TOKEN)
    assert s.restarting_in_place("job-a", 1, 1, "rank 0: its worker process died", TOKEN)
    assert s.restarting_in_place("job-a", 1, 1, "a repeat of the same report", TOKEN)
    st = status(s)
    assert [(r["index"], r["reason"]) for r in st["in_place"]] == [
        (1, "rank 0: its worker process died")
    ]
    assert st["in_place"][0]["at_s"] > 0
    assert st["in_place"][0]["step"] == 40  # the failed workers' last step
    # The new worker group reports afresh: the hang watchdog re-arms on its first step.
    assert st["started_ranks"] == [] and st["workers"] == {} and st["progress"] is None
    assert s.progress("job-a", 1, 31, {}, TOKEN)
    assert status(s)["progress"]["step"] == 31


@pytest.mark.parametrize(
    ("index", "reason", "token"),
    [(0, "x", TOKEN), (True, "x", TOKEN), (1, 5, TOKEN), (1, "x", "guessed")],
    ids=["index-0", "index-bool", "reason-not-text", "wrong-token"],
)
def test_the_actor_refuses_a_malformed_restart_report(index: Any, reason: Any, token: str) -> None:
    s = make_signals()
    assert s.restarting_in_place("job-a", 1, index, reason, token) is False
    assert status(s)["in_place"] == []


def test_the_actor_keeps_a_bounded_reason_and_a_bounded_list() -> None:
    from jobs.signals.mailbox import MAX_IN_PLACE_KEPT

    s = make_signals()
    for i in range(1, MAX_IN_PLACE_KEPT + 5):
        assert s.restarting_in_place("job-a", 1, i, "y" * 5000, TOKEN)
    kept = status(s)["in_place"]
    assert len(kept) == MAX_IN_PLACE_KEPT and kept[-1]["index"] == MAX_IN_PLACE_KEPT + 4
    assert max(len(r["reason"]) for r in kept) == in_place.MAX_REASON_CHARS


@pytest.mark.parametrize(
    ("step", "source", "restore_s"),
    [(-1, "memory", 0.1), (3, "disk", 0.1), (3, "memory", float("nan")), (3, "memory", -1.0)],
    ids=["negative-step", "unknown-source", "nan-seconds", "negative-seconds"],
)
def test_the_actor_refuses_a_malformed_restore_report(
    step: int, source: str, restore_s: float
) -> None:
    s = make_signals()
    assert s.restored("job-a", 1, step, source, restore_s, TOKEN) is False
    assert status(s)["restore"] is None
    assert s.restored("job-a", 1, 3, "memory", 0.25, TOKEN)
    assert status(s)["restore"]["source"] == "memory"
