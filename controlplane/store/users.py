"""Users of the API: their role, the queues they may submit to, and their token's hash.

Owns: `UserTable`: `add_user`, `ensure_first_admin` (the bootstrap: the first user, created
from the token `rcp up` writes), `get_user`, `list_users` (paged by name), `remove_user`,
`rotate_token` and the lookups authentication makes per request (`user_by_token_hash`,
`retired_token`). Tokens are never stored, only their SHA-256 (a token is 32 random bytes, so
its hash is a sound lookup key); a rotated or removed user's old hash goes to
``retired_tokens`` so a 401 can say "rotated" or "removed" without naming anyone.

Invariant, kept inside each write transaction: once a user exists, at least one ``admin``
does (`LastAdmin` refuses the change that would leave none).

Must not: see a token, check a role's permissions (`controlplane.service.access`), or read the
wall clock directly.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable

from controlplane.store.database import Database
from controlplane.store.errors import LastAdmin, UnknownUser, UserExists
from controlplane.store.records import UserRecord

__all__ = ["ADMIN_ROLE", "UserTable"]

ADMIN_ROLE = "admin"
"""The role that manages users (`controlplane.service.access.Role.ADMIN`); one must remain."""
_COLUMNS = "name, role, queues_json, token_hash, created_s, rotated_s, expires_s"


class UserTable(Database):
    """The users table and the hashes of retired tokens."""

    def add_user(
        self,
        name: str,
        role: str,
        queues: Iterable[str],
        token_hash: str,
        *,
        expires_s: float | None = None,
    ) -> UserRecord:
        """A new user; `UserExists` if the name is taken."""
        now = self._clock()
        with self._tx() as db:
            if db.execute("SELECT 1 FROM users WHERE name = ?", (name,)).fetchone():
                raise UserExists(f"a user named {name!r} exists already; pick another name")
            self._insert_user(db, name, role, tuple(queues), token_hash, now, expires_s)
            return self._user_in(db, name)

    def ensure_first_admin(self, name: str, token_hash: str) -> bool:
        """Create admin `name` with this token hash when no user exists yet (a new store, or
        one from before users); True if it did. Once any user exists this does nothing, so a
        rotated admin token is not brought back by a restart."""
        now = self._clock()
        with self._tx() as db:
            if db.execute("SELECT 1 FROM users LIMIT 1").fetchone() is not None:
                return False
            self._insert_user(db, name, ADMIN_ROLE, ("*",), token_hash, now, None)
            return True

    def get_user(self, name: str) -> UserRecord:
        rows = self._read(f"SELECT {_COLUMNS} FROM users WHERE name = ?", (name,))
        if not rows:
            raise UnknownUser(name)
        return _user(rows[0])

    def list_users(
        self, *, limit: int, after: str | None = None
    ) -> tuple[list[UserRecord], str | None]:
        """At most `limit` users by name, after name `after`; and the next page's `after`."""
        sql = f"SELECT {_COLUMNS} FROM users"
        params: list[object] = []
        if after is not None:
            sql += " WHERE name > ?"
            params.append(after)
        sql += " ORDER BY name LIMIT ?"
        params.append(limit + 1)
        rows = self._read(sql, params)
        page = [_user(r) for r in rows[:limit]]
        return page, (page[-1].name if len(rows) > limit and page else None)

    def count_users(self, role: str | None = None) -> int:
        if role is None:
            return int(self._read("SELECT COUNT(*) FROM users")[0][0])
        return int(self._read("SELECT COUNT(*) FROM users WHERE role = ?", (role,))[0][0])

    def remove_user(self, name: str) -> UserRecord:
        """Remove the user; their token stops at once. `LastAdmin` for the last admin."""
        with self._tx() as db:
            user = self._user_in(db, name)
            if user.role == ADMIN_ROLE and _admins(db) <= 1:
                raise LastAdmin(
                    f"{name!r} is the last admin; add another admin before removing this one"
                )
            self._retire(db, user.token_hash, "removed")
            db.execute("DELETE FROM users WHERE name = ?", (name,))
            return user

    def rotate_token(
        self, name: str, token_hash: str, *, expires_s: float | None = None
    ) -> UserRecord:
        """Give the user a new token hash (and expiry); the old token stops at once."""
        now = self._clock()
        with self._tx() as db:
            user = self._user_in(db, name)
            self._retire(db, user.token_hash, "rotated")
            db.execute(
                "UPDATE users SET token_hash = ?, rotated_s = ?, expires_s = ? WHERE name = ?",
                (token_hash, now, expires_s, name),
            )
            return self._user_in(db, name)

    def user_by_token_hash(self, token_hash: str) -> UserRecord | None:
        rows = self._read(f"SELECT {_COLUMNS} FROM users WHERE token_hash = ?", (token_hash,))
        return _user(rows[0]) if rows else None

    def retired_token(self, token_hash: str) -> str | None:
        """Why a token no longer works (``rotated``, ``removed``); None if it never did."""
        rows = self._read("SELECT why FROM retired_tokens WHERE token_hash = ?", (token_hash,))
        return str(rows[0]["why"]) if rows else None

    # -- plumbing ----------------------------------------------------------------------------

    def _insert_user(
        self,
        db: sqlite3.Connection,
        name: str,
        role: str,
        queues: tuple[str, ...],
        token_hash: str,
        now: float,
        expires_s: float | None,
    ) -> None:
        db.execute(
            "INSERT INTO users (name, role, queues_json, token_hash, created_s, rotated_s, "
            "expires_s) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (name, role, json.dumps(sorted(set(queues))), token_hash, now, now, expires_s),
        )

    def _retire(self, db: sqlite3.Connection, token_hash: str, why: str) -> None:
        db.execute(
            "INSERT INTO retired_tokens (token_hash, why, at_s) VALUES (?, ?, ?) "
            "ON CONFLICT (token_hash) DO UPDATE SET why = excluded.why, at_s = excluded.at_s",
            (token_hash, why, self._clock()),
        )

    def _user_in(self, db: sqlite3.Connection, name: str) -> UserRecord:
        row = db.execute(f"SELECT {_COLUMNS} FROM users WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise UnknownUser(name)
        return _user(row)


def _admins(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT COUNT(*) FROM users WHERE role = ?", (ADMIN_ROLE,)).fetchone()[0])


def _user(row: sqlite3.Row) -> UserRecord:
    return UserRecord(
        name=str(row["name"]),
        role=str(row["role"]),
        queues=tuple(json.loads(row["queues_json"])),
        created_s=float(row["created_s"]),
        rotated_s=float(row["rotated_s"]),
        expires_s=None if row["expires_s"] is None else float(row["expires_s"]),
        token_hash=str(row["token_hash"]),
    )
