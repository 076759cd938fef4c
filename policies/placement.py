"""Replica placement across pools and the pacing of migration back.

Owns: the pure decision `decide(snapshot, demands, config, state) -> (plan, state)` that
splits each model's total replica count (from `policies.demand`) between the ``cluster`` and
``external`` pools, and says which replicas move, how many GPUs to ask of the external pool's
autoscaler, and how traffic is weighted. It reads no clock (``snapshot.now_s``) and does no
I/O; the actuators carry the plan out make-before-break.

Rules, in order:

1. **Serving budget on the cluster pool** = GPUs of healthy ``cluster`` nodes minus GPUs held
   by running training gangs; while the admission policy claims ``training_claim_gpus`` for
   an admissible gang (GPUs serving must hand back), it is instead what serving's replicas
   hold there now minus the claim. Serving-only nodes (health found their fabric bad, not
   their GPUs) are serving's: admission never claims their replicas, which always count.
2. **Keep**: first each model's floor, ``min_cluster_replicas`` of the replicas it runs there
   (whatever a claim asks: admission never claims them; only capacity health takes out
   can); then models in keep order, the reverse of `policies.model_classes.yield_key`
   (highest priority first; within a priority, a model whose SLO is at risk first; then by
   name), keep as many of their cluster replicas as the rest of the budget holds. So the
   lowest-priority model yields first, and only as many replicas as the claim needs (a
   partial yield across models). A model a claim names (admission's `MoveServeReplicas`,
   chosen in the same order, by node) yields at least what the claim takes of it.
3. **Yield to training**: replicas over the budget move to ``external`` (one
   `MoveServeReplicas` per model, make-before-break in the actuator) as far as the external
   pool's capacity allows. The budget also shrinks when health takes a cluster node out; a
   move of a model with replicas on such a node says so (``leave_unhealthy_node``) and names
   those nodes (as a training claim's move names the nodes admission chose) unless
   training claims GPUs too (then it is ``yield_to_training``). If it cannot hold them, the
   model keeps them on the cluster pool: its demand is a guarantee (issue 28), so a claim
   that needed them is not freed and its gang waits (admission claims only what the external
   pool can host, `policies.admission`); the plan's note says ``external_full``. A model that
   is ``on_shortfall: yield`` (`ModelDemand.yields_on_shortfall`, for batch models that can
   wait) keeps only enough to stay at ``min_replicas``.
4. **Grow**: new replicas (total wanted above what runs) go to the cluster pool when it has
   room once every model kept its replicas there (rule 2 runs for all models first, so one
   model's growth never pushes another's running replicas out) and no queued training
   waits; otherwise to ``external``, and what the external pool cannot host then goes to the
   cluster pool's room all the same (a yielding model's waits for room). Growth nobody can
   host is not started; admission holds the cluster GPUs it needs and reclaims them from
   the lowest-priority training (`controlplane.loop.decide.unplaced_gpus`), so it
   starts once they are free. Training that waits only
   counts while a node it may use has a free GPU: when the cluster pool's free GPUs are all
   on serving-only nodes (fabric faults, ``NodeView.serving_only``), new replicas can land
   only there, and go there before the external pool is rented.
5. **Come back gradually**: external replicas return to the cluster pool only after it has had
   room for at least one replica, with no queued training (as in rule 4: none that a free
   GPU could serve; so replicas come back onto serving-only nodes while a gang waits), for
   ``migrate_back_idle_s``
   without a break; then at most ``migrate_back_step`` replicas per
   ``migrate_back_interval_s``, in keep order (highest priority back first), each only
   where one node has all its GPUs free once the replicas not on a node yet (Serve's
   pending ones, this tick's growth) have theirs: room in total is not enough. A job arriving resets the timer (hysteresis: a job finishing
   and another arriving does not make replicas flap).
6. **External capacity** asked of the autoscaler = GPUs of the external replicas wanted,
   rented from the providers cheapest first (`policies.providers`: each provider's share
   is ``RequestExternalCapacity.by_provider``); emitted only when it changes. Asking for 0
   lets the autoscaler remove idle nodes. A provider whose live GPUs stay below what it was
   asked for its deadline (a stock-out, a quota, a refusal) is *out* for its back-off
   (`PlacementState.providers`): it counts only the GPUs of its live nodes, so its share
   goes to the next provider, what none can host to the cluster pool (rule 4, and
   admission holds or reclaims the GPUs for it); then it is asked again. An external
   replica still starting keeps its place only while the providers have room for it once
   the running ones are counted: one that waits for a node an out provider will not
   deliver is placed again like growth. With more than
   one provider, a provider holding more than it is allocated has its least used node
   drained (`DrainNode`) once the cheaper providers' live nodes have free GPUs for its
   replicas: Serve starts them there before it stops them (make-before-break). One node at
   a time (`PlacementState.draining_node`), at most one per ``migrate_back_interval_s``.
7. **Pins** (an operator's, `ClusterSnapshot.pinned`): a model pinned to ``cluster`` keeps
   every cluster replica whatever the budget (it takes its budget first), never yields or
   grows to ``external`` (growth the cluster pool cannot host is not started; the note says
   so); a model pinned to ``external`` grows only there and never comes back (rule 5).
8. **Route weights** follow readiness: each pool's share of the model's RUNNING replicas,
   capped at the pool's new target; a pool with none gets 0. Emitted when they differ from
   ``state.route_weights`` (the caller passes what is deployed, so the action repeats until
   it shows).

Worked example: one model, 1 GPU per replica, 6 replicas wanted (min 2), all 6 on the cluster
pool of 8 GPUs; external pool holds 4 GPUs; a queued gang needs 6 GPUs, 2 are free, so
admission claims 4 from serving (``training_claim_gpus=4``). Budget = 6 held - 4 = 2, so the
model keeps 2 cluster replicas
and 4 must yield; external has room for 4 -> ``MoveServeReplicas(cluster -> external, 4)``
and ``RequestExternalCapacity(4)``. If external held only 2 GPUs, admission would not have
claimed 4 (it claims what the room hosts); were such a claim made, 2 would move and the
other 2 stay on the cluster pool (note ``external_full``): the model runs all 6 it wants.
Only an ``on_shortfall: yield`` model would fall to 4 (2 cluster + 2 external, at least
min_replicas 2), and with no external room at all to min_replicas: 2 on the cluster.
Later the gang finishes: the budget is 8 again, room for 4; after ``migrate_back_idle_s``
(say 60 s) with no queued job, 1 replica per ``migrate_back_interval_s`` (say 30 s) comes
back: at t=60, 90, 120, 150 s; the external request falls 4 -> 3 -> 2 -> 1 -> 0.

Two models: ``ranker`` (priority high = 100, ``min_cluster_replicas`` 2) and ``batch`` (low
= 0), 4 replicas each on the cluster pool of 8 GPUs, and a claim of 5 GPUs. Floors: ranker
keeps 2; the budget beyond them is 8 - 5 - 2 = 1: ranker (first in keep order) keeps 1 more,
batch none. So batch moves 4 and ranker 1 (3 stay). A claim of 7 would need ranker's floor:
admission does not make it; the gang waits, "serving-floor: ... model 'ranker' keeps 2
replica(s) on the cluster pool (min_cluster_replicas)". When the gang ends, ranker's
replica comes back first, then batch's, one per step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from policies.admission.fit import FreeGpus
from policies.model_classes import ModelClass, yield_key
from policies.plan import Action, MoveServeReplicas, RequestExternalCapacity, SetRouteWeights
from policies.providers import (
    Provider,
    ProviderState,
    advance,
    allocate,
    ask,
    caps,
    delivered_by_provider,
    is_out,
    live_by_provider,
    migrate_back,
)
from policies.snapshot import ClusterSnapshot, Pool, ReplicaState

__all__ = [
    "MigrateBackConfig",
    "ModelDemand",
    "PlacementConfig",
    "PlacementReason",
    "PlacementState",
    "PoolTargets",
    "decide",
    "external_cap_gpus",
    "provider_room",
]


class PlacementReason(str, Enum):
    YIELD_TO_TRAINING = "yield_to_training"
    LEAVE_UNHEALTHY_NODE = "leave_unhealthy_node"
    EXTERNAL_FULL = "external_full"
    MIGRATE_BACK = "migrate_back"
    EXTERNAL_CAPACITY = "external_capacity"
    ROUTE_BY_READINESS = "route_by_readiness"
    PINNED = "pinned"


@dataclass(frozen=True)
class ModelDemand:
    """What the demand policy wants for one model."""

    model: str
    num_replicas: int
    min_replicas: int
    gpus_per_replica: int
    priority: int = 0
    """The value of the model's priority class (`policies.model_classes`)."""
    min_cluster_replicas: int = 0
    """Cluster-pool replicas a training claim never moves (rule 2)."""
    slo_at_risk: bool = False
    """The model's measured p99 is over its SLO: it yields last within its class. The caller
    sets it from the p99 it measures (``False`` while it measures none)."""
    yields_on_shortfall: bool = False
    """``on_shortfall: yield`` (`ModelClass.yields_on_shortfall`): rules 3 and 4 as a
    best-effort model; False: its demand is a guarantee."""

    def __post_init__(self) -> None:
        if self.num_replicas < 0 or self.min_replicas < 0 or self.min_cluster_replicas < 0:
            raise ValueError(f"{self.model}: replica counts must be >= 0")
        if self.gpus_per_replica < 1:
            raise ValueError(f"{self.model}: gpus_per_replica must be >= 1")

    @property
    def model_class(self) -> ModelClass:
        return ModelClass(
            self.priority, self.min_cluster_replicas, self.slo_at_risk, self.yields_on_shortfall
        )


