"""How big, how deep and how wide a checkpoint's skeleton may be, checked before it unpickles.

A skeleton (a state's pickled non-tensor structure) comes from storage, which anyone holding
the bucket's keys can write. Unpickling it is safe against code (`snapshot.load_skeleton`
resolves only a list of harmless globals), but not against shape: a megabyte of nested
tuples used as a dict key makes the unpickler hash a million-deep tuple, which overflows the
C stack and kills the process (exit 139); a deep list makes every later walk of the state
raise RecursionError; a few shared references (the pickle memo) make a walk that rebuilds
the state visit 2**100 values.

Owns: `scan_skeleton`, one pass over the pickle's opcodes, with an explicit stack and no
recursion, that models what each opcode would build (its nesting depth, how many values a
walk of it visits, whether it may be a dict key) without building it, and refuses the bytes
(`CorruptCheckpointError`, or `UnsafeCheckpointError` for opcodes that exist to call or
import things) before anything recursive runs; and the limits it applies, which
`snapshot.check_skeleton` applies to a live state at save, so a state the save accepts is
one restore accepts:

* `MAX_SKELETON_BYTES`: the pickled skeleton's size.
* `MAX_SKELETON_DEPTH`: containers inside containers. A model's or optimizer's state_dict is
  3 to 5 deep.
* `MAX_KEY_DEPTH`: how deep a dict key or set element may be (a tuple of tuples is 2).
  Keys are scalars (not bytearray), dtypes, devices, sizes, and tuples and frozensets of
  them; a key that is a list, dict or set is refused.
* `MAX_SKELETON_ELEMENTS`: values a walk of the state visits (every container and every
  leaf, a shared one each time it appears). An Adam state of a 1,000-tensor model is about
  10,000.

Pickle spells a few values with more structure than they have: a `torch.Size` is
``Size((2, 3))`` (one level more), a device ``device(("cuda", 1))`` (4 values where the save
counts 1), and a `TensorSlot` saved before it had `__reduce__` an object plus a state dict
(5). So the scan allows `_DEPTH_MARGIN` more levels and `_ELEMENT_FACTOR` times the values of
the save's limits; its messages name the save's.

Must not: unpickle, import or call anything the bytes name; recurse.
"""

from __future__ import annotations

from collections.abc import Callable

from jobs.checkpoint.layout import CorruptCheckpointError, UnsafeCheckpointError

__all__ = [
    "MAX_KEY_DEPTH",
    "MAX_SKELETON_BYTES",
    "MAX_SKELETON_DEPTH",
    "MAX_SKELETON_ELEMENTS",
    "scan_skeleton",
]

MAX_SKELETON_BYTES = 64 * 1024 * 1024
MAX_SKELETON_DEPTH = 100
MAX_KEY_DEPTH = 8
MAX_SKELETON_ELEMENTS = 1_000_000

_DEPTH_MARGIN = 1
_ELEMENT_FACTOR = 8
_SCAN_DEPTH = MAX_SKELETON_DEPTH + _DEPTH_MARGIN
_SCAN_KEY_DEPTH = MAX_KEY_DEPTH + _DEPTH_MARGIN
_SCAN_ELEMENTS = MAX_SKELETON_ELEMENTS * _ELEMENT_FACTOR
_SCAN_OPCODES = 2 * _SCAN_ELEMENTS
"""Opcodes a scan reads at most; every value takes at least one, bookkeeping (MARK, MEMOIZE)
about one more each."""


class _Value:
    """What the scan knows of one value the unpickler would build."""

    __slots__ = ("depth", "elements", "keyable", "mutable", "used")

    def __init__(self, depth: int, elements: int, *, keyable: bool, mutable: bool) -> None:
        self.depth = depth
        """Containers inside containers: 0 for a scalar, 1 for a list of scalars."""
        self.elements = elements
        """Values a walk of it visits, itself included."""
        self.keyable = keyable
        """Whether it may be a dict key or set element."""
        self.mutable = mutable
        """Whether opcodes may add to it (a list, dict, set, or an object being built)."""
        self.used = False
        """Whether it was put into another value: adding to it now would make a cycle, or
        change a value whose size was already counted."""


_SCALAR = _Value(0, 1, keyable=True, mutable=False)
_UNHASHABLE_SCALAR = _Value(0, 1, keyable=False, mutable=False)  # a bytearray
_SCALAR_TUPLES = {n: _Value(1, 1 + n, keyable=True, mutable=False) for n in (1, 2, 3)}
"""Tuples of 1 to 3 scalars, shared: immutable values are never changed, only counted."""


def _refuse(what: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"the saved state's structure {what}; restore does not load it")


