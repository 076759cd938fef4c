"""One claim and one return in the simulator, as plan items: the replay a real loop's events
are compared with (issue 17).

Owns: `claim_and_return(overrides)`, the simulator's `OurScheme` on the smallest world that
has one training claim and one return (one cluster node with 2 GPUs, a model with two 1-GPU
replicas there, one 2-GPU gang that claims the node, then the replicas coming back one per
migrate-back step), and `plan_codes(events)`, the comparable form of an event log: the
admission plan items (``policy.*``) and the Serve actuator's external capacity requests and
move starts and ends, each as its kind and reason code, in order. The operator's guard
rails (``policy.held``, ``policy.pause``, ``policy.resume``) are not plan items and are left
out. tests/unit/simulate/test_simulate_replay.py compares the replay with the real `Loop` on the unit
fakes, tests/integration/test_policy_loop.py with the loop on a real cluster.

Must not: read a cluster (the caller brings the events).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controlplane.simulate.run import simulate
from controlplane.simulate.scenario import control_config, scenario_from_dict
from controlplane.simulate.trace import JobSpec, Trace

__all__ = ["KINDS", "MODEL", "claim_and_return", "plan_codes"]

MODEL = "sample"
KINDS = ("policy.", "serve.move.start", "serve.move.done", "serve.external_capacity")
GUARD_RAILS = ("policy.held", "policy.pause", "policy.resume")


def _code(kind: str, message: str) -> tuple[str, str]:
    """The event's kind and its reason code (``yield_to_training``, ``fits``...); a move's
    start by what it moves (``2 cluster -> external``), its end by its kind alone (its
    message carries the measured duration)."""
    if kind == "serve.move.done":
        return kind, ""
    reason = message.split(": ", 1)[-1] if kind.startswith("serve.move") else message
    return kind, reason.split(":", 1)[0].strip()


def plan_codes(events: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The plan items of `events` ((kind, message) pairs, oldest first) as (kind, code)."""
    return [
        _code(kind, message)
        for kind, message in events
        if kind.startswith(KINDS) and not kind.startswith(GUARD_RAILS)
    ]


def claim_and_return(
    overrides: Mapping[str, object],
    *,
    replica_start_s: float = 2.0,
    replica_stop_s: float = 1.0,
    provision_s: float = 0.0,
) -> list[tuple[str, str]]:
    """The simulator's plan items for one claim and one return (see the module doc), with
    the control plane's config `overrides` (``pools.external.*``, ``placement.*``)."""
    s = scenario_from_dict(
        {
            "nodes": 1,
            "gpus_per_node": 2,
            "days": 0.01,
            "external": {"provision_s": provision_s},
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
                "replica_start_s": replica_start_s,
                "replica_stop_s": replica_stop_s,
            },
            "config": dict(overrides),
        }
    )
    job = JobSpec("job", 0.0, 2, 1, 5.0, "high")  # queued before the first tick, as there
    steps = int(s.horizon_s / s.serving.demand_step_s) + 2
    trace = Trace((job,), (), (), {MODEL: (1.0,) * steps})
    result = simulate(s, "ours", trace, control_config(s))
    return plan_codes(result.plan_events)
