"""Scoped storage credentials: what the control plane mints for one job and hands to it.

Owns: `StorageCredentials` (the form they travel in, between the controller, the signals
actor and the job: key id, secret, session token, expiry in Unix seconds), `CredentialSource`
(what a storage calls for the current ones), `check_credentials` (the one check the signals
actor applies to what the controller puts and the job to what the actor returns), the
``storage.job_credentials`` modes (`JobCredentialsMode`) and `role_session_name` (the name
STS records a job's session under, so CloudTrail names the job).

The credentials themselves come from STS ``AssumeRole`` with the session policy
`jobs.storage_uri.job_storage_policy` builds for the job's prefix (`controlplane.storage`),
reach the job through the signals actor (`jobs.signals`), and are read by the job's S3
storage through botocore's refreshable credentials (`jobs.checkpoint.storages.s3`).

Must not: do I/O, import anything heavy, or put a secret in a message or a repr.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from enum import Enum
from typing import TypedDict

__all__ = [
    "CredentialSource",
    "JobCredentialsMode",
    "StorageCredentials",
    "check_credentials",
    "role_session_name",
]

_MAX_FIELD_CHARS = 4096
"""Longest key id, secret or session token accepted (STS session tokens run to ~1-2 KB)."""
_SESSION_NAME_RE = re.compile(r"[^\w+=,.@-]")
_SESSION_NAME_MAX = 64


class JobCredentialsMode(str, Enum):
    """``storage.job_credentials``: how a job's checkpoint code reaches object storage."""

    SCOPED = "scoped"
    """Per-job credentials minted by the controller, allowed only the job's prefix, delivered
    through the signals actor; the nodes carry no storage key."""
    SHARED = "shared"
    """The node's own AWS credentials (boto3's usual chain): bucket-wide, the same for every
    job on the node."""


class StorageCredentials(TypedDict):
    """Temporary S3 credentials of one job (the fields of STS's ``Credentials``)."""

    access_key_id: str
    secret_access_key: str
    session_token: str
    expires_unix_s: float


CredentialSource = Callable[[], StorageCredentials]
"""Returns the job's current credentials; raises when it cannot (the storage retries)."""


def check_credentials(value: object) -> StorageCredentials:
    """`value` as `StorageCredentials`, or ValueError naming the field that is wrong (never
    its value): four fields, three non-empty strings of printable ASCII and a finite expiry."""
    if not isinstance(value, Mapping):
        raise ValueError(f"storage credentials must be a mapping, got {type(value).__name__}")
    fields = ("access_key_id", "secret_access_key", "session_token", "expires_unix_s")
    if set(value) != set(fields):
        raise ValueError(f"storage credentials must have exactly the fields {', '.join(fields)}")
    texts: list[str] = []
    for name in fields[:3]:
        text = value[name]
        if not (
            isinstance(text, str)
            and 0 < len(text) <= _MAX_FIELD_CHARS
            and text.isascii()
            and text.isprintable()
            and " " not in text
        ):
            raise ValueError(f"storage credentials: {name} must be a non-empty token")
        texts.append(text)
    expires = value["expires_unix_s"]
    if isinstance(expires, bool) or not isinstance(expires, int | float):
        raise ValueError("storage credentials: expires_unix_s must be a number")
    if not math.isfinite(expires) or expires <= 0:
        raise ValueError("storage credentials: expires_unix_s must be a finite time")
    return StorageCredentials(
        access_key_id=texts[0],
        secret_access_key=texts[1],
        session_token=texts[2],
        expires_unix_s=float(expires),
    )


def role_session_name(job_id: str) -> str:
    """STS's ``RoleSessionName`` for a job: ``rcp-<job id>``, characters STS refuses replaced
    by ``-``, at most 64 characters::

        role_session_name("job-3f2a9c0d1e7b") -> "rcp-job-3f2a9c0d1e7b"
    """
    return _SESSION_NAME_RE.sub("-", f"rcp-{job_id}")[:_SESSION_NAME_MAX]
