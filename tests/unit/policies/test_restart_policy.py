"""`policies.restarts`: restart or give up, as tables."""

from __future__ import annotations

import pytest

from policies.restarts import (
    AttemptFailure,
    FailureKind,
    GiveUp,
    Restart,
    RestartLimits,
    RestartRecord,
    decide_restart,
    failure_signature,
)

LIMITS = RestartLimits(max_restarts=3, backoff_initial_s=10.0, backoff_max_s=25.0)


def failure(
    signature: str = "E: x",
    *,
    committed: int | None = None,
    start: int | None = None,
    reported: int | None = None,
    kind: FailureKind = FailureKind.CRASH,
) -> AttemptFailure:
    return AttemptFailure(kind, f"msg {signature}", signature, committed, start, reported)


def record(
    restarts: int = 0, signature: str | None = None, committed: int | None = None
) -> RestartRecord:
    return RestartRecord(restarts, signature, committed)


CASES = [
    pytest.param(failure(), record(), ("restart", 10.0, 1), id="first-failure"),
    pytest.param(failure("E: y"), record(1, "E: x"), ("restart", 20.0, 2), id="second-backoff"),
    pytest.param(failure("E: z"), record(2, "E: y"), ("restart", 25.0, 3), id="backoff-capped"),
    pytest.param(failure("E: w"), record(3, "E: z"), ("give-up", "gave up after 3"), id="max"),
    pytest.param(
        failure("E: x"), record(1, "E: x"), ("give-up", "same failure twice"), id="same-no-progress"
    ),
    pytest.param(
        failure("E: x", committed=5),
        record(1, "E: x", 4),
        ("restart", 20.0, 2),
        id="same-new-commit",
    ),
    pytest.param(
        failure("E: x", committed=4, start=4, reported=6),
        record(1, "E: x", 4),
        ("restart", 20.0, 2),
        id="same-stepped-past-start",
    ),
    pytest.param(
        failure("E: x", committed=4, start=4, reported=4),
        record(1, "E: x", 4),
        ("give-up", "same failure twice"),
        id="same-reported-only-the-start",
    ),
    pytest.param(
        failure("E: x", reported=0),
        record(1, "E: x"),
        ("restart", 20.0, 2),
        id="same-fresh-start-reported-a-step",
    ),
    pytest.param(
        failure("hang", kind=FailureKind.HANG, committed=9, start=9, reported=9),
        record(1, "hang", 9),
        ("give-up", "same failure twice"),
        id="hang-twice-at-the-same-step",
    ),
    pytest.param(
        failure(), RestartRecord(0, None, None), ("restart", 10.0, 1), id="no-previous-failure"
    ),
]


@pytest.mark.parametrize(("now", "before", "want"), CASES)
def test_decide_restart(now: AttemptFailure, before: RestartRecord, want: tuple) -> None:
    decision, after = decide_restart(now, before, LIMITS)
    assert after.last_signature == now.signature
    assert after.committed_at_last_failure == now.committed_step
    if want[0] == "restart":
        assert isinstance(decision, Restart)
        assert (decision.after_s, after.restarts) == want[1:]
        assert decision.reason.startswith(f"restart {want[2]} of 3 in {want[1]:g}s after crash")
    else:
        assert isinstance(decision, GiveUp) and want[1] in decision.reason
        assert after.restarts == before.restarts
        assert now.message in decision.reason


def test_zero_max_restarts_gives_up_on_the_first_failure() -> None:
    decision, _ = decide_restart(failure(), record(), RestartLimits(0, 10.0, 600.0))
    assert isinstance(decision, GiveUp) and "max_restarts=0" in decision.reason


SIGNATURES = [
    pytest.param(
        "(RayTrainWorker pid=4242, ip=10.0.0.7) NameError: name 'lr' is not defined",
        "(RayTrainWorker pid=977, ip=10.0.0.9) NameError: name 'lr' is not defined",
        True,
        id="pids-and-ips",
    ),
    pytest.param(
        "2026-01-01 10:11:12,345 ERROR step 40: RuntimeError: nan at 0x7f00aa",
        "2026-03-04 01:02:03,999 ERROR step 77: RuntimeError: nan at 0x7f99bb",
        True,
        id="times-steps-addresses",
    ),
    pytest.param(
        "RuntimeError: worker 0123456789abcdef0123456789abcdef died after 12.5s",
        "RuntimeError: worker fedcba9876543210fedcba9876543210 died after 3s",
        True,
        id="ray-ids-durations",
    ),
    pytest.param(
        "job job-abc-1 failed: RuntimeError: boom",
        "job job-abc-2 failed: RuntimeError: boom",
        True,
        id="the-submission-id",
    ),
    pytest.param("KeyError: 'a'", "KeyError: 'b'", False, id="another-key"),
    pytest.param(
        "Job entrypoint command failed with exit code 1",
        "Job entrypoint command failed with exit code 137",
        False,
        id="exit-codes-differ",
    ),
    pytest.param(
        "Traceback...\nValueError: x\nlater output line",
        "Traceback...\nValueError: x\nanother later line",
        True,
        id="the-exception-line-wins",
    ),
]


@pytest.mark.parametrize(("a", "b", "same"), SIGNATURES)
def test_failure_signature(a: str, b: str, same: bool) -> None:
    # Each attempt's signature drops its own submission id and the job id (as the runner does).
    first, second = (
        failure_signature(a, ("job-abc-1", "job-abc")),
        failure_signature(b, ("job-abc-2", "job-abc")),
    )
    assert (first == second) is same


def test_a_signature_is_bounded() -> None:
    assert len(failure_signature("RuntimeError: " + "x" * 10_000)) <= 300
