"""Restore survives a bad step: skeletons, indexes and manifests crafted or damaged in storage
are refused with `CorruptCheckpointError` (never a crash, a RecursionError or an allocation
of what they claim), the step is skipped with a warning naming it and why, and the next
older committed step is restored; with none left, `NoVerifiedCheckpointError` names every
step tried. What the save accepts, restore accepts. A hypothesis fuzz test mutates real
skeletons, indexes and manifests. No Ray."""

from __future__ import annotations

import base64
import collections
import copyreg
import io
import json
import logging
import pickle
import pickletools
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.checkpoint import InProcessMemoryTier, NoVerifiedCheckpointError, UnsafeCheckpointError
from jobs.checkpoint.capturing import HostBuffer, rebuild_state, take_snapshot
from jobs.checkpoint.layout import (
    CorruptCheckpointError,
    RankIndex,
    checksum,
    index_key,
    manifest_key,
    shard_key,
)
from jobs.checkpoint.restoring import restore_newest
from jobs.checkpoint.skeleton_bounds import (
    MAX_KEY_DEPTH,
    MAX_SKELETON_DEPTH,
    MAX_SKELETON_ELEMENTS,
    scan_skeleton,
)
from jobs.checkpoint.snapshot import TensorSlot, load_skeleton
from jobs.checkpoint.storages import ObjectNotFoundError, ObjectSizeError
from tests.unit.jobs.test_checkpoint_engine import assert_state_equal, engine_at, make_state
from tests.unit.jobs.test_checkpoint_restore_safety import assert_state_equal_loose

REPO = Path(__file__).resolve().parents[3]

# -- crafted pickles (protocol 5 opcodes, see pickletools) -------------------------------------

HEAD, STOP = b"\x80\x05", b"."
EMPTY_LIST, EMPTY_DICT, EMPTY_TUPLE, MARK = b"]", b"}", b")", b"("
APPEND, SETITEM, TUPLE1, TUPLE2, FROZENSET = b"a", b"s", b"\x85", b"\x86", b"\x91"
MEMOIZE, ONE = b"\x94", b"K\x01"


def binget(n: int) -> bytes:
    return b"j" + n.to_bytes(4, "little")


def deep_tuple_key(levels: int) -> bytes:
    """{((((),),),...): 1}: the unpickler hashes the key, recursing once per level."""
    return HEAD + EMPTY_DICT + EMPTY_TUPLE + TUPLE1 * levels + ONE + SETITEM + STOP


def deep_list(levels: int) -> bytes:
    """[[[[...]]]]: unpickles without recursing, but every walk of it recurses."""
    return HEAD + EMPTY_LIST * levels + APPEND * (levels - 1) + STOP


def deep_frozenset(levels: int) -> bytes:
    return HEAD + MARK + EMPTY_TUPLE + TUPLE1 * levels + FROZENSET + STOP


def self_holding_list() -> bytes:
    """x = []; x.append(x)."""
    return HEAD + EMPTY_LIST + MEMOIZE + binget(0) + APPEND + STOP


def doubling(levels: int) -> bytes:
    """t0 = (); t(n+1) = (tn, tn): a few hundred bytes a walk visits 2**levels times."""
    body = EMPTY_TUPLE + MEMOIZE
    for n in range(levels):
        body += binget(n) + binget(n) + TUPLE2 + MEMOIZE
    return HEAD + body + STOP


def list_key() -> bytes:
    return HEAD + EMPTY_DICT + EMPTY_LIST + ONE + SETITEM + STOP


