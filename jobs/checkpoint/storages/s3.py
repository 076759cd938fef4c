"""Checkpoints in S3 or an S3-compatible store (through boto3): ``s3://bucket/prefix``.

Owns: `S3Storage`, the ``s3`` backend: atomic single PUTs for small objects, multipart
uploads whose parts run concurrently (each with a CRC-32 the server checks), ranged parallel
GETs into caller-owned buffers, paged listing, batched deletes and aborting abandoned
multipart uploads. Every request retries transient failures through `retrying`. Its
credentials are boto3's usual chain, or only a `CredentialSource` (a job's scoped
credentials: `jobs.storage_credentials`), which botocore calls again before they expire
(`_SourceProvider`).

Must not: know steps, manifests or ranks, or let botocore retry on its own (every retry is
ours: counted, backed off, bounded); fall back to the node's credentials when given a source.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import functools
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypedDict, TypeVar

import botocore.session
from botocore.credentials import (
    CredentialProvider,
    CredentialResolver,
    DeferredRefreshableCredentials,
)

from jobs.checkpoint.retrying import TransientError, call_with_retries
from jobs.checkpoint.storages.interface import (
    ObjectNotFoundError,
    ObjectSizeError,
    StorageOptions,
    wait_all,
)
from jobs.storage_credentials import CredentialSource, check_credentials

__all__ = ["S3Storage"]

T = TypeVar("T")


def _crc32_b64(data: bytes | memoryview) -> str:
    return base64.b64encode((zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "big")).decode("ascii")


def _session(credentials: CredentialSource | None) -> Any:
    """A boto3 session: boto3's usual credential chain, or `credentials` and nothing else."""
    import boto3  # deferred: a heavy dependency that only S3 checkpoints need

    if credentials is None:
        return boto3.session.Session()
    core = botocore.session.get_session()
    resolver = CredentialResolver([_SourceProvider(credentials)])
    core.register_component("credential_provider", resolver)
    return boto3.session.Session(botocore_session=core)


class _SourceProvider(CredentialProvider):  # type: ignore[misc]  # botocore is untyped
    """botocore's only credential provider when a source is given: refreshable credentials
    fetched from the source on first use and again from 15 minutes before they expire
    (botocore's advisory window, where a failed fetch keeps the current ones; in the last 10
    minutes a failed fetch fails the request, which `retrying` retries when the source said
    the failure is transient)."""

    METHOD = "rcp-job-credentials"
    CANONICAL_NAME = "rcp-job-credentials"

    def __init__(self, source: CredentialSource) -> None:
        super().__init__()
        self._source = source

    def _fetch(self) -> dict[str, str]:
        c = check_credentials(self._source())
        expiry = datetime.datetime.fromtimestamp(c["expires_unix_s"], datetime.timezone.utc)
        return {
            "access_key": c["access_key_id"],
            "secret_key": c["secret_access_key"],
            "token": c["session_token"],
            "expiry_time": expiry.isoformat(),
        }

    def load(self) -> Any:
        return DeferredRefreshableCredentials(self._fetch, self.METHOD)


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
        credentials: CredentialSource | None = None,
    ) -> None:
        # Deferred: botocore is a heavy dependency that only S3 checkpoints need.
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
            client = _session(credentials).client(
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
            wait_all(small)
            all_parts = [f for *_rest, parts in uploads for f in parts]
            wait_all(all_parts)
            wait_all(
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
        wait_all(futures)

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
