"""Where each tensor lies in a snapshot's payload: dtypes by name, offsets and views.

Owns: the payload's layout, one flat uint8 buffer holding every tensor at an `ALIGN_BYTES`
aligned offset (`plan_layout`), typed views of it (`tensor_views`), the dtype names the
index records (`dtype_name`, `dtype_from_name`, every torch dtype by name: `TORCH_DTYPES`)
and the check that an index's entries fit a payload before any view is cut
(`check_tensor_layout`).

Must not: do I/O, allocate buffers (`jobs.checkpoint.capturing` does) or copy bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from jobs.checkpoint.layout import CorruptCheckpointError, TensorEntry

__all__ = [
    "ALIGN_BYTES",
    "TORCH_DTYPES",
    "check_tensor_layout",
    "dtype_from_name",
    "dtype_name",
    "plan_layout",
    "tensor_views",
]

ALIGN_BYTES = 64
TORCH_DTYPES: dict[str, torch.dtype] = {
    name: value for name, value in vars(torch).items() if isinstance(value, torch.dtype)
}
"""A dtype pickles as the global ``torch.<name>``. Read from the module's dict, not with
getattr, so no name in a checkpoint can make torch import anything."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = _PAYLOAD_DTYPES.get(name)
    if dtype is None:
        raise ValueError(f"unknown tensor dtype {name!r} in checkpoint index")
    return dtype


_SHELL_DTYPES = frozenset(
    {"bit", *(f"{sign}int{bits}" for sign in ("", "u") for bits in range(1, 8))}
)
"""Sub-byte dtypes torch names but no dense tensor has."""
_PAYLOAD_DTYPES: dict[str, torch.dtype] = {
    name: dtype
    for name, dtype in TORCH_DTYPES.items()
    if not name.startswith("q") and name not in _SHELL_DTYPES  # q...: quantized
}
"""The dtypes a payload holds: every dtype a dense tensor can have."""


def check_tensor_layout(entries: Sequence[TensorEntry], payload_bytes: int) -> None:
    """Raise `CorruptCheckpointError` unless every entry is a tensor `tensor_views` can cut
    out of a payload of `payload_bytes`: a known dtype, a shape whose size is its byte count,
    an offset aligned to its element size, and its bytes inside the payload."""
    for number, entry in enumerate(entries):
        dtype = _PAYLOAD_DTYPES.get(entry.dtype)
        if dtype is None:
            raise CorruptCheckpointError(
                f"tensor {number} has dtype {entry.dtype[:40]!r}, which restore does not read"
            )
        if any(dim < 0 for dim in entry.shape):
            raise CorruptCheckpointError(f"tensor {number} has a negative dimension")
        expected = math.prod(entry.shape) * dtype.itemsize
        if entry.nbytes != expected:
            raise CorruptCheckpointError(
                f"tensor {number} ({len(entry.shape)}-d {entry.dtype}) takes {expected} bytes, "
                f"the index says {entry.nbytes}"
            )
        offset = entry.offset_bytes
        if offset < 0 or offset % dtype.itemsize:
            raise CorruptCheckpointError(
                f"tensor {number} starts at byte {offset}, not a multiple of its "
                f"{dtype.itemsize}-byte elements"
            )
        if offset + entry.nbytes > payload_bytes:
            raise CorruptCheckpointError(
                f"tensor {number} ends at byte {offset + entry.nbytes}, past the payload's "
                f"{payload_bytes}"
            )


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