SCAN_REFUSALS = [
    pytest.param(deep_tuple_key(MAX_SKELETON_DEPTH + 5), "nested deeper", id="deep-tuple-key"),
    pytest.param(deep_tuple_key(MAX_KEY_DEPTH + 2), "key or set element nested", id="deep-key"),
    pytest.param(deep_list(200_000), "nested deeper", id="deep-list"),
    pytest.param(deep_frozenset(MAX_KEY_DEPTH + 2), "set element nested", id="deep-frozenset"),
    pytest.param(self_holding_list(), "a cycle", id="list-holding-itself"),
    pytest.param(doubling(30), "more than 1000000 values", id="memo-doubling-2**30"),
    pytest.param(list_key(), "list, dict, set or bytearray as a dict key", id="list-as-key"),
    pytest.param(HEAD + MARK * 1000 + STOP, "nested deeper", id="marks-only"),
    pytest.param(HEAD + b"N" * (64 * 1024 * 1024), "bytes, more than", id="over-64-MiB"),
    pytest.param(HEAD + b"X\xff\xff\xff\x7fab" + STOP, "runs past its end", id="length-past-end"),
    pytest.param(HEAD + b"NNN", "ends before its STOP", id="no-stop"),
    pytest.param(HEAD + b"a" + STOP, "more values than were pushed", id="append-on-nothing"),
    pytest.param(HEAD + b"h\x07" + STOP, "memo entry never stored", id="get-unknown-memo"),
    pytest.param(HEAD + b"\xff" + STOP, "unknown pickle opcode 0xff", id="unknown-opcode"),
]


@pytest.mark.parametrize(("data", "reason"), SCAN_REFUSALS)
def test_the_scan_refuses_shapes_before_anything_recurses(data: bytes, reason: str) -> None:
    with pytest.raises(CorruptCheckpointError, match=reason):
        scan_skeleton(data)
    with pytest.raises(CorruptCheckpointError, match=reason):
        load_skeleton(data)


@pytest.mark.parametrize(
    ("data", "opcode"),
    [
        pytest.param(HEAD + b"P0\n" + STOP, "PERSID", id="persid"),
        pytest.param(HEAD + b"N" + b"Q" + STOP, "BINPERSID", id="binpersid"),
        pytest.param(HEAD + b"\x82\x01" + STOP, "EXT1", id="ext1"),
        pytest.param(HEAD + MARK + b"ios\nsystem\n" + STOP, "INST", id="inst"),
        pytest.param(HEAD + b"\x97" + STOP, "NEXT_BUFFER", id="out-of-band-buffer"),
    ],
)
def test_opcodes_that_load_by_other_means_are_unsafe(data: bytes, opcode: str) -> None:
    with pytest.raises(UnsafeCheckpointError, match=f"pickle opcode {opcode}"):
        load_skeleton(data)


# -- a store with two committed steps, one of them damaged --------------------------------------


def two_steps(root: Path) -> None:
    with engine_at(root) as engine:
        for step in (1, 2):
            engine.save(make_state(step), step)


def read_index(root: Path, step: int) -> dict[str, Any]:
    return dict(json.loads((root / index_key(step, 0)).read_bytes()))


def write_index(root: Path, step: int, data: bytes, *, payload_bytes: int | None = None) -> None:
    """Rank 0's index of `step` becomes `data`, and the manifest agrees with it (checksum,
    and payload size when given): everything a writer of the bucket can do."""
    (root / index_key(step, 0)).write_bytes(data)
    path = root / manifest_key(step)
    doc = json.loads(path.read_bytes())
    doc["ranks"][0]["index_checksum"] = checksum(data)
    if payload_bytes is not None:
        doc["ranks"][0]["payload_bytes"] = payload_bytes
    path.write_bytes(json.dumps(doc).encode())


