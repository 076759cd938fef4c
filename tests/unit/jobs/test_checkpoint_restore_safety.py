"""What a restore trusts: the skeleton (a state's non-tensor structure) is loaded by a
restricted unpickler. Planted pickles are refused before anything they name runs; real
training states round-trip; a state restore would refuse is refused at the first save.
No Ray."""

from __future__ import annotations

import builtins
import collections
import copy
import logging
import os
import pickle
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from jobs.checkpoint import CheckpointEngine, UnsafeCheckpointError
from jobs.checkpoint.capturing import HostBuffer, rebuild_state, take_snapshot
from jobs.checkpoint.layout import (
    CorruptCheckpointError,
    Manifest,
    RankIndex,
    checksum,
    index_key,
    manifest_key,
)
from jobs.checkpoint.snapshot import TensorSlot, check_skeleton, flatten_state, load_skeleton
from tests.unit.jobs.test_checkpoint_engine import assert_state_equal


class Planted:
    """Pickles as a call of `fn(*args)`: what an attacker with bucket access would write."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn = fn
        self.args = args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.fn, self.args


PLANTS = [
    pytest.param(lambda m: Planted(os.system, f"touch {m}"), "posix.system", id="os.system"),
    pytest.param(lambda m: Planted(builtins.eval, f"open({m!r}, 'w')"), "eval", id="eval"),
    pytest.param(lambda m: Planted(subprocess.call, ["touch", m]), "subprocess", id="subprocess"),
    pytest.param(
        lambda m: {"ok": [1, {"deep": Planted(builtins.exec, f"open({m!r}, 'w')")}]},
        "builtins.exec",
        id="nested-exec",
    ),
    pytest.param(
        lambda m: Planted(getattr, Planted(builtins.__import__, "os"), "system"),
        "builtins.getattr",
        id="getattr-import",
    ),
    pytest.param(lambda m: Planted(torch.load, m), "torch.serialization.load", id="torch.load"),
    pytest.param(
        lambda m: collections.defaultdict(torch.device), "factory", id="defaultdict-odd-factory"
    ),
]


@pytest.mark.parametrize(("make", "names"), PLANTS)
def test_planted_skeletons_are_refused_and_never_run(
    tmp_path: Path, make: Callable[[str], Any], names: str
) -> None:
    marker = tmp_path / "pwned"
    data = pickle.dumps(make(str(marker)), protocol=pickle.HIGHEST_PROTOCOL)
    with pytest.raises(UnsafeCheckpointError, match=names):
        load_skeleton(data)
    with pytest.raises(UnsafeCheckpointError, match=names):
        rebuild_state(data, (), torch.empty(0, dtype=torch.uint8))
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL], ids=lambda p: f"proto{p}")
def test_refusal_names_the_global_at_any_protocol(protocol: int) -> None:
    data = pickle.dumps(Planted(os.system, "true"), protocol=protocol)
    with pytest.raises(UnsafeCheckpointError, match=r"refers to posix\.system, which restore"):
        load_skeleton(data)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\x80\x05garbage", id="garbage"),
        pytest.param(pickle.dumps([1, 2])[:-3], id="truncated"),
        pytest.param(pickle.dumps(Planted(complex, "not a number")), id="bad-args-to-allowed"),
    ],
)
def test_bytes_that_do_not_unpickle_are_corrupt(data: bytes) -> None:
    with pytest.raises(CorruptCheckpointError, match="does not unpickle"):
        load_skeleton(data)


@pytest.mark.parametrize(
    "slot",
    [pytest.param(TensorSlot(5), id="out-of-range"), pytest.param(TensorSlot("0"), id="str")],
)
def test_a_slot_that_names_no_tensor_is_corrupt(slot: TensorSlot) -> None:
    data = pickle.dumps({"w": slot})
    with pytest.raises(CorruptCheckpointError, match="tensor slot"):
        rebuild_state(data, (), torch.empty(0, dtype=torch.uint8))


def trained_states() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    adam = torch.optim.Adam(model.parameters(), lr=0.01, amsgrad=True)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    step_lr = torch.optim.lr_scheduler.StepLR(adam, step_size=2, gamma=0.5)
    one_cycle = torch.optim.lr_scheduler.OneCycleLR(sgd, max_lr=1.0, total_steps=10)
    lam = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(model.parameters()), lambda e: 0.9**e)
    for _ in range(3):
        loss = model(torch.randn(5, 4)).square().mean()
        adam.zero_grad()
        sgd.zero_grad()
        loss.backward()
        adam.step()
        sgd.step()
        step_lr.step()
        one_cycle.step()
    return {
        "model": model.state_dict(),
        "adam": adam.state_dict(),
        "sgd": sgd.state_dict(),
        "step_lr": step_lr.state_dict(),
        "one_cycle": one_cycle.state_dict(),
        "lambda_lr": lam.state_dict(),
        "rng": torch.get_rng_state(),
    }


@pytest.mark.parametrize(
    "state",
    [
        pytest.param(trained_states(), id="model-adam-sgd-schedulers-rng"),
        pytest.param(
            collections.OrderedDict(b=torch.ones(2), a=collections.OrderedDict(x=1)),
            id="ordered-dict",
        ),
        pytest.param(
            {
                "counts": collections.defaultdict(int, {"a": 3}),
                "lists": collections.defaultdict(list, {1: [torch.zeros(2)]}),
            },
            id="defaultdict-builtin-factory",
        ),
        pytest.param(
            {
                "dtype": torch.bfloat16,
                "device": torch.device("cuda", 1),
                "size": torch.Size([2, 3]),
                "misc": (None, True, 1.5, 2 + 3j, b"raw", bytearray(b"ba"), "s", slice(1, 9, 2)),
                "sets": ({1, 2}, frozenset({"a"})),
                "nan": float("nan"),
            },
            id="scalars-and-torch-values",
        ),
    ],
)
def test_training_states_round_trip(state: Any) -> None:
    expected = copy.deepcopy(state)
    snapshot = take_snapshot(state, HostBuffer(pin_memory=False))
    rebuilt = rebuild_state(snapshot.skeleton, snapshot.tensors, snapshot.payload)
    assert_state_equal_loose(rebuilt, expected)


def assert_state_equal_loose(actual: Any, expected: Any) -> None:
    """`assert_state_equal`, plus defaultdict factories and NaN equal to itself."""
    if isinstance(expected, collections.defaultdict):
        assert actual.default_factory is expected.default_factory
    if isinstance(expected, float) and expected != expected:
        assert actual != actual
        return
    if isinstance(expected, dict):
        assert type(actual) is type(expected) and actual.keys() == expected.keys()
        for key in expected:
            assert_state_equal_loose(actual[key], expected[key])
        return
    if type(expected) in (list, tuple):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_state_equal_loose(a, e)
        return
    assert_state_equal(actual, expected)


def test_real_states_load_into_fresh_modules() -> None:
    state = trained_states()
    snapshot = take_snapshot(state, HostBuffer(pin_memory=False))
    rebuilt = rebuild_state(snapshot.skeleton, snapshot.tensors, snapshot.payload)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model.load_state_dict(rebuilt["model"])
    adam = torch.optim.Adam(model.parameters(), lr=0.01, amsgrad=True)
    adam.load_state_dict(rebuilt["adam"])
    assert adam.state_dict()["param_groups"] == state["adam"]["param_groups"]
    torch.set_rng_state(rebuilt["rng"])


@pytest.mark.parametrize(
    ("state", "message"),
    [
        pytest.param(
            {"optim": {"state": {0: {"beta": np.float64(0.9)}}}},
            r"state\['optim'\]\['state'\]\[0\]\['beta'\] is a numpy.float64.*torch.from_numpy",
            id="numpy-scalar",
        ),
        pytest.param(
            {"a": [1, np.zeros(3)]}, r"state\['a'\]\[1\] is a numpy.ndarray", id="ndarray"
        ),
        pytest.param(
            {"sparse": torch.eye(3).to_sparse()},
            r"state\['sparse'\] is a torch.Tensor.*dense copy",
            id="sparse-tensor",
        ),
        pytest.param(
            {"f": collections.defaultdict(lambda: 0)},
            r"state\['f'\] is a defaultdict with factory",
            id="defaultdict-lambda",
        ),
        pytest.param(
            {"nt": collections.namedtuple("Point", "x y")(1, 2)},
            r"state\['nt'\] is a .*Point",
            id="namedtuple",
        ),
        pytest.param({(1, Planted(print)): 1}, r"state \(key \(1, .*\)\)\[1\]", id="in-a-key"),
        pytest.param({"s": {1, Planted(print)}}, r"state\['s'\] \(element", id="in-a-set"),
    ],
)
def test_save_refuses_what_restore_would_refuse(state: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        take_snapshot(state, HostBuffer(pin_memory=False))


def test_check_agrees_with_the_unpickler_on_accepted_states() -> None:
    skeleton, _tensors = flatten_state(trained_states())
    check_skeleton(skeleton)
    assert load_skeleton(pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)) == skeleton


def plant(root: Path, step: int, skeleton: bytes) -> None:
    """Rewrite rank 0's index of `step` with `skeleton`, and the manifest's checksum of it:
    everything a writer of the bucket can do."""
    path = root / index_key(step, 0)
    index = RankIndex.from_json_bytes(path.read_bytes())
    data = RankIndex(**{**index.__dict__, "skeleton": skeleton}).to_json_bytes()
    path.write_bytes(data)
    manifest_path = root / manifest_key(step)
    manifest = Manifest.from_json_bytes(manifest_path.read_bytes())
    record = manifest.ranks[0]
    ranks = (type(record)(**{**record.__dict__, "index_checksum": checksum(data)}),)
    manifest_path.write_bytes(Manifest(**{**manifest.__dict__, "ranks": ranks}).to_json_bytes())


def test_restore_skips_a_planted_step_and_loads_the_older_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, marker = tmp_path / "store", tmp_path / "pwned"
    with CheckpointEngine(store.as_uri()) as engine:
        engine.save({"w": torch.arange(4.0)}, 1)
        engine.save({"w": torch.arange(4.0) * 2}, 2)
    plant(store, 2, pickle.dumps({"w": Planted(os.system, f"touch {marker}")}))
    engine = CheckpointEngine(store.as_uri())
    with caplog.at_level(logging.WARNING):
        restored = engine.restore()
    assert restored is not None and restored.step == 1
    assert torch.equal(restored.state["w"], torch.arange(4.0))
    assert not marker.exists()
    assert "skipping checkpoint step 2" in caplog.text
    assert "checkpoint step 2 rank 0: the saved state refers to posix.system" in caplog.text
