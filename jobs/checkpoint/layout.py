"""Where a checkpoint's objects live and what its index and manifest say.

This module owns the on-storage format: the key of every object, the per-rank index (which
tensors sit where in the rank's payload, its shards and their checksums) and the manifest
that commits a step. It does no I/O; the engine and the storage backends do.

A checkpoint of step S is, under the storage prefix::

    step-<S:012d>/rank-<R:05d>/shard-<I:05d>.bin   raw payload bytes, written first
    step-<S:012d>/rank-<R:05d>.index.json          written by rank R after its shards are durable
    step-<S:012d>/manifest.json                    written last by rank 0: the commit
    step-<S:012d>/KEEP                             optional: retention never deletes this step

A step without ``manifest.json`` does not exist as far as restore is concerned.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

FORMAT_VERSION = 1
STEP_DIGITS = 12
_STEP_DIR_RE = re.compile(rf"^step-(\d{{{STEP_DIGITS}}})/")
MANIFEST_NAME = "manifest.json"
KEEP_NAME = "KEEP"


class CorruptCheckpointError(Exception):
    """A checkpoint's manifest, index or shard does not match what was committed."""


class UnsafeCheckpointError(CorruptCheckpointError):
    """A rank index's skeleton names a global that restore does not load (see
    `snapshot.load_skeleton`). Restore treats it like any other corrupt step: it skips it."""


def step_dir(step: int) -> str:
    if step < 0 or step >= 10**STEP_DIGITS:
        raise ValueError(f"step must be in [0, 1e{STEP_DIGITS}); got {step}")
    return f"step-{step:0{STEP_DIGITS}d}"


def manifest_key(step: int) -> str:
    return f"{step_dir(step)}/{MANIFEST_NAME}"


def keep_key(step: int) -> str:
    return f"{step_dir(step)}/{KEEP_NAME}"


def index_key(step: int, rank: int) -> str:
    return f"{step_dir(step)}/rank-{rank:05d}.index.json"


def shard_key(step: int, rank: int, shard: int) -> str:
    return f"{step_dir(step)}/rank-{rank:05d}/shard-{shard:05d}.bin"


def step_of_key(key: str) -> int | None:
    """The step a key belongs to, or None for keys outside the layout."""
    match = _STEP_DIR_RE.match(key)
    return int(match.group(1)) if match else None


def checksum(data: bytes | memoryview) -> str:
    """The checksum stored per shard and per index: CRC-32, as 8 hex digits.

    CRC-32 catches truncation, bit flips and torn writes, runs at several GB/s and
    releases the GIL, so it never becomes the bottleneck of the background upload.
    """
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


@dataclass(frozen=True)
class TensorEntry:
    """One tensor in a rank's payload: its dtype and shape, and where its bytes are."""

    dtype: str
    shape: tuple[int, ...]
    offset_bytes: int
    nbytes: int


@dataclass(frozen=True)
class ShardEntry:
    """One payload shard object: its key, its byte range in the payload, its checksum."""

    key: str
    offset_bytes: int
    size_bytes: int
    checksum: str


@dataclass(frozen=True)
class RankIndex:
    """What rank R saved for a step: how to rebuild its state from its payload shards."""

    step: int
    rank: int
    world_size: int
    payload_bytes: int
    tensors: tuple[TensorEntry, ...]
    shards: tuple[ShardEntry, ...]
    skeleton: bytes
    """The pickled state with every tensor replaced by a slot number."""

    def to_json_bytes(self) -> bytes:
        doc = {
            "format_version": FORMAT_VERSION,
            "step": self.step,
            "rank": self.rank,
            "world_size": self.world_size,
            "payload_bytes": self.payload_bytes,
            "tensors": [[t.dtype, list(t.shape), t.offset_bytes, t.nbytes] for t in self.tensors],
            "shards": [[s.key, s.offset_bytes, s.size_bytes, s.checksum] for s in self.shards],
            "skeleton_b64": base64.b64encode(self.skeleton).decode("ascii"),
        }
        return json.dumps(doc, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json_bytes(cls, data: bytes) -> RankIndex:
        try:
            doc = json.loads(data)
            _check_version(doc)
            index = cls(
                step=int(doc["step"]),
                rank=int(doc["rank"]),
                world_size=int(doc["world_size"]),
                payload_bytes=int(doc["payload_bytes"]),
                tensors=tuple(
                    TensorEntry(str(d), tuple(int(x) for x in s), int(o), int(n))
                    for d, s, o, n in doc["tensors"]
                ),
                shards=tuple(
                    ShardEntry(str(k), int(o), int(n), str(c)) for k, o, n, c in doc["shards"]
                ),
                skeleton=base64.b64decode(doc["skeleton_b64"], validate=True),
            )
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            raise CorruptCheckpointError(f"rank index is not valid: {exc}") from exc
        covered = sum(s.size_bytes for s in index.shards)
        if covered != index.payload_bytes:
            raise CorruptCheckpointError(
                f"rank index shards cover {covered} bytes, payload is {index.payload_bytes}"
            )
        return index


@dataclass(frozen=True)
class RankRecord:
    """The manifest's pointer to one rank's index, with the index's own checksum."""

    rank: int
    index_key: str
    index_checksum: str
    payload_bytes: int


@dataclass(frozen=True)
class Manifest:
    """The commit record of one step. Present means every rank's data was durable."""

    step: int
    world_size: int
    ranks: tuple[RankRecord, ...]
    created_unix_s: float
    keep: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(r.payload_bytes for r in self.ranks)

    def to_json_bytes(self) -> bytes:
        doc = {
            "format_version": FORMAT_VERSION,
            "step": self.step,
            "world_size": self.world_size,
            "created_unix_s": self.created_unix_s,
            "keep": self.keep,
            "metadata": self.metadata,
            "ranks": [asdict(r) for r in self.ranks],
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode("utf-8")

    @classmethod
    def from_json_bytes(cls, data: bytes) -> Manifest:
        try:
            doc = json.loads(data)
            _check_version(doc)
            manifest = cls(
                step=int(doc["step"]),
                world_size=int(doc["world_size"]),
                created_unix_s=float(doc["created_unix_s"]),
                keep=bool(doc.get("keep", False)),
                metadata=dict(doc.get("metadata", {})),
                ranks=tuple(
                    RankRecord(
                        rank=int(r["rank"]),
                        index_key=str(r["index_key"]),
                        index_checksum=str(r["index_checksum"]),
                        payload_bytes=int(r["payload_bytes"]),
                    )
                    for r in doc["ranks"]
                ),
            )
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
            raise CorruptCheckpointError(f"manifest is not valid: {exc}") from exc
        ranks = sorted(r.rank for r in manifest.ranks)
        # Compared by count first: a crafted world_size must not size a list.
        if len(ranks) != manifest.world_size or ranks != list(range(len(ranks))):
            raise CorruptCheckpointError(
                f"manifest lists ranks {[r.rank for r in manifest.ranks]}, "
                f"expected 0..{manifest.world_size - 1}"
            )
        return manifest


def _check_version(doc: object) -> None:
    if not isinstance(doc, dict):
        raise ValueError("top level is not an object")
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise ValueError(f"format_version {version!r}, this reader understands {FORMAT_VERSION}")
