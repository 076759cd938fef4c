"""The save path of the checkpoint engine: one rank's upload, and rank 0's commit.

Owns: what a save returns (`SaveHandle`, `SaveOutcome`), what happens when every host buffer
is still in flight (`InFlightPolicy`), the checks of the engine's settings (`check_settings`,
`check_step`), and the two storage steps of a save: `upload_rank` (this rank's shards in
parallel, then its index once every shard is durable) and `commit_step` (rank 0 waits for
every rank's index, then writes the manifest last, so a manifest implies complete data).

Must not: snapshot tensors (see `snapshot`), decide retention (see `retention`), touch
metrics or the engine's counters (the engine does), or decide when to checkpoint (see
`policies.checkpointing`).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from jobs.checkpoint.capturing import Snapshot
from jobs.checkpoint.copying import default_copy_threads
from jobs.checkpoint.layout import (
    Manifest,
    RankIndex,
    RankRecord,
    ShardEntry,
    checksum,
    index_key,
    keep_key,
    manifest_key,
    shard_key,
)
from jobs.checkpoint.storages import Storage

__all__ = [
    "DEFAULT_SHARD_SIZE_BYTES",
    "CommitTimeoutError",
    "InFlightPolicy",
    "SaveHandle",
    "SaveOutcome",
    "as_view",
    "check_settings",
    "check_step",
    "commit_step",
    "upload_rank",
]

DEFAULT_SHARD_SIZE_BYTES = 256 * 1024 * 1024


class InFlightPolicy(str, Enum):
    """What `save()` does when all `max_in_flight` saves are still persisting."""

    WAIT = "wait"
    """Block until the oldest in-flight save finishes; the wait counts as stall."""
    SKIP = "skip"
    """Drop this save (returns None), log a warning and count it."""


class CommitTimeoutError(Exception):
    """Rank 0 gave up waiting for other ranks' data; the step stays uncommitted."""


@dataclass(frozen=True)
class SaveOutcome:
    """What one save achieved once its background work finished."""

    step: int
    rank: int
    committed: bool
    """True on rank 0 once the manifest is written; other ranks only make data durable."""
    payload_bytes: int
    upload_s: float
    upload_bytes_per_s: float


class SaveHandle:
    """A save in flight. `result()` waits for it and raises its error, if any."""

    def __init__(self, step: int, stall_s: float, future: Future[SaveOutcome]) -> None:
        self.step = step
        self.stall_s = stall_s
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout_s: float | None = None) -> SaveOutcome:
        return self._future.result(timeout=timeout_s)


def check_settings(
    *,
    rank: int,
    world_size: int,
    max_in_flight: int,
    shard_size_bytes: int,
    keep_last: int,
    copy_threads: int | None,
    commit_timeout_s: float,
    commit_poll_interval_s: float,
    in_flight_policy: InFlightPolicy | str,
) -> tuple[InFlightPolicy, int]:
    """Refuse an engine setting that cannot work, with a message naming it; return the
    in-flight policy and the number of copy threads (None: `default_copy_threads`)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    if max_in_flight < 1:
        raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
    if shard_size_bytes < 1:
        raise ValueError(f"shard_size_bytes must be >= 1, got {shard_size_bytes}")
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    if copy_threads is None:
        copy_threads = default_copy_threads()
    if copy_threads < 1:
        raise ValueError(f"copy_threads must be >= 1 (or None for the default), got {copy_threads}")
    if commit_timeout_s <= 0 or commit_poll_interval_s <= 0:
        raise ValueError(
            "commit_timeout_s and commit_poll_interval_s must be > 0, got "
            f"{commit_timeout_s} and {commit_poll_interval_s}"
        )
    try:
        policy = InFlightPolicy(in_flight_policy)
    except ValueError as exc:
        raise ValueError(
            f"in_flight_policy must be one of {[p.value for p in InFlightPolicy]}, "
            f"got {in_flight_policy!r}"
        ) from exc
    return policy, copy_threads


def check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")


def upload_rank(
    storage: Storage,
    snapshot: Snapshot,
    step: int,
    *,
    rank: int,
    world_size: int,
    shard_size_bytes: int,
) -> bytes:
    """Upload this rank's shards of `snapshot`, then its index; return the index's bytes."""
    view = as_view(snapshot.payload)
    items = [
        (shard_key(step, rank, number), view[offset : offset + shard_size_bytes])
        for number, offset in enumerate(range(0, len(view), shard_size_bytes))
    ]
    # Checksums (zlib releases the GIL) run alongside the upload, not before it.
    with ThreadPoolExecutor(1, thread_name_prefix="ckpt-crc") as crc_pool:
        crcs = [crc_pool.submit(checksum, piece) for _key, piece in items]
        storage.put_many(items)
        shards = [
            ShardEntry(key, offset, len(piece), crc.result())
            for (key, piece), offset, crc in zip(
                items, range(0, len(view), shard_size_bytes), crcs, strict=True
            )
        ]
    index = RankIndex(
        step=step,
        rank=rank,
        world_size=world_size,
        payload_bytes=snapshot.payload_bytes,
        tensors=snapshot.tensors,
        shards=tuple(shards),
        skeleton=snapshot.skeleton,
    )
    index_bytes = index.to_json_bytes()
    storage.put_bytes(index_key(step, rank), index_bytes)
    return index_bytes


def commit_step(
    storage: Storage,
    step: int,
    *,
    world_size: int,
    keep: bool,
    metadata: dict[str, Any],
    timeout_s: float,
    poll_interval_s: float,
) -> float:
    """Rank 0's commit: wait for every rank's index, then write the manifest last.

    Returns the manifest's creation time (unix seconds). Raises `CommitTimeoutError` when a
    rank's index is still missing after `timeout_s` (the engine's ``commit_timeout_s``).
    """
    deadline_s = time.monotonic() + timeout_s
    missing = set(range(world_size))
    records: dict[int, RankRecord] = {}
    while True:
        for rank in sorted(missing):
            key = index_key(step, rank)
            if not storage.exists(key):
                continue
            data = storage.get_bytes(key)
            index = RankIndex.from_json_bytes(data)
            records[rank] = RankRecord(rank, key, checksum(data), index.payload_bytes)
            missing.discard(rank)
        if not missing:
            break
        if time.monotonic() >= deadline_s:
            raise CommitTimeoutError(
                f"step {step} not committed: ranks {sorted(missing)} did not finish their "
                f"data within commit_timeout_s={timeout_s}"
            )
        time.sleep(poll_interval_s)
    if keep:
        storage.put_bytes(keep_key(step), b"")
    now_s = time.time()
    manifest = Manifest(
        step=step,
        world_size=world_size,
        ranks=tuple(records[r] for r in range(world_size)),
        created_unix_s=now_s,
        keep=keep,
        metadata=metadata,
    )
    storage.put_bytes(manifest_key(step), manifest.to_json_bytes())
    return now_s


def as_view(payload: torch.Tensor) -> memoryview:
    """The bytes of a flat uint8 payload tensor, without a copy."""
    if payload.numel() == 0:
        return memoryview(b"")
    return payload.numpy().data.cast("B")