# Opcodes by what they do (pickle's own names in comments; see pickletools.opcodes).
_SCALAR_FIXED: dict[int, int] = {
    ord("N"): 0,  # NONE
    0x88: 0,  # NEWTRUE
    0x89: 0,  # NEWFALSE
    ord("K"): 1,  # BININT1
    ord("M"): 2,  # BININT2
    ord("J"): 4,  # BININT
    ord("G"): 8,  # BINFLOAT
}
"""Opcodes that push a scalar, with their argument's fixed size in bytes."""
_REFUSED: dict[int, str] = {
    ord("P"): "PERSID",
    ord("Q"): "BINPERSID",
    0x82: "EXT1",
    0x83: "EXT2",
    0x84: "EXT4",
    ord("i"): "INST",
    ord("o"): "OBJ",
    0x92: "NEWOBJ_EX",
    0x97: "NEXT_BUFFER",
    0x98: "READONLY_BUFFER",
}
"""Opcodes that load objects by other means than the globals `load_skeleton` allows, or
out-of-band buffers; a skeleton the engine saved holds none of them."""


def scan_skeleton(data: bytes | memoryview) -> None:
    """Raise unless `data` is a pickle within the limits above; build nothing.

    Example: ``pickle.dumps({"lr": 0.1, "betas": (0.9, 0.999)})`` passes (depth 2, 6 values,
    keys are strings). One million TUPLE1 opcodes after an EMPTY_TUPLE are refused at the
    102nd, before the unpickler would have hashed them.
    """
    if len(data) > MAX_SKELETON_BYTES:
        raise _refuse(f"is {len(data)} bytes, more than {MAX_SKELETON_BYTES}")
    _Scan(bytes(data)).run()


