"""The restore path of the checkpoint engine: the newest committed step that verifies.

Owns: `restore_newest`, which walks committed steps newest first (`committed_steps`),
skips a corrupt, torn or crafted step with a warning, a count and a `SkippedStep`, and raises
`NoVerifiedCheckpointError` when committed steps exist but none verifies; `RestoredCheckpoint`;
and `load_step`: the manifest, then this rank's index (`check_index`) before a payload byte is
read, then the data from the memory tier when it holds exactly that step and matches its
checksums, else from storage (a shard that fails read again up to `REREAD_ATTEMPTS` times).

Must not: write to storage, or swallow a storage outage (an unreachable store raises, so a
job never silently restarts from scratch), or let bytes from storage reach a recursive walk,
an allocation or a tensor view before they were checked.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from jobs.checkpoint import metrics
from jobs.checkpoint.capturing import copy_tensors
from jobs.checkpoint.layout import (
    CorruptCheckpointError,
    Manifest,
    RankIndex,
    RankRecord,
    ShardEntry,
    UnsafeCheckpointError,
    checksum,
    index_key,
    manifest_key,
    shard_key,
    step_of_key,
)
from jobs.checkpoint.memory_tiers import MemoryTier
from jobs.checkpoint.payload import check_tensor_layout
from jobs.checkpoint.saving import as_view
from jobs.checkpoint.skeleton_bounds import scan_skeleton
from jobs.checkpoint.snapshot import unflatten_state, unpickle_scanned_skeleton
from jobs.checkpoint.storages import ObjectNotFoundError, ObjectSizeError, Storage

__all__ = [
    "REREAD_ATTEMPTS",
    "NoVerifiedCheckpointError",
    "RestoredCheckpoint",
    "SkippedStep",
    "check_index",
    "committed_steps",
    "host_memory_bytes",
    "load_step",
    "restore_newest",
]

logger = logging.getLogger(__name__)

REREAD_ATTEMPTS = 3
"""How many times a restore reads a step's shards from storage before calling it corrupt."""


@dataclass(frozen=True)
class SkippedStep:
    """A committed step restore did not load, and why (the error's message)."""

    step: int
    reason: str


class NoVerifiedCheckpointError(CorruptCheckpointError):
    """Committed steps exist, but none verifies; the message names each and why. Raised
    rather than returning None, which would restart the job from scratch."""

    def __init__(self, uri: str, skipped: tuple[SkippedStep, ...]) -> None:
        tried = "; ".join(f"step {s.step}: {s.reason}" for s in skipped)
        super().__init__(
            f"no committed checkpoint in {uri} verifies, so none is restored ({tried}); "
            "restore an older copy of the checkpoints, or start the job afresh under a new "
            "checkpoint.uri"
        )
        self.skipped = skipped


@dataclass(frozen=True)
class RestoredCheckpoint:
    """A verified checkpoint: its step, the state as saved, and where it was read from."""

    step: int
    state: Any
    source: str
    """"memory" (the memory tier) or "storage"."""
    metadata: Mapping[str, Any]
    skipped: tuple[SkippedStep, ...] = ()
    """Newer committed steps that failed to verify, newest first."""
    check_s: float = 0.0
    """Seconds this step's bounds checks took (`check_index` but for parsing the index and
    unpickling the skeleton: the payload, shard and tensor bounds and the skeleton's scan);
    what issue 26 added to a restore."""


def committed_steps(storage: Storage) -> list[int]:
    """Steps with a manifest, newest first (not yet verified)."""
    steps = {
        step
        for key in storage.list_keys()
        if key.endswith("/manifest.json") and (step := step_of_key(key)) is not None
    }
    return sorted(steps, reverse=True)


def restore_newest(
    storage: Storage,
    memory_tier: MemoryTier | None,
    *,
    rank: int,
    world_size: int,
    run_name: str,
    max_step: int | None,
    map_location: str | torch.device,
) -> RestoredCheckpoint | None:
    """The newest committed step (at most `max_step`) that fully verifies; None when there
    is no committed step; `NoVerifiedCheckpointError` when there are some and none
    verifies."""
    skipped: list[SkippedStep] = []
    for step in committed_steps(storage):
        if max_step is not None and step > max_step:
            continue
        try:
            restored = load_step(
                storage,
                memory_tier,
                step,
                rank=rank,
                world_size=world_size,
                map_location=map_location,
            )
        except (CorruptCheckpointError, ObjectNotFoundError, ObjectSizeError) as exc:
            metrics.SKIPPED_ON_RESTORE.labels(run_name).inc()
            logger.warning("skipping checkpoint step %d in %s: %s", step, storage.uri, exc)
            skipped.append(SkippedStep(step, str(exc)))
            continue
        metrics.RESTORES.labels(run_name, restored.source).inc()
        return replace(restored, skipped=tuple(skipped))
    if skipped:
        raise NoVerifiedCheckpointError(storage.uri, tuple(skipped))
    return None


