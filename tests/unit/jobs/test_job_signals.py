"""The job signals actor's checks, without Ray: the actor class is used directly.

Who may say what: only the control plane (an HMAC over a fresh nonce and the call, under the
secret the actor was created with) registers, reads and asks; only the
attempt's token holder reports workers, progress and checkpoints, and only under the job's
prefix.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from jobs.signals.mailbox import MAX_RANKS, _JobSignals
from jobs.signals.reports import Rejection
from jobs.signals.trust import (
    admin_auth,
    checkpoint_prefix,
    derive_admin_secret,
    token_sha256,
    under_prefix,
)

ADMIN = derive_admin_secret("the-controllers-admin-key", "salt-1")
TOKEN = "the-attempts-token"
PREFIX = "/train/job-a"
_nonce = [0]


def auth(method: str, *args: Any, secret: str = ADMIN) -> tuple[int, str]:
    """A fresh admin authentication for `method(*args)`, as `RayJobs` makes one."""
    _nonce[0] = max(_nonce[0] + 1, time.time_ns())
    return admin_auth(secret, _nonce[0], method, args)


def admin(s: _JobSignals, method: str, *args: Any) -> Any:
    return getattr(s, method)(*args, auth=auth(method, *args))


def make_signals(attempt: int = 1) -> _JobSignals:
    s = _JobSignals(ADMIN)
    admin(s, "register", "job-a", attempt, token_sha256(TOKEN), PREFIX)
    return s


def status(s: _JobSignals, job_id: str = "job-a") -> dict[str, Any]:
    return dict(admin(s, "status", job_id))


# -- the job's side -----------------------------------------------------------------------------

CALLERS = {
    "no-token": ("job-a", 1, ""),
    "wrong-token": ("job-a", 1, "guessed"),
    "another-jobs-token": ("job-a", 1, "token-of-job-b"),
    "stale-attempt": ("job-a", 0, TOKEN),
    "unknown-job": ("job-b", 1, TOKEN),
    "not-a-string": ("job-a", 1, None),
}


@pytest.mark.parametrize("caller", list(CALLERS), ids=list(CALLERS))
def test_job_side_calls_without_the_attempts_token_change_nothing(caller: str) -> None:
    s = make_signals()
    admin(s, "request_checkpoint", "job-a", 5.0)
    job_id, attempt, token = CALLERS[caller]
    assert s.worker_started(job_id, attempt, 0, token) is False  # type: ignore[arg-type]
    assert s.checkpointed(job_id, attempt, 3, f"{PREFIX}/step-3", 1.0, token) is False  # type: ignore[arg-type]
    assert s.poll(job_id, attempt, token) is False  # type: ignore[arg-type]
    st = status(s)
    assert st["started_ranks"] == [] and st["checkpoint"] is None
    assert sum(admin(s, "rejections").values()) == 3
    assert status(s, "job-b") == {}  # nothing is kept for a job nobody registered


def test_the_attempts_token_holder_reports_workers_and_checkpoints_under_its_prefix() -> None:
    s = make_signals()
    assert s.poll("job-a", 1, TOKEN) is False
    admin(s, "request_checkpoint", "job-a", 5.0)
    assert s.poll("job-a", 1, TOKEN) is True
    assert s.worker_started("job-a", 1, 0, TOKEN) and s.worker_started("job-a", 1, 1, TOKEN)
    assert s.checkpointed("job-a", 1, 7, f"{PREFIX}/step-00000007", 9.0, TOKEN)
    st = status(s)
    assert st["attempt"] == 1 and st["started_ranks"] == [0, 1]
    assert st["checkpoint"]["path"] == f"{PREFIX}/step-00000007"
    assert st["checkpoint"]["answers_request"] is True
    assert "token_sha256" not in st and token_sha256(TOKEN) not in repr(st)


@pytest.mark.parametrize(
    "path",
    [
        "/train/job-b/step-00000007",
        f"{PREFIX}/../job-b/step-00000007",
        f"{PREFIX}0/step-00000007",
        PREFIX,
        "/tmp/evil",
        "s3://bucket/train/job-a/step-7",
        "",
    ],
    ids=["other-job", "dot-dot", "longer-sibling", "prefix-itself", "elsewhere", "uri", "empty"],
)
def test_a_checkpoint_outside_the_registered_prefix_is_refused(path: str) -> None:
    s = make_signals()
    assert s.checkpointed("job-a", 1, 7, path, 9.0, TOKEN) is False
    assert status(s)["checkpoint"] is None
    assert admin(s, "rejections") == {Rejection.PATH_OUTSIDE_PREFIX.value: 1}
    assert status(s)["rejected_calls"] == 1


def test_a_new_attempt_voids_the_old_token_and_its_workers() -> None:
    s = make_signals()
    s.worker_started("job-a", 1, 0, TOKEN)
    s.checkpointed("job-a", 1, 4, f"{PREFIX}/step-00000004", 1.0, TOKEN)
    admin(s, "register", "job-a", 2, token_sha256("second"), PREFIX)
    assert s.worker_started("job-a", 1, 1, TOKEN) is False
    assert s.worker_started("job-a", 2, 1, TOKEN) is False  # the old token, new attempt
    assert s.worker_started("job-a", 2, 0, "second") is True
    st = status(s)
    assert st["attempt"] == 2 and st["started_ranks"] == [0]
    assert st["checkpoint"]["step"] == 4  # the job's latest checkpoint outlives the attempt
    # Registering the same attempt and token again (a restarted controller) keeps the workers.
    admin(s, "register", "job-a", 2, token_sha256("second"), PREFIX)
    assert status(s)["started_ranks"] == [0]


# -- the control plane's side -------------------------------------------------------------------


ADMIN_CALLS = {
    "register": ("job-a", 1, token_sha256("attacker"), "/"),
    "status": ("job-a",),
    "request_checkpoint": ("job-a", 1.0),
    "clear_request": ("job-a",),
    "forget": ("job-a",),
    "rejections": (),
}


def _replay(s: _JobSignals, method: str, args: tuple[Any, ...]) -> Any:
    """Record one genuine call, then send that very call again."""
    genuine = auth(method, *args)
    getattr(s, method)(*args, auth=genuine)
    admin(s, "register", "job-a", 1, token_sha256(TOKEN), PREFIX)  # undo what it did
    return genuine


FORGERIES = {
    "no-auth": lambda method, args, s: None,
    "garbage": lambda method, args, s: ("x", 5),
    "the-admin-key-itself": lambda method, args, s: ADMIN,
    "another-actors-secret": lambda method, args, s: auth(
        method, *args, secret=derive_admin_secret("the-controllers-admin-key", "salt-2")
    ),
    "mac-of-other-args": lambda method, args, s: auth(method, *args, "extra"),
    "mac-of-another-method": lambda method, args, s: auth(
        "status" if method != "status" else "forget", *args
    ),
    "stale-nonce": lambda method, args, s: admin_auth(ADMIN, time.time_ns() - 10**12, method, args),
    "future-nonce": lambda method, args, s: admin_auth(
        ADMIN, time.time_ns() + 10**12, method, args
    ),
    "replayed": lambda method, args, s: _replay(s, method, args),
}


@pytest.mark.parametrize("method", list(ADMIN_CALLS))
@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_control_plane_calls_need_a_fresh_mac_of_the_call(method: str, forgery: str) -> None:
    s = make_signals()
    args = ADMIN_CALLS[method]
    forged = FORGERIES[forgery](method, args, s)
    with pytest.raises(PermissionError):
        getattr(s, method)(*args, auth=forged)
    # Nothing changed: the real token still works and the registration is the original.
    assert s.worker_started("job-a", 1, 0, TOKEN) is True
    assert status(s)["checkpoint_prefix"] == PREFIX
    assert not hasattr(s, "check_admin")  # nothing answers "is this the key?" any more


def test_forget_drops_the_job() -> None:
    s = make_signals()
    admin(s, "forget", "job-a")
    assert status(s) == {}
    assert s.worker_started("job-a", 1, 0, TOKEN) is False


# -- the prefix ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "prefix", "inside"),
    [
        ("/t/job-a/step-1", "/t/job-a", True),
        ("/t/job-a/step-1/", "/t/job-a/", True),
        ("/t/./job-a//step-1", "/t/job-a", True),
        ("/t/job-a/../job-b/step-1", "/t/job-a", False),
        ("/t/job-ab/step-1", "/t/job-a", False),
        ("/t/job-a", "/t/job-a", False),
        ("file:///t/job-a/step-1", "/t/job-a", True),
        ("file://host/t/job-a/step-1", "/t/job-a", False),
        ("s3://b/t/job-a/step-1", "s3://b/t/job-a", True),
        ("s3://b/t/job-a/../job-b/step-1", "s3://b/t/job-a", False),
        ("s3://other/t/job-a/step-1", "s3://b/t/job-a", False),
        ("gs://b/t/job-a/step-1", "s3://b/t/job-a", False),
        ("s3://b/t/job-a/step-1?x=1", "s3://b/t/job-a", False),
        ("s3://b/t/job-a", "s3://b/t/job-a", False),
        ("/t/job-a/step-1", "s3://b/t/job-a", False),
        ("", "/t/job-a", False),
    ],
)
def test_under_prefix(path: str, prefix: str, inside: bool) -> None:
    assert under_prefix(path, prefix) is inside


def test_under_prefix_resolves_symlinks(tmp_path: Path) -> None:
    (tmp_path / "job-a").mkdir()
    (tmp_path / "job-b" / "step-1").mkdir(parents=True)
    (tmp_path / "job-a" / "step-1").symlink_to(tmp_path / "job-b" / "step-1")
    assert not under_prefix(str(tmp_path / "job-a" / "step-1"), str(tmp_path / "job-a"))


@pytest.mark.parametrize("job_id", ["", ".", "..", "a/b", "..\\b"])
def test_a_job_id_that_is_not_one_segment_names_no_prefix(job_id: str) -> None:
    with pytest.raises(ValueError, match="cannot name a checkpoint prefix"):
        checkpoint_prefix("/t", job_id)


def test_progress_stamps_when_the_step_grew_and_keeps_only_known_finite_stats() -> None:
    actor = make_signals()
    assert actor.progress(
        "job-a", 1, 5, {"stall_s": 0.5, "wall_s": 10.0, "junk": 1, "saves": float("nan")}, TOKEN
    )
    first = status(actor)["progress"]
    assert first["step"] == 5 and first["stall_s"] == 0.5 and first["wall_s"] == 10.0
    assert "junk" not in first and "saves" not in first
    time.sleep(0.01)
    assert actor.progress("job-a", 1, 5, {}, TOKEN)  # same step: alive, but no progress
    again = status(actor)["progress"]
    assert again["step_at_s"] == first["step_at_s"] and again["at_s"] > first["at_s"]
    assert actor.progress("job-a", 1, 6, {}, TOKEN)
    assert status(actor)["progress"]["step_at_s"] > first["step_at_s"]
    # Refused: a wrong token, another attempt, a negative or non-int step, stats not a mapping.
    assert not actor.progress("job-a", 1, 7, {}, "wrong")
    assert not actor.progress("job-a", 2, 7, {}, TOKEN)
    assert not actor.progress("job-a", 1, -1, {}, TOKEN)
    assert not actor.progress("job-a", 1, True, {}, TOKEN)
    assert not actor.progress("job-a", 1, 7, [1], TOKEN)
    assert status(actor)["progress"]["step"] == 6


def test_worker_started_records_pid_and_node_and_refuses_absurd_ranks() -> None:
    actor = make_signals()
    assert actor.worker_started("job-a", 1, 0, TOKEN, 1234, "ab12cd")
    assert actor.worker_started("job-a", 1, 1, TOKEN, -5, "../etc")
    assert not actor.worker_started("job-a", 1, MAX_RANKS, TOKEN, 1, "ab")
    got = status(actor)
    assert got["started_ranks"] == [0, 1]
    assert got["workers"] == {0: {"pid": 1234, "node_id": "ab12cd"}, 1: {}}