@dataclass(kw_only=True)
class MigrateBackConfig:
    """How replicas come back from the external pool (rule 5). The ``placement`` config
    section is this class, so each field and default is defined here only (not frozen for
    that reason: omegaconf makes a frozen dataclass a read-only node)."""

    migrate_back_idle_s: float = 60.0
    """The cluster pool must have room, with no queued training, this long before replicas
    come back from the external pool."""
    migrate_back_step: int = 1
    """Replicas that come back per step."""
    migrate_back_interval_s: float = 30.0
    """Seconds between steps back."""


@dataclass
class PlacementConfig(MigrateBackConfig):
    """The policy's whole config: the `MigrateBackConfig` knobs (keyword-only) and the
    external pool's size, which the caller derives from its pool config. Invalid values raise
    ValueError naming the field."""

    external_max_gpus: int
    """GPUs the external pool can have at most (the sum of its providers' max_gpus)."""
    external_deadline_s: float = 900.0
    """With no `providers`: the one implicit provider's delivery deadline (rule 6)."""
    external_backoff_s: float = 1800.0
    """With no `providers`: the one implicit provider's back-off (rule 6)."""
    providers: tuple[Provider, ...] = ()
    """Who rents the external pool's GPUs (`policies.providers`); none given: one provider,
    ``external``, of `external_max_gpus` at no price."""

    def __post_init__(self) -> None:
        if self.external_max_gpus < 0:
            raise ValueError("external_max_gpus must be >= 0")
        if not self.providers:
            self.providers = (
                Provider(
                    "external",
                    self.external_max_gpus,
                    0.0,
                    self.external_deadline_s,
                    self.external_backoff_s,
                ),
            )
        names = [p.name for p in self.providers]
        if len(set(names)) != len(names):
            raise ValueError(f"providers: names must be unique, got {names}")
        if sum(p.max_gpus for p in self.providers) != self.external_max_gpus:
            raise ValueError("external_max_gpus must be the sum of the providers' max_gpus")
        if self.migrate_back_step < 1:
            raise ValueError("migrate_back_step must be >= 1")
        if self.migrate_back_idle_s < 0 or self.migrate_back_interval_s < 0:
            raise ValueError("migrate_back_idle_s and migrate_back_interval_s must be >= 0")


