"""Placement's `decide` and its rules, one private function each, in the order of the
package docstring (`policies.placement`), where the rules and worked examples are.

Owns: the split of each model's replicas between the pools this tick (rules 1-5, pins woven
in as rule 7 says), the route weights (rule 8), and the sequence `decide` calls them in.
Rule 6, the providers, is `policies.placement.external`.
Must not: read a clock or do I/O; everything comes from the snapshot and the state handed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, replace

from policies.model_classes import ModelClass, yield_key
from policies.placement.config import PlacementConfig
from policies.placement.external import drain_to_cheaper, providers_now, request_capacity
from policies.placement.fit import free_after_growth, take
from policies.placement.reasons import PlacementReason
from policies.placement.state import PlacementState
from policies.placement.targets import ModelDemand, PoolTargets
from policies.plan import Action, MoveServeReplicas, SetRouteWeights
from policies.snapshot import ClusterSnapshot, Pool, ReplicaState

_ACTIVE = frozenset({ReplicaState.RUNNING, ReplicaState.STARTING})
"""A replica that holds (or is about to hold) its GPUs."""


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
    tick = _tick(snapshot, demands, training_claim_gpus, claims)
    # The providers' record advanced to now (rule 6): their room bounds rules 3 and 4.
    providers = providers_now(snapshot, config, state)
    # 1. Serving budget on the cluster pool.
    budget = _serving_budget_gpus(snapshot, tick.claim_gpus)
    # 2. Keep: floors first, then keep order (7: a model pinned to the cluster keeps all).
    keeps, budget = _keep(tick, budget)
    # 3. Yield to training and 4. grow, one model at a time in keep order (7: pins).
    placed = _yield_and_grow(tick, keeps, budget, providers.room_gpus)
    # 5. Come back gradually (7: never a model pinned to the external pool).
    back = _come_back(tick, config, state, placed)
    # 6. External capacity, cheapest provider first; drain back to the cheaper ones.
    external_gpus = sum(back.external[d.model] * d.gpus_per_replica for d in tick.ordered)
    capacity = request_capacity(external_gpus, config, state, providers, snapshot.now_s)
    drain = drain_to_cheaper(snapshot, config, state, capacity.by_provider)
    # 8. Route weights follow readiness.
    weights, routes = _route_weights(tick, back, state.route_weights)

    targets = tuple(
        PoolTargets(
            d.model, back.cluster[d.model], back.external[d.model], placed.notes.get(d.model, "")
        )
        for d in tick.ordered
    )
    actions: list[Action] = [*placed.yields, *back.moves]
    actions += [a for a in (capacity.action, drain.action) if a is not None]
    actions += routes
    new_state = replace(
        state,
        room_since_s=back.room_since_s,
        last_step_back_s=back.last_step_back_s,
        requested_external_gpus=capacity.requested_gpus,
        route_weights=weights,
        providers=capacity.providers,
        draining_node=drain.draining_node,
        last_drain_s=drain.last_drain_s,
    )
    return (targets, tuple(actions)), new_state


@dataclass(frozen=True)
class _Tick:
    """What every rule reads this tick."""

    snapshot: ClusterSnapshot
    ordered: tuple[ModelDemand, ...]
    """The demands in keep order (rule 2): those pinned to the cluster pool first, then the
    reverse of `yield_key` (highest priority first)."""
    classes: Mapping[str, ModelClass]
    current: Mapping[str, tuple[int, int]]
    """Each model's running and starting replicas: (cluster, external)."""
    claimed: Mapping[str, MoveServeReplicas]
    """Admission's claim, by the model it names."""
    claim_gpus: int
    """GPUs training claims from serving: ``training_claim_gpus`` plus the claims' GPUs."""
    training_waiting: bool
    """Queued training waits that a free cluster GPU could serve (rules 4 and 5)."""


