"""Local mode's security model (issue 12, item 8): state files owner-only from creation, Ray
token auth for every Ray process and client, loopback unless `ray.allow_remote`.

No Ray is started here; the integration test (test_local_cluster.py) shows a client without
the token is refused by a real cluster.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.config import ConfigError, load_config
from controlplane.local.cluster import LocalCluster
from controlplane.local.head import node_env
from controlplane.local.state_file import write_state
from controlplane.ray_connection import (
    RAY_AUTH_TOKEN_ENV,
    ClusterError,
    ray_token_path,
    use_ray_token,
)
from controlplane.statefiles import create_private, narrow_private, private_umask, write_private
from controlplane.store import Store
from controlplane.tokens import ensure_token, write_url


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """Umask 0: a file is as wide as its creator asked for, so only an explicit mode at
    creation keeps it private (what a chmod afterwards would leave open for a moment)."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _store(state: Path) -> list[Path]:
    db = state / "controlplane.db"
    store = Store(db)
    store.put("k", {"v": 1})  # a write: SQLite now has its WAL and shared-memory files
    wal, shm = db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")
    assert wal.exists() and shm.exists()
    paths = [db, wal, shm]
    store.close()
    return paths


def _api_token(state: Path) -> list[Path]:
    ensure_token(state)
    return [state / "api-token"]


def _api_url(state: Path) -> list[Path]:
    write_url(state, "http://127.0.0.1:8080")
    return [state / "api-url"]


def _cluster_state(state: Path) -> list[Path]:
    cluster = LocalCluster(load_config(None, [f"state_dir={state}"]))
    write_state(cluster.state_file, {"cluster_id": "x", "status": "starting"})
    return [cluster.state_file]


def _private_file(state: Path) -> list[Path]:
    write_private(state / "ray-token", "t\n")
    return [state / "ray-token"]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(_store, id="job-database-and-wal"),
        pytest.param(_api_token, id="api-token"),
        pytest.param(_api_url, id="api-url"),
        pytest.param(_cluster_state, id="local-cluster-state"),
        pytest.param(_private_file, id="ray-token"),
    ],
)
def test_state_files_are_0600_and_the_state_dir_0700_from_creation(
    tmp_path: Path, open_umask: None, make: object
) -> None:
    state = tmp_path / "state"
    paths = make(state)  # type: ignore[operator]
    assert mode(state) == 0o700
    for p in paths:
        if p.exists():
            assert mode(p) == 0o600, p


def test_rewriting_a_file_that_was_left_wide_makes_it_0600(tmp_path: Path) -> None:
    path = tmp_path / "local-cluster.json"
    path.write_text("{}")
    path.chmod(0o644)
    write_private(path, '{"a": 1}')
    assert mode(path) == 0o600
    assert path.read_text() == '{"a": 1}'
    assert [p.name for p in tmp_path.iterdir()] == ["local-cluster.json"]  # no temp left


def test_create_private_keeps_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "db"
    path.write_bytes(b"rows")
    create_private(path)
    assert path.read_bytes() == b"rows"


