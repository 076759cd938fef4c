"""Who is calling: users, their tokens, and authenticating one request.

Owns: `Identity` over the store's users table: the first admin (`bootstrap`), adding, listing,
removing users and rotating their tokens (an `ApiError` naming the field; the last admin who
can sign in, or whose token never expires, is a 409: `controlplane.store.users`),
`recover_admin` (the break-glass way back, run beside the store, not through the API), and
`authenticate`: an ``Authorization`` header to a `Principal`, or a 401 naming the problem
without saying whose a token might be. Each request looks the token's hash up in the store
(no cache), so a rotated or removed token stops on the very next request.

Tokens: 32 random bytes (`tokens.new_token`), handed out once, stored as their SHA-256 only.

Must not: know HTTP beyond the header's text, log or return a stored hash, or touch Ray.
"""

from __future__ import annotations

import hmac
import math
import re
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from controlplane.api.access import ALL_QUEUES, Principal, Role
from controlplane.api.jobs import ApiError, int_param
from controlplane.store import (
    LastAdmin,
    Store,
    UnknownUser,
    UserExists,
    UserRecord,
)
from controlplane.tokens import new_token, token_hash

__all__ = [
    "BOOTSTRAP_ADMIN",
    "MAX_EXPIRES_IN_S",
    "Identity",
    "recover_admin",
    "user_to_json",
]

BOOTSTRAP_ADMIN = "admin"
"""The first user: created with the state dir's token when the store has no user yet."""
MAX_EXPIRES_IN_S = 10 * 365 * 86400
MAX_QUEUES = 64
MAX_HEADER_CHARS = 512
"""An ``Authorization`` value longer than this is refused unread (a token is 43 characters)."""
DEFAULT_USERS_PAGE = 100
MAX_USERS_PAGE = 1000
_NAME_RE = re.compile(r"[a-z][a-z0-9._-]{0,62}")
_NAME_RULE = "1-63 characters: lower-case letters, digits, '.', '_', '-', starting with a letter"
_USER_KEYS = frozenset({"name", "role", "queues", "expires_in_s"})


def user_to_json(user: UserRecord) -> dict[str, Any]:
    """The API's view of a user: never the token or its hash."""
    return {
        "name": user.name,
        "role": user.role,
        "queues": list(user.queues),
        "created_s": user.created_s,
        "rotated_s": user.rotated_s,
        "expires_s": user.expires_s,
    }