@dataclass(frozen=True)
class PlacementState:
    """The policy's memory; the caller stores it and hands it back next tick."""

    room_since_s: float | None = None
    last_step_back_s: float | None = None
    requested_external_gpus: int = 0
    route_weights: Mapping[str, tuple[tuple[Pool, float], ...]] = field(default_factory=dict)
    providers: Mapping[str, ProviderState] = field(default_factory=dict)
    """Each provider's request and delivery record (rule 6, `policies.providers`)."""
    draining_node: str | None = None
    """The external node rule 7 drained last; no other is drained while it is live."""
    last_drain_s: float | None = None

    def provider_requests(self) -> tuple[tuple[str, int], ...]:
        """What each provider was asked for, by name."""
        return tuple(sorted((k, s.requested_gpus) for k, s in self.providers.items()))


def provider_room(
    snapshot: ClusterSnapshot, config: PlacementConfig, state: PlacementState
) -> dict[str, int]:
    """GPUs each provider can have now: its most, or while it is out (rule 6) only the GPUs
    of its live nodes."""
    live = live_by_provider(snapshot, config.providers)
    return caps(config.providers, state.providers, live, snapshot.now_s)


def external_cap_gpus(
    snapshot: ClusterSnapshot, config: PlacementConfig, state: PlacementState
) -> int:
    """GPUs the external pool can have now: the sum of its providers' room (rule 6)."""
    return sum(provider_room(snapshot, config, state).values())


