"""Retries with capped exponential backoff and full jitter for object-storage calls.

This module owns which failures are worth retrying (throttling, 5xx, timeouts, connection
resets, truncated reads, a checksum that did not match on download) and how long to wait.
It does not know what is being retried; callers pass a function and a label.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    IncompleteReadError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError
from urllib3.exceptions import HTTPError as Urllib3HTTPError

T = TypeVar("T")

RETRYABLE_ERROR_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
     "RequestTimeout", "RequestTimeoutException", "InternalError", "ServiceUnavailable",
     "BadDigest", "IncompleteBody"}
)  # fmt: skip


class TransientError(Exception):
    """A failure the caller knows to be transient (a short or mismatching read)."""


_RETRYABLE_TYPES = (
    TransientError, BotoConnectionError, EndpointConnectionError, ConnectionClosedError,
    ReadTimeoutError, ResponseStreamingError, IncompleteReadError, Urllib3HTTPError,
    ConnectionError, TimeoutError,
)  # fmt: skip


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry one storage call."""

    max_attempts: int = 8
    base_delay_s: float = 0.05
    max_delay_s: float = 5.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay_s < 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError(
                "RetryPolicy needs 0 <= base_delay_s <= max_delay_s, got "
                f"base_delay_s={self.base_delay_s}, max_delay_s={self.max_delay_s}"
            )

    def delay_s(self, attempt: int, rng: random.Random) -> float:
        """Full jitter: uniform in [0, min(max_delay_s, base_delay_s * 2**attempt)]."""
        return rng.uniform(0.0, min(self.max_delay_s, self.base_delay_s * (2**attempt)))


def is_retryable(exc: BaseException) -> bool:
    """True for throttling, server errors, timeouts, resets and short reads."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        return error.get("Code") in RETRYABLE_ERROR_CODES or status == 429 or status >= 500
    return isinstance(exc, _RETRYABLE_TYPES)


def call_with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy,
    on_retry: Callable[[str, BaseException], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> T:
    """Call `fn` until it succeeds, it fails with a non-retryable error, or attempts run out."""
    generator = rng or random.Random()
    for attempt in range(policy.max_attempts):
        try:
            return fn()
        except Exception as exc:
            if not is_retryable(exc) or attempt + 1 >= policy.max_attempts:
                raise
            if on_retry is not None:
                on_retry(what, exc)
            sleep(policy.delay_s(attempt, generator))
    raise AssertionError("unreachable: the loop returns or raises")
