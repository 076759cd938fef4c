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


EMBEDDED_ACCESS_KEY = "rcp-local"
EMBEDDED_SECRET_KEY = "rcp-local-secret"
"""The embedded object store accepts any key pair; these name the local store, nothing more
(local mode's nodes carry them as the usual AWS variables: `controlplane.local.head`)."""
STORAGE_CONNECT_TIMEOUT_S = 5.0
STORAGE_READ_TIMEOUT_S = 15.0
"""Every request the control plane makes to object storage gives up after this long."""


def s3_client(cfg: Config, endpoint_url: str | None = None) -> Any:
    import boto3  # deferred: boto3 is heavy and optional here
    from botocore.config import Config as BotoConfig

    endpoint = endpoint_url or cfg.storage_endpoint_url
    kwargs: dict[str, Any] = {
        "region_name": cfg.storage.region,
        "config": BotoConfig(
            connect_timeout=STORAGE_CONNECT_TIMEOUT_S,
            read_timeout=STORAGE_READ_TIMEOUT_S,
            retries={"max_attempts": 3, "mode": "standard"},
        ),
    }
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    if cfg.storage.embedded:
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


def check_bucket(client: Any, bucket: str) -> str | None:
    """None when `bucket` exists and these credentials reach it, else why not (a sentence).
    Raises for anything else (storage unreachable), which is not the bucket's fault."""
    from botocore.exceptions import ClientError  # deferred: botocore is heavy and optional here

    try:
        client.head_bucket(Bucket=bucket)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchBucket", "NotFound"):
            return f"bucket {bucket!r} does not exist"
        if code in ("403", "AccessDenied", "Forbidden"):
            return f"bucket {bucket!r} exists but the cluster's credentials cannot reach it"
        raise
    return None
