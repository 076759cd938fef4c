"""The decide phase: every pure policy, in one batch, on one observation.

Owns: `decide(observation, policies, admission_state, serving_state)` -> `Decision` (and
`policies_of(cfg)`, every policy's config built once from the control plane's `Config`):

0. the jobs' lifecycle (`policies.attempts.decide_all`), decided even while the loop is
   paused (it follows what already happened; `guards.hold` keeps nothing of it back);
1. admission (`policies.admission.decide`) with each served model's class this tick
   (`model_classes_now`), the external pool's room (`external_room_gpus`), serving's
   forecast (`forecast_now`) and the GPUs serving holds from last tick (`unplaced_gpus`,
   `unstarted_cluster_gpus`): serving's demand is a guarantee unless a model is
   ``on_shortfall: yield``. The head of the queue may claim serve replicas;
2. health remediation (`policies.health.remediate`) when ``health.act``;
3. demand (`policies.demand.decide_replicas`) per served model, then placement
   (`policies.placement.decide`) with admission's claims handed over in-process, as data;
4. the serving plan (`_with_scales`), last a `ScaleIngress` when the ingress's count for its
   traffic (`policies.ingress.decide_ingress`) differs from Serve's. Placement's route
   weights are replaced by what Serve has deployed, so its `SetRouteWeights` is
   level-triggered: repeated until the deployed table matches;
5. ``wanted`` (`wanted_now`), every tick, a move in flight or not.

Demand's decisions and placement are skipped while a move is in flight (``serving_busy``):
the tracked operation is the single writer of the model's targets and routes until it ends.
Run mid-move, placement sees half-moved replicas and its plan flaps (tried on the unit fakes,
tests/unit/simulate/test_simulate_replay.py: the external request went 1 -> 0 -> 1 GPUs during one
migrate-back step, which on Kubernetes resizes the external group under a live replica).

Must not: read a clock, call Ray or the store, or hold state (it comes in and goes out).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from controlplane.adapters.serve import ServeView
from controlplane.config import Config
from controlplane.loop.types import Decision, Observation, ServingPolicyState
from controlplane.policy_config import (
    admission_config,
    attempt_config,
    demand_config,
    ingress_scaling,
    model_class,
    placement_config,
)
from policies import admission, attempts, health, placement
from policies.admission import AdmissionConfig, AdmissionState
from policies.attempts import AttemptConfig
from policies.demand import DemandConfig, DemandLoad, DemandState, decide_replicas, wanted_replicas
from policies.forecast import (
    DailyProfile,
    ForecastConfig,
    ForecastModel,
    ServingForecast,
    record,
    serving_forecast,
)
from policies.ingress import IngressLoad, IngressScaling, IngressTraffic, decide_ingress
from policies.model_classes import ModelClass
from policies.placement import (
    ModelDemand,
    PlacementConfig,
    PlacementState,
    PoolTargets,
    external_cap_gpus,
)
from policies.plan import (
    Action,
    MoveServeReplicas,
    Plan,
    ScaleIngress,
    ScaleServePool,
    SetRouteWeights,
)
from policies.snapshot import ClusterSnapshot, Pool, ReplicaState

__all__ = ["Policies", "decide", "decide_serving", "model_classes_now", "policies_of", "wanted_now"]


@dataclass(frozen=True)
class Policies:
    """Every policy's config, built once from `controlplane.config.Config`."""

    admission: AdmissionConfig
    placement: PlacementConfig
    demand: Mapping[str, DemandConfig]
    """Per served model."""
    gpus_per_replica: Mapping[str, float]
    act_on_health: bool = True
    ingress: IngressScaling | None = None
    """The ingress's scaling (None: the loop leaves the ingress's replica count alone)."""
    model_classes: Mapping[str, ModelClass] = field(default_factory=dict)
    """Per served model: its priority value and cluster floor (`policies.model_classes`)."""
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    """Serving's daily profile and how far admission looks ahead (`policies.forecast`)."""
    attempts: AttemptConfig = field(default_factory=lambda: attempt_config(Config()))
    """The bounds on starting a gang (`policies.attempts`)."""

    def replica_gpus(self, model: str) -> int:
        """Whole GPUs one replica of `model` holds (at least 1)."""
        return max(1, math.ceil(self.gpus_per_replica.get(model, 1.0)))


