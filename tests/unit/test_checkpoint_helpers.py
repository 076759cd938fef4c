"""Ray Train checkpointing helpers outside Ray: save cadence, interval policy, preemption.

Rank, world size and run name are passed in, so no Ray Train context (and no Ray) is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jobs.checkpoint.layout import keep_key
from jobs.checkpointing_helpers import (
    PREEMPT_KEY,
    TrainCheckpointing,
    request_preemption_checkpoint,
)
from policies.checkpointing import IntervalConfig
from tests.unit.test_checkpoint_engine import assert_state_equal, make_state


def helper(path: Path, **kwargs: Any) -> TrainCheckpointing:
    kwargs.setdefault("memory_tier", "process")
    return TrainCheckpointing(
        path.as_uri(), rank=0, world_size=1, run_name="unit", preempt_poll_interval_s=0.0, **kwargs
    )


@pytest.mark.parametrize(
    ("every_n_steps", "due_steps"),
    [
        pytest.param(1, [0, 1, 2, 3, 4, 5, 6, 7], id="every-step"),
        pytest.param(3, [2, 5], id="every-third"),
        pytest.param(10, [], id="not-within-run"),
    ],
)
def test_every_n_steps(tmp_path: Path, every_n_steps: int, due_steps: list[int]) -> None:
    ckpt = helper(tmp_path, every_n_steps=every_n_steps)
    assert [s for s in range(8) if ckpt.should_save(s)] == due_steps
    ckpt.finish()


def test_preemption_request_saves_commits_keeps_and_stops(tmp_path: Path) -> None:
    ckpt = helper(tmp_path, every_n_steps=1000)
    assert not ckpt.should_save(0)
    request_preemption_checkpoint(tmp_path.as_uri(), reason="queue needs the GPUs")
    assert (tmp_path / PREEMPT_KEY).read_text() == "queue needs the GPUs"
    assert ckpt.should_save(1)
    ckpt.save(make_state(1), 1)
    assert ckpt.preempted
    assert (tmp_path / keep_key(1)).exists()  # committed before save() returned, and kept
    assert not (tmp_path / PREEMPT_KEY).exists()
    ckpt.finish()
    restored = helper(tmp_path).restore()
    assert restored is not None and restored.step == 1
    assert_state_equal(restored.state, make_state(1))


def test_interval_follows_the_policy_after_each_save(tmp_path: Path) -> None:
    bounds = IntervalConfig(min_interval_s=30.0, max_interval_s=90.0)
    ckpt = helper(tmp_path, mtbf_s=10.0 * 3600, interval_config=bounds)
    assert ckpt.interval_s == 30.0  # before any measurement: the lower bound
    assert not ckpt.should_save(0)  # not yet 30 s since the helper started
    ckpt.save(make_state(1), 1)
    # A millisecond-scale stall against a 10 h MTBF puts the optimum below 30 s.
    assert ckpt.interval_s == 30.0
    assert ckpt.stats()["checkpoint_interval_s"] == 30.0
    ckpt.finish()


def test_restore_then_resume_saving(tmp_path: Path) -> None:
    first = helper(tmp_path, every_n_steps=1)
    first.save(make_state(4), 4)
    first.finish()
    second = helper(tmp_path, every_n_steps=1)
    restored = second.restore()
    assert restored is not None and restored.step == 4
    with pytest.raises(ValueError, match="not after"):
        second.save(make_state(4), 4)
    second.save(make_state(5), 5)
    second.finish()


def test_restore_with_nothing_saved_allows_any_step(tmp_path: Path) -> None:
    ckpt = helper(tmp_path, every_n_steps=1)
    assert ckpt.restore() is None
    ckpt.save(make_state(0), 0)
    ckpt.finish()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"every_n_steps": 0}, "every_n_steps", id="zero-steps"),
        pytest.param({"memory_tier": "disk"}, "memory_tier", id="unknown-tier"),
    ],
)
def test_bad_arguments(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        helper(tmp_path, **kwargs)
