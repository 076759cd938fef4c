"""The signals actor's trust checks: token hashes, admin MACs and checkpoint prefixes.

Owns: `token_sha256` (what the store and the actor keep instead of a job's token), the admin
MAC over a call (`admin_auth`, keyed with `derive_admin_secret`) and its nonce window
(`ADMIN_NONCE_WINDOW_S`), a job's checkpoint prefix (`checkpoint_prefix`) and the check
that a reported path lies strictly under it (`under_prefix`).

Must not: import Ray or do I/O beyond resolving local paths (the control plane calls these
too); log or print a token or a secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from urllib.parse import urlsplit

__all__ = [
    "ADMIN_NONCE_WINDOW_S",
    "AdminAuth",
    "admin_auth",
    "checkpoint_prefix",
    "derive_admin_secret",
    "token_sha256",
    "under_prefix",
]


def token_sha256(token: str) -> str:
    """The hex SHA-256 of a signal token: what the store and the actor keep instead of it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


ADMIN_NONCE_WINDOW_S = 300.0
"""How far (either way) an admin call's nonce (nanoseconds since the epoch) may be from the
actor's clock. With "each nonce larger than the last", a recorded call can be replayed only to
an actor that restarted in the last few minutes, and only once."""


def derive_admin_secret(admin_key: str, salt: str) -> str:
    """The secret one signals actor is created with: HMAC-SHA256 of `salt` (fresh for each
    actor the controller creates) under the controller's admin key, which stays with it."""
    return hmac.new(
        admin_key.encode("utf-8"), f"rcp-job-signals:{salt}".encode(), hashlib.sha256
    ).hexdigest()


AdminAuth = tuple[int, str]
"""``(nonce, mac)``: what an admin call presents (`admin_auth`)."""


def admin_auth(secret: str, nonce: int, method: str, args: tuple[object, ...]) -> AdminAuth:
    """``(nonce, mac)`` for an admin call: HMAC-SHA256 of ``[method, nonce, args]`` (JSON)
    under the actor's secret, so the MAC names this call and no other."""
    msg = json.dumps([method, int(nonce), list(args)], separators=(",", ":"), sort_keys=True)
    mac = hmac.new(secret.encode("utf-8"), msg.encode("utf-8"), hashlib.sha256).hexdigest()
    return int(nonce), mac


def checkpoint_prefix(storage_path: str | os.PathLike[str], job_id: str) -> str:
    """Where a job's checkpoints live: ``<storage_path>/<job_id>`` (the Ray Train run's name
    is the job id, see `jobs.launcher.run_gang`). A job id that is not one path segment is
    refused, so no id can name another job's prefix or a parent directory."""
    if not job_id or job_id in (".", "..") or "/" in job_id or "\\" in job_id:
        raise ValueError(f"job id {job_id!r} cannot name a checkpoint prefix")
    base = os.fspath(storage_path)
    if "://" in base:
        return base.rstrip("/") + "/" + job_id
    return os.path.join(base, job_id)


def _local(path: str) -> str | None:
    """A local path (``file://`` stripped) made absolute with every symlink resolved."""
    if "://" in path:
        parts = urlsplit(path)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            return None
        path = parts.path
    return os.path.realpath(os.path.expanduser(path))


def under_prefix(path: str, prefix: str) -> bool:
    """Whether `path` lies strictly below `prefix` (a job's checkpoint prefix).

    Local paths are compared after resolving ``..`` and symlinks (a link inside the prefix
    that points elsewhere is outside). URIs (``s3://bucket/key``) must have the prefix's
    scheme and bucket, a key below the prefix's and no ``.``/``..`` segment, query or
    fragment. Anything else (empty, a different scheme, a relative path mixed with a URI)
    is outside::

        under_prefix("/t/j-1/step-00000007", "/t/j-1")      -> True
        under_prefix("/t/j-1/../j-2/step-00000007", "/t/j-1") -> False
        under_prefix("/t/j-10/step-00000007", "/t/j-1")      -> False
        under_prefix("s3://b/t/j-1/step-7", "s3://other/t/j-1") -> False
    """
    if not isinstance(path, str) or not isinstance(prefix, str) or not path or not prefix:
        return False
    local_path, local_prefix = _local(path), _local(prefix)
    if local_path is not None and local_prefix is not None:
        return local_path != local_prefix and (
            os.path.commonpath([local_path, local_prefix]) == local_prefix
        )
    if local_path is not None or local_prefix is not None:
        return False
    p, q = urlsplit(path), urlsplit(prefix)
    if (p.scheme, p.netloc) != (q.scheme, q.netloc) or not p.netloc:
        return False
    if p.query or p.fragment:
        return False
    segments = p.path.split("/")
    if any(s in (".", "..") for s in segments):
        return False
    base = q.path.rstrip("/") + "/"
    return p.path.startswith(base) and len(p.path.rstrip("/")) > len(base)
