"""When the controller mints a running job's scoped storage credentials again.

Owns `credentials_action(held, cached, now_s, duration_s)`: for one job, from the expiry of
the credentials the signals actor holds for its attempt (`held`, None: none), the expiry of
the newest ones the controller minted for it (`cached`, None: none since it started) and the
lifetime it mints (`duration_s`), whether to leave them (`KEEP`), hand the cached ones to
the actor again (`PUT`: the actor restarted or was replaced and lost them) or mint new ones
(`MINT`).

Credentials are fresh while more than `refresh_ahead_s(duration_s)` is left: half their
lifetime, and never under `MIN_REFRESH_AHEAD_S` (20 min). A job's boto refreshes from
15 min before expiry (botocore's advisory window), so when it asks, the actor already holds
credentials with more than 15 min left and one ask suffices.

Worked example (duration 3600 s, so fresh means more than 1800 s left; now = 10,000):

    held 13,000 (3000 s left)                   -> KEEP
    held 11,500 (1500 s left), cached 11,500    -> MINT   (the newest we have is due too)
    held None (actor restarted), cached 13,000  -> PUT    (ours is still fresh)
    held None, cached None (controller restart) -> MINT

Must not: read clocks, call STS or the actor (the caller passes what it read).
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "MIN_REFRESH_AHEAD_S",
    "CredentialsAction",
    "credentials_action",
    "refresh_ahead_s",
]

MIN_REFRESH_AHEAD_S = 1200.0
"""Least time left at which credentials count as due: above botocore's 15 min advisory
refresh window, so a job never refreshes into credentials that are due themselves."""


class CredentialsAction(str, Enum):
    KEEP = "keep"
    PUT = "put"
    MINT = "mint"


def refresh_ahead_s(duration_s: float) -> float:
    """Time left at which credentials of lifetime `duration_s` are minted again."""
    return max(duration_s / 2.0, MIN_REFRESH_AHEAD_S)


def credentials_action(
    held_expires_s: float | None,
    cached_expires_s: float | None,
    now_s: float,
    duration_s: float,
) -> CredentialsAction:
    """What to do about one running job's credentials (see the module doc)."""
    ahead_s = refresh_ahead_s(duration_s)
    if held_expires_s is not None and held_expires_s - now_s > ahead_s:
        return CredentialsAction.KEEP
    if (
        cached_expires_s is not None
        and cached_expires_s - now_s > ahead_s
        and cached_expires_s != held_expires_s
    ):
        return CredentialsAction.PUT
    return CredentialsAction.MINT
