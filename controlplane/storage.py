"""Object storage access for the control plane (the only module here that talks to S3 or STS).

Owns: building a boto3 client from config, creating the bucket of `storage.uri`, and minting a
job's scoped credentials (`JobCredentialMinter`). Credentials come from boto3's usual chain and
are never logged; only the embedded loopback store gets fixed local keys, since it accepts any.
"""

from __future__ import annotations

import json
import threading
from typing import Any
from urllib.parse import urlparse

from controlplane.config import Config
from jobs.storage_credentials import StorageCredentials, check_credentials, role_session_name
from jobs.storage_uri import StorageUri, job_storage_policy


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


EMBEDDED_JOB_ROLE_ARN = "arn:aws:iam::123456789012:role/rcp-local-jobs"
"""The role jobs' credentials are minted from with the embedded store and no
``storage.job_role_arn``: its STS accepts any ARN and enforces no policy."""


def s3_client(cfg: Config, endpoint_url: str | None = None) -> Any:
    return _client(cfg, "s3", endpoint_url or cfg.storage_endpoint_url)


def _client(cfg: Config, service: str, endpoint: str | None) -> Any:
    import boto3  # deferred: boto3 is heavy and optional here
    from botocore.config import Config as BotoConfig

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
    return boto3.client(service, **kwargs)


def job_role_arn(cfg: Config) -> str:
    """The role jobs' scoped credentials come from: ``storage.job_role_arn``, else the embedded
    store's stand-in (`EMBEDDED_JOB_ROLE_ARN`), else "" (config validation refuses that with
    ``scoped`` and an S3 ``storage.uri``)."""
    if cfg.storage.job_role_arn:
        return cfg.storage.job_role_arn
    return EMBEDDED_JOB_ROLE_ARN if cfg.storage.embedded else ""


class JobCredentialMinter:
    """Mints one job's credentials for its prefix: STS ``AssumeRole`` on `job_role_arn`
    with the session policy `job_storage_policy(prefix)`: S3 then allows the role's rights
    intersected with that policy. Thread-safe; the client is built on first use."""

    def __init__(self, cfg: Config, client: Any | None = None) -> None:
        self.cfg = cfg
        self._client = client
        self._lock = threading.Lock()

    def _sts(self) -> Any:
        with self._lock:  # building a boto3 client is not thread-safe; using one is
            if self._client is None:
                endpoint = self.cfg.storage.sts_endpoint_url or self.cfg.storage_endpoint_url
                self._client = _client(self.cfg, "sts", endpoint)
            return self._client

    def mint(self, job_id: str, prefix: StorageUri) -> StorageCredentials:
        """Credentials for `job_id` allowed only under `prefix` (an ``s3://`` key prefix)."""
        role = job_role_arn(self.cfg)
        if not role:
            raise ValueError(
                "storage.job_role_arn is not set: scoped job credentials need a role to mint from"
            )
        policy = json.dumps(job_storage_policy(prefix), separators=(",", ":"))
        answer = self._sts().assume_role(
            RoleArn=role,
            RoleSessionName=role_session_name(job_id),
            Policy=policy,
            DurationSeconds=int(self.cfg.storage.job_credentials_duration_s),
        )
        c = answer["Credentials"]
        return check_credentials(
            {
                "access_key_id": c["AccessKeyId"],
                "secret_access_key": c["SecretAccessKey"],
                "session_token": c["SessionToken"],
                "expires_unix_s": c["Expiration"].timestamp(),
            }
        )


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
