"""Storage backends for checkpoints, behind one interface, picked by the URI's scheme.

This package is the only code in the checkpoint engine that talks to object storage or the
checkpoint directory: ``s3://bucket/prefix`` (AWS or any S3-compatible endpoint, through
boto3) and ``file:///absolute/path``. Every backend writes small objects atomically, writes
many large objects in parallel (S3: multipart uploads whose parts run concurrently, each
with a CRC-32 the server checks), reads into caller-owned buffers, and retries transient
failures through `retrying`. It knows nothing about steps, manifests or ranks.

Owns: the scheme registry (`STORAGES`, `open_storage`) and the package's public names. The
interface and shared tuning are in `interface`, the backends in `local` (``file://``) and
`s3` (``s3://``).

Must not: know steps, manifests or ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from jobs.checkpoint.storages.interface import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_PART_SIZE_BYTES,
    ObjectNotFoundError,
    ObjectSizeError,
    OnRetry,
    Storage,
    StorageOptions,
)
from jobs.checkpoint.storages.local import LocalStorage
from jobs.checkpoint.storages.s3 import S3Storage

__all__ = [
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_PART_SIZE_BYTES",
    "STORAGES",
    "LocalStorage",
    "ObjectNotFoundError",
    "ObjectSizeError",
    "OnRetry",
    "S3Storage",
    "Storage",
    "StorageFactory",
    "StorageOptions",
    "open_storage",
]


StorageFactory = Callable[[str, "str | None", "str | None", StorageOptions], Storage]


def _open_file(
    uri: str, _endpoint: str | None, _region: str | None, opts: StorageOptions
) -> Storage:
    parsed = urlparse(uri)
    if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
        raise ValueError(f"file URI must be file:///absolute/path, got {uri!r}")
    return LocalStorage(Path(parsed.path), opts)


def _open_s3(uri: str, endpoint: str | None, region: str | None, opts: StorageOptions) -> Storage:
    parsed = urlparse(uri)
    if not parsed.netloc:
        raise ValueError(f"s3 URI must name a bucket, s3://bucket/prefix; got {uri!r}")
    return S3Storage(parsed.netloc, parsed.path, endpoint_url=endpoint, region=region, options=opts)


STORAGES: dict[str, StorageFactory] = {"file": _open_file, "s3": _open_s3}
"""Backends by URI scheme. Add one here to support another store."""


def open_storage(
    uri: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    options: StorageOptions | None = None,
) -> Storage:
    """The backend for `uri` (``s3://bucket/prefix`` or ``file:///path``)."""
    if not isinstance(uri, str) or "://" not in uri:
        raise ValueError(
            f"checkpoint uri must look like s3://bucket/prefix or file:///path, got {uri!r}"
        )
    scheme = uri.split("://", 1)[0].lower()
    factory = STORAGES.get(scheme)
    if factory is None:
        raise ValueError(
            f"checkpoint uri scheme {scheme!r} is not supported; use one of {sorted(STORAGES)}"
        )
    return factory(uri, endpoint_url, region, options or StorageOptions())