def edit_index(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        doc = read_index(root, 2)
        edit(doc)
        write_index(root, 2, json.dumps(doc).encode(), payload_bytes=doc["payload_bytes"])

    return apply


def plant_skeleton(data: bytes) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        doc = read_index(root, 2)
        doc["skeleton_b64"] = base64.b64encode(data).decode()
        write_index(root, 2, json.dumps(doc).encode())

    return apply


def raw_index(text: bytes) -> Callable[[Path], None]:
    return lambda root: write_index(root, 2, text)


def edit_manifest(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        path = root / manifest_key(2)
        doc = json.loads(path.read_bytes())
        edit(doc)
        path.write_bytes(json.dumps(doc).encode())

    return apply


def _shape(doc: dict[str, Any]) -> None:
    doc["tensors"][0][1] = [64, 65]  # 64x64 float32 bytes, shaped as 64x65


def _offset_past_payload(doc: dict[str, Any]) -> None:
    doc["tensors"][0][2] = doc["payload_bytes"]


def _one_tib_payload(doc: dict[str, Any]) -> None:
    doc["payload_bytes"] = 1 << 40
    doc["shards"] = [[shard_key(2, 0, 0), 0, 1 << 40, "00000000"]]


def _misaligned(doc: dict[str, Any]) -> None:
    doc["tensors"][0][2] = 2


def _unknown_dtype(doc: dict[str, Any]) -> None:
    doc["tensors"][0][0] = "qint8"


def _negative_dim(doc: dict[str, Any]) -> None:
    doc["tensors"][0][1] = [-64, -64]


def _older_steps_shards(doc: dict[str, Any]) -> None:
    doc["shards"] = [[s[0].replace("step-000000000002", "step-000000000001")] + s[1:]
                     for s in doc["shards"]]  # fmt: skip


def _overlapping_shards(doc: dict[str, Any]) -> None:
    doc["shards"][1][1] = 0


DAMAGE = [
    pytest.param(plant_skeleton(deep_list(200_000)), "nested deeper", id="skeleton-deep-list"),
    pytest.param(plant_skeleton(self_holding_list()), "a cycle", id="skeleton-cycle"),
    pytest.param(plant_skeleton(doubling(23)), "values", id="skeleton-memo-doubling-2**23"),
    pytest.param(
        plant_skeleton(deep_tuple_key(MAX_SKELETON_DEPTH + 50)),
        "nested deeper",
        id="skeleton-deep-tuple-key",
    ),
    pytest.param(edit_index(_shape), "takes 16640 bytes, the index says 16384", id="shape"),
    pytest.param(edit_index(_offset_past_payload), "past the payload", id="offset-past-payload"),
    pytest.param(edit_index(_one_tib_payload), "more than this host's", id="claims-1-TiB"),
    pytest.param(edit_index(_misaligned), "not a multiple of its 4-byte", id="misaligned"),
    pytest.param(edit_index(_unknown_dtype), "dtype 'qint8'", id="quantized-dtype"),
    pytest.param(edit_index(_negative_dim), "negative dimension", id="negative-dimension"),
    pytest.param(edit_index(_older_steps_shards), "not 'step-000000000002", id="foreign-shards"),
    pytest.param(edit_index(_overlapping_shards), "must tile the payload", id="overlapping"),
    pytest.param(
        edit_index(lambda d: d.update(step=float("inf"))), "rank index is not valid", id="infinity"
    ),
    pytest.param(raw_index(b"[" * 100_000), "rank index is not valid", id="deep-json"),
    pytest.param(
        edit_manifest(lambda d: d.update(world_size=10**12)), "expected 0..", id="huge-world"
    ),
    pytest.param(
        edit_manifest(lambda d: d["ranks"][0].update(index_key="../../etc/passwd")),
        "as rank 0's index",
        id="index-elsewhere",
    ),
    pytest.param(
        edit_manifest(lambda d: d["ranks"][0].update(payload_bytes=7)),
        "the manifest 7",
        id="payload-not-the-manifests",
    ),
]


@pytest.mark.parametrize(("damage", "reason"), DAMAGE)
def test_a_bad_newest_step_is_skipped_and_the_older_one_restored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], None], reason: str
) -> None:
    two_steps(tmp_path)
    damage(tmp_path)
    with caplog.at_level(logging.WARNING):
        restored = engine_at(tmp_path).restore()
    assert restored is not None and restored.step == 1
    assert_state_equal(restored.state, make_state(1))
    assert [s.step for s in restored.skipped] == [2]
    assert reason in restored.skipped[0].reason
    assert f"skipping checkpoint step 2 in {tmp_path.as_uri()}" in caplog.text
    assert reason in caplog.text


