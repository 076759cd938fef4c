"""Capturing a state into reusable host memory, and rebuilding it from a payload.

Owns: the only work `save()` does on the training thread (`take_snapshot`): flatten the
state, check that restore will load its skeleton, pickle the skeleton and copy the tensors'
bytes into one flat host buffer at aligned offsets. The buffer is the payload that gets
uploaded as is: there is no second serialization pass. Buffers are allocated once,
pre-faulted, and reused (`HostBuffer`; pinned when CUDA is present so device-to-host copies
run at full PCIe speed). Host-to-host copies go through `jobs.checkpoint.copying`. And the
way back: `rebuild_state`, which checks the skeleton (`snapshot.load_skeleton`) and the
index against the payload (`payload.check_tensor_layout`) before any tensor is copied.

Must not: do I/O or start threads (the engine does both, and lends the copy pool).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import torch

from jobs.checkpoint.copying import copy_host_tensors
from jobs.checkpoint.layout import TensorEntry
from jobs.checkpoint.payload import check_tensor_layout, plan_layout, tensor_views
from jobs.checkpoint.skeleton_bounds import MAX_SKELETON_BYTES
from jobs.checkpoint.snapshot import (
    check_skeleton,
    flatten_state,
    load_skeleton,
    unflatten_state,
)

__all__ = ["HostBuffer", "Snapshot", "copy_tensors", "rebuild_state", "take_snapshot"]


class HostBuffer:
    """A flat, reusable uint8 host buffer; grows (never shrinks) to the largest payload."""

    def __init__(self, *, pin_memory: bool) -> None:
        self._pin_memory = pin_memory
        self._buffer = torch.empty(0, dtype=torch.uint8)

    def reserve(self, nbytes: int) -> torch.Tensor:
        """A view of at least `nbytes` bytes; allocates and pre-faults when it must grow."""
        if nbytes > self._buffer.numel():
            buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self._pin_memory)
            buffer.zero_()  # touch every page now, not during the first timed snapshot
            self._buffer = buffer
        return self._buffer[:nbytes]


@dataclass(frozen=True)
class Snapshot:
    """A state captured on the host: pickled skeleton, tensor layout and payload bytes."""

    skeleton: bytes
    tensors: tuple[TensorEntry, ...]
    payload: torch.Tensor
    """Flat uint8 view into a `HostBuffer`; valid until that buffer is reused."""

    @property
    def payload_bytes(self) -> int:
        return self.payload.numel()


def take_snapshot(
    state: Any,
    buffer: HostBuffer,
    *,
    synchronize: Callable[[], None] | None = None,
    copy_pool: Executor | None = None,
    copy_threads: int = 1,
) -> Snapshot:
    """Copy `state` into `buffer` and return the snapshot. Blocks until the copy is done.

    Raises TypeError, naming the key, for a value restore would not load. Host tensors are
    copied by this thread and up to `copy_threads - 1` tasks of `copy_pool`; device tensors
    by asynchronous device-to-host copies and one `synchronize`.
    """
    skeleton, tensors = flatten_state(state)
    check_skeleton(skeleton)
    try:
        skeleton_bytes = pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise TypeError(f"checkpoint state cannot be pickled: {exc}") from exc
    if len(skeleton_bytes) > MAX_SKELETON_BYTES:
        raise TypeError(
            f"checkpoint state's non-tensor part pickles to {len(skeleton_bytes)} bytes, more "
            f"than the {MAX_SKELETON_BYTES} restore loads; save large values as tensors"
        )
    entries, payload_bytes = plan_layout(tensors)
    payload = buffer.reserve(payload_bytes)
    destinations = tensor_views(payload, entries)
    non_empty = [(d, s) for d, s in zip(destinations, tensors, strict=True) if s.numel() > 0]
    if any(s.is_cuda for _, s in non_empty):
        for dst, src in non_empty:
            dst.copy_(src, non_blocking=True)
        (synchronize or torch.cuda.synchronize)()
    else:
        copy_host_tensors(non_empty, pool=copy_pool, threads=copy_threads)
    return Snapshot(skeleton=skeleton_bytes, tensors=entries, payload=payload)


def rebuild_state(
    skeleton: bytes,
    entries: Sequence[TensorEntry],
    payload: torch.Tensor,
    *,
    map_location: str | torch.device = "cpu",
) -> Any:
    """The state a snapshot captured, with every tensor an independent copy.

    The skeleton is loaded with `load_skeleton` first (UnsafeCheckpointError or
    CorruptCheckpointError), and the entries checked against the payload
    (`check_tensor_layout`), before any tensor is copied.
    """
    structure = load_skeleton(skeleton)
    check_tensor_layout(entries, payload.numel())
    return unflatten_state(structure, copy_tensors(payload, entries, map_location))


def copy_tensors(
    payload: torch.Tensor, entries: Sequence[TensorEntry], map_location: str | torch.device
) -> list[torch.Tensor]:
    """Each entry's tensor, copied out of `payload` to `map_location` (entries checked by
    `check_tensor_layout` first)."""
    return [v.to(map_location, copy=True) for v in tensor_views(payload, entries)]