def policies_of(cfg: Config) -> Policies:
    """Every policy's config from `cfg` (`controlplane.policy_config`): what the controller
    hands its loop, and the fleet simulator its decide calls."""
    models = cfg.serving.models if cfg.serve.deploy_app else []
    return Policies(
        admission=admission_config(cfg),
        placement=placement_config(cfg),
        demand={m.name: demand_config(m) for m in models},
        gpus_per_replica={m.name: m.num_gpus for m in models},
        act_on_health=cfg.health.act,
        ingress=ingress_scaling(cfg.serving.ingress) if cfg.serve.deploy_app else None,
        model_classes={m.name: model_class(cfg, m) for m in models},
        forecast=cfg.forecast,
        attempts=attempt_config(cfg),
    )


def decide(
    observation: Observation,
    policies: Policies,
    admission_state: AdmissionState,
    serving_state: ServingPolicyState,
    *,
    serving_busy: bool = False,
) -> Decision:
    snapshot = observation.snapshot
    measured = {m.model: m.p99_ms for m in snapshot.serve_load if m.p99_ms is not None}
    classes = model_classes_now(policies, measured)
    room = (
        external_room_gpus(snapshot, policies, serving_state.placement) if policies.demand else None
    )
    ahead = forecast_now(snapshot, policies, serving_state) if policies.demand else None
    plan, new_admission = admission.decide(
        snapshot,
        policies.admission,
        admission_state,
        models=classes,
        external_room_gpus=room,
        serving_need_gpus=serving_state.unplaced_gpus if policies.demand else 0,
        serving_hold_gpus=serving_state.unstarted_gpus if policies.demand else 0,
        forecast=ahead,
    )
    remediation = health.remediate(snapshot, observation.verdicts) if policies.act_on_health else ()
    claims = tuple(a for a in plan if isinstance(a, MoveServeReplicas))
    decision = Decision(
        lifecycle=attempts.decide_all(observation.jobs_view, policies.attempts),
        admission=plan,
        admission_state=new_admission,
        remediation=remediation,
        claims=claims,
        forecast=ahead,
    )
    if not observation.serve.deployed or not policies.demand:
        return decision
    decision = replace(decision, wanted=wanted_now(observation.loads, policies))
    if serving_busy:
        return decision
    serving, targets, new_serving = decide_serving(
        snapshot,
        observation.serve,
        observation.loads,
        policies,
        serving_state,
        claims,
        observation.ingress,
        classes,
    )
    return replace(decision, serving=serving, serving_state=new_serving, targets=targets)


def external_room_gpus(
    snapshot: ClusterSnapshot, policies: Policies, state: PlacementState | None = None
) -> int:
    """GPUs the external pool can still host: what it can have now
    (`policies.placement.external_cap_gpus`) less what the external replicas there hold or are
    starting on. A training claim moves cluster replicas only as far as this holds them."""
    held = sum(
        r.gpus
        for r in snapshot.serve_replicas
        if r.pool is Pool.EXTERNAL and r.state is not ReplicaState.STOPPING
    )
    cap = external_cap_gpus(snapshot, policies.placement, state or PlacementState())
    return max(0, cap - held)


def forecast_now(
    snapshot: ClusterSnapshot, policies: Policies, state: ServingPolicyState
) -> ServingForecast | None:
    """Serving's forecast for admission (`policies.forecast.serving_forecast`): each served
    model's daily profile, GPUs per replica and cluster floor, against what the providers can
    host now. A model that is ``on_shortfall: yield`` or pinned to ``external`` holds nothing
    back."""
    if not policies.forecast.enabled:
        return None
    models = []
    for name in sorted(policies.demand):
        gpus = policies.replica_gpus(name)
        cls = policies.model_classes.get(name, ModelClass())
        models.append(
            ForecastModel(
                name,
                state.forecast.get(name, DailyProfile()),
                gpus,
                floor_gpus=cls.min_cluster_replicas * gpus,
                guaranteed=not cls.yields_on_shortfall
                and snapshot.pinned.get(name) is not Pool.EXTERNAL,
            )
        )
    cap = external_cap_gpus(snapshot, policies.placement, state.placement)
    return serving_forecast(models, snapshot.now_s, cap, policies.forecast)