def _tick(
    snapshot: ClusterSnapshot,
    demands: tuple[ModelDemand, ...],
    training_claim_gpus: int,
    claims: tuple[MoveServeReplicas, ...],
) -> _Tick:
    gpus_of = {d.model: d.gpus_per_replica for d in demands}
    training_claim_gpus += sum(c.num_replicas * gpus_of.get(c.model, 1) for c in claims)
    classes = {d.model: d.model_class for d in demands}

    def keep_order(d: ModelDemand) -> tuple[bool, int, bool, str]:
        priority, at_risk, name = yield_key(d.model, classes)
        return (snapshot.pinned.get(d.model) is not Pool.CLUSTER, -priority, not at_risk, name)

    ordered = tuple(sorted(demands, key=keep_order))
    current = {
        d.model: (
            _count(snapshot, d.model, Pool.CLUSTER, _ACTIVE),
            _count(snapshot, d.model, Pool.EXTERNAL, _ACTIVE),
        )
        for d in ordered
    }
    return _Tick(
        snapshot,
        ordered,
        classes,
        current,
        {c.model: c for c in claims},
        training_claim_gpus,
        _training_could_use_room(snapshot),
    )


def _count(snapshot: ClusterSnapshot, model: str, pool: Pool, states: Set[ReplicaState]) -> int:
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