def test_when_no_step_verifies_the_error_names_each_and_why(tmp_path: Path) -> None:
    two_steps(tmp_path)
    plant_skeleton(deep_list(5000))(tmp_path)
    (tmp_path / shard_key(1, 0, 0)).write_bytes(b"torn")
    with pytest.raises(NoVerifiedCheckpointError) as caught:
        engine_at(tmp_path).restore()
    message = str(caught.value)
    assert "step 2: the saved state's structure is nested deeper than 100" in message
    assert "step 1: " in message and "has 4 bytes, expected 4096" in message
    assert [s.step for s in caught.value.skipped] == [2, 1]
    assert isinstance(caught.value, CorruptCheckpointError)


def test_a_memory_copy_shorter_than_its_index_falls_back_to_storage(tmp_path: Path) -> None:
    tier = InProcessMemoryTier()
    with engine_at(tmp_path, memory_tier=tier) as engine:
        engine.save(make_state(1), 1)
    held = tier.get(0)
    assert held is not None
    tier.put(0, held.step, held.index, held.payload[:-64])
    restored = engine_at(tmp_path, memory_tier=tier).restore()
    assert restored is not None and restored.source == "storage"
    assert_state_equal(restored.state, make_state(1))


CRASH_CHILD = """
import sys
from jobs.checkpoint import CheckpointEngine, CorruptCheckpointError
from jobs.checkpoint.snapshot import load_skeleton
try:
    load_skeleton(open(sys.argv[2], "rb").read())
except CorruptCheckpointError as exc:
    print("refused:", str(exc)[:80])
restored = CheckpointEngine(sys.argv[1]).restore()
print("restored step", restored.step, "skipped", [s.step for s in restored.skipped])
"""


