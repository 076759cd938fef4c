"""Users of the API: their role, the queues they may submit to, and their token's hash.

Owns: `UserTable`: `add_user`, `ensure_first_admin` (the bootstrap: the first user, created
from the token `rcp up` writes), `get_user`, `list_users` (paged by name), `remove_user`,
`rotate_token`, `recover_admin` (``rcp users recover-admin``: the way back when no admin can
sign in) and the lookups authentication makes per request (`user_by_token_hash`,
`retired_token`). Tokens are never stored, only their SHA-256 (a token is 32 random bytes, so
its hash is a sound lookup key); a rotated or removed user's old hash goes to
``retired_tokens`` so a 401 can say "rotated" or "removed" without naming anyone. Each user
has a ``user_id`` that is never reused; jobs are owned by it (`controlplane.store.jobs`).

Invariant, kept inside each write transaction (`LastAdmin` refuses the change that breaks
it): an admin who can sign in now (a token that has not expired) is never removed or given an
expired token while they are the last such admin, and an admin whose token never expires is
never removed or given an expiring token while they are the last such admin. The second rule
is what keeps the first true tomorrow: an admin may hold an expiring token only beside one
whose token does not expire. A store already without such an admin (an older version allowed
it) is not refused changes that do not make it worse.

Must not: see a token, check a role's permissions (`controlplane.api.access`), or read the
wall clock directly.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterable

from controlplane.store.database import Database
from controlplane.store.errors import LastAdmin, UnknownUser, UserExists
from controlplane.store.records import UserRecord

__all__ = ["ADMIN_ROLE", "RECOVER_ADMIN_EVENT", "UserTable"]

ADMIN_ROLE = "admin"
"""The role that manages users (`controlplane.api.access.Role.ADMIN`); one must remain."""
_COLUMNS = "name, user_id, role, queues_json, token_hash, created_s, rotated_s, expires_s"
RECOVER_ADMIN_EVENT = "audit.users.recover-admin"
"""The event `recover_admin` records: an audit event, though no API request made it."""


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
        """Remove the user; their token stops at once. `LastAdmin` for the last admin who
        can sign in, or the last whose token never expires (the module's invariant). Their
        jobs keep their name as ``owner`` and belong to no user from now on."""
        now = self._clock()
        with self._tx() as db:
            user = self._user_in(db, name)
            _check_admins_remain(db, user, now, removing=True)
            self._retire(db, user.token_hash, "removed")
            db.execute("DELETE FROM users WHERE name = ?", (name,))
            return user

    def rotate_token(
        self, name: str, token_hash: str, *, expires_s: float | None = None
    ) -> UserRecord:
        """Give the user a new token hash (and expiry); the old token stops at once.
        `LastAdmin` when an expiry would leave no admin whose token never expires (the
        module's invariant): rotate that admin without one, or add another admin first."""
        now = self._clock()
        with self._tx() as db:
            user = self._user_in(db, name)
            _check_admins_remain(db, user, now, expires_s=expires_s)
            self._retire(db, user.token_hash, "rotated")
            db.execute(
                "UPDATE users SET token_hash = ?, rotated_s = ?, expires_s = ? WHERE name = ?",
                (token_hash, now, expires_s, name),
            )
            return self._user_in(db, name)

    def recover_admin(self, name: str, token_hash: str, *, actor: str) -> tuple[UserRecord, bool]:
        """Give admin `name` this token hash, one that never expires, creating the admin if
        no user has the name; (the admin, whether it was created). The break-glass way back
        when no admin can sign in: `rcp users recover-admin` on the controller's host, which
        holds the store. The old token stops at once (``rotated``). One event
        `RECOVER_ADMIN_EVENT` names the admin and `actor` (who ran it, where), in the same
        transaction. `UserExists` when the name is a user who is not an admin: recovery
        makes no one an admin who was not one (pick another name)."""
        now = self._clock()
        with self._tx() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM users WHERE name = ?", (name,)).fetchone()
            created = row is None
            if row is None:
                self._insert_user(db, name, ADMIN_ROLE, ("*",), token_hash, now, None)
            else:
                old = _user(row)
                if old.role != ADMIN_ROLE:
                    raise UserExists(
                        f"{name!r} is a {old.role}, not an admin; recovery makes no one an "
                        "admin who was not one: pick another name (--name)"
                    )
                self._retire(db, old.token_hash, "rotated")
                db.execute(
                    "UPDATE users SET token_hash = ?, rotated_s = ?, expires_s = NULL "
                    "WHERE name = ?",
                    (token_hash, now, name),
                )
            user = self._user_in(db, name)
            what = "created" if created else "given a new token"
            self._insert_event(
                db,
                now,
                RECOVER_ADMIN_EVENT,
                f"{actor} users.recover-admin name={name} ({what}, without the API)",
                None,
                {
                    "user": actor,
                    "user_id": None,
                    "role": None,
                    "route": "users.recover-admin",
                    "subject": {"name": name, "user_id": user.user_id, "role": ADMIN_ROLE},
                    "status": 201 if created else 200,
                },
            )
            return user, created

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
            "INSERT INTO users (name, user_id, role, queues_json, token_hash, created_s, "
            "rotated_s, expires_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                name,
                f"u-{uuid.uuid4().hex[:16]}",
                role,
                json.dumps(sorted(set(queues))),
                token_hash,
                now,
                now,
                expires_s,
            ),
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


def _check_admins_remain(
    db: sqlite3.Connection,
    user: UserRecord,
    now: float,
    *,
    removing: bool = False,
    expires_s: float | None = None,
) -> None:
    """`LastAdmin` if removing `user`, or giving them a token that expires at `expires_s`
    (None: never), breaks the module's invariant; nothing for a user who is not an admin."""
    if user.role != ADMIN_ROLE:
        return
    was_working = user.expires_s is None or user.expires_s > now
    was_lasting = user.expires_s is None
    still_working = not removing and (expires_s is None or expires_s > now)
    still_lasting = not removing and expires_s is None
    others_working, others_lasting = db.execute(
        "SELECT COALESCE(SUM(expires_s IS NULL OR expires_s > ?), 0), "
        "COALESCE(SUM(expires_s IS NULL), 0) FROM users WHERE role = ? AND name != ?",
        (now, ADMIN_ROLE, user.name),
    ).fetchone()
    change = "removing them" if removing else "an expired token"
    if was_working and not still_working and not others_working:
        raise LastAdmin(
            f"{user.name!r} is the last admin who can sign in (every other admin's token has "
            f"expired, or there is none): {change} would leave nobody to manage users. Add "
            "another admin first (rcp users add NAME --role admin)"
        )
    change = "removing them" if removing else "an expiring token"
    if was_lasting and not still_lasting and not others_lasting:
        raise LastAdmin(
            f"{user.name!r} is the last admin whose token never expires: {change} would leave "
            "no admin once the other tokens expire. Add another admin without --expires-in-s "
            "first, or rotate this one without it"
        )


def _user(row: sqlite3.Row) -> UserRecord:
    return UserRecord(
        name=str(row["name"]),
        user_id=str(row["user_id"]),
        role=str(row["role"]),
        queues=tuple(json.loads(row["queues_json"])),
        created_s=float(row["created_s"]),
        rotated_s=float(row["rotated_s"]),
        expires_s=None if row["expires_s"] is None else float(row["expires_s"]),
        token_hash=str(row["token_hash"]),
    )