def _wide(path: Path, file_mode: int = 0o644) -> Path:
    """`path` as an older version left it: the state dir 0755, the file `file_mode`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o755)
    path.write_text("old-token\n")
    path.chmod(file_mode)
    return path


def _open_store(state: Path) -> list[Path]:
    db = state / "controlplane.db"
    for p in (_wide(db), _wide(state / "controlplane.db-wal")):
        p.write_bytes(b"")
    store = Store(db)
    wal_mode = mode(state / "controlplane.db-wal")  # SQLite removes it on close
    store.close()
    assert wal_mode == 0o600
    return [db]


def _open_api_token(state: Path) -> list[Path]:
    _wide(state / "api-token")
    assert ensure_token(state) == "old-token"
    return [state / "api-token", state]


def _create_private_over_a_wide_file(state: Path) -> list[Path]:
    create_private(_wide(state / "db"))
    return [state / "db"]


@pytest.mark.parametrize(
    "open_it",
    [
        pytest.param(_open_store, id="job-database-and-wal"),
        pytest.param(_open_api_token, id="api-token-and-state-dir"),
        pytest.param(_create_private_over_a_wide_file, id="create-private"),
    ],
)
def test_state_files_an_older_version_left_0644_are_narrowed_on_open(
    tmp_path: Path, open_it: object, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="controlplane.statefiles"):
        paths = open_it(tmp_path / "state")  # type: ignore[operator]
    for p in paths:
        assert mode(p) == (0o700 if p.is_dir() else 0o600), p
        notes = [r.getMessage() for r in caplog.records]
        assert any(f"narrowed {p} from 0" in n for n in notes), (p, notes)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(0o644, 0o600, id="0644-to-0600"),
        pytest.param(0o666, 0o600, id="0666-to-0600"),
        pytest.param(0o444, 0o400, id="read-only-stays-read-only"),
        pytest.param(0o600, 0o600, id="already-private"),
    ],
)
def test_narrow_private_only_removes_bits(tmp_path: Path, before: int, after: int) -> None:
    path = _wide(tmp_path / "f", before)
    assert narrow_private(path) is (before != after)
    assert mode(path) == after


def test_narrow_private_does_not_follow_a_symlink(tmp_path: Path) -> None:
    target = _wide(tmp_path / "elsewhere" / "f")
    link = tmp_path / "state" / "db"
    link.parent.mkdir()
    link.symlink_to(target)
    create_private(link)
    assert not narrow_private(link)
    assert mode(target) == 0o644


def test_private_umask_is_restored(tmp_path: Path) -> None:
    before = os.umask(0o022)
    try:
        with private_umask():
            (tmp_path / "log").write_text("x")
            (tmp_path / "dir").mkdir()
        assert mode(tmp_path / "log") == 0o600
        assert mode(tmp_path / "dir") == 0o700
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(before)


def test_up_narrows_a_state_dir_an_older_version_left_open(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    notes: list[str] = []
    LocalCluster(load_config(None, [f"state_dir={state}"]))._make_state_dir_private(notes.append)
    assert mode(state) == 0o700
    assert notes and "0700" in notes[0]


def test_every_ray_process_runs_with_token_auth_from_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RAY_AUTH_TOKEN_ENV, "a-token-for-some-other-cluster")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cfg = load_config(None, [f"state_dir={tmp_path}"])
    env = node_env(cfg, "cid")
    assert env["RAY_AUTH_MODE"] == "token"
    assert env["RAY_AUTH_TOKEN_PATH"] == str(ray_token_path(cfg).resolve())
    # The value would win over the file in Ray's lookup; it is never passed on.
    assert RAY_AUTH_TOKEN_ENV not in env


@pytest.fixture
def ray_auth_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", RAY_AUTH_TOKEN_ENV):
        monkeypatch.delenv(key, raising=False)
    yield
    monkeypatch.undo()
    from ray._raylet import AuthenticationTokenLoader
    from ray._raylet import Config as RayConfig

    RayConfig.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def test_a_client_uses_the_token_file_of_the_cluster_it_connects_to(
    tmp_path: Path, ray_auth_restored: None
) -> None:
    from ray._private.authentication.http_token_authentication import (
        get_auth_headers_if_auth_enabled,
    )

    first, second = tmp_path / "a" / "ray-token", tmp_path / "b" / "ray-token"
    write_private(first, "1" * 64 + "\n")
    write_private(second, "2" * 64 + "\n")
    use_ray_token(first)
    assert get_auth_headers_if_auth_enabled({}) == {"authorization": "Bearer " + "1" * 64}
    # The next module's cluster has another token: the cached one must not be reused.
    use_ray_token(second)
    assert get_auth_headers_if_auth_enabled({}) == {"authorization": "Bearer " + "2" * 64}
    assert os.environ["RAY_AUTH_TOKEN_PATH"] == str(second.resolve())


def test_connecting_without_a_token_file_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="no Ray token at .*rcp down"):
        use_ray_token(tmp_path / "ray-token")


@pytest.mark.parametrize(
    ("overrides", "ok"),
    [
        pytest.param([], True, id="default-loopback"),
        pytest.param(["ray.node_ip=127.0.0.1"], True, id="ipv4-loopback"),
        pytest.param(["ray.node_ip=127.0.0.2"], True, id="other-127"),
        pytest.param(["ray.node_ip=::1"], True, id="ipv6-loopback"),
        pytest.param(["ray.node_ip=localhost"], True, id="localhost"),
        pytest.param(["ray.node_ip=0.0.0.0"], False, id="all-interfaces"),
        pytest.param(["ray.node_ip='::'"], False, id="ipv6-all-interfaces"),
        pytest.param(["ray.node_ip=10.1.2.3"], False, id="private-ip"),
        pytest.param(["ray.node_ip=203.0.113.7"], False, id="public-ip"),
        pytest.param(["ray.node_ip=myhost.example"], False, id="host-name"),
        pytest.param(["ray.node_ip=0.0.0.0", "ray.allow_remote=true"], True, id="allowed"),
        pytest.param(["ray.node_ip=10.1.2.3", "ray.allow_remote=true"], True, id="pod-ip-allowed"),
    ],
)
def test_a_non_loopback_bind_address_needs_allow_remote(overrides: list[str], ok: bool) -> None:
    if ok:
        load_config(None, overrides)
        return
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert "ray.node_ip" in str(err.value)
    assert "ray.allow_remote=true" in str(err.value)
