"""The serving half of the policy loop: observe Serve, decide per model, act make-before-break.

Owns: turning Serve's status into snapshot rows, running the pure demand and placement
policies (`policies.demand`, `policies.placement`) for every declared model, and applying
their plan through the serving plane's primitives (`serve.operations`) and the Ray
autoscaler's `request_resources` for the external pool. Policy state (demand timers,
migration pacing) is plain data the caller persists (`to_dict` / `from_dict`); the desired
replica targets and route weights live in Serve itself (see `serve.spec`), so a restarted
actor resumes from what is deployed and never double-scales.

Must not: decide anything itself (that is `policies/`), or stop a replica before its
replacement runs (`serve.operations.move` is make-before-break).

Actions are applied in this order each tick: external capacity first (so rented nodes start
launching), then moves out of or back into the cluster pool, then plain scale changes, then
route weights from readiness.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from controlplane.policy_config import demand_config
from policies.demand import DemandLoad, DemandState, Direction, decide_replicas
from policies.placement import ModelDemand, PlacementConfig, PlacementState, PoolTargets
from policies.placement import decide as decide_placement
from policies.plan import Action, MoveServeReplicas, RequestExternalCapacity
from policies.snapshot import ClusterSnapshot, Pool, ReplicaState, ServeReplica

log = logging.getLogger(__name__)

LoadSource = Callable[[], Mapping[str, float]]

_STATES = {
    "RUNNING": ReplicaState.RUNNING,
    "STARTING": ReplicaState.STARTING,
    "UPDATING": ReplicaState.STARTING,
    "RECOVERING": ReplicaState.STARTING,
    "PENDING_MIGRATION": ReplicaState.STARTING,
    "STOPPING": ReplicaState.STOPPING,
}


@dataclass
class ServingPolicyState:
    """Everything the serving step remembers between ticks (stored by the caller)."""

    demand: dict[str, DemandState] = field(default_factory=dict)
    placement: PlacementState = field(default_factory=PlacementState)

    def to_dict(self) -> dict[str, Any]:
        p = self.placement
        return {
            "demand": {
                m: {
                    "direction": s.direction.value,
                    "since_s": s.since_s,
                    "highest_wanted": s.highest_wanted,
                }
                for m, s in self.demand.items()
            },
            "placement": {
                "room_since_s": p.room_since_s,
                "last_step_back_s": p.last_step_back_s,
                "requested_external_gpus": p.requested_external_gpus,
                "route_weights": {
                    m: [[pool.value, w] for pool, w in ws] for m, ws in p.route_weights.items()
                },
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ServingPolicyState:
        if not data:
            return cls()
        demand = {
            m: DemandState(Direction(s["direction"]), float(s["since_s"]), int(s["highest_wanted"]))
            for m, s in (data.get("demand") or {}).items()
        }
        p = data.get("placement") or {}
        placement = PlacementState(
            room_since_s=p.get("room_since_s"),
            last_step_back_s=p.get("last_step_back_s"),
            requested_external_gpus=int(p.get("requested_external_gpus", 0)),
            route_weights={
                m: tuple((Pool(pool), float(w)) for pool, w in ws)
                for m, ws in (p.get("route_weights") or {}).items()
            },
        )
        return cls(demand=demand, placement=placement)


def replicas_from_status(
    status: Mapping[str, Any], gpus_per_replica: Mapping[str, float]
) -> tuple[ServeReplica, ...]:
    """Snapshot rows from `serve.status.serve_status()` output."""
    rows: list[ServeReplica] = []
    for model, info in (status.get("models") or {}).items():
        for pool_name, pool_info in (info.get("pools") or {}).items():
            for r in pool_info.get("replicas") or []:
                state = _STATES.get(str(r.get("state")))
                if state is None:
                    continue
                rows.append(
                    ServeReplica(
                        replica_id=str(r.get("replica_id")),
                        model=model,
                        pool=Pool(pool_name),
                        node_id=str(r.get("node_id") or ""),
                        gpus=math.ceil(gpus_per_replica.get(model, 1.0)),
                        state=state,
                    )
                )
    return tuple(rows)


def targets_from_status(status: Mapping[str, Any]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for model, info in (status.get("models") or {}).items():
        for pool_name, pool_info in (info.get("pools") or {}).items():
            out[(model, pool_name)] = int(pool_info.get("target") or 0)
    return out


@dataclass(frozen=True)
class ServingDecision:
    targets: tuple[PoolTargets, ...]
    actions: tuple[Action, ...]
    demands: tuple[ModelDemand, ...]


class ServingStep:
    """One model-serving decision per tick, applied through `serve.operations`."""

    def __init__(
        self,
        serving: Any,
        placement: PlacementConfig,
        load_source: LoadSource | None = None,
    ) -> None:
        self.serving = serving
        self.placement = placement
        self.load_source = load_source or (lambda: {})
        self.models = {m.name: m for m in serving.models}

    # -- observe ----------------------------------------------------------------------------
    def observe(self) -> tuple[dict[str, Any], tuple[ServeReplica, ...]]:
        from serve.status import serve_status

        status = serve_status()
        gpus = {name: m.num_gpus for name, m in self.models.items()}
        return status, replicas_from_status(status, gpus)

    # -- decide (pure) ----------------------------------------------------------------------
    def decide(
        self,
        snapshot: ClusterSnapshot,
        loads: Mapping[str, float],
        state: ServingPolicyState,
        training_claim_gpus: int,
    ) -> tuple[ServingDecision, ServingPolicyState]:
        demands: list[ModelDemand] = []
        new_demand = dict(state.demand)
        for name, m in sorted(self.models.items()):
            current = sum(
                1
                for r in snapshot.serve_replicas
                if r.model == name and r.state in (ReplicaState.RUNNING, ReplicaState.STARTING)
            )
            config = demand_config(m)
            decision, new_demand[name] = decide_replicas(
                DemandLoad(
                    ongoing_requests=float(loads.get(name, 0.0)),
                    current_replicas=current,
                    now_s=snapshot.now_s,
                ),
                config,
                state.demand.get(name, DemandState()),
            )
            demands.append(
                ModelDemand(
                    name, decision.num_replicas, m.min_replicas, max(1, math.ceil(m.num_gpus))
                )
            )
        (targets, actions), placement = decide_placement(
            snapshot, tuple(demands), self.placement, state.placement, training_claim_gpus
        )
        return ServingDecision(targets, actions, tuple(demands)), ServingPolicyState(
            new_demand, placement
        )

    def _others_ready(self, model: str, pool: Pool) -> bool:
        from serve.status import serve_status

        return others_ready(serve_status(), model, pool)

    # -- act --------------------------------------------------------------------------------
    def external_bundles(self, targets: tuple[PoolTargets, ...]) -> list[dict[str, float]]:
        """One resource bundle per external replica wanted, for `request_resources`."""
        bundles: list[dict[str, float]] = []
        for t in targets:
            m = self.models[t.model]
            bundle = {"GPU": float(m.num_gpus), "CPU": float(m.num_cpus), "pool_external": 1.0}
            bundles.extend(dict(bundle) for _ in range(t.external))
        return bundles

    def act(
        self,
        decision: ServingDecision,
        current_targets: Mapping[tuple[str, str], int],
        record: Callable[[str, str], None],
    ) -> None:
        """Apply `decision`; `record(kind, message)` receives one event per step taken."""
        from ray.autoscaler.sdk import request_resources

        from serve import operations

        for a in decision.actions:
            if isinstance(a, RequestExternalCapacity):
                request_resources(bundles=self.external_bundles(decision.targets) or [])
                record("serve.external_capacity", a.reason)
        targets = dict(current_targets)
        for a in decision.actions:
            if isinstance(a, MoveServeReplicas) and a.num_replicas > 0:
                record(
                    "serve.move.start",
                    f"{a.model}: {a.num_replicas} {a.from_pool.value} -> {a.to_pool.value}: {a.reason}",
                )
                result = operations.move(
                    a.model, a.from_pool.value, a.to_pool.value, a.num_replicas, reason=a.reason
                )
                targets[(a.model, a.from_pool.value)] = (
                    targets.get((a.model, a.from_pool.value), 0) - result.num_replicas
                )
                targets[(a.model, a.to_pool.value)] = (
                    targets.get((a.model, a.to_pool.value), 0) + result.num_replicas
                )
                record(
                    "serve.move.done",
                    f"{a.model}: moved {result.num_replicas} in {result.duration_s:.1f}s",
                )
        # Scale-ups first (they wait for RUNNING), then scale-downs, each only once every
        # other pool of the model runs all of its target: nothing is stopped before what
        # replaces it serves. A scale-down that must wait is retried next tick.
        changes = [
            (t, pool, want, targets.get((t.model, pool.value), 0))
            for t in decision.targets
            for pool, want in ((Pool.CLUSTER, t.cluster), (Pool.EXTERNAL, t.external))
            if want != targets.get((t.model, pool.value), 0)
        ]
        changes.sort(key=lambda c: c[2] < c[3])
        for t, pool, want, have in changes:
            if want < have and not self._others_ready(t.model, pool):
                record(
                    "serve.scale.wait",
                    f"{t.model}/{pool.value}: {have} -> {want} waits for the other pool",
                )
                continue
            record(
                "serve.scale",
                f"{t.model}/{pool.value}: {have} -> {want}" + (f" ({t.note})" if t.note else ""),
            )
            operations.scale_pool(t.model, pool.value, want)
        for t in decision.targets:
            operations.set_route_weights_from_readiness(t.model)


def others_ready(status: Mapping[str, Any], model: str, pool: Pool) -> bool:
    """Whether every pool of `model` other than `pool` runs all of its target."""
    pools = ((status.get("models") or {}).get(model) or {}).get("pools") or {}
    return all(
        int(p.get("running", 0)) >= int(p.get("target", 0))
        for name, p in pools.items()
        if name != pool.value
    )


def decision_to_json(decision: ServingDecision) -> dict[str, Any]:
    return {
        "targets": [asdict(t) for t in decision.targets],
        "actions": [
            {
                "kind": type(a).__name__,
                **{k: (v.value if hasattr(v, "value") else v) for k, v in asdict(a).items()},
            }
            for a in decision.actions
        ],
    }
