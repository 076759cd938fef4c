"""The operator's guard rails in the loop, on fake adapters: pause, pins and hand cordons.

Paused, the loop makes no new admission, claim, move or health removal (it records what it
held as ``policy.held`` events); a move already in flight still finishes make-before-break;
after resume the claim proceeds. Pins and cordons reach the policies through the snapshot,
and all three survive a controller restart (they live in the store's kv).
"""

from __future__ import annotations

from pathlib import Path

from controlplane.loop.guards import GuardStore
from controlplane.store import JobState
from policies.snapshot import Pool
from tests.unit.loop.test_loop_claim import MODEL, world
from tests.unit.loop_fakes import World


def guards(w: World) -> GuardStore:
    return w.loop.guard_store


def paused_gauge(w: World) -> float:
    return w.metrics.gauges[("rcp_policy_paused", ())]


def test_a_pause_holds_the_claim_and_resume_lets_it_proceed(tmp_path: Path) -> None:
    w = world(tmp_path)
    guards(w).pause("oncall", "incident 42")
    job_id = w.jobs.submit("claims-the-cluster", workers=2)
    w.tick(8)

    assert w.store.get(job_id).state is JobState.QUEUED  # the gang waits
    assert w.serve.nodes_of(MODEL, Pool.CLUSTER) == ["c1", "c1"]  # the replicas stay
    assert w.serve.nodes_of(MODEL, Pool.EXTERNAL) == []
    assert w.serve.writes == []  # nothing was written to Serve
    assert w.serve.failed_requests == 0
    held = w.events("policy.held")
    assert held and all("paused by oncall (incident 42)" in m for m in held)
    assert any(m.startswith("MoveServeReplicas held") for m in held)
    assert w.events("policy.MoveServeReplicas") == []
    assert paused_gauge(w) == 1.0
    assert w.metrics.gauges[("rcp_policy_held_actions", ())] >= 1

    assert guards(w).resume() is not None
    for _ in range(40):
        w.tick()
        if w.store.get(job_id).state is not JobState.QUEUED:
            break
    assert w.store.get(job_id).state in (JobState.ADMITTED, JobState.RUNNING)
    assert w.serve.nodes_of(MODEL, Pool.EXTERNAL) == ["e1", "e1"]
    assert w.serve.failed_requests == 0
    assert paused_gauge(w) == 0.0
    assert w.loop.stats.failures == {}


def test_a_move_in_flight_finishes_while_paused(tmp_path: Path) -> None:
    w = world(tmp_path)
    job_id = w.jobs.submit("claims-the-cluster", workers=2)
    for _ in range(10):
        w.tick()
        if w.loop.serve is not None and w.loop.serve.operations:
            break
    assert w.loop.serve is not None and w.loop.serve.operations
    guards(w).pause("oncall", "freeze")
    w.tick(20)

    assert not w.loop.serve.operations  # the move ended
    assert len(w.events("serve.move.done")) == 1
    assert w.serve.nodes_of(MODEL, Pool.EXTERNAL) == ["e1", "e1"]
    assert w.serve.failed_requests == 0
    # ...but the admission it made room for waits for the resume.
    assert w.store.get(job_id).state is JobState.QUEUED
    assert any(m.startswith("AdmitJob held") for m in w.events("policy.held"))


def test_the_pause_pins_and_cordons_survive_a_restart(tmp_path: Path) -> None:
    w = world(tmp_path)
    g = guards(w)
    g.pause("oncall", "freeze")
    g.pin(MODEL, Pool.CLUSTER, "oncall")
    g.cordon("e1", "oncall", "bad fan")
    again = w.restart()
    loaded = again.loop.guard_store.load()
    assert loaded.pause is not None and (loaded.pause.by, loaded.pause.reason) == (
        "oncall",
        "freeze",
    )
    assert loaded.pinned() == {MODEL: Pool.CLUSTER}
    assert set(loaded.cordons) == {"e1"}
    again.tick()
    assert again.loop.guards.paused


def test_a_pinned_model_is_not_claimed_and_the_gang_says_why(tmp_path: Path) -> None:
    w = world(tmp_path)
    guards(w).pin(MODEL, Pool.CLUSTER, "oncall")
    job_id = w.jobs.submit("claims-the-cluster", workers=2)
    w.tick(8)

    assert w.store.get(job_id).state is JobState.QUEUED
    assert w.serve.nodes_of(MODEL, Pool.CLUSTER) == ["c1", "c1"]
    message = w.store.get(job_id).info.get("message")
    assert message is not None and message.startswith("pinned-serving:") and MODEL in message
    (event,) = w.events("policy.WaitJob")
    assert MODEL in event

    guards(w).unpin(MODEL)
    for _ in range(40):
        w.tick()
        if w.store.get(job_id).state is not JobState.QUEUED:
            break
    assert w.store.get(job_id).state in (JobState.ADMITTED, JobState.RUNNING)
    assert w.serve.failed_requests == 0


def test_a_hand_cordon_moves_replicas_off_and_keeps_gangs_out(tmp_path: Path) -> None:
    w = world(tmp_path)
    guards(w).cordon("c1", "oncall", "flaky NIC")
    job_id = w.jobs.submit("small", workers=1)
    w.tick(20)

    assert w.store.get(job_id).state is JobState.QUEUED  # no capacity on a cordoned node
    assert w.serve.nodes_of(MODEL, Pool.CLUSTER) == []  # serving left it, make-before-break
    assert w.serve.nodes_of(MODEL, Pool.EXTERNAL) == ["e1", "e1"]
    assert w.serve.failed_requests == 0
    assert w.metrics.gauges[("rcp_nodes_cordoned_by_hand", ())] == 1.0

    guards(w).uncordon("c1")
    for _ in range(10):
        w.tick()
        if w.store.get(job_id).state is not JobState.QUEUED:
            break
    assert w.store.get(job_id).state in (JobState.ADMITTED, JobState.RUNNING)
