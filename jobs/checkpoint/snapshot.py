"""Snapshot: copy a training state's tensors into reusable host buffers, and rebuild it.

This module owns the only work `save()` does on the training thread: walk the state
(nested dicts, lists and tuples of tensors and plain values), check that restore will be
able to load its non-tensor structure, pickle that skeleton with every dense tensor
replaced by a slot number, and copy the tensors' bytes into one flat host buffer at 64-byte
aligned offsets. The buffer is the payload that gets uploaded as is: there is no second
serialization pass. Buffers are allocated once, pre-faulted, and reused (pinned when CUDA
is present so device-to-host copies run at full PCIe speed). Host-to-host copies are split
into chunks of about equal size that the calling thread and a copy pool lent by the engine
work through together.

It also owns what restore trusts: the skeleton is loaded by `load_skeleton`, an unpickler
that resolves only the globals in `_ALLOWED_GLOBALS` (builtin containers and scalars,
`OrderedDict`, `defaultdict` with a builtin factory, torch dtypes, devices and sizes, and
`TensorSlot`). Anything else is `UnsafeCheckpointError`, before it can run. Before the
unpickler sees a byte, `skeleton_bounds.scan_skeleton` bounds the skeleton's size, nesting
depth, number of values and dict key types without recursing. `take_snapshot` applies the
same rules at save time (`check_skeleton`), so a state restore would refuse is a `TypeError`
naming its key at the first save. `check_tensor_layout` checks each tensor's dtype, shape,
size and offset against the payload before any view of it is made.

It must not do I/O or start threads; the engine does both.
"""

from __future__ import annotations

import collections
import io
import math
import os
import pickle
import queue
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from jobs.checkpoint.layout import CorruptCheckpointError, TensorEntry, UnsafeCheckpointError
from jobs.checkpoint.skeleton_bounds import (
    MAX_KEY_DEPTH,
    MAX_SKELETON_BYTES,
    MAX_SKELETON_DEPTH,
    MAX_SKELETON_ELEMENTS,
    scan_skeleton,
)

ALIGN_BYTES = 64
MIB = 1024 * 1024
MAX_DEFAULT_COPY_THREADS = 4
"""`default_copy_threads()` uses at most this many threads (the training thread included)."""
MIN_COPY_CHUNK_BYTES = 8 * MIB
"""Host copies smaller than two chunks of this size run on the calling thread alone."""
COPY_CHUNKS_PER_THREAD = 4
"""Chunks per copying thread: a thread the OS descheduled holds back one small chunk, not a
whole share of the snapshot, while the other threads take the remaining chunks."""

_SAFE_HINT = (
    "save tensors, numbers, strings, bytes, None, torch dtypes/devices/sizes and dicts, "
    "OrderedDicts, lists, tuples and sets of them"
)


@dataclass(frozen=True)
class TensorSlot:
    """Stands in for a tensor in the pickled skeleton."""

    index: int

    def __reduce__(self) -> tuple[type[TensorSlot], tuple[int]]:
        # TensorSlot(index): half the opcodes of the default (an object, then its __dict__),
        # so a skeleton of many tensors scans and unpickles in half the time. Skeletons
        # saved before still load: the unpickler builds those with NEWOBJ and BUILD.
        return TensorSlot, (self.index,)


def _is_dense(value: object) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and not value.is_quantized
        and not value.is_nested
    )