class Identity:
    """Users and authentication over the `Store`; thread-safe as the store is."""

    def __init__(
        self, store: Store, queues: Callable[[], list[str]], clock: Callable[[], float] = time.time
    ) -> None:
        """`queues` lists the configured queues a user may be bound to."""
        self.store = store
        self._queues = queues
        self._clock = clock

    def bootstrap(self, token: str) -> bool:
        """Make `token` the first admin's (``admin``) when the store has no user: a new
        store, or one from before users, whose token file thereby keeps working."""
        return self.store.ensure_first_admin(BOOTSTRAP_ADMIN, token_hash(token))

    # -- authentication ------------------------------------------------------------------------

    def authenticate(self, header: str | None) -> Principal:
        """The caller an ``Authorization: Bearer <token>`` header names, or ApiError 401."""
        scheme, _, given = (header or "").partition(" ")
        given = given.strip()
        if scheme.lower() != "bearer" or not given:
            raise ApiError(
                401, "missing token: send 'Authorization: Bearer <token>'", "Authorization"
            )
        try:
            raw = given.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a lone surrogate that is no escaped byte
            raw = b""
        if not raw or len(given) > MAX_HEADER_CHARS:
            raise ApiError(401, "wrong token", "Authorization")
        digest = token_hash(raw)
        user = self.store.user_by_token_hash(digest)
        if user is None or not hmac.compare_digest(user.token_hash, digest):
            why = self.store.retired_token(digest)
            if why == "rotated":
                message = "this token was rotated and no longer works; use the new one"
            elif why == "removed":
                message = "this token's user was removed; ask an admin for a user of your own"
            else:
                message = "wrong token"
            raise ApiError(401, message, "Authorization")
        if user.expires_s is not None and self._clock() >= user.expires_s:
            raise ApiError(
                401,
                "this token has expired; ask an admin to rotate it (rcp users rotate-token)",
                "Authorization",
            )
        return Principal(
            name=user.name,
            role=Role(user.role),
            queues=frozenset(user.queues),
            user_id=user.user_id,
        )

    # -- management ----------------------------------------------------------------------------

    def add(self, payload: Any) -> tuple[UserRecord, str]:
        """A new user from ``{name, role, queues, expires_in_s?}``; (user, their token)."""
        if not isinstance(payload, Mapping):
            raise ApiError(400, "the request body must be a JSON object", "<body>")
        _known_only(payload, _USER_KEYS)
        name = _name(payload.get("name"))
        role = _role(payload.get("role"))
        queues = self._queue_list(payload.get("queues", []))
        expires_s = self._expires(payload.get("expires_in_s"))
        token = new_token()
        try:
            user = self.store.add_user(
                name, role.value, queues, token_hash(token), expires_s=expires_s
            )
        except UserExists as exc:
            raise ApiError(409, str(exc), "name") from exc
        return user, token

    def list_users(
        self, limit: str | None, after: str | None
    ) -> tuple[list[UserRecord], str | None]:
        n = DEFAULT_USERS_PAGE if limit is None else int_param("limit", limit, 1, MAX_USERS_PAGE)
        if after is not None and len(after) > 64:
            raise ApiError(400, "after must be a user name from the previous page", "after")
        return self.store.list_users(limit=n, after=after or None)

    def remove(self, name: str) -> UserRecord:
        try:
            return self.store.remove_user(_name(name))
        except UnknownUser as exc:
            raise ApiError(404, str(exc), "name") from exc
        except LastAdmin as exc:
            raise ApiError(409, str(exc), "name") from exc

    def rotate(self, name: str, payload: Any) -> tuple[UserRecord, str]:
        """A new token for the user (the old one stops at once); ``{expires_in_s?}`` sets
        the new token's lifetime (none: it never expires)."""
        if payload is None:
            payload = {}
        if not isinstance(payload, Mapping):
            raise ApiError(400, "the request body must be a JSON object or empty", "<body>")
        _known_only(payload, {"expires_in_s"})
        expires_s = self._expires(payload.get("expires_in_s"))
        token = new_token()
        try:
            user = self.store.rotate_token(_name(name), token_hash(token), expires_s=expires_s)
        except UnknownUser as exc:
            raise ApiError(404, str(exc), "name") from exc
        except LastAdmin as exc:
            raise ApiError(409, str(exc), "expires_in_s") from exc
        return user, token

    def _queue_list(self, value: Any) -> list[str]:
        if not isinstance(value, list) or len(value) > MAX_QUEUES:
            raise ApiError(
                400, f"queues must be a list of at most {MAX_QUEUES} queue names", "queues"
            )
        known = set(self._queues())
        for q in value:
            if not isinstance(q, str) or (q != ALL_QUEUES and q not in known):
                shown = repr(q)[:80]
                raise ApiError(
                    400,
                    f"queues: {shown} is not a configured queue; known: "
                    f"{', '.join(sorted(known))} (or '{ALL_QUEUES}' for every queue)",
                    "queues",
                )
        return sorted(set(value))

    def _expires(self, value: Any) -> float | None:
        if value is None:
            return None
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not 1 <= value <= MAX_EXPIRES_IN_S
        ):
            raise ApiError(
                400,
                f"expires_in_s must be a number of seconds in 1..{MAX_EXPIRES_IN_S}, or absent "
                "for a token that never expires",
                "expires_in_s",
            )
        return self._clock() + float(value)


def recover_admin(store: Store, name: str, actor: str) -> tuple[UserRecord, str, bool]:
    """The break-glass way back when no admin can sign in: admin `name` (created if no user
    has it) gets a fresh token that never expires; (the admin, the token, whether it was
    created). Run beside the store, never through the API; `actor` (who ran it, and where)
    goes into its audit event. ValueError for a bad name or a non-admin user."""
    try:
        checked = _name(name)
    except ApiError as exc:
        raise ValueError(exc.message) from None
    token = new_token()
    try:
        user, created = store.recover_admin(checked, token_hash(token), actor=actor)
    except UserExists as exc:
        raise ValueError(str(exc)) from exc
    return user, token, created


def _known_only(payload: Mapping[Any, Any], keys: Collection[str]) -> None:
    unknown = sorted(str(k)[:40] for k in payload if k not in keys)
    if unknown:
        known = ", ".join(sorted(keys))
        raise ApiError(400, f"unknown field {unknown[0]!r}; known: {known}", unknown[0])


def _name(value: Any) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        shown = repr(value)[:80]
        raise ApiError(400, f"name: {shown} is not a user name ({_NAME_RULE})", "name")
    return value


def _role(value: Any) -> Role:
    try:
        return Role(value) if isinstance(value, str) else Role("")
    except ValueError:
        known = ", ".join(r.value for r in Role)
        raise ApiError(
            400, f"role: {repr(value)[:80]} is not a role; known: {known}", "role"
        ) from None
