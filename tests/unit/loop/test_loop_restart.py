"""The control loop on fake adapters: a controller restarted in the middle of a move.

Owns the checks that a make-before-break move is a tracked operation kept in the store: a new
`Loop` on the same store says it resumes (``serve.resume``), finishes the move from the step
it was in without raising the external pool twice, and the gang is admitted; and that a move
whose new replicas never start is unwound (the target pool put back) after
``serving.ready_timeout_s``, the source pool untouched. The real cluster version is
tests/integration/test_policy_loop.py (the controller actor killed mid-move).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.loop.act.operations import MovePhase
from controlplane.store import JobState
from policies.snapshot import Pool
from tests.unit.loop_fakes import World, make_world

MODEL = "sample"
TWO_REPLICAS = (
    "serving:\n  models:\n    - name: sample\n      min_replicas: 2\n      max_replicas: 2\n"
    "  ready_timeout_s: 10\n"
)


def world(tmp_path: Path, start_ticks: int = 3) -> World:
    w = make_world(
        tmp_path,
        "serve.deploy_app=true",
        "pools.external.providers=[{name: rent-a, max_nodes: 1, gpus_per_node: 2}]",
        config_text=TWO_REPLICAS,
        start_ticks=start_ticks,
    )
    w.cluster.add("c1", Pool.CLUSTER, gpus=2)
    w.cluster.add("e1", Pool.EXTERNAL, gpus=2)
    w.serve.deploy(MODEL, cluster=2)
    return w


def tick_until_phase(w: World, phase: MovePhase, limit: int = 30) -> None:
    assert w.loop.serve is not None
    for _ in range(limit):
        w.tick()
        ops = w.loop.serve.operations
        if ops and ops[0].phase is phase:
            return
    raise AssertionError(f"no move reached {phase.value}")


@pytest.mark.parametrize("phase", [MovePhase.MAKE, MovePhase.SHIFT, MovePhase.BREAK])
def test_a_restarted_controller_resumes_the_move(tmp_path: Path, phase: MovePhase) -> None:
    w = world(tmp_path)
    job_id = w.jobs.submit("claims-again", workers=2)
    tick_until_phase(w, phase)
    w.loop.stop()
    w = w.restart()  # the old loop's memory is gone; only the store and the world remain
    most_external = 0
    for _ in range(40):
        w.tick()
        most_external = max(most_external, w.serve.targets[(MODEL, Pool.EXTERNAL)])
        if w.store.get(job_id).state is not JobState.QUEUED:
            break
    assert w.store.get(job_id).state in (JobState.ADMITTED, JobState.RUNNING)
    assert most_external <= 2, "the restarted controller scaled the external pool twice"
    (resume,) = w.events("serve.resume")
    assert f"({phase.value})" in resume
    assert len(w.events("serve.move.start")) == 1
    assert w.events("serve.move.done")
    assert w.serve.failed_requests == 0


def test_a_move_whose_replicas_never_start_is_unwound(tmp_path: Path) -> None:
    w = world(tmp_path, start_ticks=1000)
    w.jobs.submit("claims-again", workers=2)
    tick_until_phase(w, MovePhase.MAKE)
    w = w.restart()
    for _ in range(15):
        w.tick()
        if w.events("serve.move.unwound"):
            break
    (unwound,) = w.events("serve.move.unwound")
    assert "external put back to 0" in unwound
    assert w.serve.targets[(MODEL, Pool.CLUSTER)] == 2  # the source was never touched
    assert w.serve.failed_requests == 0