def _same_mapping(original: dict[Any, Any], items: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A mapping of `original`'s type (dict, OrderedDict, defaultdict, ...) holding `items`."""
    if type(original) is dict:
        return dict(items)
    if isinstance(original, collections.defaultdict):
        rebuilt: dict[Any, Any] = type(original)(original.default_factory)
        rebuilt.update(items)
        return rebuilt
    return type(original)(items)


def flatten_state(state: Any) -> tuple[Any, list[torch.Tensor]]:
    """Split `state` into a skeleton (tensors replaced by `TensorSlot`) and its tensors.

    The same tensor object appearing twice (tied weights) gets one slot, so it is stored
    once and restored as one tensor shared by both places.
    """
    tensors: list[torch.Tensor] = []
    seen: dict[int, int] = {}

    def walk(value: Any, depth: int) -> Any:
        if _is_dense(value):
            key = id(value)
            if key not in seen:
                seen[key] = len(tensors)
                tensors.append(value.detach())
            return TensorSlot(seen[key])
        if depth >= MAX_SKELETON_DEPTH and isinstance(value, dict | list | tuple):
            raise TypeError(_too_deep_message("state"))
        if isinstance(value, dict):
            return _same_mapping(value, [(k, walk(v, depth + 1)) for k, v in value.items()])
        if isinstance(value, list):
            return [walk(v, depth + 1) for v in value]
        if type(value) is tuple:
            return tuple(walk(v, depth + 1) for v in value)
        return value

    return walk(state, 0), tensors


def _too_deep_message(path: str) -> str:
    return (
        f"checkpoint state at {path} is nested more than {MAX_SKELETON_DEPTH} containers deep "
        "(or holds itself), which restore does not load; flatten it, or save it as a tensor"
    )


def unflatten_state(skeleton: Any, tensors: Sequence[torch.Tensor]) -> Any:
    """Inverse of `flatten_state`. A slot that names no tensor is `CorruptCheckpointError`."""

    def walk(value: Any) -> Any:
        if isinstance(value, TensorSlot):
            index = vars(value).get("index")  # a crafted slot may lack it
            if type(index) is not int or not 0 <= index < len(tensors):
                raise CorruptCheckpointError(
                    f"skeleton names tensor slot {index!r}; the index lists {len(tensors)}"
                )
            return tensors[index]
        if isinstance(value, dict):
            return _same_mapping(value, [(k, walk(v)) for k, v in value.items()])
        if isinstance(value, list):
            return [walk(v) for v in value]
        if type(value) is tuple:
            return tuple(walk(v) for v in value)
        return value

    return walk(skeleton)


# ------------------------------------------------------------------- what restore loads

_SCALAR_TYPES: frozenset[type] = frozenset(
    {type(None), bool, int, float, complex, str, bytes, bytearray}
)
_DEFAULTDICT_FACTORIES: frozenset[Any] = frozenset(
    {None, list, dict, set, frozenset, tuple, int, float, complex, str, bool,
     collections.OrderedDict}
)  # fmt: skip
"""`defaultdict` factories restore rebuilds: each makes an empty or zero value."""
_TORCH_DTYPES: dict[str, torch.dtype] = {
    name: value for name, value in vars(torch).items() if isinstance(value, torch.dtype)
}
"""A dtype pickles as the global ``torch.<name>``. Read from the module's dict, not with
getattr, so no name in a checkpoint can make torch import anything."""


def _defaultdict(factory: Any = None, *rest: Any) -> collections.defaultdict[Any, Any]:
    """What a skeleton's ``collections.defaultdict`` resolves to: refuses other factories."""
    if rest or factory not in _DEFAULTDICT_FACTORIES:
        raise UnsafeCheckpointError(
            f"the saved state has a defaultdict whose factory is {factory!r}, which restore "
            f"does not call; {_SAFE_HINT}"
        )
    return collections.defaultdict(factory)


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    **{
        ("builtins", kind.__name__): kind
        for kind in (complex, slice, set, frozenset, list, dict, tuple, int, float, str, bool)
    },
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "defaultdict"): _defaultdict,
    ("torch", "device"): torch.device,
    ("torch", "Size"): torch.Size,
    (__name__, "TensorSlot"): TensorSlot,
    **{("torch", name): dtype for name, dtype in _TORCH_DTYPES.items()},
}
"""Every global a skeleton may name. None of them runs code, touches files or allocates more
than its arguments' size when called (``bytes`` is left out: ``bytes(10**12)`` would)."""


class _SkeletonUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED_GLOBALS.get((module, name))
        if found is None:
            raise UnsafeCheckpointError(
                f"the saved state refers to {module}.{name}, which restore does not load; "
                f"{_SAFE_HINT}"
            )
        return found


def load_skeleton(data: bytes) -> Any:
    """Unpickle a skeleton, resolving only `_ALLOWED_GLOBALS`, once `scan_skeleton` passed.

    Raises `UnsafeCheckpointError` for any other global (nothing it names is imported or
    called) and `CorruptCheckpointError` for bytes that do not unpickle or exceed the
    skeleton's bounds (size, depth, values, key types).
    """
    scan_skeleton(data)
    return unpickle_scanned_skeleton(data)