def unstarted_cluster_gpus(
    snapshot: ClusterSnapshot, demands: tuple[ModelDemand, ...], targets: tuple[PoolTargets, ...]
) -> int:
    """GPUs of the cluster replicas placement targets that hold no node yet: the next tick's
    admission keeps that many free GPUs from gangs (never preempting for them), so a gang is
    not admitted onto the free GPU a replica was just placed on (seen on a real cluster: a
    preempted gang, re-queued, took back the GPU serving had reclaimed from it before the new
    replica reached it, and was preempted again)."""
    gpus = {d.model: d.gpus_per_replica for d in demands}
    on_node: dict[str, int] = {}
    for r in snapshot.serve_replicas:
        if r.pool is Pool.CLUSTER and r.node_id and r.state is not ReplicaState.STOPPING:
            on_node[r.model] = on_node.get(r.model, 0) + 1
    return sum(max(0, t.cluster - on_node.get(t.model, 0)) * gpus.get(t.model, 1) for t in targets)


def unplaced_gpus(
    demands: tuple[ModelDemand, ...], targets: tuple[PoolTargets, ...], pinned: Mapping[str, Pool]
) -> int:
    """GPUs of the replicas demand wants that placement could place nowhere this tick, over
    the models whose demand is a guarantee (not ``on_shortfall: yield``, not pinned to
    ``external``): the next tick's admission holds them for serving before any gang, and
    reclaims them from training if it must."""
    placed = {t.model: t.cluster + t.external for t in targets}
    return sum(
        max(0, max(d.num_replicas, d.min_replicas) - placed.get(d.model, 0)) * d.gpus_per_replica
        for d in demands
        if not d.yields_on_shortfall and pinned.get(d.model) is not Pool.EXTERNAL
    )


def model_classes_now(policies: Policies, p99_ms: Mapping[str, float]) -> dict[str, ModelClass]:
    """Each served model's class this tick: its configured priority and floor, at risk when
    its measured p99 (`p99_ms`, by model) is over its SLO (``target_p99_ms``)."""
    out: dict[str, ModelClass] = {}
    for name, cls in policies.model_classes.items():
        target = policies.demand[name].target_p99_ms if name in policies.demand else None
        p99 = p99_ms.get(name)
        at_risk = target is not None and p99 is not None and p99 > target
        out[name] = replace(cls, slo_at_risk=at_risk)
    return out


def wanted_now(loads: Mapping[str, float], policies: Policies) -> tuple[tuple[str, int], ...]:
    """Per served model, the replicas the load on the board asks for now (``Decision.wanted``;
    no delays: what a move must leave RUNNING). Ongoing requests only, the p99 left out on
    purpose: mid-move both pools run the model's replicas, and a latency ask relative to that
    doubled count would keep the move's source replicas (a training claim would never get its
    GPUs); the demand policy acts on the p99 once the move ends, through its delays."""
    return tuple(
        (name, wanted_replicas(float(loads.get(name, 0.0)), config))
        for name, config in sorted(policies.demand.items())
    )


