"""Admins cannot all be lost, and `rcp users recover-admin` brings one back when they are.

The guard (`controlplane.store.users`): an admin who can sign in now is never removed or
given an expired token while the last such admin, and an admin whose token never expires is
never removed or given an expiring token while the last such admin. The recovery runs on a
real SQLite store in a temp state dir, without the API. No Ray.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from controlplane.api.identity import Identity
from controlplane.cli.users import users_group
from controlplane.config import load_config
from controlplane.store import ADMIN_ROLE, RECOVER_ADMIN_EVENT, LastAdmin, Store
from controlplane.tokens import token_hash

NOW_S = 10_000.0
LASTING: float | None = None
"""An admin token that never expires."""
LATER = NOW_S + 3600.0
"""A token that works now and expires in an hour."""
EXPIRED = NOW_S - 1.0


def fixed_clock() -> float:
    return NOW_S


def users_store(path: Path, users: dict[str, tuple[str, float | None]]) -> Store:
    """A store holding `users`: name -> (role, token expiry); each token is the name x 8."""
    store = Store(path, clock=fixed_clock)
    for name, (role, expires_s) in users.items():
        store.add_user(name, role, ["*"], token_hash(name * 8), expires_s=expires_s)
    return store


@dataclass(frozen=True)
class Case:
    users: dict[str, tuple[str, float | None]]
    change: Callable[[Store], object]
    refused: bool


def remove(name: str) -> Callable[[Store], object]:
    return lambda store: store.remove_user(name)


def rotate(name: str, expires_s: float | None) -> Callable[[Store], object]:
    return lambda store: store.rotate_token(name, token_hash("new"), expires_s=expires_s)


A = ADMIN_ROLE
CASES = {
    # The review's finding: the other admin's token had expired, yet it counted.
    "remove-the-only-working-admin-beside-an-expired-one": Case(
        {"ann": (A, LASTING), "old": (A, EXPIRED)}, remove("ann"), refused=True
    ),
    "remove-the-expired-admin": Case(
        {"ann": (A, LASTING), "old": (A, EXPIRED)}, remove("old"), refused=False
    ),
    "remove-the-lasting-admin-beside-one-that-expires": Case(
        {"ann": (A, LASTING), "tmp": (A, LATER)}, remove("ann"), refused=True
    ),
    "remove-one-of-two-lasting-admins": Case(
        {"ann": (A, LASTING), "bea": (A, LASTING)}, remove("ann"), refused=False
    ),
    "give-the-last-lasting-admin-an-expiring-token": Case(
        {"ann": (A, LASTING), "tmp": (A, LATER)}, rotate("ann", LATER), refused=True
    ),
    "give-the-last-working-admin-an-expired-token": Case(
        {"ann": (A, LASTING)}, rotate("ann", EXPIRED), refused=True
    ),
    "give-one-of-two-lasting-admins-an-expiring-token": Case(
        {"ann": (A, LASTING), "bea": (A, LASTING)}, rotate("ann", LATER), refused=False
    ),
    "rotate-the-last-lasting-admin-without-expiry": Case(
        {"ann": (A, LASTING)}, rotate("ann", LASTING), refused=False
    ),
    "an-older-store-without-a-lasting-admin-keeps-its-last-working-one": Case(
        {"tmp": (A, LATER), "old": (A, EXPIRED)}, remove("tmp"), refused=True
    ),
    "an-older-store-without-a-lasting-admin-may-rotate-it-with-expiry": Case(
        {"tmp": (A, LATER)}, rotate("tmp", LATER + 60), refused=False
    ),
    "remove-a-researcher": Case(
        {"ann": (A, LASTING), "rex": ("researcher", LASTING)}, remove("rex"), refused=False
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_the_last_working_or_lasting_admin_is_kept(case: Case, tmp_path: Path) -> None:
    with users_store(tmp_path / "store.db", case.users) as store:
        before = store.list_users(limit=100)[0]
        if case.refused:
            with pytest.raises(LastAdmin, match="last admin"):
                case.change(store)
            assert store.list_users(limit=100)[0] == before  # nothing changed
        else:
            case.change(store)
            assert store.list_users(limit=100)[0] != before


# -- rcp users recover-admin ---------------------------------------------------------------


def recover(state_dir: Path, *args: str) -> tuple[int, str, str]:
    out = CliRunner().invoke(
        users_group, ["recover-admin", "--state-dir", str(state_dir), *args], env={}
    )
    return out.exit_code, out.stdout, out.stderr


def lost_admins(state_dir: Path) -> Path:
    """A store whose only admin's token expired (nobody can manage users through the API),
    beside a researcher; returns its path."""
    path = load_config(None, [f"state_dir={state_dir}"]).jobs_db_path
    path.parent.mkdir(parents=True, exist_ok=True)
    with users_store(path, {"admin": (A, EXPIRED), "rex": ("researcher", LASTING)}):
        pass
    return path


@pytest.mark.parametrize(
    "name, created",
    [("admin", False), ("rescue", True)],
    ids=["restores-the-expired-admin", "creates-a-new-admin"],
)
def test_recover_admin_gives_a_working_admin_and_audits_it(
    tmp_path: Path, name: str, created: bool
) -> None:
    path = lost_admins(tmp_path)
    code, stdout, stderr = recover(tmp_path, "--name", name, "--json")
    assert code == 0, stderr
    answer = json.loads(stdout)
    token = answer["token"]
    assert (answer["name"], answer["role"], answer["expires_s"]) == (name, A, None)
    assert answer["created"] is created
    with Store(path) as store:
        who = Identity(store, lambda: ["default"]).authenticate(f"Bearer {token}")
        assert (who.name, who.role.value, who.queues) == (name, A, frozenset({"*"}))
        (event,) = store.events(kind_prefix=RECOVER_ADMIN_EVENT)
        assert event.data["subject"]["name"] == name and name in event.message
        assert "recover-admin" in str(event.data["user"])
        assert token not in json.dumps(dict(event.data)) + event.message
        if not created:
            assert store.retired_token(token_hash("admin" * 8)) == "rotated"


def test_recover_admin_prints_the_token_alone_on_stdout(tmp_path: Path) -> None:
    path = lost_admins(tmp_path)
    code, stdout, stderr = recover(tmp_path)
    assert code == 0 and "shown this once" in stderr.lower()
    token = stdout.strip()
    assert len(stdout.splitlines()) == 1 and token not in stderr
    with Store(path) as store:
        assert store.user_by_token_hash(token_hash(token)) is not None


@pytest.mark.parametrize(
    "args, has_store, message",
    [
        (("--name", "rex"), True, "not an admin"),
        (("--name", "Bad Name"), True, "not a user name"),
        ((), False, "no job store"),
    ],
    ids=["a-researchers-name", "a-bad-name", "no-store-here"],
)
def test_recover_admin_refuses_and_changes_nothing(
    tmp_path: Path, args: tuple[str, ...], has_store: bool, message: str
) -> None:
    path = lost_admins(tmp_path) if has_store else None
    code, stdout, stderr = recover(tmp_path, *args)
    assert code == 2 and message in stderr and stdout == ""
    if path is None:
        assert list(tmp_path.iterdir()) == []  # no empty store was created
        return
    with Store(path) as store:
        assert store.events(kind_prefix=RECOVER_ADMIN_EVENT) == []
        assert store.get_user("rex").role == "researcher"
