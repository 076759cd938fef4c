"""The restore path of the checkpoint engine: the newest committed step that verifies.

Owns: `restore_newest`, which walks committed steps newest first (`committed_steps`) and
skips, with a warning and a count, a step that is corrupt or torn (`CorruptCheckpointError`,
`ObjectNotFoundError`, `ObjectSizeError`, `UnsafeCheckpointError`); `RestoredCheckpoint`;
and `load_step`: read a step's manifest, check it names this
step and this job's number of ranks, then take this rank's data from the memory tier when it
holds exactly that step (and its index and shards match their checksums), else from storage
(index checked against the manifest, every shard against the index, a shard that fails read
again up to `REREAD_ATTEMPTS` times), and rebuild the state through the restricted
unpickler.

Must not: write to storage, or swallow a storage outage (an unreachable store raises, so a
job never silently restarts from scratch).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from jobs.checkpoint import metrics
from jobs.checkpoint.layout import (
    CorruptCheckpointError,
    Manifest,
    RankIndex,
    ShardEntry,
    UnsafeCheckpointError,
    checksum,
    manifest_key,
    step_of_key,
)
from jobs.checkpoint.memory_tiers import MemoryTier
from jobs.checkpoint.saving import as_view
from jobs.checkpoint.snapshot import rebuild_state
from jobs.checkpoint.storages import ObjectNotFoundError, ObjectSizeError, Storage

__all__ = [
    "REREAD_ATTEMPTS",
    "RestoredCheckpoint",
    "committed_steps",
    "load_step",
    "restore_newest",
]

logger = logging.getLogger(__name__)

REREAD_ATTEMPTS = 3
"""How many times a restore reads a step's shards from storage before calling it corrupt."""


@dataclass(frozen=True)
class RestoredCheckpoint:
    """A verified checkpoint: its step, the state as saved, and where it was read from."""

    step: int
    state: Any
    source: str
    """"memory" (the memory tier) or "storage"."""
    metadata: Mapping[str, Any]


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
    """The newest committed step (at most `max_step`) that fully verifies, or None."""
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
            continue
        metrics.RESTORES.labels(run_name, restored.source).inc()
        return restored
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
    held = memory_tier.get(rank) if memory_tier is not None else None
    if held is not None and held.step == step and checksum(held.index) == record.index_checksum:
        index = _parse_index(held.index, step, rank, world_size)
        payload = (
            torch.frombuffer(bytearray(held.payload), dtype=torch.uint8)
            if len(held.payload)
            else torch.empty(0, dtype=torch.uint8)
        )
        bad = _bad_shards(index, payload)
        if not bad:
            state = _rebuild(step, rank, index, payload, map_location)
            return RestoredCheckpoint(step, state, "memory", manifest.metadata)
        logger.warning("memory tier copy of step %d fails checksums; reading storage", step)
    index_bytes = storage.get_bytes(record.index_key)
    if checksum(index_bytes) != record.index_checksum:
        raise CorruptCheckpointError(f"index {record.index_key} does not match its checksum")
    index = _parse_index(index_bytes, step, rank, world_size)
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
    state = _rebuild(step, rank, index, payload, map_location)
    return RestoredCheckpoint(step, state, "storage", manifest.metadata)


def _rebuild(
    step: int, rank: int, index: RankIndex, payload: torch.Tensor, map_location: str | torch.device
) -> Any:
    try:
        return rebuild_state(index.skeleton, index.tensors, payload, map_location=map_location)
    except UnsafeCheckpointError as exc:
        raise UnsafeCheckpointError(f"checkpoint step {step} rank {rank}: {exc}") from exc


def _parse_index(data: bytes, step: int, rank: int, world_size: int) -> RankIndex:
    index = RankIndex.from_json_bytes(data)
    if (index.step, index.rank, index.world_size) != (step, rank, world_size):
        raise CorruptCheckpointError(
            f"index names step {index.step} rank {index.rank}/{index.world_size}, "
            f"expected step {step} rank {rank}/{world_size}"
        )
    return index


def _bad_shards(
    index: RankIndex, payload: torch.Tensor, only: list[ShardEntry] | None = None
) -> list[ShardEntry]:
    view = as_view(payload)
    return [
        s
        for s in (index.shards if only is None else only)
        if checksum(view[s.offset_bytes : s.offset_bytes + s.size_bytes]) != s.checksum
    ]
