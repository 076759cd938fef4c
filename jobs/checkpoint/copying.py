"""Host-to-host copies of a snapshot's tensors, split in chunks over a lent copy pool.

Owns: splitting the (destination, source) copies into chunks of about equal bytes
(`plan_copy_chunks`), and copying them on the calling thread together with up to
``threads - 1`` tasks of a pool the engine lends (`copy_host_tensors`), with torch's
intra-op pool off meanwhile; how many threads copy by default (`default_copy_threads`).

Must not: start threads or own a pool (the engine lends one); copy device tensors (a
device-to-host copy is `jobs.checkpoint.capturing.take_snapshot`'s).
"""

from __future__ import annotations

import os
import queue
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager

import torch

__all__ = [
    "COPY_CHUNKS_PER_THREAD",
    "MAX_DEFAULT_COPY_THREADS",
    "MIN_COPY_CHUNK_BYTES",
    "CopyPair",
    "copy_host_tensors",
    "default_copy_threads",
    "plan_copy_chunks",
]

MIB = 1024 * 1024
MAX_DEFAULT_COPY_THREADS = 4
"""`default_copy_threads()` uses at most this many threads (the training thread included)."""
MIN_COPY_CHUNK_BYTES = 8 * MIB
"""Host copies smaller than two chunks of this size run on the calling thread alone."""
COPY_CHUNKS_PER_THREAD = 4
"""Chunks per copying thread: a thread the OS descheduled holds back one small chunk, not a
whole share of the snapshot, while the other threads take the remaining chunks."""


CopyPair = tuple[torch.Tensor, torch.Tensor]
"""(destination view in the payload, source tensor)."""


def default_copy_threads() -> int:
    """Threads a host snapshot copies with by default: min(4, CPUs), the caller included."""
    return max(1, min(MAX_DEFAULT_COPY_THREADS, os.cpu_count() or 1))


def _pair_bytes(pair: CopyPair) -> int:
    src = pair[1]
    return src.numel() * src.element_size()


def _sliceable(dst: torch.Tensor, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Views of a pair that `[a:b]` slices at unit boundaries, and the unit's size in bytes.

    A contiguous source is split at any element (flat views of both); a strided one between
    rows of its first dimension; a 0-d tensor not at all.
    """
    if src.is_contiguous():
        return dst.view(-1), src.view(-1), src.element_size()
    if src.dim() >= 1:
        return dst, src, (src.numel() // src.shape[0]) * src.element_size()
    return dst.view(1), src.view(1), src.element_size()


def plan_copy_chunks(pairs: Sequence[CopyPair], *, threads: int) -> list[list[CopyPair]]:
    """Split the copies into chunks of about equal bytes, in payload order.

    With `threads` <= 1, or under two `MIN_COPY_CHUNK_BYTES` in all, everything is one
    chunk. Otherwise a chunk is ``max(MIN_COPY_CHUNK_BYTES, total / (threads *
    COPY_CHUNKS_PER_THREAD))`` bytes and a tensor that crosses a chunk's end is split there.
    Example: 1 GiB in 129 tensors and 2 threads make 8 chunks of 128 MiB; 20 MiB makes 2.
    """
    total = sum(_pair_bytes(p) for p in pairs)
    if threads <= 1 or total < 2 * MIN_COPY_CHUNK_BYTES:
        return [list(pairs)] if pairs else []
    chunk_bytes = max(MIN_COPY_CHUNK_BYTES, -(-total // (threads * COPY_CHUNKS_PER_THREAD)))
    chunks: list[list[CopyPair]] = []
    current: list[CopyPair] = []
    room = chunk_bytes
    for dst, src in pairs:
        flat_dst, flat_src, unit = _sliceable(dst, src)
        count = flat_src.shape[0]
        start = 0
        while start < count:
            take = min(count - start, max(1, room // unit))
            current.append((flat_dst[start : start + take], flat_src[start : start + take]))
            room -= take * unit
            start += take
            if room <= 0 or start < count:
                chunks.append(current)
                current, room = [], chunk_bytes
    if current:
        chunks.append(current)
    return chunks


@contextmanager
def _one_intra_op_thread() -> Iterator[None]:
    """Torch's intra-op (OpenMP) pool off while the snapshot copies.

    Each copy_ of a large tensor is otherwise an OpenMP parallel region ending in a barrier;
    with many tensors and any other load on the cores (the background upload, data loader
    workers) every barrier waits for a descheduled thread, and the snapshot runs many times
    slower than one memcpy of the same bytes. Copy threads that work through a shared queue
    of chunks do not wait on each other until the very end.
    """
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads > 1:
            torch.set_num_threads(threads)


def copy_host_tensors(
    pairs: Sequence[CopyPair], *, pool: Executor | None = None, threads: int = 1
) -> None:
    """Copy every (dst, src) pair, on this thread plus up to `threads - 1` tasks of `pool`.

    Returns when every byte is copied. The pool's tasks and this thread take chunks from one
    queue; a task that had not started by the time the queue ran dry is cancelled, not
    waited for.
    """
    helpers = max(0, threads - 1) if pool is not None else 0
    chunks = plan_copy_chunks(pairs, threads=helpers + 1)
    with _one_intra_op_thread():
        if helpers == 0 or len(chunks) <= 1:
            for chunk in chunks:
                _copy_chunk(chunk)
            return
        assert pool is not None
        todo: queue.SimpleQueue[list[CopyPair]] = queue.SimpleQueue()
        for chunk in chunks:
            todo.put(chunk)

        def drain(set_threads: bool) -> None:
            if set_threads:
                # A pool thread's OpenMP setting is its own; the training thread's is off.
                torch.set_num_threads(1)
            while True:
                try:
                    chunk = todo.get_nowait()
                except queue.Empty:
                    return
                _copy_chunk(chunk)

        futures = [pool.submit(drain, True) for _ in range(min(helpers, len(chunks) - 1))]
        failures: list[BaseException] = []
        try:
            drain(False)
        finally:
            for future in futures:
                if not future.cancel() and (exc := future.exception()) is not None:
                    failures.append(exc)
        if failures:
            raise failures[0]


def _copy_chunk(chunk: list[CopyPair]) -> None:
    torch._foreach_copy_([d for d, _ in chunk], [s for _, s in chunk])
