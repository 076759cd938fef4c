"""A state's skeleton: its non-tensor structure, and which skeletons restore loads.

Owns: splitting a training state (nested dicts, lists and tuples of tensors and plain values)
into a skeleton, every dense tensor replaced by a `TensorSlot`, and its tensors
(`flatten_state`), and the way back (`unflatten_state`); and what restore trusts:
`load_skeleton`, an unpickler that resolves only `_ALLOWED_GLOBALS` (anything else is
`UnsafeCheckpointError`, before it can run), after `skeleton_bounds.scan_skeleton` bounded the
bytes; and `check_skeleton`, the same rules on a live skeleton at save time, so a state restore
would refuse is a `TypeError` naming its key at the first save.

The module keeps the name ``snapshot``: a saved skeleton names its slots
``jobs.checkpoint.snapshot.TensorSlot``, so moving `TensorSlot` would change the format.

Must not: do I/O or start threads (the engine does both); resolve a global outside
`_ALLOWED_GLOBALS` while unpickling.
"""

from __future__ import annotations

import collections
import io
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from jobs.checkpoint.layout import CorruptCheckpointError, UnsafeCheckpointError
from jobs.checkpoint.payload import TORCH_DTYPES
from jobs.checkpoint.skeleton_bounds import (
    MAX_KEY_DEPTH,
    MAX_SKELETON_DEPTH,
    MAX_SKELETON_ELEMENTS,
    scan_skeleton,
)

__all__ = [
    "TensorSlot",
    "check_skeleton",
    "flatten_state",
    "load_skeleton",
    "unflatten_state",
    "unpickle_scanned_skeleton",
]

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
    **{("torch", name): dtype for name, dtype in TORCH_DTYPES.items()},
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