@dataclass(frozen=True)
class PoolTargets:
    """The decided replica count per pool for one model (what the actuator scales to)."""

    model: str
    cluster: int
    external: int
    note: str = ""
    """Why the targets fall short of the demand (e.g. the external pool is full), if they do."""


def _count(snapshot: ClusterSnapshot, model: str, pool: Pool, states: set[ReplicaState]) -> int:
    return sum(
        1
        for r in snapshot.serve_replicas
        if r.model == model and r.pool is pool and r.state in states
    )


def _serving_budget_gpus(snapshot: ClusterSnapshot, training_claim_gpus: int) -> int:
    """Cluster-pool GPUs serving may use this tick.

    Without a claim: every healthy cluster GPU no training gang holds. With a claim (the
    admission policy asks serving to hand back `training_claim_gpus` of the GPUs its
    replicas hold on the nodes gangs may use): what serving holds there now, less the
    claim, plus what its replicas hold on serving-only nodes (``NodeView.serving_only``),
    which are serving's whatever training claims: those replicas stay.
    """
    live = {n.node_id for n in snapshot.live_nodes(Pool.CLUSTER)}
    held = sum(
        gpus
        for gang in snapshot.running
        for node, gpus in gang.gpus_by_node.items()
        if node in live
    )
    available = max(0, snapshot.live_gpus_total(Pool.CLUSTER) - held)
    if training_claim_gpus <= 0:
        return available
    gang_ids = {n.node_id for n in snapshot.gang_nodes(Pool.CLUSTER)}
    serving_held = {True: 0, False: 0}  # on a gang node?
    for r in snapshot.serve_replicas:
        if r.node_id in live and r.state in (ReplicaState.RUNNING, ReplicaState.STARTING):
            serving_held[r.node_id in gang_ids] += r.gpus
    on_gang_nodes = max(0, min(available, serving_held[True]) - training_claim_gpus)
    return min(available, on_gang_nodes + serving_held[False])


def _training_could_use_room(snapshot: ClusterSnapshot) -> bool:
    """Whether queued training waits (not backing off) and a node it may use has a free GPU.

    When every free cluster GPU is on serving-only nodes, a replica started on the cluster
    pool can only land there, on GPUs no gang may use: growth and the way back (rules 4
    and 5) then go on while training waits.
    """
    waiting = any(
        job.not_before_s is None or job.not_before_s <= snapshot.now_s for job in snapshot.queued
    )
    return waiting and any(n.gpus_free > 0 for n in snapshot.gang_nodes(Pool.CLUSTER))


