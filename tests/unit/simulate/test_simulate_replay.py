"""The simulator's act stand-in against the real loop: one claim and one return.

The real `Loop` on the unit fakes (tests/unit/loop_fakes.py, the scenario of
test_loop_claim.py and of the integration module test_policy_loop.py: one 2-GPU cluster node
with two 1-GPU replicas, a 2-GPU gang that claims it, then replicas coming back one per
interval) and the simulator's `OurScheme` on the same world must write the same sequence of
events: the admission plan items (``policy.*``) and the Serve actuator's (external capacity,
move start and done), each with the same reason code (`controlplane.simulate.replay`).
"""

from __future__ import annotations

import json
from pathlib import Path

from controlplane.simulate.replay import MODEL, claim_and_return, plan_codes
from controlplane.store import JobState
from policies.snapshot import Pool
from tests.unit.loop_fakes import make_world

OVERRIDES: dict[str, object] = {
    "pools.external.providers": [{"name": "rent-a", "max_nodes": 1, "gpus_per_node": 2}],
    "placement.migrate_back_idle_s": 2,
    "placement.migrate_back_step": 1,
    "placement.migrate_back_interval_s": 4,
}


def real_loop(tmp_path: Path) -> list[tuple[str, str]]:
    text = "serving:\n  models:\n    - name: sample\n      min_replicas: 2\n      max_replicas: 2\n"
    overrides = [f"{k}={json.dumps(v)}" for k, v in OVERRIDES.items()]
    w = make_world(tmp_path, "serve.deploy_app=true", *overrides, config_text=text)
    w.cluster.add("c1", Pool.CLUSTER, gpus=2)
    w.cluster.add("e1", Pool.EXTERNAL, gpus=2)
    w.serve.deploy(MODEL, cluster=2)
    job_id = w.jobs.submit("claims-the-cluster", workers=2)
    for _ in range(40):
        w.tick()
        if w.store.get(job_id).state is not JobState.QUEUED:
            break
    w.tick(3)
    w.cluster.gangs.pop(job_id)
    w.store.transition(job_id, JobState.SUCCEEDED, "done")
    for _ in range(40):
        w.tick()
        if (
            not w.serve.targets[(MODEL, Pool.EXTERNAL)]
            and w.serve.running(MODEL, Pool.CLUSTER) == 2
        ):
            break
    w.tick(3)
    return plan_codes((e.kind, e.message) for e in w.store.events(limit=10_000))


def simulated() -> list[tuple[str, str]]:
    return claim_and_return(OVERRIDES)


def test_the_simulator_writes_the_events_the_real_loop_wrote(tmp_path: Path) -> None:
    real = real_loop(tmp_path)
    sim = simulated()
    # The scenario has one claim and one return; both sides must show them.
    assert ("policy.AdmitJob", "fits") in real
    assert sum(1 for k, _ in real if k == "serve.move.start") == 3  # out once, back twice
    assert sim == real


def test_plan_codes_leave_out_the_guard_rails_and_other_kinds() -> None:
    events = [
        ("policy.pause", "paused by admin: integration"),
        ("policy.held", "MoveServeReplicas held, the policy actor is paused: ..."),
        ("serve.move.start", "sample: 2 cluster -> external: yield_to_training: 2 replica(s)"),
        ("job.state", "job j: QUEUED -> ADMITTED"),
        ("policy.AdmitJob", "fits: all 2 workers x 1 GPUs fit now"),
        ("serve.move.done", "sample: moved 2 in 6.0s"),
    ]
    assert plan_codes(events) == [
        ("serve.move.start", "2 cluster -> external"),
        ("policy.AdmitJob", "fits"),
        ("serve.move.done", ""),
    ]
