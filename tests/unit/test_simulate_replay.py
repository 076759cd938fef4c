"""The simulator's act stand-in against the real loop: one claim and one return.

The real `Loop` on the unit fakes (tests/unit/loop_fakes.py, the scenario of
test_loop_claim.py and of the integration module test_policy_loop.py: one 2-GPU cluster node
with two 1-GPU replicas, a 2-GPU gang that claims it, then replicas coming back one per
interval) and the simulator's `OurScheme` on the same world must write the same sequence of
events: the admission plan items (``policy.*``) and the Serve actuator's (external capacity,
move start and done, scales), each with the same reason code.
"""

from __future__ import annotations

from pathlib import Path

from controlplane.simulate.run import simulate
from controlplane.simulate.scenario import control_config, scenario_from_dict
from controlplane.simulate.trace import JobSpec, Trace
from controlplane.store import JobState
from policies.snapshot import Pool
from tests.unit.loop_fakes import make_world

MODEL = "sample"
OVERRIDES = {
    "pools.external.max_nodes": 1,
    "pools.external.gpus_per_node": 2,
    "placement.migrate_back_idle_s": 2,
    "placement.migrate_back_step": 1,
    "placement.migrate_back_interval_s": 4,
}
KINDS = ("policy.", "serve.move.start", "serve.move.done", "serve.external_capacity")


def _code(kind: str, message: str) -> tuple[str, str]:
    """The event's kind and its reason code (``yield_to_training``, ``fits``...); a move's
    end by its kind alone (its message carries the measured duration)."""
    if kind == "serve.move.done":
        return kind, ""
    reason = message.split(": ", 1)[-1] if kind.startswith("serve.move") else message
    return kind, reason.split(":", 1)[0].strip()


def real_loop(tmp_path: Path) -> list[tuple[str, str]]:
    text = "serving:\n  models:\n    - name: sample\n      min_replicas: 2\n      max_replicas: 2\n"
    overrides = [f"{k}={v}" for k, v in OVERRIDES.items()]
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
    events = w.store.events(limit=10_000)
    return [_code(e.kind, e.message) for e in events if e.kind.startswith(KINDS)]


def simulated() -> list[tuple[str, str]]:
    s = scenario_from_dict(
        {
            "nodes": 1,
            "gpus_per_node": 2,
            "days": 0.01,
            "external": {"provision_s": 0},
            "failures": {"hot_faults_per_node_year": 0, "fabric_faults_per_node_year": 0},
            "training": {"gang_gpus": {"2": 1.0}},
            "serving": {
                "models": [
                    {
                        "name": MODEL,
                        "gpus_per_replica": 1,
                        "replica_rps": 10,
                        "peak_rps": 1,
                        "min_replicas": 2,
                        "max_replicas": 2,
                    }
                ],
                "noise": 0,
                "replica_start_s": 2,
                "replica_stop_s": 1,
            },
            "config": OVERRIDES,
        }
    )
    job = JobSpec("job", 1.0, 2, 1, 5.0, "high")
    steps = int(s.horizon_s / s.serving.demand_step_s) + 2
    trace = Trace((job,), (), (), {MODEL: (1.0,) * steps})
    result = simulate(s, "ours", trace, control_config(s))
    return [_code(k, m) for k, m in result.plan_events if k.startswith(KINDS)]


def test_the_simulator_writes_the_events_the_real_loop_wrote(tmp_path: Path) -> None:
    real = real_loop(tmp_path)
    sim = simulated()
    # The scenario has one claim and one return; both sides must show them.
    assert ("policy.AdmitJob", "fits") in real
    assert sum(1 for k, _ in real if k == "serve.move.start") == 3  # out once, back twice
    assert sim == real