def _take(free: FreeGpus, gpus: int, n: int) -> int:
    """How many of `n` replicas of `gpus` GPUs each fit, each whole on one node (best fit,
    `FreeGpus.place`); takes their GPUs from `free`."""
    placed = 0
    while placed < n:
        spot = free.place(gpus, 1)
        if not spot:
            break
        free.add(spot[0][0], -gpus)
        placed += 1
    return placed


def _free_after_growth(
    snapshot: ClusterSnapshot, demands: list[ModelDemand], grown: Mapping[str, int]
) -> FreeGpus:
    """Free GPUs per live cluster node once the replicas not on a node yet have theirs:
    those Serve has not placed (no node) and this tick's growth (rule 4), largest first."""
    free = FreeGpus({n.node_id: n.gpus_free for n in snapshot.live_nodes(Pool.CLUSTER)})
    gpus_of = {d.model: d.gpus_per_replica for d in demands}
    pending = [
        r.gpus
        for r in snapshot.serve_replicas
        if r.pool is Pool.CLUSTER and not r.node_id and r.state is not ReplicaState.STOPPING
    ]
    pending += [gpus_of[m] for m, k in grown.items() for _ in range(k)]
    for gpus in sorted(pending, reverse=True):
        _take(free, gpus, 1)
    return free


def _weights(running: dict[Pool, int]) -> tuple[tuple[Pool, float], ...]:
    total = sum(running.values())
    if total == 0:
        return ()
    return tuple((pool, running[pool] / total) for pool in (Pool.CLUSTER, Pool.EXTERNAL))