def host_memory_bytes() -> int | None:
    """This host's physical memory, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def load_step(
    storage: Storage,
    memory_tier: MemoryTier | None,
    step: int,
    *,
    rank: int,
    world_size: int,
    map_location: str | torch.device,
) -> RestoredCheckpoint:
    """This rank's state of committed `step`, verified; raises if anything fails to verify."""
    manifest = Manifest.from_json_bytes(storage.get_bytes(manifest_key(step)))
    if manifest.step != step:
        raise CorruptCheckpointError(f"manifest under step {step} says step {manifest.step}")
    if manifest.world_size != world_size:
        raise ValueError(
            f"checkpoint step {step} in {storage.uri} was saved by "
            f"{manifest.world_size} ranks, this job has world_size={world_size}; "
            "restoring onto a different number of ranks is not supported"
        )
    record = next(r for r in manifest.ranks if r.rank == rank)
    if record.index_key != index_key(step, rank):
        raise CorruptCheckpointError(
            f"manifest names {record.index_key[:200]!r} as rank {rank}'s index, "
            f"not {index_key(step, rank)!r}"
        )
    held = memory_tier.get(rank) if memory_tier is not None else None
    if held is not None and held.step == step and checksum(held.index) == record.index_checksum:
        index, structure, check_s = check_index(held.index, record, step, rank, world_size)
        if len(held.payload) == index.payload_bytes:
            payload = (
                torch.frombuffer(bytearray(held.payload), dtype=torch.uint8)
                if len(held.payload)
                else torch.empty(0, dtype=torch.uint8)
            )
            if not _bad_shards(index, payload):
                state = _rebuild(structure, index, payload, map_location)
                return RestoredCheckpoint(step, state, "memory", manifest.metadata, check_s=check_s)
        logger.warning(
            "memory tier copy of step %d does not match its index or checksums; reading storage",
            step,
        )
    index_bytes = storage.get_bytes(record.index_key)
    if checksum(index_bytes) != record.index_checksum:
        raise CorruptCheckpointError(f"index {record.index_key} does not match its checksum")
    index, structure, check_s = check_index(index_bytes, record, step, rank, world_size)
    payload = torch.empty(index.payload_bytes, dtype=torch.uint8)
    view = as_view(payload)
    todo = list(index.shards)
    for _attempt in range(REREAD_ATTEMPTS):
        storage.get_many(
            [(s.key, view[s.offset_bytes : s.offset_bytes + s.size_bytes]) for s in todo]
        )
        todo = _bad_shards(index, payload, only=todo)
        if not todo:
            break
        logger.info("step %d: %d shard(s) failed checksum, reading again", step, len(todo))
    if todo:
        raise CorruptCheckpointError(f"shards {[s.key for s in todo]} do not match their checksums")
    state = _rebuild(structure, index, payload, map_location)
    return RestoredCheckpoint(step, state, "storage", manifest.metadata, check_s=check_s)


def check_index(
    data: bytes, record: RankRecord, step: int, rank: int, world_size: int
) -> tuple[RankIndex, Any, float]:
    """Parse rank `rank`'s index of `step` and check everything in it that restore will
    act on, before a payload byte is allocated or read. Returns the index, its skeleton
    unpickled (tensors still slots), and the seconds the bounds checks took (the scan
    included, the parsing and unpickling not). Raises `CorruptCheckpointError` (or its
    `UnsafeCheckpointError`) naming the first thing that does not hold."""
    index = RankIndex.from_json_bytes(data)
    if (index.step, index.rank, index.world_size) != (step, rank, world_size):
        raise CorruptCheckpointError(
            f"index names step {index.step} rank {index.rank}/{index.world_size}, "
            f"expected step {step} rank {rank}/{world_size}"
        )
    began = time.perf_counter()
    _check_bounds(index, record)
    try:
        scan_skeleton(index.skeleton)
        check_s = time.perf_counter() - began
        structure = unpickle_scanned_skeleton(index.skeleton)
    except UnsafeCheckpointError as exc:
        raise UnsafeCheckpointError(f"checkpoint step {step} rank {rank}: {exc}") from exc
    return index, structure, check_s


def _check_bounds(index: RankIndex, record: RankRecord) -> None:
    """The payload is the manifest's and fits in memory, the shards are this rank's and
    tile it, and every tensor lies inside it."""
    if index.payload_bytes != record.payload_bytes:
        raise CorruptCheckpointError(
            f"index says the payload is {index.payload_bytes} bytes, the manifest "
            f"{record.payload_bytes}"
        )
    memory_bytes = host_memory_bytes()
    if memory_bytes is not None and index.payload_bytes > memory_bytes:
        raise CorruptCheckpointError(
            f"index says the payload is {index.payload_bytes} bytes, more than this host's "
            f"{memory_bytes} bytes of memory"
        )
    offset = 0
    for number, shard in enumerate(index.shards):
        expected_key = shard_key(index.step, index.rank, number)
        if shard.key != expected_key:
            raise CorruptCheckpointError(
                f"shard {number} is {shard.key[:200]!r}, not {expected_key!r}"
            )
        if shard.offset_bytes != offset or shard.size_bytes <= 0:
            raise CorruptCheckpointError(
                f"shard {number} covers bytes {shard.offset_bytes}+{shard.size_bytes}; "
                f"shards must tile the payload in order (next byte {offset})"
            )
        offset += shard.size_bytes
    check_tensor_layout(index.tensors, index.payload_bytes)


def _rebuild(
    structure: Any, index: RankIndex, payload: torch.Tensor, map_location: str | torch.device
) -> Any:
    return unflatten_state(structure, copy_tensors(payload, index.tensors, map_location))


def _bad_shards(
    index: RankIndex, payload: torch.Tensor, only: list[ShardEntry] | None = None
) -> list[ShardEntry]:
    view = as_view(payload)
    return [
        s
        for s in (index.shards if only is None else only)
        if checksum(view[s.offset_bytes : s.offset_bytes + s.size_bytes]) != s.checksum
    ]
