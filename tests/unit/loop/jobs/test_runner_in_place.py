"""Restarts in place, through the runner: the run's own report becomes an attempt's end and a
restart spent, the job stays RUNNING, and the recovery is timed from the job's progress
(the fake Ray of `test_runner`, a real store, file:// checkpoints; no Ray)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.adapters.ray_jobs import RayJobStatus
from controlplane.config import load_config
from controlplane.loop.act.jobs.runner import JobRunner
from controlplane.loop.observe import build_snapshot
from controlplane.store import JobState, Store, recoveries
from controlplane.store.reliability import fleet_record
from tests.unit.loop.jobs.test_runner import Clock, FakeRay, admit, commit, running, submit
from tests.unit.runner_tick import reconcile

S = JobState


@pytest.fixture()
def world(tmp_path: Path) -> tuple[Store, Any, FakeRay, Clock, JobRunner]:
    cfg = load_config(
        None,
        [f"state_dir={tmp_path}", f"storage.uri=file://{tmp_path}/store", "storage.embedded=false"],
    )
    clock = Clock()
    store = Store(tmp_path / "db.sqlite", clock=clock)
    fake = FakeRay()
    return store, cfg, fake, clock, JobRunner(store, cfg, fake, clock=clock)


def restarted_in_place(fake: Any, job_id: str, index: int, at_s: float, reason: str) -> None:
    """What the signals actor holds after the run reported a restart in place."""
    sig = fake.signals[job_id]
    step = (sig.get("progress") or {}).get("step")
    report = {"index": index, "at_s": at_s, "reason": reason, "step": step}
    sig.setdefault("in_place", []).append(report)
    sig.update(started_ranks=[], workers={}, progress=None, restore=None)


def test_the_launcher_is_told_how_many_restarts_in_place_the_job_has_left(world: Any) -> None:
    store, _cfg, fake, _clock, runner = world
    job_id = submit(store, max_restarts=3)
    store.update_info(job_id, {"restarts": 1})
    admit(runner, job_id)
    envv = fake.submitted[-1][2]["env_vars"]
    assert envv["RCP_RESTARTS_IN_PLACE"] == "2"
    assert envv["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "0.5"  # a dead worker found sooner
    assert envv["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0"  # one actor fewer per start
    assert store.get(job_id).info["first_admitted_s"] == 1000.0
    off = submit(store, restart_in_place=False)
    admit(runner, off)
    assert "RCP_RESTARTS_IN_PLACE" not in fake.submitted[-1][2]["env_vars"]


def test_a_restart_in_place_is_recorded_once_spends_a_restart_and_is_timed(world: Any) -> None:
    store, cfg, fake, clock, runner = world
    job_id = running(store, fake, runner)
    fake.report_progress(job_id, 40, clock.now, stall_s=0.5, wall_s=50.0)
    commit(cfg, job_id, 35)
    clock.now += 31  # past the checkpoint scan interval: step 35 is read
    reconcile(runner)
    failed_s = clock.now + 2
    restarted_in_place(fake, job_id, 1, failed_s, "rank 1: its worker process died")
    clock.now += 3
    reconcile(runner)
    reconcile(runner)  # the same report again: recorded once
    job = store.get(job_id)
    assert job.state is S.RUNNING and job.info["attempt"] == 1  # the same Ray Job goes on
    assert job.info["restarts"] == 1 and job.info["in_place_recorded"] == 1
    (entry,) = job.info["attempts"]
    assert (entry["attempt"], entry["in_place"], entry["kind"], entry["step"]) == (
        1,
        1,
        "crash",
        40,
    )
    assert entry["checkpoint_step"] == 35 and entry["reason"].endswith("worker process died")
    assert job.info["stall_s_total"] == 0.5 and job.info.get("progress") is None
    assert job.info["recovering"]["failed_s"] == failed_s
    assert fleet_record(store, clock.now)["by_kind"]["gang-crash"] == pytest.approx(1.0)
    assert fake.stopped == []  # nothing was stopped: the run restarted itself
    # The new worker group restores step 35 from the memory tier and trains on.
    fake.signals[job_id]["restore"] = {"step": 35, "source": "memory", "restore_s": 0.5}
    fake.report_progress(job_id, 36, failed_s + 4.5)
    reconcile(runner)
    info = store.get(job_id).info
    [r] = recoveries.recoveries(info)
    assert (r.seconds, r.source, r.restored_step, r.in_place) == (4.5, "memory", 35, True)
    assert r.caught_up_s is None
    # The failed run's end records the step the run after it resumed from (storage's scan
    # may not have seen that commit when the failure was recorded).
    assert info["attempts"][-1]["checkpoint_step"] == 35
    fake.report_progress(job_id, 41, failed_s + 9.0)
    reconcile(runner)
    [r] = recoveries.recoveries(store.get(job_id).info)
    assert r.caught_up_s == failed_s + 9.0
    # The run ends well: the attempt's own end follows its restart in place.
    fake.jobs[f"{job_id}-1"] = RayJobStatus.SUCCEEDED
    reconcile(runner)
    job = store.get(job_id)
    assert job.state is S.SUCCEEDED
    assert [(a["kind"], a.get("in_place")) for a in job.info["attempts"]] == [
        ("crash", 1),
        ("succeeded", None),
    ]
    # Its message is about now: it succeeded; the crash's reason stays in the attempts.
    assert job.info["message"] == (
        "succeeded after 1 failed or interrupted attempt end(s); see its attempts"
    )


def test_the_same_failure_twice_in_place_before_any_progress_fails_the_job(world: Any) -> None:
    store, _cfg, fake, clock, runner = world
    job_id = running(store, fake, runner)
    restarted_in_place(fake, job_id, 1, clock.now, "rank 0: KeyError: 'lr'")
    reconcile(runner)
    assert store.get(job_id).info["restarts"] == 1
    restarted_in_place(fake, job_id, 2, clock.now + 5, "rank 0: KeyError: 'lr'")
    clock.now += 6
    reconcile(runner)
    job = store.get(job_id)
    assert job.state is S.FAILED
    assert job.info["message"] == "rank 0: KeyError: 'lr'"
    assert "same failure twice before any progress" in store.history(job_id)[-1].reason
    assert fake.stopped == [f"{job_id}-1"]  # the run would restart again: it is stopped


def test_a_report_from_another_attempt_or_malformed_is_not_recorded(world: Any) -> None:
    store, _cfg, fake, clock, runner = world
    job_id = running(store, fake, runner)
    fake.signals[job_id]["in_place"] = [
        {"index": 0, "at_s": clock.now, "reason": "x"},
        {"index": 1, "at_s": float("nan"), "reason": "x"},
        {"index": 2, "at_s": clock.now, "reason": 7},
        "not a mapping",
    ]
    reconcile(runner)
    job = store.get(job_id)
    assert job.state is S.RUNNING and "restarts" not in job.info
    fake.signals[job_id]["attempt"] = 2
    fake.signals[job_id]["in_place"] = [{"index": 1, "at_s": clock.now, "reason": "x"}]
    reconcile(runner)
    assert "restarts" not in store.get(job_id).info  # the actor forgot the other attempt


def test_a_restart_in_place_that_never_trains_again_re_queues_the_job(world: Any) -> None:
    """Ray Train retries a worker group on a node that is gone for as long as it likes; the
    control plane gives the restart ``jobs.gang_start_timeout_s`` (120 s) to train again."""
    store, _cfg, fake, clock, runner = world
    job_id = running(store, fake, runner)
    fake.report_progress(job_id, 40, clock.now)
    reconcile(runner)
    failed_s = clock.now + 1
    restarted_in_place(fake, job_id, 1, failed_s, "rank 1: its worker process died")
    clock.now += 2
    reconcile(runner)
    clock.now = failed_s + 100
    reconcile(runner)
    assert store.get(job_id).state is S.RUNNING and fake.stopped == []
    clock.now = failed_s + 121
    reconcile(runner)
    job = store.get(job_id)
    assert job.state is S.QUEUED and fake.stopped == [f"{job_id}-1"]
    assert "restart-in-place-stuck" in store.history(job_id)[-1].reason
    assert job.info["restarts"] == 1  # the crash spent one; the re-queue spends none
    assert [(a["kind"], a.get("in_place")) for a in job.info["attempts"]] == [
        ("crash", 1),
        ("lost", None),
    ]
    [open_] = recoveries.recoveries(job.info)  # still the crash's recovery, from its failure
    assert (open_.failed_s, open_.seconds, open_.in_place) == (failed_s, None, False)


# -- a node the gang was placed on is gone -------------------------------------------------------


def test_a_gang_whose_node_is_gone_is_re_queued_at_once_without_a_restart(world: Any) -> None:
    """The observe phase marks a gang's nodes that Ray no longer lists alive
    (`with_lost_nodes`); `policies.attempts` re-queues it, its gang stopped, no restart spent
    (Ray Train would otherwise retry the worker group on the dead node)."""
    from controlplane.loop.observe import with_lost_nodes
    from policies.attempts import decide_all

    store, _cfg, fake, clock, runner = world
    job_id = running(store, fake, runner)  # placed on n1
    records = store.list_jobs(states=[S.RUNNING])
    view = with_lost_nodes(runner.observe(), records, alive={"n1", "n2"})
    assert [g.lost_nodes for g in view.gangs] == [()]
    # A read with no node alive at all says nothing: no gang is re-queued on it.
    assert [g.lost_nodes for g in with_lost_nodes(view, records, alive=set()).gangs] == [()]
    runner.apply(decide_all(view, runner_config(runner)), lambda: None)
    assert store.get(job_id).state is S.RUNNING
    view = with_lost_nodes(runner.observe(), records, alive={"n2"})
    assert [g.lost_nodes for g in view.gangs] == [("n1",)]
    runner.apply(decide_all(view, runner_config(runner)), lambda: None)
    job = store.get(job_id)
    assert job.state is S.QUEUED and fake.stopped == [f"{job_id}-1"]
    assert "node-lost" in store.history(job_id)[-1].reason and "restarts" not in job.info
    # Queued again, it carries when it lost the node: admission weighs borrowing a node from
    # serving against waiting for the replacement (policies.admission.borrow).
    [queued] = build_snapshot(clock(), [], store.list_jobs()).queued
    assert queued.lost_s == job.info["attempts"][-1]["ended_s"] and queued.lost_s is not None


def test_only_a_lost_node_or_health_end_marks_a_queued_job_lost(world: Any) -> None:
    store, _cfg, _fake, _clock, _runner = world
    job_id = submit(store)
    for kind, lost in [("crash", False), ("preempted", False), ("health", True), ("lost", True)]:
        store.update_info(job_id, {"attempts": [{"attempt": 1, "kind": kind, "ended_s": 5.0}]})
        [queued] = build_snapshot(10.0, [], store.list_jobs()).queued
        assert queued.lost_s == (5.0 if lost else None), kind
    store.update_info(job_id, {"attempts": [{"kind": "lost", "ended_s": "soon"}]})
    assert build_snapshot(10.0, [], store.list_jobs()).queued[0].lost_s is None


def runner_config(runner: Any) -> Any:
    from controlplane.policy_config import attempt_config

    return attempt_config(runner.cfg)
