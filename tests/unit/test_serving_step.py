"""The serving step's pure parts: status -> snapshot rows, demand + placement per model, the
external capacity bundles, and its state surviving a round trip through the store."""

from __future__ import annotations

from typing import Any

from controlplane.serving import (
    ServingPolicyState,
    ServingStep,
    replicas_from_status,
    targets_from_status,
)
from policies.placement import PlacementConfig
from policies.plan import MoveServeReplicas, RequestExternalCapacity
from policies.snapshot import Pool, ReplicaState
from serve.config import ModelConfig, ServingConfig
from tests.unit.builders import node, snapshot


def status(cluster: list[str], external: list[str]) -> dict[str, Any]:
    def pool(states: list[str], node_id: str) -> dict[str, Any]:
        return {
            "target": len(states),
            "replicas": [
                {"replica_id": f"{node_id}-{i}", "state": s, "node_id": node_id}
                for i, s in enumerate(states)
            ],
        }

    return {
        "deployed": True,
        "models": {
            "m": {"pools": {"cluster": pool(cluster, "c1"), "external": pool(external, "e1")}}
        },
    }


def step(**model: Any) -> ServingStep:
    serving = ServingConfig(models=[ModelConfig(name="m", **model)])
    return ServingStep(
        serving,
        PlacementConfig(external_max_gpus=8, migrate_back_idle_s=0),
    )


def test_status_rows_keep_state_pool_and_node() -> None:
    rows = replicas_from_status(
        status(["RUNNING", "STARTING"], ["STOPPING", "PENDING_ALLOCATION"]), {"m": 1.0}
    )
    assert [(r.pool, r.state, r.node_id) for r in rows] == [
        (Pool.CLUSTER, ReplicaState.RUNNING, "c1"),
        (Pool.CLUSTER, ReplicaState.STARTING, "c1"),
        (Pool.EXTERNAL, ReplicaState.STOPPING, "e1"),
    ]
    assert targets_from_status(status(["RUNNING"], [])) == {
        ("m", "cluster"): 1,
        ("m", "external"): 0,
    }


def test_training_claim_moves_replicas_out_and_asks_for_external_gpus() -> None:
    s = step(min_replicas=2, max_replicas=4, num_gpus=1.0)
    rows = replicas_from_status(status(["RUNNING"] * 4, []), {"m": 1.0})
    snap = snapshot([node("c1", gpus_total=4), node("c2", gpus_total=4)], replicas=rows)
    decision, state = s.decide(snap, {"m": 8.0}, ServingPolicyState(), training_claim_gpus=8)
    moves = [a for a in decision.actions if isinstance(a, MoveServeReplicas)]
    assert [(m.from_pool, m.to_pool, m.num_replicas) for m in moves] == [
        (Pool.CLUSTER, Pool.EXTERNAL, 4)
    ]
    assert [a.num_gpus for a in decision.actions if isinstance(a, RequestExternalCapacity)] == [4]
    bundles = s.external_bundles(decision.targets)
    assert bundles == [{"GPU": 1.0, "CPU": 1.0, "pool_external": 1.0}] * 4
    assert state.placement.requested_external_gpus == 4


def test_demand_drives_the_total() -> None:
    s = step(min_replicas=1, max_replicas=4, target_ongoing_requests=2.0, upscale_delay_s=0.0)
    rows = replicas_from_status(status(["RUNNING"], []), {"m": 1.0})
    snap = snapshot([node("c1", gpus_total=4)], replicas=rows)
    decision, _ = s.decide(snap, {"m": 6.0}, ServingPolicyState(), training_claim_gpus=0)
    assert decision.demands[0].num_replicas == 3
    assert (decision.targets[0].cluster, decision.targets[0].external) == (3, 0)


def test_state_round_trips_through_plain_data() -> None:
    s = step(min_replicas=2, max_replicas=4, upscale_delay_s=30.0)
    rows = replicas_from_status(status(["RUNNING"] * 2, []), {"m": 1.0})
    snap = snapshot([node("c1", gpus_total=4)], replicas=rows)
    _, state = s.decide(snap, {"m": 8.0}, ServingPolicyState(), training_claim_gpus=4)
    again = ServingPolicyState.from_dict(state.to_dict())
    assert again == state
    assert ServingPolicyState.from_dict(None) == ServingPolicyState()


def test_scale_down_waits_until_the_other_pool_runs_its_target() -> None:
    from controlplane.serving import others_ready

    starting = status(["RUNNING", "RUNNING"], ["STARTING", "RUNNING"])
    starting["models"]["m"]["pools"]["external"]["running"] = 1
    starting["models"]["m"]["pools"]["cluster"]["running"] = 2
    assert not others_ready(starting, "m", Pool.CLUSTER)  # external runs 1 of 2
    assert others_ready(starting, "m", Pool.EXTERNAL)  # cluster runs 2 of 2
