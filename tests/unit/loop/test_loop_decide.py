"""The decide phase's serving half and the Serve view it reads.

Owns the checks of: Serve's status -> the `ServeView` rows (state, pool, node) and targets;
demand + placement per model with admission's claim handed over as data (the yield move
carries the claim's node ids and job); the plan's `ScaleServePool` items once moves are
counted in; the external capacity bundles; the serving state surviving a round trip through
the store; and the scale-down guard (every other pool runs its target).
"""

from __future__ import annotations

from typing import Any

from controlplane.adapters.serve import view_from_status
from controlplane.loop.decide import Policies, decide, decide_serving
from controlplane.loop.guards import hold
from controlplane.loop.types import Observation, ServingPolicyState
from controlplane.policy_config import demand_config
from policies.admission import AdmissionConfig, AdmissionState
from policies.attempts import GangStatus, GangView, JobsView, MarkRunning
from policies.placement import PlacementConfig
from policies.plan import MoveServeReplicas, RequestExternalCapacity, ScaleServePool
from policies.snapshot import Pool, ReplicaState
from serve.config import ModelConfig
from tests.unit.builders import node, snapshot


def status(cluster: list[str], external: list[str]) -> dict[str, Any]:
    def pool(states: list[str], node_id: str) -> dict[str, Any]:
        return {
            "target": len(states),
            "running": states.count("RUNNING"),
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


def policies(**model: Any) -> Policies:
    m = ModelConfig(name="m", **model)
    return Policies(
        admission=AdmissionConfig(),
        placement=PlacementConfig(external_max_gpus=8, migrate_back_idle_s=0),
        demand={"m": demand_config(m)},
        gpus_per_replica={"m": m.num_gpus},
    )


def claim(n: int, *node_ids: str) -> MoveServeReplicas:
    return MoveServeReplicas(
        "m", Pool.CLUSTER, Pool.EXTERNAL, n, node_ids, "serve_yields", for_job_id="j1"
    )


def test_status_rows_keep_state_pool_and_node() -> None:
    view = view_from_status(
        status(["RUNNING", "STARTING"], ["STOPPING", "PENDING_ALLOCATION"]), {"m": 1.0}
    )
    assert [(r.pool, r.state, r.node_id) for r in view.replicas] == [
        (Pool.CLUSTER, ReplicaState.RUNNING, "c1"),
        (Pool.CLUSTER, ReplicaState.STARTING, "c1"),
        (Pool.EXTERNAL, ReplicaState.STOPPING, "e1"),
    ]
    assert (view.target("m", Pool.CLUSTER), view.target("m", Pool.EXTERNAL)) == (2, 2)
    assert not view_from_status({"deployed": False}, {}).deployed


def test_a_claim_moves_replicas_out_with_its_node_ids_and_asks_for_external_gpus() -> None:
    p = policies(min_replicas=2, max_replicas=4, num_gpus=1.0)
    view = view_from_status(status(["RUNNING"] * 4, []), {"m": 1.0})
    snap = snapshot([node("c1", gpus_total=4), node("c2", gpus_total=4)], replicas=view.replicas)
    claims = (claim(4, "c1", "c1", "c1", "c1"),)
    plan, targets, state = decide_serving(snap, view, {"m": 8.0}, p, ServingPolicyState(), claims)
    moves = [a for a in plan if isinstance(a, MoveServeReplicas)]
    assert [(m.from_pool, m.to_pool, m.num_replicas, m.node_ids, m.for_job_id) for m in moves] == [
        (Pool.CLUSTER, Pool.EXTERNAL, 4, ("c1", "c1", "c1", "c1"), "j1")
    ]
    assert [a.num_gpus for a in plan if isinstance(a, RequestExternalCapacity)] == [4]
    assert not [a for a in plan if isinstance(a, ScaleServePool)]  # the move reaches the targets
    assert state.placement.requested_external_gpus == 4
    assert (targets[0].cluster, targets[0].external) == (0, 4)


def test_demand_drives_the_total_as_a_scale_item() -> None:
    p = policies(min_replicas=1, max_replicas=4, target_ongoing_requests=2.0, upscale_delay_s=0.0)
    view = view_from_status(status(["RUNNING"], []), {"m": 1.0})
    snap = snapshot([node("c1", gpus_total=4)], replicas=view.replicas)
    plan, targets, _ = decide_serving(snap, view, {"m": 6.0}, p, ServingPolicyState())
    assert (targets[0].cluster, targets[0].external) == (3, 0)
    assert [(a.pool, a.num_replicas) for a in plan if isinstance(a, ScaleServePool)] == [
        (Pool.CLUSTER, 3)
    ]


def test_state_round_trips_through_plain_data() -> None:
    p = policies(min_replicas=2, max_replicas=4, upscale_delay_s=30.0)
    view = view_from_status(status(["RUNNING"] * 2, []), {"m": 1.0})
    snap = snapshot([node("c1", gpus_total=4)], replicas=view.replicas)
    _, _, state = decide_serving(snap, view, {"m": 8.0}, p, ServingPolicyState(), (claim(2),))
    again = ServingPolicyState.from_dict(state.to_dict())
    assert again == state
    assert ServingPolicyState.from_dict(None) == ServingPolicyState()


def test_scale_down_waits_until_the_other_pool_runs_its_target() -> None:
    starting = status(["RUNNING", "RUNNING"], ["STARTING", "RUNNING"])
    view = view_from_status(starting, {"m": 1.0})
    assert not view.others_ready("m", Pool.CLUSTER)  # external runs 1 of 2
    assert view.others_ready("m", Pool.EXTERNAL)  # cluster runs 2 of 2


def test_the_jobs_lifecycle_is_decided_in_the_decide_phase_and_kept_while_paused() -> None:
    """A gang whose workers all started is marked RUNNING by the tick that observed it: the
    decide phase returns `MarkRunning` (policies.attempts), and a pause holds none of it."""
    started = GangView(
        job_id="j",
        running=False,
        status=GangStatus.RUNNING,
        now_s=0.0,
        admitted_s=0.0,
        num_workers=2,
        started_ranks=2,
    )
    observed = Observation(
        snapshot=snapshot([node("c1", gpus_total=4)]), jobs_view=JobsView((started,))
    )
    bare = Policies(
        admission=AdmissionConfig(),
        placement=PlacementConfig(external_max_gpus=8),
        demand={},
        gpus_per_replica={},
    )
    decided = decide(observed, bare, AdmissionState(), ServingPolicyState())
    assert decided.lifecycle == (MarkRunning("j", "gang-running: all 2 workers started"),)
    assert hold(decided, AdmissionState()).lifecycle == decided.lifecycle
