"""The storage interface every checkpoint backend implements, and the tuning they share.

Owns: the `Storage` protocol (what the checkpoint engine needs from a place to keep
checkpoints), `StorageOptions` (part size, concurrency, retries, fsync, timeouts), the
errors a backend raises for a missing or torn object, and `wait_all` for a backend's
parallel requests.

Must not: talk to object storage or the disk (the backends in `local` and `s3` do), or know
steps, manifests or ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from jobs.checkpoint.retrying import RetryPolicy

__all__ = [
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_PART_SIZE_BYTES",
    "ObjectNotFoundError",
    "ObjectSizeError",
    "OnRetry",
    "Storage",
    "StorageOptions",
    "wait_all",
]

OnRetry = Callable[[str, BaseException], None]
T = TypeVar("T")
DEFAULT_PART_SIZE_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_CONCURRENCY = 16
_MIN_PART_SIZE_BYTES = 5 * 1024 * 1024  # S3's floor for all but the last part


class ObjectNotFoundError(Exception):
    """The key does not exist in the checkpoint storage."""


class ObjectSizeError(Exception):
    """An object exists but its size is not what the index promised (a torn object)."""


class Storage(Protocol):
    """What the checkpoint engine needs from a place to keep checkpoints."""

    uri: str

    def put_bytes(self, key: str, data: bytes) -> None:
        """Write one small object atomically (visible whole or not at all)."""

    def put_many(self, items: Sequence[tuple[str, memoryview]]) -> None:
        """Write many (possibly large) objects in parallel; returns when all are durable."""

    def get_bytes(self, key: str) -> bytes:
        """Read one object whole; raises ObjectNotFoundError."""

    def get_many(self, items: Sequence[tuple[str, memoryview]]) -> None:
        """Fill each buffer with its object; raises ObjectSizeError on a size mismatch."""

    def exists(self, key: str) -> bool: ...

    def list_keys(self, prefix: str = "") -> list[str]:
        """Every key under `prefix` (relative to the storage root), sorted."""

    def delete_keys(self, keys: Sequence[str]) -> None: ...

    def abort_abandoned_uploads(self, should_abort: Callable[[str, float], bool]) -> int:
        """Abort unfinished writes for which should_abort(key, age_s) holds; return count."""

    def close(self) -> None: ...


@dataclass
class StorageOptions:
    """Tuning shared by all backends."""

    part_size_bytes: int = DEFAULT_PART_SIZE_BYTES
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    on_retry: OnRetry | None = None
    fsync: bool = True
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.part_size_bytes < _MIN_PART_SIZE_BYTES:
            raise ValueError(
                f"part_size_bytes must be >= {_MIN_PART_SIZE_BYTES} (S3's minimum part), "
                f"got {self.part_size_bytes}"
            )
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {self.max_concurrency}")


def wait_all(futures: Sequence[Future[T]]) -> None:
    """Waits for every future before raising the first error."""
    first_error: BaseException | None = None
    for future in futures:
        try:
            future.result()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            first_error = first_error or exc
    if first_error is not None:
        raise first_error