def test_a_megabyte_of_nested_tuples_as_a_key_does_not_kill_the_process(tmp_path: Path) -> None:
    """Before the scan, this exited 139 (SIGSEGV) in the unpickler's hash of the key. In a
    child process, so that a regression fails this test instead of killing pytest."""
    store, skeleton = tmp_path / "store", tmp_path / "skeleton.pkl"
    two_steps(store)
    data = deep_tuple_key(1_000_000)
    skeleton.write_bytes(data)
    plant_skeleton(data)(store)
    child = subprocess.run(
        [sys.executable, "-c", CRASH_CHILD, store.as_uri(), str(skeleton)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, f"exit {child.returncode}: {child.stderr[-2000:]}"
    assert "refused: the saved state's structure is nested deeper than 100" in child.stdout
    assert "restored step 1 skipped [2]" in child.stdout


# -- what the save accepts, restore accepts --------------------------------------------------


def nest(kind: str, levels: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(levels):
        if kind == "list":
            value = [value]
        elif kind == "tuple":
            value = (value,)
        elif kind == "dict":
            value = {"k": value}
        elif kind == "ordered":
            value = collections.OrderedDict(k=value)
        else:
            value = collections.defaultdict(list, {1: value})
    return value


LEAVES = [
    pytest.param(torch.arange(3.0), 0, id="tensor"),
    pytest.param(torch.Size([2, 3]), 1, id="size"),
    pytest.param(torch.device("cuda", 1), 0, id="device"),
    pytest.param(2 + 3j, 0, id="complex"),
    pytest.param(slice(1, 9, 2), 1, id="slice"),
    pytest.param(torch.bfloat16, 0, id="dtype"),
    pytest.param(frozenset({(1, 2)}), 2, id="frozenset"),
]


def save_and_rebuild(state: Any) -> Any:
    snapshot = take_snapshot(state, HostBuffer(pin_memory=False))
    return rebuild_state(snapshot.skeleton, snapshot.tensors, snapshot.payload)


@pytest.mark.parametrize("kind", ["list", "tuple", "dict", "ordered", "defaultdict"])
@pytest.mark.parametrize(("leaf", "leaf_depth"), LEAVES)
def test_the_deepest_state_the_save_accepts_restores(kind: str, leaf: Any, leaf_depth: int) -> None:
    state = nest(kind, MAX_SKELETON_DEPTH - leaf_depth, leaf)
    assert_state_equal_loose(save_and_rebuild(state), state)
    with pytest.raises(TypeError, match="nested more than 100 containers deep"):
        take_snapshot(nest(kind, 1, state), HostBuffer(pin_memory=False))


def nested_key(levels: int, leaf: Any) -> Any:
    for _ in range(levels):
        leaf = (leaf,)
    return leaf


@pytest.mark.parametrize(
    ("leaf", "leaf_depth"),
    [
        pytest.param("name", 0, id="str"),
        pytest.param(torch.Size([4]), 1, id="size"),
        pytest.param(torch.device("cpu"), 0, id="device"),
        pytest.param(frozenset({1}), 1, id="frozenset"),
    ],
)
def test_the_deepest_key_the_save_accepts_restores(leaf: Any, leaf_depth: int) -> None:
    key = nested_key(MAX_KEY_DEPTH - leaf_depth, leaf)
    state = nest("list", MAX_SKELETON_DEPTH - MAX_KEY_DEPTH - 1, {key: torch.ones(2)})
    assert_state_equal_loose(save_and_rebuild(state), state)
    with pytest.raises(TypeError, match=f"key nested more than {MAX_KEY_DEPTH} deep"):
        take_snapshot({nested_key(1, key): 1}, HostBuffer(pin_memory=False))


def test_the_most_values_the_save_accepts_restore() -> None:
    state = {"ids": list(range(MAX_SKELETON_ELEMENTS - 3))}  # dict, key, list: 3 more values
    assert save_and_rebuild(state) == state
    with pytest.raises(TypeError, match="holds more than 1000000 values"):
        take_snapshot({"ids": [*state["ids"], 0]}, HostBuffer(pin_memory=False))


def test_a_state_that_holds_itself_is_refused_at_save() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(TypeError, match="or holds itself"):
        take_snapshot({"loop": loop}, HostBuffer(pin_memory=False))


# -- fuzz: mutated skeletons, indexes and manifests ------------------------------------------


class DictStorage:
    """A `Storage` over a dict of keys to bytes (reads only, as restore needs)."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.uri = "memory://fuzz"

    def get_bytes(self, key: str) -> bytes:
        if key not in self.objects:
            raise ObjectNotFoundError(key)
        return self.objects[key]

    def get_many(self, items: list[tuple[str, memoryview]]) -> None:
        for key, view in items:
            data = self.get_bytes(key)
            if len(data) != len(view):
                raise ObjectSizeError(f"{key} has {len(data)} bytes, expected {len(view)}")
            view[:] = data

    def list_keys(self, prefix: str = "") -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))


class SavedObjects(dict[str, bytes]):
    """The objects of a saved store, by key; shown by count (a failing example prints it)."""

    def __repr__(self) -> str:
        return f"<{len(self)} objects of steps 1 and 2>"


@pytest.fixture(scope="module")
def saved_objects(tmp_path_factory: pytest.TempPathFactory) -> SavedObjects:
    root = tmp_path_factory.mktemp("fuzz-store")
    two_steps(root)
    files = [p for p in sorted(root.rglob("*")) if p.is_file()]
    return SavedObjects({p.relative_to(root).as_posix(): p.read_bytes() for p in files})


PICKLE_OPCODES = st.sampled_from(
    [bytes([c]) for c in b"]})(aeslt\x85\x86\x87\x8f\x90\x91\x94NK.2010bR\x81\x93"]
    + [b"h\x00", b"h\x05", b"q\x00", b"X\x04\x00\x00\x00abcd", b"\x8a\x08" + b"\xff" * 8]
)
NUMBER_CHANGES: dict[str, Callable[[Any], Any]] = {
    "zero": lambda n: 0,
    "negative": lambda n: -1 - n,
    "plus-one": lambda n: n + 1,
    "plus-64": lambda n: n + 64,
    "double": lambda n: n * 2,
    "tebibyte": lambda n: 1 << 40,
    "huge": lambda n: 10**30,
    "infinite": lambda n: float("inf"),
    "fraction": lambda n: n + 0.5,
}
"""What a number in an index or manifest becomes: near its value, or absurd."""
TARGETS = ["skeleton"] * 4 + ["index-number"] * 4 + ["index-bytes", "manifest-number"] * 1


@dataclass(frozen=True)
class Mutation:
    """One change to the newest step (or to both) as a damaged disk or an attacker makes it."""

    steps: tuple[int, ...]
    apply: Callable[[dict[str, bytes]], None]


@st.composite
def mutations(draw: st.DrawFn) -> Mutation:
    target = draw(st.sampled_from(TARGETS))
    steps = draw(st.sampled_from([(2,), (2,), (2,), (2, 1)]))
    fix_checksum = draw(st.sampled_from([True, True, True, False]))
    how = draw(st.sampled_from(["flip", "flip", "truncate", "insert", "insert", "nest"]))
    at = draw(st.floats(0, 1))
    mask = draw(st.integers(1, 255))
    noise = draw(st.lists(PICKLE_OPCODES, min_size=1, max_size=40).map(b"".join))
    change = NUMBER_CHANGES[draw(st.sampled_from(sorted(NUMBER_CHANGES)))]
    depth = draw(st.sampled_from([50, 200, 5000]))

    def bytes_mutation(data: bytes) -> bytes:
        pos = min(int(at * len(data)), len(data) - 1)
        if how == "flip":
            return data[:pos] + bytes([data[pos] ^ mask]) + data[pos + 1 :]
        if how == "truncate":
            return data[:pos]
        if how == "insert":
            return data[:pos] + noise + data[pos:]
        return data[:pos] + b"[" * depth + data[pos:]  # nest

    def number_mutation(data: bytes) -> bytes:
        """One number somewhere in the JSON document changed."""
        doc = json.loads(data)
        places: list[tuple[Any, Any]] = []
        todo = [doc]
        while todo:
            node = todo.pop()
            for key, value in node.items() if isinstance(node, dict) else enumerate(node):
                if isinstance(value, int | float) and not isinstance(value, bool):
                    places.append((node, key))
                elif isinstance(value, dict | list):
                    todo.append(value)
        node, key = places[min(int(at * len(places)), len(places) - 1)]
        node[key] = change(node[key])
        return json.dumps(doc).encode()

    def apply(objects: dict[str, bytes]) -> None:
        for step in steps:
            ikey, mkey = index_key(step, 0), manifest_key(step)
            if target == "manifest-number":
                objects[mkey] = number_mutation(objects[mkey])
                continue
            if target == "skeleton":
                doc = json.loads(objects[ikey])
                skeleton = base64.b64decode(doc["skeleton_b64"])
                if how == "nest":  # a deep list appended to the state's top level
                    skeleton = skeleton[:-1] + EMPTY_LIST * depth + APPEND * depth + STOP
                else:
                    skeleton = bytes_mutation(skeleton)
                doc["skeleton_b64"] = base64.b64encode(skeleton).decode()
                objects[ikey] = json.dumps(doc).encode()
            elif target == "index-number":
                objects[ikey] = number_mutation(objects[ikey])
            else:
                objects[ikey] = bytes_mutation(objects[ikey])
            if fix_checksum:
                manifest = json.loads(objects[mkey])
                manifest["ranks"][0]["index_checksum"] = checksum(objects[ikey])
                objects[mkey] = json.dumps(manifest).encode()

    return Mutation(steps, apply)


def payload_of(objects: dict[str, bytes], step: int) -> bytes:
    index = RankIndex.from_json_bytes(objects[index_key(step, 0)])
    return b"".join(objects[s.key] for s in index.shards)


def tensors_in(state: Any) -> list[torch.Tensor]:
    found, todo = [], [state]
    while todo:
        value = todo.pop()
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, dict):
            todo.extend(value.values())
        elif isinstance(value, list | tuple):
            todo.extend(value)
    return found


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(mutation=mutations())
def test_fuzz_restore_returns_a_committed_step_or_the_products_error(
    saved_objects: SavedObjects, mutation: Mutation
) -> None:
    """Whatever is done to the newest step, restore returns step 1 bit-exact, or step 2 as
    stored (bit-exact when its index is untouched; built only of its payload's bytes when
    the index was rewritten with its checksum, as an attacker can); with both steps
    changed it may instead raise `NoVerifiedCheckpointError`. Nothing else: no other
    exception, no crash, no allocation of what a field claims."""
    objects = dict(saved_objects)
    mutation.apply(objects)
    try:
        restored = restore_newest(
            DictStorage(objects),  # type: ignore[arg-type]
            None,
            rank=0,
            world_size=1,
            run_name="fuzz",
            max_step=None,
            map_location="cpu",
        )
    except NoVerifiedCheckpointError as exc:
        assert mutation.steps == (2, 1)
        assert [s.step for s in exc.skipped] == [2, 1]
        return
    assert restored is not None and restored.step in (1, 2)
    step = restored.step
    if objects[index_key(step, 0)] == saved_objects[index_key(step, 0)]:
        assert_state_equal(restored.state, make_state(step))
    else:
        payload = payload_of(saved_objects, step)
        for tensor in tensors_in(restored.state):
            assert tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes() in payload


class SlotsAsBefore(pickle.Pickler):
    """Pickles a `TensorSlot` as skeletons saved before it had `__reduce__` hold it: an
    object (NEWOBJ) and then its __dict__ (BUILD)."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is TensorSlot:
            return copyreg.__newobj__, (TensorSlot,), {"index": obj.index}, None, None
        return NotImplemented


def test_the_scan_accepts_every_opcode_a_real_state_pickles_to() -> None:
    from tests.unit.jobs.test_checkpoint_restore_safety import trained_states

    odd = (b"b", bytearray(b"ba"), 2**100, -(2**70), {1, 2}, frozenset({3}), [], {})
    snapshot = take_snapshot({**trained_states(), "odd": odd}, HostBuffer(pin_memory=False))
    ops = {op.name for op, _arg, _pos in pickletools.genops(snapshot.skeleton)}
    assert {"LONG1", "BYTEARRAY8", "FROZENSET", "ADDITEMS", "REDUCE", "STACK_GLOBAL"} <= ops
    restored = rebuild_state(snapshot.skeleton, snapshot.tensors, snapshot.payload)
    assert restored["odd"] == odd
    plain = {"a": [1, 2.5, "s", None, True, (1, (2,))], 3: {4, 5}, (6,): frozenset({7})}
    for protocol in (0, 1, 2, 3, 4):  # text opcodes, PUT/GET, MARK-built containers
        data = pickle.dumps(plain, protocol=protocol, fix_imports=False)
        assert load_skeleton(data) == plain


def test_skeletons_saved_before_slots_had_reduce_still_load() -> None:
    skeleton = {"model": {"w": TensorSlot(0)}, "optim": [TensorSlot(1), (TensorSlot(2),)]}
    out = io.BytesIO()
    SlotsAsBefore(out, protocol=pickle.HIGHEST_PROTOCOL).dump(skeleton)
    ops = {op.name for op, _arg, _pos in pickletools.genops(out.getvalue())}
    assert {"NEWOBJ", "BUILD"} <= ops
    assert load_skeleton(out.getvalue()) == skeleton
