"""Object storage access for the control plane (the only module here that talks to S3).

Owns: building a boto3 client from config and creating the bucket of `storage.uri`.
Credentials come from boto3's usual chain (environment, profile, instance role) and are never
logged; only the embedded loopback store gets fixed local keys, since it accepts any.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from controlplane.config import Config


def bucket_of(uri: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix)."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"storage.uri: expected s3://bucket[/prefix], got {uri!r}")
    return parsed.netloc, parsed.path.lstrip("/")


def s3_client(cfg: Config, endpoint_url: str | None = None) -> Any:
    import boto3

    endpoint = endpoint_url or cfg.storage.endpoint_url
    kwargs: dict[str, Any] = {"region_name": cfg.storage.region}
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    if cfg.storage.embedded:
        from controlplane.local.cluster import EMBEDDED_ACCESS_KEY, EMBEDDED_SECRET_KEY

        kwargs["aws_access_key_id"] = EMBEDDED_ACCESS_KEY
        kwargs["aws_secret_access_key"] = EMBEDDED_SECRET_KEY
    return boto3.client("s3", **kwargs)


def ensure_bucket(cfg: Config, endpoint_url: str | None = None) -> str:
    """Create the bucket of storage.uri if it does not exist; returns its name."""
    if not cfg.storage.uri.startswith("s3://"):
        return ""
    bucket, _ = bucket_of(cfg.storage.uri)
    client = s3_client(cfg, endpoint_url)
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)
    return bucket