def decide(
    snapshot: ClusterSnapshot,
    demands: tuple[ModelDemand, ...],
    config: PlacementConfig,
    state: PlacementState,
    training_claim_gpus: int = 0,
    claims: tuple[MoveServeReplicas, ...] = (),
) -> tuple[tuple[tuple[PoolTargets, ...], tuple[Action, ...]], PlacementState]:
    """Targets per (model, pool) and the actions to reach them; see the module docstring.

    `claims` are the admission policy's `MoveServeReplicas` for a waiting gang: their
    replicas' GPUs add to `training_claim_gpus`, and a model's yield move carries the node
    ids (and the job) its claim names, so the Serve actuator frees those nodes.
    """
    now = snapshot.now_s
    active = {ReplicaState.RUNNING, ReplicaState.STARTING}
    training_waiting = _training_could_use_room(snapshot)
    gpus_of = {d.model: d.gpus_per_replica for d in demands}
    training_claim_gpus += sum(c.num_replicas * gpus_of.get(c.model, 1) for c in claims)
    claimed = {c.model: c for c in claims}
    budget = _serving_budget_gpus(snapshot, training_claim_gpus)
    held = delivered_by_provider(snapshot, config.providers)
    delivered = advance(config.providers, state.providers, held, now)
    room = provider_room(snapshot, config, replace(state, providers=delivered))
    external_left = sum(room.values())
    actions: list[Action] = []
    targets: list[PoolTargets] = []

    # Rule 2: models pinned to the cluster pool take their share of the budget first, then
    # the others in keep order (the reverse of `yield_key`: highest priority first).
    classes = {d.model: d.model_class for d in demands}

    def keep_order(d: ModelDemand) -> tuple[bool, int, bool, str]:
        priority, at_risk, name = yield_key(d.model, classes)
        return (snapshot.pinned.get(d.model) is not Pool.CLUSTER, -priority, not at_risk, name)

    ordered = sorted(demands, key=keep_order)
    current = {
        d.model: (
            _count(snapshot, d.model, Pool.CLUSTER, active),
            _count(snapshot, d.model, Pool.EXTERNAL, active),
        )
        for d in ordered
    }
    # Floors first: each model's min_cluster_replicas (of those it runs there) before any
    # model keeps more, whatever a claim asks (admission never claims them; only capacity
    # health takes out can); `budget` is then what is left beyond the floors.
    floor_room = _serving_budget_gpus(snapshot, 0)
    floors: dict[str, int] = {}
    for d in ordered:
        wanted = min(current[d.model][0], max(d.num_replicas, d.min_replicas))
        floors[d.model] = min(wanted, d.min_cluster_replicas, floor_room // d.gpus_per_replica)
        floor_room -= floors[d.model] * d.gpus_per_replica
        budget = max(0, budget - floors[d.model] * d.gpus_per_replica)

    unhealthy = {n.node_id for n in snapshot.nodes if not n.healthy}
    on_unhealthy = {
        d.model: sum(
            1
            for r in snapshot.serve_replicas
            if r.model == d.model
            and r.pool is Pool.CLUSTER
            and r.node_id in unhealthy
            and r.state in active
        )
        for d in ordered
    }

    # Rule 2, keep: every model's kept cluster replicas, in keep order, before any model
    # grows (rule 4), so one model's growth never pushes another's running replicas out.
    keeps: dict[str, int] = {}
    for d in ordered:
        cur_c = current[d.model][0]
        total = max(d.num_replicas, d.min_replicas)
        floor = floors[d.model]
        claim = claimed.get(d.model)
        # A model a claim names yields (at least) what the claim takes of it.
        most = min(cur_c, total, cur_c - claim.num_replicas if claim is not None else cur_c)
        # Pinned to the cluster pool: its replicas there stay whatever the budget.
        if snapshot.pinned.get(d.model) is Pool.CLUSTER:
            keeps[d.model] = min(cur_c, total)
        else:
            keeps[d.model] = floor + min(max(0, most - floor), budget // d.gpus_per_replica)
        budget = max(0, budget - (keeps[d.model] - floor) * d.gpus_per_replica)

    # An external replica still starting keeps its place only while the providers have room
    # for it once every running one is counted: one waiting for a node that a provider out
    # of stock will not deliver is growth again (rule 6), placed elsewhere or held for by
    # admission, never left pending.
    running_e = {
        d.model: _count(snapshot, d.model, Pool.EXTERNAL, {ReplicaState.RUNNING}) for d in ordered
    }
    starting_room = external_left - sum(
        min(running_e[d.model], max(0, max(d.num_replicas, d.min_replicas) - keeps[d.model]))
        * d.gpus_per_replica
        for d in ordered
    )

    # Pass 1 (rules 3-4): yield, grow.
    yields: list[MoveServeReplicas] = []
    grown: dict[str, int] = {}
    """New cluster replicas this tick (rule 4): no node holds them yet."""
    plan_c: dict[str, int] = {}
    plan_e: dict[str, int] = {}
    notes: dict[str, str] = {}
    for d in ordered:
        g = d.gpus_per_replica
        cur_c, cur_e = current[d.model]
        total = max(d.num_replicas, d.min_replicas)
        pin = snapshot.pinned.get(d.model)
        claim = claimed.get(d.model)
        keep_c = keeps[d.model]
        keep_run = min(running_e[d.model], total - keep_c)
        keep_start = min(cur_e - running_e[d.model], total - keep_c - keep_run)
        keep_start = min(keep_start, max(0, starting_room) // g)
        starting_room -= keep_start * g
        keep_e = keep_run + keep_start
        external_left -= keep_e * g
        need = total - keep_c - keep_e
        # Cluster replicas over the budget that are still needed relocate; the rest is growth.
        relocate = min(max(0, min(cur_c, total) - keep_c), need)
        grow = need - relocate
        guaranteed = not d.yields_on_shortfall
        new_c = 0
        if grow > 0 and pin is not Pool.EXTERNAL:
            if not training_waiting:
                new_c = min(grow, budget // g)
            elif guaranteed:
                # Training waits, but what the external pool cannot host (relocations take
                # its room first) grows on the cluster pool: demand is a guarantee.
                room_e = max(0, external_left) // g
                new_c = min(grow, max(0, relocate + grow - room_e), budget // g)
        grown[d.model] = new_c
        to_external = relocate + grow - new_c
        if pin is Pool.CLUSTER and to_external:
            notes[d.model] = (
                f"{PlacementReason.PINNED.value}: {d.model} is pinned to the cluster pool, "
                f"which has no room for {to_external} more replica(s)"
            )
            to_external = 0
        ext_ok = min(to_external, max(0, external_left) // g)
        external_left -= ext_ok * g
        moved = min(relocate, ext_ok)
        # What the external pool cannot hold: relocating replicas stay on the cluster pool
        # (a claim that needed them is not freed: admission asks again, and its gang waits);
        # a model that yields on shortfall keeps only what min_replicas needs. Growth nobody
        # can host is not started.
        placed = keep_c + keep_e + new_c + ext_ok
        stay_c = relocate - moved
        if not guaranteed:
            stay_c = min(stay_c, max(0, d.min_replicas - placed))
        c = keep_c + new_c + stay_c
        e = keep_e + ext_ok
        budget = max(0, budget - (new_c + stay_c) * g)
        plan_c[d.model], plan_e[d.model] = c, e
        if to_external > ext_ok:
            notes[d.model] = (
                f"{PlacementReason.EXTERNAL_FULL.value}: the external pool cannot hold "
                f"{to_external - ext_ok} more replica(s) of {d.model}; it runs {c + e} "
                f"(wanted {total}, min {d.min_replicas})"
            )
        if moved:
            reason = (
                f"{PlacementReason.YIELD_TO_TRAINING.value}: {moved} replica(s) of {d.model} "
                "make room on the cluster pool for training"
            )
            node_ids = claim.node_ids[:moved] if claim is not None else ()
            if on_unhealthy.get(d.model) and training_claim_gpus <= 0:
                reason = (
                    f"{PlacementReason.LEAVE_UNHEALTHY_NODE.value}: {moved} replica(s) of "
                    f"{d.model} leave the cluster pool: {on_unhealthy[d.model]} run on nodes "
                    "health took out and the healthy nodes have no room"
                )
                node_ids = tuple(
                    sorted(
                        r.node_id
                        for r in snapshot.serve_replicas
                        if r.model == d.model
                        and r.pool is Pool.CLUSTER
                        and r.node_id in unhealthy
                        and r.state in active
                    )
                )[:moved]
            yields.append(
                MoveServeReplicas(
                    model=d.model,
                    from_pool=Pool.CLUSTER,
                    to_pool=Pool.EXTERNAL,
                    num_replicas=moved,
                    node_ids=node_ids,
                    reason=reason,
                    for_job_id=claim.for_job_id if claim is not None else None,
                )
            )
    # Moves out in yield order (the lowest priority first), the reverse of the keep order.
    yields.sort(key=lambda a: yield_key(a.model, classes))
    actions.extend(yields)

    # Pass 2 (rule 5): gradual migration back.
    room_gpus = budget
    can_come_back = [
        d
        for d in ordered
        if plan_e[d.model] > 0
        and room_gpus >= d.gpus_per_replica
        and snapshot.pinned.get(d.model) is not Pool.EXTERNAL
    ]
    room_since = state.room_since_s
    last_step = state.last_step_back_s
    if can_come_back and not training_waiting:
        room_since = now if room_since is None else room_since
    else:
        room_since = None
    if (
        room_since is not None
        and now - room_since >= config.migrate_back_idle_s
        and (last_step is None or now - last_step >= config.migrate_back_interval_s)
    ):
        step_left = config.migrate_back_step
        free = _free_after_growth(snapshot, ordered, grown)
        for d in can_come_back:
            n = min(step_left, plan_e[d.model], room_gpus // d.gpus_per_replica)
            n = _take(free, d.gpus_per_replica, n)
            if n <= 0:
                continue
            plan_e[d.model] -= n
            plan_c[d.model] += n
            room_gpus -= n * d.gpus_per_replica
            step_left -= n
            actions.append(
                MoveServeReplicas(
                    model=d.model,
                    from_pool=Pool.EXTERNAL,
                    to_pool=Pool.CLUSTER,
                    num_replicas=n,
                    node_ids=(),
                    reason=(
                        f"{PlacementReason.MIGRATE_BACK.value}: cluster pool had room for "
                        f"{now - room_since:.0f}s with no queued training that could use it"
                    ),
                )
            )
            last_step = now
            if step_left == 0:
                break

    for d in ordered:
        targets.append(
            PoolTargets(d.model, plan_c[d.model], plan_e[d.model], notes.get(d.model, ""))
        )

    # Rule 6: external capacity, rented cheapest provider first (`policies.providers`).
    external_gpus = sum(plan_e[d.model] * d.gpus_per_replica for d in ordered)
    requested = state.requested_external_gpus
    alloc = allocate(config.providers, room, external_gpus)
    providers = {k: ask(s, alloc[k], held.get(k, 0), now) for k, s in delivered.items()}
    by_provider = tuple(sorted(alloc.items()))
    asked_before = tuple((k, g) for k, g in state.provider_requests() if g)
    if external_gpus != requested or tuple((k, g) for k, g in by_provider if g) != asked_before:
        out = [p.name for p in config.providers if is_out(delivered[p.name], now)]
        actions.append(
            RequestExternalCapacity(
                num_gpus=external_gpus,
                reason=(
                    f"{PlacementReason.EXTERNAL_CAPACITY.value}: external replicas need "
                    f"{external_gpus} GPU(s) (was {requested}): "
                    + ", ".join(f"{k} {v}" for k, v in alloc.items())
                    + (f"; out: {', '.join(out)}" if out else "")
                ),
                by_provider=by_provider,
            )
        )
        requested = external_gpus

    # Rule 6, continued: back to the cheapest provider, one drained node at a time.
    ext_live = snapshot.live_nodes(Pool.EXTERNAL)
    draining = state.draining_node
    # A drained node is unhealthy in the snapshot until it leaves: it is gone once Ray no
    # longer lists it at all.
    ext_all = {n.node_id for n in snapshot.nodes if n.pool is Pool.EXTERNAL}
    if draining is not None and draining not in ext_all:
        draining = None
    last_drain = state.last_drain_s
    paced = last_drain is None or now - last_drain >= config.migrate_back_interval_s
    if len(config.providers) > 1 and draining is None and paced:
        used: dict[str, int] = {}
        for r in snapshot.serve_replicas:
            if r.pool is Pool.EXTERNAL and r.state in active:
                used[r.node_id] = used.get(r.node_id, 0) + r.gpus
        drain = migrate_back(config.providers, alloc, ext_live, used)
        if drain is not None:
            actions.append(drain)
            draining, last_drain = drain.node_id, now

    # Rule 8: route weights from readiness, each pool's RUNNING replicas capped at its new
    # target (replicas about to stop get no new traffic).
    weights = dict(state.route_weights)
    for d in ordered:
        planned = {Pool.CLUSTER: plan_c[d.model], Pool.EXTERNAL: plan_e[d.model]}
        running = {
            pool: min(planned[pool], _count(snapshot, d.model, pool, {ReplicaState.RUNNING}))
            for pool in (Pool.CLUSTER, Pool.EXTERNAL)
        }
        w = _weights(running)
        if w and weights.get(d.model) != w:
            weights[d.model] = w
            actions.append(
                SetRouteWeights(
                    model=d.model,
                    weights=w,
                    reason=(
                        f"{PlacementReason.ROUTE_BY_READINESS.value}: running replicas "
                        f"cluster={running[Pool.CLUSTER]} external={running[Pool.EXTERNAL]}"
                    ),
                )
            )

    new_state = replace(
        state,
        room_since_s=room_since,
        last_step_back_s=last_step,
        requested_external_gpus=requested,
        route_weights=weights,
        providers=providers,
        draining_node=draining,
        last_drain_s=last_drain,
    )
    return (tuple(targets), tuple(actions)), new_state
