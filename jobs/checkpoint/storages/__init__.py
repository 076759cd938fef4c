"""Storage backends for checkpoints, behind one interface, picked by the URI's scheme.

This package is the only code in the checkpoint engine that talks to object storage or the
checkpoint directory: ``s3://bucket/prefix`` (AWS or any S3-compatible endpoint, through
boto3) and ``file:///absolute/path``.

Owns: the scheme registry (`STORAGES`, `open_storage`) and the package's public names. The
interface and shared tuning are in `interface`, the backends in `local` and `s3`. URIs are
parsed by `jobs.storage_uri.parse_storage_uri`, the parser the job spec's checks use too, so a
URI names here exactly the place those checks compared.

Must not: know steps, manifests or ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

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
from jobs.storage_credentials import CredentialSource
from jobs.storage_uri import StorageUri, parse_storage_uri

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


StorageFactory = Callable[
    [StorageUri, "str | None", "str | None", StorageOptions, "CredentialSource | None"], Storage
]


STORAGES: dict[str, StorageFactory] = {
    "file": lambda uri, _endpoint, _region, opts, _creds: LocalStorage(Path(uri.key_prefix), opts),
    "s3": lambda uri, endpoint, region, opts, creds: S3Storage(
        uri.bucket,
        uri.key_prefix,
        endpoint_url=endpoint,
        region=region,
        options=opts,
        credentials=creds,
    ),
}
"""Backends by URI scheme (`jobs.storage_uri.SCHEMES`). Add one here, and there, to support
another store."""


def open_storage(
    uri: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    options: StorageOptions | None = None,
    credentials: CredentialSource | None = None,
) -> Storage:
    """The backend for `uri` (``s3://bucket/prefix`` or ``file:///path``); a URI that
    `parse_storage_uri` refuses is a ValueError saying why. `credentials`: where an S3
    backend gets its credentials (a job's scoped ones), instead of boto3's usual chain."""
    try:
        parsed = parse_storage_uri(uri)
    except ValueError as exc:
        raise ValueError(f"checkpoint uri: {exc}") from exc
    return STORAGES[parsed.scheme](
        parsed, endpoint_url, region, options or StorageOptions(), credentials
    )
