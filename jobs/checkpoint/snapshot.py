"""Snapshot: copy a training state's tensors into reusable host buffers, and rebuild it.

This module owns the only work `save()` does on the training thread: walk the state
(nested dicts, lists and tuples of tensors and picklable leaves), pickle the skeleton with
every dense tensor replaced by a slot number, and copy the tensors' bytes into one flat
host buffer at 64-byte aligned offsets. The buffer is the payload that gets uploaded as is:
there is no second serialization pass. Buffers are allocated once, pre-faulted, and reused
(pinned when CUDA is present so device-to-host copies run at full PCIe speed).

It must not do I/O or start threads; the engine does both.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from jobs.checkpoint.layout import TensorEntry

ALIGN_BYTES = 64


@dataclass(frozen=True)
class TensorSlot:
    """Stands in for a tensor in the pickled skeleton."""

    index: int


def _is_dense(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and not value.is_quantized
        and not value.is_nested
    )


def flatten_state(state: Any) -> tuple[Any, list[torch.Tensor]]:
    """Split `state` into a skeleton (tensors replaced by `TensorSlot`) and its tensors.

    The same tensor object appearing twice (tied weights) gets one slot, so it is stored
    once and restored as one tensor shared by both places.
    """
    tensors: list[torch.Tensor] = []
    seen: dict[int, int] = {}

    def walk(value: Any) -> Any:
        if _is_dense(value):
            key = id(value)
            if key not in seen:
                seen[key] = len(tensors)
                tensors.append(value.detach())
            return TensorSlot(seen[key])
        if isinstance(value, dict):
            items = [(k, walk(v)) for k, v in value.items()]
            return type(value)(items) if type(value) is not dict else dict(items)
        if isinstance(value, list):
            return [walk(v) for v in value]
        if type(value) is tuple:
            return tuple(walk(v) for v in value)
        return value

    return walk(state), tensors


def unflatten_state(skeleton: Any, tensors: Sequence[torch.Tensor]) -> Any:
    """Inverse of `flatten_state`."""

    def walk(value: Any) -> Any:
        if isinstance(value, TensorSlot):
            return tensors[value.index]
        if isinstance(value, dict):
            items = [(k, walk(v)) for k, v in value.items()]
            return type(value)(items) if type(value) is not dict else dict(items)
        if isinstance(value, list):
            return [walk(v) for v in value]
        if type(value) is tuple:
            return tuple(walk(v) for v in value)
        return value

    return walk(skeleton)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {name!r} in checkpoint index")
    return dtype


def plan_layout(tensors: Sequence[torch.Tensor]) -> tuple[tuple[TensorEntry, ...], int]:
    """Aligned offsets of each tensor in the payload, and the payload size in bytes."""
    entries: list[TensorEntry] = []
    offset_bytes = 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(
            TensorEntry(dtype_name(tensor.dtype), tuple(tensor.shape), offset_bytes, nbytes)
        )
        offset_bytes += -(-nbytes // ALIGN_BYTES) * ALIGN_BYTES
    return tuple(entries), offset_bytes


def tensor_views(buffer: torch.Tensor, entries: Sequence[TensorEntry]) -> list[torch.Tensor]:
    """Typed views of `buffer` (flat uint8) at each entry's place."""
    views = []
    for entry in entries:
        raw = buffer[entry.offset_bytes : entry.offset_bytes + entry.nbytes]
        views.append(raw.view(dtype_from_name(entry.dtype)).view(entry.shape))
    return views


class HostBuffer:
    """A flat, reusable uint8 host buffer; grows (never shrinks) to the largest payload."""

    def __init__(self, *, pin_memory: bool) -> None:
        self._pin_memory = pin_memory
        self._buffer = torch.empty(0, dtype=torch.uint8)

    @property
    def capacity_bytes(self) -> int:
        return self._buffer.numel()

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
    state: Any, buffer: HostBuffer, *, synchronize: Callable[[], None] | None = None
) -> Snapshot:
    """Copy `state` into `buffer` and return the snapshot. Blocks until the copy is done."""
    skeleton, tensors = flatten_state(state)
    try:
        skeleton_bytes = pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise TypeError(
            f"checkpoint state has a value that cannot be pickled: {exc}. Tensors, dicts, "
            "lists, tuples and picklable objects are supported."
        ) from exc
    entries, payload_bytes = plan_layout(tensors)
    payload = buffer.reserve(payload_bytes)
    destinations = tensor_views(payload, entries)
    non_empty = [(d, s) for d, s in zip(destinations, tensors, strict=True) if s.numel() > 0]
    if non_empty:
        any_cuda = any(s.is_cuda for _, s in non_empty)
        dsts = [d for d, _ in non_empty]
        srcs = [s for _, s in non_empty]
        if any_cuda:
            for dst, src in zip(dsts, srcs, strict=True):
                dst.copy_(src, non_blocking=True)
            (synchronize or torch.cuda.synchronize)()
        else:
            _copy_host_tensors(dsts, srcs)
    return Snapshot(skeleton=skeleton_bytes, tensors=entries, payload=payload)


def _copy_host_tensors(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    """Host-to-host copies with torch's intra-op thread pool off.

    Each copy_ of a large tensor is otherwise an OpenMP parallel region ending in a barrier;
    with many tensors and any other load on the cores (the background upload, data loader
    workers) every barrier waits for a descheduled thread, and the snapshot runs many times
    slower than one memcpy of the same bytes. One thread streaming the copies does not wait.
    """
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
    try:
        torch._foreach_copy_(dsts, srcs)
    finally:
        if threads > 1:
            torch.set_num_threads(threads)


def rebuild_state(
    skeleton: bytes,
    entries: Sequence[TensorEntry],
    payload: torch.Tensor,
    *,
    map_location: str | torch.device = "cpu",
) -> Any:
    """The state a snapshot captured, with every tensor an independent copy."""
    views = tensor_views(payload, entries)
    tensors = [v.to(map_location, copy=True) for v in views]
    return unflatten_state(pickle.loads(skeleton), tensors)  # noqa: S301 - trusted storage