def decide_serving(
    snapshot: ClusterSnapshot,
    serve: ServeView,
    loads: Mapping[str, float],
    policies: Policies,
    state: ServingPolicyState,
    claims: tuple[MoveServeReplicas, ...] = (),
    ingress: IngressTraffic | None = None,
    classes: Mapping[str, ModelClass] | None = None,
) -> tuple[Plan, tuple[PoolTargets, ...], ServingPolicyState]:
    """Demand then placement for every model, then the ingress's count; the serving plan,
    targets and new state."""
    demands: list[ModelDemand] = []
    new_demand = dict(state.demand)
    new_forecast = dict(state.forecast)
    for name, config in sorted(policies.demand.items()):
        # What demand decided last tick, else the model's total target in Serve (what the
        # last scale asked for), never the replicas it already shows: a new pool's replicas
        # appear a few ticks after its app is deployed, and counting only those would undo
        # the scale-up the next tick. Not Serve's targets when demand decided: placement sets
        # them below demand while it can place no more (a provider out of stock), and demand
        # reading that as a fall would wait out its upscale delay again, letting the GPUs
        # held for the missing replica go to a gang meanwhile.
        current = state.replicas.get(
            name, sum(serve.target(name, p) for p in (Pool.CLUSTER, Pool.EXTERNAL))
        )
        wanted, new_demand[name] = decide_replicas(
            DemandLoad(
                ongoing_requests=float(loads.get(name, 0.0)),
                current_replicas=current,
                now_s=snapshot.now_s,
                p99_ms=snapshot.load_of(name).p99_ms,
            ),
            config,
            state.demand.get(name, DemandState()),
        )
        if policies.forecast.enabled:
            new_forecast[name] = record(
                state.forecast.get(name, DailyProfile()),
                snapshot.now_s,
                wanted.num_replicas,
                policies.forecast,
            )
        gpus = policies.replica_gpus(name)
        cls = (policies.model_classes if classes is None else classes).get(name, ModelClass())
        demands.append(
            ModelDemand(
                name,
                wanted.num_replicas,
                config.min_replicas,
                gpus,
                priority=cls.priority,
                min_cluster_replicas=cls.min_cluster_replicas,
                slo_at_risk=cls.slo_at_risk,
                yields_on_shortfall=cls.yields_on_shortfall,
            )
        )
    deployed = {d.model: serve.weights(d.model) for d in demands}
    placement_state = replace(
        state.placement, route_weights={m: w for m, w in deployed.items() if w}
    )
    (targets, actions), new_placement = placement.decide(
        snapshot, tuple(demands), policies.placement, placement_state, claims=claims
    )
    plan = _with_scales(actions, targets, serve)
    new_ingress = state.ingress
    if policies.ingress is not None and serve.ingress_target > 0:
        load = IngressLoad(ingress or IngressTraffic(), serve.ingress_target, snapshot.now_s)
        decided, new_ingress = decide_ingress(load, policies.ingress, state.ingress)
        if decided.num_replicas != serve.ingress_target:
            plan = (*plan, ScaleIngress(decided.num_replicas, decided.message))
    new_state = ServingPolicyState(
        new_demand,
        new_placement,
        new_ingress,
        unplaced_gpus(tuple(demands), targets, snapshot.pinned),
        new_forecast,
        unstarted_gpus=unstarted_cluster_gpus(snapshot, tuple(demands), targets),
        replicas={d.model: d.num_replicas for d in demands},
    )
    return plan, targets, new_state


def _with_scales(
    actions: tuple[Action, ...], targets: tuple[PoolTargets, ...], serve: ServeView
) -> Plan:
    """Placement's actions with a `ScaleServePool` for each pool whose target differs from
    Serve's once the moves are counted in; moves and scales before route weights."""
    expected = {key: view.target for key, view in serve.pools.items()}
    for a in actions:
        if isinstance(a, MoveServeReplicas):
            have = expected.get((a.model, a.from_pool), 0)
            n = min(a.num_replicas, have)
            expected[(a.model, a.from_pool)] = have - n
            expected[(a.model, a.to_pool)] = expected.get((a.model, a.to_pool), 0) + n
    ups: list[Action] = []
    downs: list[Action] = []
    for t in targets:
        for pool, want in ((Pool.CLUSTER, t.cluster), (Pool.EXTERNAL, t.external)):
            have = expected.get((t.model, pool), 0)
            if want != have:
                why = f"{have} -> {want}" + (f" ({t.note})" if t.note else "")
                (ups if want > have else downs).append(ScaleServePool(t.model, pool, want, why))
    # Scale-ups first (nothing waits on them), then scale-downs (each re-routes first).
    routes = tuple(a for a in actions if isinstance(a, SetRouteWeights))
    others = tuple(a for a in actions if not isinstance(a, SetRouteWeights))
    return others + tuple(ups) + tuple(downs) + routes
