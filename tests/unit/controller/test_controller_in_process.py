"""The controller run in-process (`controlplane.controller.in_process`), the Kubernetes way: no actor.

Owns the checks that a leftover ``rcp-controller`` actor is stopped before the in-process
controller opens the store (and that a stuck one stops the start), and that a job store
that cannot be opened ends the process with `ExitCode.STORE` and the store's own message, so
Kubernetes restarts the container. Must not start Ray: the actor lookups are fakes. The real
run against a local cluster is tests/integration/test_local_cluster.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.config import ConfigError, load_config
from controlplane.controller.in_process import ExitCode, run_in_process, stop_leftover_actor
from controlplane.tokens import TokenFileError, admin_token


class FakeActors:
    """The ``rcp-controller`` name in Ray: `gone_after` lookups after a kill it is free."""

    def __init__(self, present: bool, gone_after: int | None) -> None:
        self.present = present
        self.gone_after = gone_after
        self.killed: list[Any] = []
        self._lookups_since_kill = 0

    def get(self) -> Any:
        if self.killed:
            self._lookups_since_kill += 1
            if self.gone_after is not None and self._lookups_since_kill > self.gone_after:
                self.present = False
        return "handle" if self.present else None

    def kill(self, handle: Any) -> None:
        self.killed.append(handle)


@pytest.mark.parametrize(
    ("present", "gone_after", "left_none", "killed"),
    [
        pytest.param(False, None, True, [], id="no-actor-nothing-killed"),
        pytest.param(True, 0, True, ["handle"], id="actor-killed-and-gone"),
        pytest.param(True, 2, True, ["handle"], id="actor-gone-after-a-while"),
        pytest.param(True, None, False, ["handle"], id="actor-never-leaves"),
    ],
)
def test_a_leftover_controller_actor_is_stopped_first(
    present: bool, gone_after: int | None, left_none: bool, killed: list[Any], monkeypatch: Any
) -> None:
    monkeypatch.setattr("controlplane.controller.in_process.time.sleep", lambda _s: None)
    actors = FakeActors(present, gone_after)
    assert stop_leftover_actor(actors.get, actors.kill, wait_s=0.05) is left_none
    assert actors.killed == killed


def test_a_stuck_actor_stops_the_start_before_the_store_is_opened(
    tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr("controlplane.controller.in_process.LEFTOVER_ACTOR_WAIT_S", 0.05)
    monkeypatch.setattr("controlplane.controller.in_process.time.sleep", lambda _s: None)
    cfg = load_config(None, [f"state_dir={tmp_path / 'state'}"])
    actors = FakeActors(True, None)
    code = run_in_process(cfg, find_actor=actors.get, kill_actor=actors.kill)
    assert code == ExitCode.LEFTOVER_ACTOR
    assert not cfg.jobs_db_path.exists(), "two controllers must never share a store"


def test_a_corrupt_store_exits_non_zero_with_the_store_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = load_config(None, [f"state_dir={tmp_path / 'state'}"])
    cfg.jobs_db_path.parent.mkdir(parents=True, exist_ok=True)
    cfg.jobs_db_path.write_bytes(b"this is not sqlite\n" * 500)
    actors = FakeActors(False, None)
    code = run_in_process(cfg, find_actor=actors.get, kill_actor=actors.kill)
    assert code == ExitCode.STORE and int(code) != 0
    out = capsys.readouterr().out
    assert str(cfg.jobs_db_path) in out and "move the file aside" in out
    assert "api-token" not in out


def test_the_admin_token_comes_from_the_configured_secret_file(tmp_path: Path) -> None:
    """On KubeRay the first admin's token is a mounted Secret (api.admin_token_file): read as
    it is, never written to the state dir; a missing or short file is a clear refusal that
    names the setting and never shows the token."""
    secret = tmp_path / "api-admin" / "token"
    secret.parent.mkdir()
    secret.write_text("s" * 40 + "\n")
    cfg = load_config(
        overrides=[f"state_dir={tmp_path / 'state'}", f"api.admin_token_file={secret}"]
    )
    assert admin_token(cfg) == "s" * 40
    assert not (tmp_path / "state" / "api-token").exists()
    secret.write_text("short")
    with pytest.raises(TokenFileError, match=r"api.admin_token_file: .* 5 characters") as exc:
        admin_token(cfg)
    assert "short" not in str(exc.value)
    secret.unlink()
    with pytest.raises(TokenFileError, match="api.admin_token_file: cannot read"):
        admin_token(cfg)
    local = load_config(overrides=[f"state_dir={tmp_path / 'local'}"])
    assert admin_token(local) == (tmp_path / "local" / "api-token").read_text().strip()


def test_a_relative_admin_token_file_is_refused() -> None:
    with pytest.raises(ConfigError, match="api.admin_token_file: must be an absolute path"):
        load_config(overrides=["api.admin_token_file=token"])
