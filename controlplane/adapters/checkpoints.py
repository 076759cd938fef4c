"""Committed checkpoint steps, as object storage shows them: what the controller believes about
a job's checkpoints (never the training loop's word).

Owns: `CheckpointReader`, the control plane's only reader of jobs' checkpoints. For a job's
prefix (``s3://bucket/prefix`` through the control plane's client,
`controlplane.storage.s3_client`, whose every request has a timeout; or ``file:///path``):

* `CheckpointReader.newest` - the newest committed step, optionally only those newer than a
  step already known: it lists the ``step-<S>/`` directories (the layout of
  `jobs.checkpoint.layout`; at most `MAX_LIST_PAGES` pages, starting after the known step)
  and reads the manifests newest first (at most `MAX_MANIFEST_READS`), returning the first
  that is committed;
* `CheckpointReader.committed` - whether one step's manifest is committed.

A manifest is written by the job, so it is untrusted: at most `MAX_MANIFEST_BYTES` are read
(a larger one is refused), it must parse (`Manifest.from_json_bytes`), name the step its key
names and carry a finite creation time; anything else counts as not committed, with a log
line. On a file:// prefix only regular files are opened, never through a symlink, and
without blocking (a FIFO planted there cannot hang the reader).

Must not: write or delete anything in storage, decide anything, or be called on the tick
thread without a bound (the runner calls it from worker threads and waits a bounded time).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from controlplane.config import Config
from controlplane.storage import bucket_of, s3_client
from jobs.checkpoint.layout import (
    STEP_DIGITS,
    CorruptCheckpointError,
    Manifest,
    manifest_key,
    step_dir,
)

__all__ = [
    "MAX_LIST_PAGES",
    "MAX_MANIFEST_BYTES",
    "MAX_MANIFEST_READS",
    "CheckpointReader",
    "CommittedStep",
]

log = logging.getLogger(__name__)

MAX_MANIFEST_BYTES = 1 << 20
"""The most of one manifest the reader reads; a larger one is refused (a manifest is a few
KiB: one line per rank)."""
MAX_LIST_PAGES = 10
"""Listing pages (1000 step directories each) one `newest` call reads. The listing starts
after the step already known, so a longer history costs nothing; more new steps than this
since the last read are picked up by the next read, which starts further on."""
LIST_PAGE_KEYS = 1000
"""Step directories one listing page asks for (S3's own most)."""
MAX_MANIFEST_READS = 4
"""Manifests one `newest` call reads, newest first: the newest directories may still be
uploading (no manifest yet)."""
_STEP_DIR = re.compile(rf"^step-(\d{{{STEP_DIGITS}}})$")


@dataclass(frozen=True)
class CommittedStep:
    """A step whose manifest is in storage: the commit."""

    step: int
    uri: str
    """The step's directory: ``<prefix>/step-<S>``."""
    committed_unix_s: float
    """The manifest's ``created_unix_s`` (the job's clock when it committed)."""

    def to_info(self, read_s: float) -> dict[str, Any]:
        """The job-info form (``info["checkpoint"]``), with when the controller read it."""
        return {
            "step": self.step,
            "uri": self.uri,
            "committed_unix_s": self.committed_unix_s,
            "read_s": read_s,
        }


class CheckpointReader:
    """Reads committed steps under jobs' prefixes (see the module doc). Thread-safe."""

    def __init__(self, cfg: Config, client_factory: Callable[[], Any] | None = None) -> None:
        self._factory = client_factory or (lambda: s3_client(cfg))
        self._client: Any = None
        self._lock = threading.Lock()

    def _s3(self) -> Any:
        with self._lock:  # building a boto3 client is not thread-safe; using one is
            if self._client is None:
                self._client = self._factory()
            return self._client

    # -- the two questions -------------------------------------------------------------------

    def newest(self, prefix: str, after_step: int | None = None) -> CommittedStep | None:
        """The newest committed step under `prefix` (newer than `after_step` when given), or
        None. Raises on a storage error (the caller logs it and asks again later)."""
        listed = self._list_steps(prefix, after_step)
        steps = sorted((s for s in listed if after_step is None or s > after_step), reverse=True)
        for step in steps[:MAX_MANIFEST_READS]:
            found = self.committed(prefix, step)
            if found is not None:
                return found
        return None

    def committed(self, prefix: str, step: int) -> CommittedStep | None:
        """`step` as committed under `prefix`, or None (no manifest, or one refused)."""
        if not 0 <= step < 10**STEP_DIGITS:
            return None
        data = self._read_manifest(prefix, step)
        if data is None:
            return None
        base = prefix.rstrip("/")
        where = f"{base}/{manifest_key(step)}"
        if len(data) > MAX_MANIFEST_BYTES:
            log.warning("checkpoint manifest %s: over %d bytes; refused", where, MAX_MANIFEST_BYTES)
            return None
        try:
            manifest = Manifest.from_json_bytes(data)
        except CorruptCheckpointError as exc:
            log.warning("checkpoint manifest %s: refused: %s", where, exc)
            return None
        if manifest.step != step:
            log.warning(
                "checkpoint manifest %s names step %d, not its key's %d; refused",
                where,
                manifest.step,
                step,
            )
            return None
        if not math.isfinite(manifest.created_unix_s):
            log.warning("checkpoint manifest %s: creation time is not finite; refused", where)
            return None
        return CommittedStep(step, f"{base}/{step_dir(step)}", manifest.created_unix_s)

    # -- storage -------------------------------------------------------------------------------

    def _list_steps(self, prefix: str, after_step: int | None) -> list[int]:
        if _is_s3(prefix):
            return self._list_s3(prefix, after_step)
        try:
            names = os.listdir(_file_path(prefix))
        except FileNotFoundError:
            return []
        return [s for s in map(_step_of, names) if s is not None]

    def _read_manifest(self, prefix: str, step: int) -> bytes | None:
        if _is_s3(prefix):
            return self._get_s3(prefix, step)
        return _read_file(os.path.join(_file_path(prefix), manifest_key(step)))

    def _list_s3(self, prefix: str, after_step: int | None) -> list[int]:
        bucket, key = _s3_key(prefix)
        kwargs: dict[str, Any] = {
            "Bucket": bucket,
            "Prefix": key + "step-",
            "Delimiter": "/",
            "MaxKeys": LIST_PAGE_KEYS,
        }
        if after_step is not None and 0 <= after_step < 10**STEP_DIGITS:
            # "~" sorts after "/": the listing starts past the known step's own directory.
            kwargs["StartAfter"] = f"{key}{step_dir(after_step)}~"
        steps: list[int] = []
        client = self._s3()
        for page_number in range(MAX_LIST_PAGES):
            page = client.list_objects_v2(**kwargs)
            for common in page.get("CommonPrefixes") or []:
                step = _step_of(str(common.get("Prefix", ""))[len(key) :].rstrip("/"))
                if step is not None:
                    steps.append(step)
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
            if page_number == MAX_LIST_PAGES - 1:
                log.info(
                    "%s: more steps than %d pages; the next read goes on", prefix, MAX_LIST_PAGES
                )
            kwargs["ContinuationToken"] = token
        return steps

    def _get_s3(self, prefix: str, step: int) -> bytes | None:
        bucket, key = _s3_key(prefix)
        client = self._s3()
        try:
            # One byte past the bound: a body that long is too large, whatever it claims.
            resp = client.get_object(
                Bucket=bucket, Key=key + manifest_key(step), Range=f"bytes=0-{MAX_MANIFEST_BYTES}"
            )
        except client.exceptions.NoSuchKey:
            return None
        except Exception as exc:
            if _code(exc) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        body = resp["Body"]
        try:
            return bytes(body.read(MAX_MANIFEST_BYTES + 1))
        finally:
            body.close()


def _is_s3(prefix: str) -> bool:
    """Whether `prefix` is ``s3://`` (else ``file://``; ValueError for anything else)."""
    scheme = urlsplit(prefix).scheme
    if scheme not in ("s3", "file"):
        raise ValueError(f"checkpoint prefix {prefix!r}: expected s3:// or file://")
    return scheme == "s3"


def _step_of(name: str) -> int | None:
    """The step of a ``step-<S>`` directory name; None for any other name."""
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def _s3_key(prefix: str) -> tuple[str, str]:
    bucket, key = bucket_of(prefix)
    key = key.strip("/")
    return bucket, f"{key}/" if key else ""


def _code(exc: Exception) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _file_path(prefix: str) -> str:
    parts = urlsplit(prefix)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise ValueError(f"checkpoint prefix {prefix!r}: expected file:///absolute/path")
    return parts.path


def _read_file(path: str) -> bytes | None:
    """A regular file's first ``MAX_MANIFEST_BYTES + 1`` bytes; None when it is missing or
    not a regular file (a symlink, a FIFO, a device)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ENXIO):
            if exc.errno != errno.ENOENT:
                log.warning("checkpoint manifest %s: not a regular file; refused", path)
            return None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            log.warning("checkpoint manifest %s: not a regular file; refused", path)
            return None
        chunks = []
        left = MAX_MANIFEST_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