def unpickle_scanned_skeleton(data: bytes) -> Any:
    """`load_skeleton` after its scan: only for bytes `scan_skeleton` has passed (restore
    times the scan apart from the unpickling)."""
    try:
        return _SkeletonUnpickler(io.BytesIO(data)).load()
    except UnsafeCheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of untrusted bytes is corruption
        raise CorruptCheckpointError(
            f"the saved state's structure does not unpickle: {type(exc).__name__}: {exc}"
        ) from exc


def check_skeleton(skeleton: Any, path: str = "state") -> None:
    """Raise TypeError naming the first value `load_skeleton` would refuse, by key path.

    Mirrors `_ALLOWED_GLOBALS` on live objects: exact types only, so subclasses (numpy
    scalars are float subclasses, namedtuples tuple ones) are refused like any custom class.
    Mirrors `skeleton_bounds` too: at most `MAX_SKELETON_DEPTH` containers deep, at most
    `MAX_SKELETON_ELEMENTS` values, dict keys and set elements only scalars, dtypes,
    devices, sizes and tuples and frozensets of them, at most `MAX_KEY_DEPTH` deep.
    """
    elements = 0

    def check(value: Any, path: str, depth: int, key_depth: int | None) -> None:
        """`depth`: containers above `value`; `key_depth`: the same within the dict key or
        set element it is part of, None outside keys."""
        nonlocal elements
        elements += 1
        if elements > MAX_SKELETON_ELEMENTS:
            raise TypeError(
                f"checkpoint state holds more than {MAX_SKELETON_ELEMENTS} values (at {path}), "
                "which restore does not load; save long sequences as tensors"
            )
        kind = type(value)
        in_key = key_depth is not None
        if kind in _SCALAR_TYPES or kind is TensorSlot or kind is torch.device:
            if in_key and kind is bytearray:
                raise TypeError(_key_message(path, value))
            return
        if isinstance(value, torch.dtype):
            return
        if in_key and kind not in (tuple, frozenset, torch.Size):
            raise TypeError(_key_message(path, value))
        if depth >= MAX_SKELETON_DEPTH:
            raise TypeError(_too_deep_message(path))
        if key_depth is not None and key_depth >= MAX_KEY_DEPTH:
            raise TypeError(
                f"checkpoint state at {path} is a key nested more than {MAX_KEY_DEPTH} "
                "deep, which restore does not load"
            )
        inner = None if key_depth is None else key_depth + 1
        if kind in (dict, collections.OrderedDict, collections.defaultdict):
            if kind is collections.defaultdict and value.default_factory not in (
                _DEFAULTDICT_FACTORIES
            ):
                raise TypeError(
                    f"checkpoint state at {path} is a defaultdict with factory "
                    f"{value.default_factory!r}, which restore does not call; use a factory "
                    "such as list, dict or int, or convert it with dict(...)"
                )
            for k, v in value.items():
                check(k, f"{path} (key {k!r})", depth + 1, 0)
                check(v, f"{path}[{k!r}]", depth + 1, None)
            return
        if kind in (list, tuple, torch.Size):
            for i, v in enumerate(value):
                check(v, f"{path}[{i}]", depth + 1, inner)
            return
        if kind in (set, frozenset):
            for v in value:
                check(v, f"{path} (element {v!r})", depth + 1, inner or 0)
            return
        if kind is slice:
            for part in (value.start, value.stop, value.step):
                check(part, path, depth + 1, None)
            return
        hint = (
            "; sparse, quantized and nested tensors are not supported, save a dense copy"
            if isinstance(value, torch.Tensor)
            else " (numpy: torch.from_numpy(a) or a.tolist())"
            if kind.__module__.startswith("numpy")
            else ""
        )
        raise TypeError(
            f"checkpoint state at {path} is a {kind.__module__}.{kind.__qualname__}, which "
            f"restore does not load; {_SAFE_HINT}{hint}"
        )

    check(skeleton, path, 0, None)


def _key_message(path: str, value: object) -> str:
    return (
        f"checkpoint state at {path} is a {type(value).__qualname__} used as a dict key or set "
        "element, which restore does not load; keys are numbers, strings, bytes, None, "
        "dtypes, devices, sizes, and tuples and frozensets of them"
    )


# ------------------------------------------------------------------------------ layout


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
    for name, dtype in _TORCH_DTYPES.items()
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


# ------------------------------------------------------------------------------- copies

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
