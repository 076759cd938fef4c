"""The SDK's errors: what the API refused (`ApiError`, its kinds by HTTP status), or that it
could not be reached; and the client-side ones (`NotConfigured`, `WaitTimeout`).

Must not: do I/O or read the environment.
"""

from __future__ import annotations

__all__ = [
    "ERROR_BY_STATUS",
    "ApiError",
    "AuthError",
    "ConflictError",
    "Forbidden",
    "JobNotFound",
    "NotConfigured",
    "SpecRejected",
    "WaitTimeout",
]


class ApiError(Exception):
    """The API refused a request or could not be reached. `status` 0 means unreachable."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message if field is None else f"{message} (field: {field})")
        self.status = status
        self.message = message
        self.field = field
        self.retry_after_s: float | None = None
        """A 429's ``Retry-After``: how long the server asked the client to wait."""


class NotConfigured(ApiError):
    """No API URL or token could be found."""


class AuthError(ApiError):
    """401: missing, wrong, expired, rotated or removed token (and, as `Forbidden`, 403)."""


class Forbidden(AuthError):
    """403: the token is fine but its user may not do this (the message says what is missing:
    a role, a queue binding, or ownership of the job)."""


class SpecRejected(ApiError):
    """400/422: the spec (or a parameter) is invalid; `field` names it."""


class JobNotFound(ApiError):
    """404: no such job."""


class ConflictError(ApiError):
    """409: e.g. cancelling a finished job, or an idempotency key reused for another spec."""


class WaitTimeout(ApiError):
    """`wait` gave up before the job finished."""


ERROR_BY_STATUS: dict[int, type[ApiError]] = {
    400: SpecRejected,
    401: AuthError,
    403: Forbidden,
    404: JobNotFound,
    409: ConflictError,
    422: SpecRejected,
}
