"""``jobs.gang_start_timeout_s`` bounds only a gang's start: a gang that is RUNNING is never
taken for one that did not start, however long it runs past the timeout (the runner on a fake
Ray and a fake clock; test_job_durability runs a real torch.distributed gang without a clock).
"""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.adapters.ray_jobs import RayJobStatus
from controlplane.store import JobState
from tests.unit.loop.jobs.test_runner import admit, env, submit
from tests.unit.runner_tick import reconcile

__all__ = ["env"]  # the fixture, shared with test_runner


@pytest.mark.parametrize("past_timeout_s", [1, 600, 86400], ids=["1s", "10min", "1day"])
def test_a_running_gang_past_the_start_timeout_is_left_running(
    env: Any, past_timeout_s: float
) -> None:
    store, cfg, fake, clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    fake.start_workers(job_id, 1, 2)
    reconcile(runner)
    assert store.get(job_id).state is JobState.RUNNING
    clock.now += cfg.jobs.gang_start_timeout_s + past_timeout_s
    reconcile(runner)
    assert store.get(job_id).state is JobState.RUNNING
    assert fake.stopped == []
    fake.jobs[f"{job_id}-1"] = RayJobStatus.SUCCEEDED
    reconcile(runner)
    assert store.get(job_id).state is JobState.SUCCEEDED
    assert store.get(job_id).info["submission_id"] == f"{job_id}-1"  # one attempt


def test_a_gang_that_never_started_is_stopped_at_the_timeout(env: Any) -> None:
    """The other side of the same rule: one worker of two started, then the timeout."""
    store, cfg, fake, clock, runner = env
    job_id = submit(store)
    admit(runner, job_id)
    fake.start_workers(job_id, 1, 1)
    clock.now += cfg.jobs.gang_start_timeout_s + 1
    reconcile(runner)
    assert f"{job_id}-1" in fake.stopped
    assert store.get(job_id).state is JobState.QUEUED
