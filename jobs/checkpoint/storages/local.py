"""Checkpoints in a local (or network-mounted) directory: ``file:///absolute/path``.

Owns: `LocalStorage`, the ``file`` backend: atomic writes (temporary file, fsync, rename,
fsync the directory), parallel reads into caller-owned buffers, listing, deleting, and
removing a crashed writer's leftover temporaries.

Must not: know steps, manifests or ranks, or talk to object storage (see `s3`).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from jobs.checkpoint.storages.interface import (
    ObjectNotFoundError,
    ObjectSizeError,
    StorageOptions,
    wait_all,
)

__all__ = ["LocalStorage"]


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
        wait_all([self._pool.submit(self._write, key, view) for key, view in items])

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
        wait_all([self._pool.submit(self._read_into, key, view) for key, view in items])

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _files(self) -> Iterator[tuple[Path, str]]:
        """Every file under the root, with its path relative to the root as a key."""
        for dirpath, _dirs, files in os.walk(self.root):
            for name in files:
                path = Path(dirpath) / name
                yield path, os.path.relpath(path, self.root).replace(os.sep, "/")

    def list_keys(self, prefix: str = "") -> list[str]:
        return sorted(
            key
            for path, key in self._files()
            if self._TMP_MARK not in path.name and key.startswith(prefix)
        )

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
        for path, key in self._files():
            if self._TMP_MARK not in path.name:
                continue
            try:
                age_s = now_s - path.stat().st_mtime
            except FileNotFoundError:
                continue
            if should_abort(key.split(self._TMP_MARK)[0], age_s):
                path.unlink(missing_ok=True)
                count += 1
        return count

    def close(self) -> None:
        self._pool.shutdown(wait=True)
