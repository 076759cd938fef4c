"""Storage backends for checkpoints, behind one interface, picked by the URI's scheme.

This module is the only code in the checkpoint engine that talks to object storage or the
checkpoint directory: ``s3://bucket/prefix`` (AWS or any S3-compatible endpoint, through
boto3) and ``file:///absolute/path``. Every backend writes small objects atomically, writes
many large objects in parallel (S3: multipart uploads whose parts run concurrently, each
with a CRC-32 the server checks), reads into caller-owned buffers, and retries transient
failures through `retrying`. It knows nothing about steps, manifests or ranks.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypedDict, TypeVar
from urllib.parse import urlparse

from jobs.checkpoint.retrying import RetryPolicy, TransientError, call_with_retries

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
        ...

    def put_many(self, items: Sequence[tuple[str, memoryview]]) -> None:
        """Write many (possibly large) objects in parallel; returns when all are durable."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """Read one object whole; raises ObjectNotFoundError."""
        ...

    def get_many(self, items: Sequence[tuple[str, memoryview]]) -> None:
        """Fill each buffer with its object; raises ObjectSizeError on a size mismatch."""
        ...

    def exists(self, key: str) -> bool: ...

    def list_keys(self, prefix: str = "") -> list[str]:
        """Every key under `prefix` (relative to the storage root), sorted."""
        ...

    def delete_keys(self, keys: Sequence[str]) -> None: ...

    def abort_abandoned_uploads(self, should_abort: Callable[[str, float], bool]) -> int:
        """Abort unfinished writes for which should_abort(key, age_s) holds; return count."""
        ...

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


def _wait_all(futures: Sequence[Future[T]]) -> None:
    """Waits for every future before raising the first error."""
    first_error: BaseException | None = None
    for future in futures:
        try:
            future.result()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            first_error = first_error or exc
    if first_error is not None:
        raise first_error


class LocalStorage:
    """Checkpoints in a local (or network-mounted) directory: ``file:///abs/path``.

    Atomic writes: a temporary file in the same directory, fsync, rename, fsync the
    directory. Leftover temporaries of a crashed writer are what `abort_abandoned_uploads`
    removes.
    """

    _TMP_MARK = ".tmp-"

    def __init__(self, root: Path, options: StorageOptions | None = None) -> None:
        self.root = root
        self.uri = root.as_uri()
        self.options = options or StorageOptions()
        self._pool = ThreadPoolExecutor(
            self.options.max_concurrency, thread_name_prefix="ckpt-file"
        )
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"storage key must be relative without '..': {key!r}")
        return self.root / key

    def _write(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}{self._TMP_MARK}{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as handle:
                handle.write(data)
                if self.options.fsync:
                    handle.flush()
                    os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if self.options.fsync:
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._write(key, data)

    def put_many(self, items: Sequence[tuple[str, memoryview]]) -> None:
        _wait_all([self._pool.submit(self._write, key, view) for key, view in items])

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"{self.uri}/{key} does not exist") from exc

    def _read_into(self, key: str, view: memoryview) -> None:
        path = self._path(key)
        try:
            size = path.stat().st_size
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"{self.uri}/{key} does not exist") from exc
        if size != len(view):
            raise ObjectSizeError(f"{self.uri}/{key} has {size} bytes, expected {len(view)}")
        with open(path, "rb", buffering=0) as handle:
            done = 0
            while done < len(view):
                n = handle.readinto(view[done:])
                if not n:
                    raise ObjectSizeError(f"{self.uri}/{key} ended after {done} bytes")
                done += n

    def get_many(self, items: Sequence[tuple[str, memoryview]]) -> None:
        _wait_all([self._pool.submit(self._read_into, key, view) for key, view in items])

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list_keys(self, prefix: str = "") -> list[str]:
        keys = []
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if self._TMP_MARK in name:
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), self.root).replace(os.sep, "/")
                if rel.startswith(prefix):
                    keys.append(rel)
        return sorted(keys)

    def delete_keys(self, keys: Sequence[str]) -> None:
        for key in keys:
            path = self._path(key)
            path.unlink(missing_ok=True)
            parent = path.parent
            while parent != self.root:
                try:
                    parent.rmdir()
                except OSError:
                    break
                parent = parent.parent

    def abort_abandoned_uploads(self, should_abort: Callable[[str, float], bool]) -> int:
        now_s = time.time()
        count = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                if self._TMP_MARK not in name:
                    continue
                path = Path(dirpath) / name
                key = os.path.relpath(path, self.root).replace(os.sep, "/")
                key = key.split(self._TMP_MARK)[0]
                try:
                    age_s = now_s - path.stat().st_mtime
                except FileNotFoundError:
                    continue
                if should_abort(key, age_s):
                    path.unlink(missing_ok=True)
                    count += 1
        return count

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _crc32_b64(data: bytes | memoryview) -> str:
    return base64.b64encode((zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "big")).decode("ascii")


class _UploadedPart(TypedDict):
    """One uploaded part, as ``complete_multipart_upload`` lists it."""

    PartNumber: int
    ETag: str
    ChecksumCRC32: str


class S3Storage:
    """Checkpoints in S3 or an S3-compatible store: ``s3://bucket/prefix``.

    Objects above `part_size_bytes` go up as multipart uploads whose parts (of all objects
    at once) share one pool of `max_concurrency` threads; every request carries a CRC-32
    the server verifies. Reads are ranged GETs of part size, also in parallel. botocore's
    own retries are off so every retry is ours: counted, backed off, and bounded.
    `client` is a boto3 S3 client (boto3 has no type information, so it is Any here).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        options: StorageOptions | None = None,
        client: Any | None = None,
    ) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.options = options or StorageOptions()
        self._pool = ThreadPoolExecutor(self.options.max_concurrency, thread_name_prefix="ckpt-s3")
        self._local = threading.local()
        if client is None:
            config = Config(
                region_name=region,
                retries={"max_attempts": 1, "mode": "standard"},
                max_pool_connections=self.options.max_concurrency + 4,
                connect_timeout=self.options.connect_timeout_s,
                read_timeout=self.options.read_timeout_s,
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
                s3={"addressing_style": "path"} if endpoint_url else {},
            )
            client = boto3.session.Session().client(
                "s3", endpoint_url=endpoint_url, region_name=region, config=config
            )
        self.client = client

    def _full(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _relative(self, full_key: str) -> str:
        return full_key[len(self.prefix) + 1 :] if self.prefix else full_key

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        return call_with_retries(
            fn, what=what, policy=self.options.retry, on_retry=self.options.on_retry
        )

    def put_bytes(self, key: str, data: bytes) -> None:
        full = self._full(key)
        self._retry(
            f"put {full}",
            lambda: self.client.put_object(
                Bucket=self.bucket, Key=full, Body=data, ChecksumCRC32=_crc32_b64(data)
            ),
        )

    def _put_part(self, full: str, upload_id: str, number: int, view: memoryview) -> _UploadedPart:
        body = bytes(view)
        crc = _crc32_b64(body)
        response = self._retry(
            f"upload part {number} of {full}",
            lambda: self.client.upload_part(
                Bucket=self.bucket,
                Key=full,
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
                ChecksumCRC32=crc,
            ),
        )
        return {"PartNumber": number, "ETag": response["ETag"], "ChecksumCRC32": crc}

    def _complete(self, full: str, upload_id: str, parts: list[_UploadedPart], size: int) -> None:
        attempts = {"n": 0}

        def complete() -> None:
            attempts["n"] += 1
            try:
                self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=full,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )
            except self.client.exceptions.NoSuchUpload:
                # A retried complete whose first attempt succeeded but whose reply was lost.
                if attempts["n"] > 1 and self._size_of(full) == size:
                    return
                raise

        self._retry(f"complete {full}", complete)

    def _size_of(self, full: str) -> int | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=full)
        except self.client.exceptions.ClientError:
            return None
        return int(head["ContentLength"])

    def put_many(self, items: Sequence[tuple[str, memoryview]]) -> None:
        part = self.options.part_size_bytes
        small: list[Future[None]] = []
        uploads: list[tuple[str, str, int, list[Future[_UploadedPart]]]] = []
        try:
            for key, view in items:
                full = self._full(key)
                if len(view) <= part:
                    small.append(self._pool.submit(self.put_bytes, key, bytes(view)))
                    continue
                created = self._retry(
                    f"create upload {full}",
                    functools.partial(
                        self.client.create_multipart_upload,
                        Bucket=self.bucket,
                        Key=full,
                        ChecksumAlgorithm="CRC32",
                    ),
                )
                parts = [
                    self._pool.submit(
                        self._put_part, full, created["UploadId"], i + 1, view[off : off + part]
                    )
                    for i, off in enumerate(range(0, len(view), part))
                ]
                uploads.append((full, created["UploadId"], len(view), parts))
            _wait_all(small)
            all_parts = [f for *_rest, parts in uploads for f in parts]
            _wait_all(all_parts)
            _wait_all(
                [
                    self._pool.submit(self._complete, full, uid, [f.result() for f in parts], size)
                    for full, uid, size, parts in uploads
                ]
            )
        except BaseException:
            for _full, upload_id, _size, parts in uploads:
                for future in parts:
                    future.cancel()
                # Best effort: retention aborts whatever is left behind.
                with contextlib.suppress(Exception):
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=_full, UploadId=upload_id
                    )
            raise

    def get_bytes(self, key: str) -> bytes:
        full = self._full(key)

        def get() -> bytes:
            try:
                response = self.client.get_object(Bucket=self.bucket, Key=full)
            except self.client.exceptions.NoSuchKey as exc:
                raise ObjectNotFoundError(f"{self.uri}/{key} does not exist") from exc
            data: bytes = response["Body"].read()
            return data

        return self._retry(f"get {full}", get)

    def _get_range(self, full: str, start: int, view: memoryview, total: int) -> None:
        def get() -> None:
            try:
                response = self.client.get_object(
                    Bucket=self.bucket, Key=full, Range=f"bytes={start}-{start + len(view) - 1}"
                )
            except self.client.exceptions.NoSuchKey as exc:
                raise ObjectNotFoundError(f"{self.uri}/{self._relative(full)} missing") from exc
            except self.client.exceptions.ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status == 416 or exc.response.get("Error", {}).get("Code") == "InvalidRange":
                    raise ObjectSizeError(
                        f"{self.uri}/{self._relative(full)} is shorter than {total} bytes"
                    ) from exc
                raise
            content_range = str(response.get("ContentRange", ""))
            size = int(content_range.rsplit("/", 1)[1]) if "/" in content_range else None
            if size is None and start == 0:
                size = int(response["ContentLength"])
            if size is not None and size != total:
                raise ObjectSizeError(
                    f"{self.uri}/{self._relative(full)} has {size} bytes, expected {total}"
                )
            data = response["Body"].read()
            if len(data) != len(view):
                raise TransientError(f"short read of {full}: {len(data)} of {len(view)} bytes")
            view[:] = data

        self._retry(f"get {full}@{start}", get)

    def get_many(self, items: Sequence[tuple[str, memoryview]]) -> None:
        part = self.options.part_size_bytes
        futures = []
        for key, view in items:
            full = self._full(key)
            if len(view) == 0:
                futures.append(self._pool.submit(self._check_empty, key))
                continue
            for off in range(0, len(view), part):
                futures.append(
                    self._pool.submit(self._get_range, full, off, view[off : off + part], len(view))
                )
        _wait_all(futures)

    def _check_empty(self, key: str) -> None:
        data = self.get_bytes(key)
        if data:
            raise ObjectSizeError(f"{self.uri}/{key} has {len(data)} bytes, expected 0")

    def exists(self, key: str) -> bool:
        full = self._full(key)

        def head() -> bool:
            try:
                self.client.head_object(Bucket=self.bucket, Key=full)
            except self.client.exceptions.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                    return False
                raise
            return True

        return self._retry(f"head {full}", head)

    def list_keys(self, prefix: str = "") -> list[str]:
        full_prefix = self._full(prefix) if self.prefix else prefix

        def list_all() -> list[str]:
            keys: list[str] = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=full_prefix):
                keys.extend(self._relative(o["Key"]) for o in page.get("Contents", []))
            return keys

        return sorted(self._retry(f"list {full_prefix}", list_all))

    def delete_keys(self, keys: Sequence[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": self._full(k)} for k in keys[start : start + 1000]]

            def delete(batch: list[dict[str, str]] = batch) -> None:
                response = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
                errors = response.get("Errors", [])
                if errors:
                    raise TransientError(f"could not delete {len(errors)} objects: {errors[:3]}")

            self._retry(f"delete {len(batch)} objects", delete)

    def abort_abandoned_uploads(self, should_abort: Callable[[str, float], bool]) -> int:
        now_s = time.time()
        count = 0
        paginator = self.client.get_paginator("list_multipart_uploads")
        pages = self._retry(
            "list multipart uploads",
            lambda: list(paginator.paginate(Bucket=self.bucket, Prefix=self._full(""))),
        )
        for page in pages:
            for upload in page.get("Uploads", []):
                age_s = now_s - upload["Initiated"].timestamp()
                if should_abort(self._relative(upload["Key"]), age_s):
                    self._retry(
                        f"abort upload {upload['Key']}",
                        functools.partial(
                            self.client.abort_multipart_upload,
                            Bucket=self.bucket,
                            Key=upload["Key"],
                            UploadId=upload["UploadId"],
                        ),
                    )
                    count += 1
        return count

    def close(self) -> None:
        self._pool.shutdown(wait=True)


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
