"""Checkpoint engine against the local-directory backend: round trips, snapshot isolation,
in-flight policies, commit protocol, verification on restore, retention. No Ray."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from jobs.checkpoint import (
    CheckpointEngine,
    CommitTimeoutError,
    InFlightPolicy,
    InProcessMemoryTier,
    LocalStorage,
)
from jobs.checkpoint.layout import index_key, keep_key, manifest_key, shard_key
from jobs.checkpoint.storages import StorageOptions, open_storage

SMALL_SHARD_BYTES = 4096


def make_state(seed: int, *, width: int = 64) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(width, width, generator=gen)
    return {
        "model": {"weight": weight, "bias": torch.randn(width, generator=gen)},
        "optim": {"state": {0: {"exp_avg": torch.randn(width, generator=gen), "step": seed}}},
        "rng": gen.get_state(),
        "step": seed,
        "extras": {"lr": 0.1 * seed, "tags": ("a", seed)},
    }


def raw_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def assert_state_equal(actual: Any, expected: Any) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor)
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        assert torch.equal(raw_bytes(actual), raw_bytes(expected))
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and actual.keys() == expected.keys()
        for key in expected:
            assert_state_equal(actual[key], expected[key])
    elif isinstance(expected, list | tuple):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_state_equal(a, e)
    else:
        assert actual == expected


def clone_state(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        return type(state)((k, clone_state(v)) for k, v in state.items())
    if isinstance(state, list | tuple):
        return type(state)(clone_state(v) for v in state)
    return state


def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline_s, "condition not reached in time"
        time.sleep(0.01)


def engine_at(path: Path, **kwargs: Any) -> CheckpointEngine:
    kwargs.setdefault("shard_size_bytes", SMALL_SHARD_BYTES)
    return CheckpointEngine(path.as_uri(), **kwargs)


@pytest.mark.parametrize(
    "tensor",
    [
        pytest.param(torch.randn(3, 5), id="float32"),
        pytest.param(torch.randn(7, 3).to(torch.bfloat16), id="bfloat16"),
        pytest.param(torch.arange(11, dtype=torch.int64), id="int64"),
        pytest.param(torch.tensor([True, False, True]), id="bool"),
        pytest.param(torch.randn(4, dtype=torch.complex64), id="complex64"),
        pytest.param(torch.tensor(3.5), id="scalar"),
        pytest.param(torch.empty(0, 4), id="empty"),
        pytest.param(torch.randn(6, 8).t(), id="non-contiguous"),
        pytest.param(torch.randn(10, 10)[::3, 1:], id="strided-slice"),
    ],
)
def test_round_trip_is_bit_exact(tmp_path: Path, tensor: torch.Tensor) -> None:
    state = {"t": tensor, "list": [tensor * 0 + 1, 5], "tuple": (tensor.clone(),)}
    expected = clone_state(state)
    with engine_at(tmp_path) as engine:
        engine.save(state, 1)
        engine.wait()
    restored = engine_at(tmp_path).restore()
    assert restored is not None and restored.step == 1 and restored.source == "storage"
    assert_state_equal(restored.state, expected)


@pytest.mark.parametrize("copy_threads", [1, 3])
def test_large_state_copied_by_several_threads_is_bit_exact(
    tmp_path: Path, copy_threads: int
) -> None:
    gen = torch.Generator().manual_seed(3)
    state = {
        "big": torch.randn(3 * 1024 * 1024, generator=gen),  # 12 MiB: split across chunks
        "strided": torch.randn(2048, 1024, generator=gen).t(),  # 8 MiB, split by rows
        "small": [torch.randn(7, generator=gen), torch.tensor(2.5)],
    }
    expected = clone_state(state)
    with engine_at(tmp_path, copy_threads=copy_threads, shard_size_bytes=8 << 20) as engine:
        handle = engine.save(state, 1)
        assert handle is not None and engine.copy_threads == copy_threads
    restored = engine_at(tmp_path).restore()
    assert restored is not None
    assert_state_equal(restored.state, expected)


def test_tied_tensors_are_stored_once_and_stay_tied(tmp_path: Path) -> None:
    shared = torch.randn(128)
    with engine_at(tmp_path) as engine:
        engine.save({"a": shared, "b": shared}, 1)
    restored = engine_at(tmp_path).restore()
    assert restored is not None
    assert restored.state["a"] is restored.state["b"]
    assert torch.equal(restored.state["a"], shared)
    keys = LocalStorage(tmp_path).list_keys("step-000000000001/rank-00000/")
    total_bytes = sum((tmp_path / k).stat().st_size for k in keys)
    assert total_bytes == 128 * 4


def test_save_returns_a_snapshot_isolated_from_later_training(tmp_path: Path) -> None:
    state = make_state(1)
    expected = clone_state(state)
    gate = threading.Event()
    storage = GatedStorage(LocalStorage(tmp_path), gate)
    engine = engine_at(tmp_path, storage=storage)
    handle = engine.save(state, 1)
    assert handle is not None and not handle.done()
    state["model"]["weight"].add_(1.0)  # training goes on while the upload is held back
    state["optim"]["state"][0]["exp_avg"].zero_()
    gate.set()
    engine.close()
    restored = engine_at(tmp_path).restore()
    assert restored is not None
    assert_state_equal(restored.state, expected)


class GatedStorage:
    """Delegates to a real backend; put_many waits on a gate (holds a save in flight)."""

    def __init__(self, inner: LocalStorage, gate: threading.Event) -> None:
        self.inner = inner
        self.gate = gate
        self.uri = inner.uri
        self.puts: list[str] = []

    def put_many(self, items: Sequence[tuple[str, memoryview]]) -> None:
        assert self.gate.wait(30), "test gate never opened"
        self.inner.put_many(items)

    def put_bytes(self, key: str, data: bytes) -> None:
        self.puts.append(key)
        self.inner.put_bytes(key, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_skip_policy_drops_a_save_while_one_is_in_flight(tmp_path: Path) -> None:
    gate = threading.Event()
    engine = engine_at(
        tmp_path, storage=GatedStorage(LocalStorage(tmp_path), gate), in_flight_policy="skip"
    )
    first = engine.save(make_state(1), 1)
    second = engine.save(make_state(2), 2)
    gate.set()
    engine.wait()
    assert first is not None and second is None
    assert engine.stats()["checkpoint_skipped_saves"] == 1.0
    assert engine.committed_steps() == [1]
    engine.close()


def test_wait_policy_blocks_until_the_previous_save_released_its_buffer(tmp_path: Path) -> None:
    gate = threading.Event()
    storage = GatedStorage(LocalStorage(tmp_path), gate)
    engine = engine_at(tmp_path, storage=storage, in_flight_policy=InFlightPolicy.WAIT)
    engine.save(make_state(1), 1)
    opener = threading.Timer(0.05, gate.set)
    opener.start()
    second = engine.save(make_state(2), 2)  # returns only once step 1's data is durable
    assert second is not None
    assert index_key(1, 0) in storage.puts
    engine.close()
    assert engine.committed_steps() == [2, 1]


def test_two_slots_let_two_saves_be_in_flight(tmp_path: Path) -> None:
    gate = threading.Event()
    engine = engine_at(
        tmp_path,
        storage=GatedStorage(LocalStorage(tmp_path), gate),
        max_in_flight=2,
        in_flight_policy="skip",
    )
    handles = [engine.save(make_state(s), s) for s in (1, 2, 3)]
    gate.set()
    engine.close()
    assert [h is not None for h in handles] == [True, True, False]
    assert engine.committed_steps() == [2, 1]


def test_restore_skips_corrupt_newest_and_loads_older_bit_exact(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with engine_at(tmp_path) as engine:
        for step in (1, 2):
            engine.save(make_state(step), step)
    shard = tmp_path / shard_key(2, 0, 0)
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        restored = engine_at(tmp_path).restore()
    assert restored is not None and restored.step == 1
    assert_state_equal(restored.state, make_state(1))
    assert "skipping checkpoint step 2" in caplog.text


Corruption = Callable[[Path], None]


def _truncate_shard(root: Path) -> None:
    path = root / shard_key(2, 0, 0)
    path.write_bytes(path.read_bytes()[:-7])


def _delete_shard(root: Path) -> None:
    (root / shard_key(2, 0, 1)).unlink()


def _garble_manifest(root: Path) -> None:
    (root / manifest_key(2)).write_bytes(b"{not json")


def _edit_index(root: Path) -> None:
    path = root / index_key(2, 0)
    path.write_bytes(path.read_bytes().replace(b'"step":2', b'"step":3'))


def _delete_index(root: Path) -> None:
    (root / index_key(2, 0)).unlink()


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(_truncate_shard, id="truncated-shard"),
        pytest.param(_delete_shard, id="missing-shard"),
        pytest.param(_garble_manifest, id="garbled-manifest"),
        pytest.param(_edit_index, id="edited-index"),
        pytest.param(_delete_index, id="missing-index"),
    ],
)
def test_every_kind_of_damage_falls_back_to_the_older_step(
    tmp_path: Path, corrupt: Corruption
) -> None:
    with engine_at(tmp_path) as engine:
        for step in (1, 2):
            engine.save(make_state(step), step)
    corrupt(tmp_path)
    restored = engine_at(tmp_path).restore()
    assert restored is not None and restored.step == 1
    assert_state_equal(restored.state, make_state(1))


def test_uncommitted_newer_step_is_invisible(tmp_path: Path) -> None:
    def crash(step: int) -> None:
        if step == 2:
            raise RuntimeError("process died between data and manifest")

    engine = engine_at(tmp_path, before_commit=crash)
    engine.save(make_state(1), 1)
    handle = engine.save(make_state(2), 2)
    assert handle is not None
    with pytest.raises(RuntimeError, match="between data and manifest"):
        handle.result()
    engine.close()
    assert (tmp_path / index_key(2, 0)).exists()
    assert not (tmp_path / manifest_key(2)).exists()
    restored = engine_at(tmp_path).restore()
    assert restored is not None and restored.step == 1
    assert engine.stats()["checkpoint_failed_uploads"] == 1.0


def test_rank0_commits_only_after_every_rank_is_durable(tmp_path: Path) -> None:
    rank1_gate = threading.Event()
    rank0 = engine_at(tmp_path, rank=0, world_size=2, commit_poll_interval_s=0.01)
    rank1 = engine_at(
        tmp_path,
        rank=1,
        world_size=2,
        storage=GatedStorage(LocalStorage(tmp_path), rank1_gate),
    )
    handle0 = rank0.save(make_state(10), 5)
    rank1.save(make_state(11), 5)
    assert handle0 is not None
    # Rank 0's own data becomes durable while rank 1's is held back: no manifest yet.
    wait_for(lambda: (tmp_path / index_key(5, 0)).exists())
    assert not (tmp_path / manifest_key(5)).exists()
    assert not handle0.done()
    rank1_gate.set()
    assert handle0.result(30).committed
    rank1.close()
    rank0.close()
    for rank, seed in ((0, 10), (1, 11)):
        restored = engine_at(tmp_path, rank=rank, world_size=2).restore()
        assert restored is not None and restored.step == 5
        assert_state_equal(restored.state, make_state(seed))


def test_commit_times_out_when_a_rank_never_finishes(tmp_path: Path) -> None:
    rank0 = engine_at(
        tmp_path, rank=0, world_size=2, commit_timeout_s=0.2, commit_poll_interval_s=0.02
    )
    handle = rank0.save(make_state(1), 1)
    assert handle is not None
    with pytest.raises(CommitTimeoutError, match=r"ranks \[1\]"):
        handle.result(30)
    rank0.close()
    assert not (tmp_path / manifest_key(1)).exists()
    assert engine_at(tmp_path, rank=0, world_size=2).restore() is None


def test_retention_keeps_last_k_and_keep_marked(tmp_path: Path) -> None:
    with engine_at(tmp_path, keep_last=2) as engine:
        engine.save(make_state(1), 1, keep=True)
        for step in (2, 3, 4, 5):
            engine.save(make_state(step), step)
    assert engine.committed_steps() == [5, 4, 1]
    assert (tmp_path / keep_key(1)).exists()
    assert not (tmp_path / "step-000000000002").exists()
    assert not (tmp_path / "step-000000000003").exists()


def test_memory_tier_serves_the_newest_committed_step(tmp_path: Path) -> None:
    tier = InProcessMemoryTier()
    with engine_at(tmp_path, memory_tier=tier) as engine:
        engine.save(make_state(1), 1)
        engine.save(make_state(2), 2)
    engine = engine_at(tmp_path, memory_tier=tier)
    restored = engine.restore()
    assert restored is not None and restored.step == 2 and restored.source == "memory"
    assert_state_equal(restored.state, make_state(2))
    assert engine.stats()["checkpoint_restored_from_memory"] == 1.0


def test_memory_tier_with_a_stale_step_is_not_used(tmp_path: Path) -> None:
    tier = InProcessMemoryTier()
    with engine_at(tmp_path, memory_tier=tier) as engine:
        engine.save(make_state(1), 1)
    with engine_at(tmp_path) as engine:  # a newer step committed by another process
        engine._last_step = 1
        engine.save(make_state(2), 2)
    restored = engine_at(tmp_path, memory_tier=tier).restore()
    assert restored is not None and restored.step == 2 and restored.source == "storage"


def test_memory_tier_copy_that_fails_checksums_falls_back_to_storage(tmp_path: Path) -> None:
    tier = InProcessMemoryTier()
    with engine_at(tmp_path, memory_tier=tier) as engine:
        engine.save(make_state(1), 1)
    held = tier.get(0)
    assert held is not None
    held.payload[0] ^= 0xFF
    engine = engine_at(tmp_path, memory_tier=tier)
    restored = engine.restore()
    assert restored is not None and restored.source == "storage"
    assert_state_equal(restored.state, make_state(1))
    assert engine.stats()["checkpoint_restored_from_memory"] == 0.0


def test_restore_with_max_step(tmp_path: Path) -> None:
    with engine_at(tmp_path) as engine:
        for step in (1, 2, 3):
            engine.save(make_state(step), step)
    restored = engine_at(tmp_path).restore(max_step=2)
    assert restored is not None and restored.step == 2


def test_restore_on_empty_storage_is_none(tmp_path: Path) -> None:
    assert engine_at(tmp_path).restore() is None


def test_world_size_change_is_a_clear_error(tmp_path: Path) -> None:
    with engine_at(tmp_path) as engine:
        engine.save(make_state(1), 1)
    with pytest.raises(ValueError, match="saved by 1 ranks, this job has world_size=2"):
        engine_at(tmp_path, rank=0, world_size=2).restore()


def test_steps_must_increase(tmp_path: Path) -> None:
    with engine_at(tmp_path) as engine:
        engine.save(make_state(1), 3)
        with pytest.raises(ValueError, match="step 3 is not after"):
            engine.save(make_state(1), 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"rank": 2, "world_size": 2}, "rank must be in", id="rank-out-of-range"),
        pytest.param({"max_in_flight": 0}, "max_in_flight", id="no-slots"),
        pytest.param({"in_flight_policy": "drop"}, "in_flight_policy", id="unknown-policy"),
        pytest.param({"keep_last": 0}, "keep_last", id="keep-nothing"),
        pytest.param({"copy_threads": 0}, "copy_threads", id="no-copy-thread"),
        pytest.param({"part_size_bytes": 1024}, "part_size_bytes", id="part-too-small"),
    ],
)
def test_bad_engine_arguments(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        engine_at(tmp_path, **kwargs)


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        pytest.param("gs://bucket/x", "scheme 'gs' is not supported", id="unknown-scheme"),
        pytest.param("/plain/path", "must look like", id="no-scheme"),
        pytest.param("file://relative/path", "file:///absolute/path", id="relative-file"),
        pytest.param("s3:///prefix-only", "must name a bucket", id="s3-without-bucket"),
    ],
)
def test_bad_uri(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_storage(uri, options=StorageOptions())


def test_bad_step_and_unpicklable_state(tmp_path: Path) -> None:
    with engine_at(tmp_path) as engine:
        with pytest.raises(ValueError, match="non-negative int"):
            engine.save(make_state(1), -1)
        with pytest.raises(TypeError, match=r"state\['fn'\] is a builtins.function"):
            engine.save({"fn": lambda: 1}, 1)
        assert engine.save(make_state(1), 1) is not None  # the failed snapshot freed its slot