class _Scan:
    """One pass over a pickle's opcodes: a model of the unpickler's stack, marks and memo,
    holding `_Value`s instead of objects."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.stack: list[_Value] = []
        self.marks: list[int] = []
        self.memo: dict[int, _Value] = {}
        self.done = False

    def run(self) -> None:
        data, size, stack, memo = self.data, len(self.data), self.stack, self.memo
        pos = 0
        for _ in range(_SCAN_OPCODES):
            if pos >= size:
                raise _refuse("does not unpickle: it ends before its STOP opcode")
            op = data[pos]
            pos += 1
            # The opcodes most of a skeleton is made of, inline.
            width = _SCALAR_FIXED.get(op)
            if width is not None:
                pos += width
                stack.append(_SCALAR)
                continue
            if op == 0x94 and stack and not (self.marks and self.marks[-1] == len(stack)):
                memo[len(memo)] = stack[-1]  # MEMOIZE
                continue
            if op == 0x8C and pos < size:  # SHORT_BINUNICODE
                pos += 1 + data[pos]
                stack.append(_SCALAR)
                continue
            if op == 0x68 and pos < size and data[pos] in memo:  # BINGET
                stack.append(memo[data[pos]])
                pos += 1
                continue
            if op == 0x6A:  # LONG_BINGET
                found = memo.get(int.from_bytes(data[pos : pos + 4], "little"))
                if found is not None and pos + 4 <= size:
                    stack.append(found)
                    pos += 4
                    continue
            if 0x85 <= op <= 0x87:  # TUPLE1..3 of scalars: a slot's (index,), betas, ...
                n = op - 0x84
                if (
                    len(stack) - n >= (self.marks[-1] if self.marks else 0)
                    and stack[-n:].count(_SCALAR) == n
                ):
                    del stack[-n:]
                    stack.append(_SCALAR_TUPLES[n])
                    continue
            if op == 0x52 and len(stack) - 2 >= (self.marks[-1] if self.marks else 0):
                args = stack.pop()  # REDUCE; see `reduce`
                made = _Value(args.depth, args.elements + stack.pop().elements, keyable=True,
                              mutable=True)  # fmt: skip
                _check(made)
                stack.append(made)
                continue
            handler = _HANDLERS.get(op)
            if handler is None:
                if op in _REFUSED:
                    raise UnsafeCheckpointError(
                        f"the saved state uses the pickle opcode {_REFUSED[op]}, which restore "
                        "does not load"
                    )
                raise _refuse(f"does not unpickle: unknown pickle opcode 0x{op:02x}")
            self.pos = pos
            handler(self, op)
            if self.done:
                return
            pos = self.pos
        raise _refuse(f"takes more than {_SCAN_OPCODES} pickle opcodes")

    # -- reading arguments

    def argument(self, width: int, signed: bool = False) -> int:
        end = self.pos + width
        if end > len(self.data):
            raise _refuse("does not unpickle: it ends inside an opcode")
        value = int.from_bytes(self.data[self.pos : end], "little", signed=signed)
        self.pos = end
        return value

    def line(self) -> bytes:
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            raise _refuse("does not unpickle: it ends inside an opcode")
        text = self.data[self.pos : end]
        self.pos = end + 1
        return text

    # -- the stack

    def take(self, n: int) -> list[_Value]:
        stack, marks = self.stack, self.marks
        if len(stack) < n or (marks and len(stack) - n < marks[-1]):
            raise _refuse("does not unpickle: an opcode takes more values than were pushed")
        taken = stack[len(stack) - n :]
        del stack[len(stack) - n :]
        return taken

    def take_to_mark(self) -> list[_Value]:
        if not self.marks:
            raise _refuse("does not unpickle: an opcode needs a MARK that is not there")
        start = self.marks.pop()
        taken = self.stack[start:]
        del self.stack[start:]
        return taken

    def top(self) -> _Value:
        if not self.stack or (self.marks and self.marks[-1] == len(self.stack)):
            raise _refuse("does not unpickle: an opcode needs a value that was not pushed")
        return self.stack[-1]

    # -- what values become

    def add_to(self, target: _Value, values: list[_Value], *, level: int = 1) -> None:
        """`values` go into `target` (a list, dict, set, or an object being built), each
        `level` deeper than it."""
        for value in values:
            if value.mutable:
                value.used = True
        if not target.mutable:
            raise _refuse("does not unpickle: items are added to a value that takes none")
        if target.used:
            raise _refuse(
                "adds to a container after putting it in another one (a cycle, or a value "
                "shared before it was complete)"
            )
        for value in values:
            target.elements += value.elements
            target.depth = max(target.depth, value.depth + level)
        _check(target)

    def new(self, values: list[_Value], *, keyable: bool, mutable: bool) -> None:
        made = _Value(1, 1, keyable=keyable and all(v.keyable for v in values), mutable=True)
        self.add_to(made, values)
        made.mutable = mutable
        self.stack.append(made)

    # -- one method per opcode family; `op` is the opcode's byte

    def sized_scalar(self, op: int) -> None:
        width, signed = _SIZED[op]
        length = self.argument(width, signed)
        if length < 0 or self.pos + length > len(self.data):
            raise _refuse("does not unpickle: a length runs past its end")
        self.pos += length
        self.stack.append(_UNHASHABLE_SCALAR if op == 0x96 else _SCALAR)

    def line_scalar(self, op: int) -> None:
        self.line()
        self.stack.append(_SCALAR)

    def memoize(self, op: int) -> None:
        self.memo[len(self.memo)] = self.top()

    def get(self, op: int) -> None:
        key = self.memo_index(op, {0x68: 1, 0x6A: 4})
        found = self.memo.get(key)
        if found is None:
            raise _refuse("does not unpickle: it refers to a memo entry never stored")
        self.stack.append(found)

    def put(self, op: int) -> None:
        self.memo[self.memo_index(op, {0x71: 1, 0x72: 4})] = self.top()

    def memo_index(self, op: int, widths: dict[int, int]) -> int:
        width = widths.get(op)
        if width is not None:
            return self.argument(width)
        try:
            return int(self.line())  # GET and PUT spell it in decimal
        except ValueError:
            raise _refuse("does not unpickle: a memo index is not a number") from None

    def mark(self, op: int) -> None:
        self.marks.append(len(self.stack))
        if len(self.marks) > _SCAN_DEPTH:
            raise _refuse(f"is nested deeper than {MAX_SKELETON_DEPTH} levels")

    def empty_container(self, op: int) -> None:  # EMPTY_LIST, EMPTY_DICT, EMPTY_SET
        self.stack.append(_Value(1, 1, keyable=False, mutable=True))

    def empty_tuple(self, op: int) -> None:
        self.stack.append(_Value(1, 1, keyable=True, mutable=False))

    def short_tuple(self, op: int) -> None:  # TUPLE1, TUPLE2, TUPLE3
        self.new(self.take(op - 0x84), keyable=True, mutable=False)

    def tuple(self, op: int) -> None:
        self.new(self.take_to_mark(), keyable=True, mutable=False)

    def list(self, op: int) -> None:
        self.new(self.take_to_mark(), keyable=False, mutable=True)

    def frozenset(self, op: int) -> None:
        items = self.take_to_mark()
        _check_keys(items)
        self.new(items, keyable=True, mutable=False)

    def dict(self, op: int) -> None:
        items = self.take_to_mark()
        _check_keys(items[0::2])
        self.new(items, keyable=False, mutable=True)

    def append(self, op: int) -> None:  # APPEND, APPENDS
        items = self.take(1) if op == 0x61 else self.take_to_mark()
        self.add_to(self.top(), items)

    def setitems(self, op: int) -> None:  # SETITEM, SETITEMS
        items = self.take(2) if op == 0x73 else self.take_to_mark()
        _check_keys(items[0::2])
        self.add_to(self.top(), items)

    def additems(self, op: int) -> None:
        items = self.take_to_mark()
        _check_keys(items)
        self.add_to(self.top(), items)

    def global_(self, op: int) -> None:  # GLOBAL (two lines), STACK_GLOBAL (two strings)
        if op == 0x63:
            self.line()
            self.line()
        else:
            self.take(2)
        self.stack.append(_SCALAR)

    def reduce(self, op: int) -> None:  # REDUCE, NEWOBJ: a callable or class, its arguments
        made_by, args = self.take(2)
        # The arguments' tuple stands for the object's own level and count.
        made = _Value(args.depth, args.elements + made_by.elements, keyable=True, mutable=True)
        _check(made)
        self.stack.append(made)

    def build(self, op: int) -> None:
        # The state dict stands for the object's own level, as REDUCE's arguments do.
        state = self.take(1)
        self.add_to(self.top(), state, level=0)

    def dup(self, op: int) -> None:
        self.stack.append(self.top())

    def pop(self, op: int) -> None:
        if self.marks and self.marks[-1] == len(self.stack):
            self.marks.pop()
        else:
            self.take(1)

    def pop_mark(self, op: int) -> None:
        self.take_to_mark()

    def skip(self, op: int) -> None:  # PROTO (1 byte), FRAME (8: only groups what follows)
        self.argument(1 if op == 0x80 else 8)

    def stop(self, op: int) -> None:
        self.top()
        self.done = True


def _check(value: _Value) -> None:
    if value.depth > _SCAN_DEPTH:
        raise _refuse(f"is nested deeper than {MAX_SKELETON_DEPTH} levels")
    if value.elements > _SCAN_ELEMENTS:
        raise _refuse(f"holds more than {MAX_SKELETON_ELEMENTS} values")


def _check_keys(keys: list[_Value]) -> None:
    for key in keys:
        if not key.keyable:
            raise _refuse("uses a list, dict, set or bytearray as a dict key or set element")
        if key.depth > _SCAN_KEY_DEPTH:
            raise _refuse(f"has a dict key or set element nested deeper than {MAX_KEY_DEPTH}")


_SIZED: dict[int, tuple[int, bool]] = {
    0x8A: (1, False),  # LONG1
    0x8B: (4, True),  # LONG4
    ord("U"): (1, False),  # SHORT_BINSTRING
    ord("T"): (4, True),  # BINSTRING
    ord("C"): (1, False),  # SHORT_BINBYTES
    ord("B"): (4, False),  # BINBYTES
    0x8E: (8, False),  # BINBYTES8
    0x96: (8, False),  # BYTEARRAY8 (the one scalar that is no key)
    0x8C: (1, False),  # SHORT_BINUNICODE
    ord("X"): (4, False),  # BINUNICODE
    0x8D: (8, False),  # BINUNICODE8
}
"""Opcodes that push a scalar of a length given first: (size of the length, signed)."""

_HANDLERS: dict[int, Callable[[_Scan, int], None]] = {
    **{op: _Scan.sized_scalar for op in _SIZED},
    **{ord(c): _Scan.line_scalar for c in "ILSVF"},  # INT, LONG, STRING, UNICODE, FLOAT
    0x94: _Scan.memoize,
    **{op: _Scan.get for op in (0x68, 0x6A, 0x67)},  # BINGET, LONG_BINGET, GET
    **{op: _Scan.put for op in (0x71, 0x72, 0x70)},  # BINPUT, LONG_BINPUT, PUT
    0x28: _Scan.mark,
    **{op: _Scan.empty_container for op in (0x5D, 0x7D, 0x8F)},
    0x29: _Scan.empty_tuple,
    **{op: _Scan.short_tuple for op in (0x85, 0x86, 0x87)},
    0x74: _Scan.tuple,
    0x6C: _Scan.list,
    0x91: _Scan.frozenset,
    0x64: _Scan.dict,
    **{op: _Scan.append for op in (0x61, 0x65)},
    **{op: _Scan.setitems for op in (0x73, 0x75)},
    0x90: _Scan.additems,
    **{op: _Scan.global_ for op in (0x63, 0x93)},
    **{op: _Scan.reduce for op in (0x52, 0x81)},
    0x62: _Scan.build,
    0x32: _Scan.dup,
    0x30: _Scan.pop,
    0x31: _Scan.pop_mark,
    **{op: _Scan.skip for op in (0x80, 0x95)},
    0x2E: _Scan.stop,
}
"""What each opcode the scan models does; any other opcode is refused."""