def _keep(tick: _Tick, budget_gpus: int) -> tuple[dict[str, int], int]:
    """Rule 2: each model's kept cluster replicas, in keep order, before any model grows
    (rule 4), so one model's growth never pushes another's running replicas out; and the
    budget left after them."""
    floors, budget = _floors(tick, budget_gpus)
    keeps: dict[str, int] = {}
    for d in tick.ordered:
        cur_c = tick.current[d.model][0]
        total = max(d.num_replicas, d.min_replicas)
        floor = floors[d.model]
        claim = tick.claimed.get(d.model)
        # A model a claim names yields (at least) what the claim takes of it.
        most = min(cur_c, total, cur_c - claim.num_replicas if claim is not None else cur_c)
        # Pinned to the cluster pool (rule 7): its replicas there stay whatever the budget.
        if tick.snapshot.pinned.get(d.model) is Pool.CLUSTER:
            keeps[d.model] = min(cur_c, total)
        else:
            keeps[d.model] = floor + min(max(0, most - floor), budget // d.gpus_per_replica)
        budget = max(0, budget - (keeps[d.model] - floor) * d.gpus_per_replica)
    return keeps, budget


def _floors(tick: _Tick, budget_gpus: int) -> tuple[dict[str, int], int]:
    """Rule 2's floors: each model's min_cluster_replicas (of those it runs there) before any
    model keeps more, whatever a claim asks (admission never claims them; only capacity
    health takes out can); and the budget left beyond the floors."""
    floor_room = _serving_budget_gpus(tick.snapshot, 0)
    floors: dict[str, int] = {}
    for d in tick.ordered:
        wanted = min(tick.current[d.model][0], max(d.num_replicas, d.min_replicas))
        floors[d.model] = min(wanted, d.min_cluster_replicas, floor_room // d.gpus_per_replica)
        floor_room -= floors[d.model] * d.gpus_per_replica
        budget_gpus = max(0, budget_gpus - floors[d.model] * d.gpus_per_replica)
    return floors, budget_gpus


@dataclass(frozen=True)
class _Placed:
    """Rules 3 and 4's outcome."""

    cluster: dict[str, int]
    external: dict[str, int]
    notes: dict[str, str]
    """Why a model's targets fall short of its demand, if they do."""
    yields: tuple[MoveServeReplicas, ...]
    """Moves out to the external pool, in yield order (the lowest priority first)."""
    grown: dict[str, int]
    """New cluster replicas this tick (rule 4): no node holds them yet."""
    budget_gpus: int
    """Cluster GPUs serving may still use: the room for the way back (rule 5)."""


def _yield_and_grow(
    tick: _Tick, keeps: Mapping[str, int], budget: int, external_left: int
) -> _Placed:
    """Rules 3 and 4, model by model in keep order: replicas over the budget yield to the
    external pool as far as it has room, new ones grow where rule 4 says. One pass, since a
    model's relocations and growth share the external pool's room (relocations first)."""
    snapshot = tick.snapshot
    # An external replica still starting keeps its place only while the providers have room
    # for it once every running one is counted: one waiting for a node that a provider out
    # of stock will not deliver is growth again (rule 6), placed elsewhere or held for by
    # admission, never left pending.
    running_e = {
        d.model: _count(snapshot, d.model, Pool.EXTERNAL, {ReplicaState.RUNNING})
        for d in tick.ordered
    }
    starting_room = external_left - sum(
        min(running_e[d.model], max(0, max(d.num_replicas, d.min_replicas) - keeps[d.model]))
        * d.gpus_per_replica
        for d in tick.ordered
    )
    yields: list[MoveServeReplicas] = []
    grown: dict[str, int] = {}
    plan_c: dict[str, int] = {}
    plan_e: dict[str, int] = {}
    notes: dict[str, str] = {}
    for d in tick.ordered:
        g = d.gpus_per_replica
        cur_c, cur_e = tick.current[d.model]
        total = max(d.num_replicas, d.min_replicas)
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
        new_c = _grow_on_cluster(tick, d, relocate, grow, budget, external_left)
        grown[d.model] = new_c
        to_external = relocate + grow - new_c
        if snapshot.pinned.get(d.model) is Pool.CLUSTER and to_external:
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
        if d.yields_on_shortfall:
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
            yields.append(_yield_move(tick, d, moved))
    # Moves out in yield order (the lowest priority first), the reverse of the keep order.
    yields.sort(key=lambda a: yield_key(a.model, tick.classes))
    return _Placed(plan_c, plan_e, notes, tuple(yields), grown, budget)


def _grow_on_cluster(
    tick: _Tick, d: ModelDemand, relocate: int, grow: int, budget: int, external_left: int
) -> int:
    """Rule 4: how many of `grow` new replicas start on the cluster pool. All the budget holds
    while no training waits; while it waits, only a guaranteed model's that the external
    pool cannot host (its relocations take that room first); none of a model pinned to the
    external pool (rule 7)."""
    if grow <= 0 or tick.snapshot.pinned.get(d.model) is Pool.EXTERNAL:
        return 0
    g = d.gpus_per_replica
    if not tick.training_waiting:
        return min(grow, budget // g)
    if d.yields_on_shortfall:
        return 0
    # Training waits, but what the external pool cannot host grows on the cluster pool:
    # demand is a guarantee.
    room_e = max(0, external_left) // g
    return min(grow, max(0, relocate + grow - room_e), budget // g)


def _yield_move(tick: _Tick, d: ModelDemand, moved: int) -> MoveServeReplicas:
    """Rule 3: the move of `moved` replicas of `d` to the external pool, naming the nodes its
    claim names; or, with no GPUs claimed and replicas on nodes health took out, those
    nodes (``leave_unhealthy_node``)."""
    claim = tick.claimed.get(d.model)
    reason = (
        f"{PlacementReason.YIELD_TO_TRAINING.value}: {moved} replica(s) of {d.model} "
        "make room on the cluster pool for training"
    )
    node_ids = claim.node_ids[:moved] if claim is not None else ()
    unhealthy = {n.node_id for n in tick.snapshot.nodes if not n.healthy}
    on_unhealthy = sorted(
        r.node_id
        for r in tick.snapshot.serve_replicas
        if r.model == d.model
        and r.pool is Pool.CLUSTER
        and r.node_id in unhealthy
        and r.state in _ACTIVE
    )
    if on_unhealthy and tick.claim_gpus <= 0:
        reason = (
            f"{PlacementReason.LEAVE_UNHEALTHY_NODE.value}: {moved} replica(s) of "
            f"{d.model} leave the cluster pool: {len(on_unhealthy)} run on nodes "
            "health took out and the healthy nodes have no room"
        )
        node_ids = tuple(on_unhealthy)[:moved]
    return MoveServeReplicas(
        model=d.model,
        from_pool=Pool.CLUSTER,
        to_pool=Pool.EXTERNAL,
        num_replicas=moved,
        node_ids=node_ids,
        reason=reason,
        for_job_id=claim.for_job_id if claim is not None else None,
    )


@dataclass(frozen=True)
class _Back:
    """Rule 5's outcome: the targets once replicas came back, and its timers."""

    cluster: dict[str, int]
    external: dict[str, int]
    moves: tuple[MoveServeReplicas, ...]
    room_since_s: float | None
    last_step_back_s: float | None


def _come_back(
    tick: _Tick, config: PlacementConfig, state: PlacementState, placed: _Placed
) -> _Back:
    """Rule 5: once the cluster pool has had room with no queued training for
    ``migrate_back_idle_s``, at most ``migrate_back_step`` external replicas per
    ``migrate_back_interval_s`` come back, in keep order, each only where one node has its
    GPUs free; never a model pinned to the external pool (rule 7)."""
    snapshot, now = tick.snapshot, tick.snapshot.now_s
    plan_c, plan_e = dict(placed.cluster), dict(placed.external)
    room_gpus = placed.budget_gpus
    can_come_back = [
        d
        for d in tick.ordered
        if plan_e[d.model] > 0
        and room_gpus >= d.gpus_per_replica
        and snapshot.pinned.get(d.model) is not Pool.EXTERNAL
    ]
    room_since = state.room_since_s
    last_step = state.last_step_back_s
    if can_come_back and not tick.training_waiting:
        room_since = now if room_since is None else room_since
    else:
        room_since = None
    moves: list[MoveServeReplicas] = []
    if (
        room_since is not None
        and now - room_since >= config.migrate_back_idle_s
        and (last_step is None or now - last_step >= config.migrate_back_interval_s)
    ):
        step_left = config.migrate_back_step
        free = free_after_growth(snapshot, tick.ordered, placed.grown)
        for d in can_come_back:
            n = min(step_left, plan_e[d.model], room_gpus // d.gpus_per_replica)
            n = take(free, d.gpus_per_replica, n)
            if n <= 0:
                continue
            plan_e[d.model] -= n
            plan_c[d.model] += n
            room_gpus -= n * d.gpus_per_replica
            step_left -= n
            why = (
                f"{PlacementReason.MIGRATE_BACK.value}: cluster pool had room for "
                f"{now - room_since:.0f}s with no queued training that could use it"
            )
            moves.append(MoveServeReplicas(d.model, Pool.EXTERNAL, Pool.CLUSTER, n, (), why))
            last_step = now
            if step_left == 0:
                break
    return _Back(plan_c, plan_e, tuple(moves), room_since, last_step)


def _route_weights(
    tick: _Tick, back: _Back, deployed: Mapping[str, tuple[tuple[Pool, float], ...]]
) -> tuple[dict[str, tuple[tuple[Pool, float], ...]], list[SetRouteWeights]]:
    """Rule 8: each pool's share of a model's RUNNING replicas, capped at the pool's new
    target (replicas about to stop get no new traffic); set where it differs from what is
    `deployed`. Returns the weights and the actions that set them."""
    weights = dict(deployed)
    actions: list[SetRouteWeights] = []
    for d in tick.ordered:
        planned = {Pool.CLUSTER: back.cluster[d.model], Pool.EXTERNAL: back.external[d.model]}
        running = {
            pool: min(planned[pool], _count(tick.snapshot, d.model, pool, {ReplicaState.RUNNING}))
            for pool in (Pool.CLUSTER, Pool.EXTERNAL)
        }
        w = _weights(running)
        if w and weights.get(d.model) != w:
            weights[d.model] = w
            why = (
                f"{PlacementReason.ROUTE_BY_READINESS.value}: running replicas "
                f"cluster={running[Pool.CLUSTER]} external={running[Pool.EXTERNAL]}"
            )
            actions.append(SetRouteWeights(d.model, w, why))
    return weights, actions


def _weights(running: dict[Pool, int]) -> tuple[tuple[Pool, float], ...]:
    total = sum(running.values())
    if total == 0:
        return ()
    return tuple((pool, running[pool] / total) for pool in (Pool.CLUSTER, Pool.EXTERNAL))
