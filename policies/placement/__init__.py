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
4. **Grow**: new replicas (total wanted above what runs) go to the cluster pool when it has room
   once every model kept its replicas there (rule 2 runs for all models first, so one model's
   growth never pushes another's running replicas out) and no queued training waits; otherwise
   to ``external``, and what the external pool cannot host then goes to the cluster pool's room
   all the same (a yielding model's waits for room). Growth nobody can host is not started;
   admission holds the cluster GPUs it needs and reclaims them from the lowest-priority training
   (`controlplane.loop.decide.unplaced_gpus`), so it starts once they are free. Training that
   waits only counts while a node it may use has a free GPU: when the cluster pool's free GPUs
   are all on serving-only nodes (fabric faults, ``NodeView.serving_only``), new replicas can
   land only there, and go there before the external pool is rented.
5. **Come back gradually**: external replicas return to the cluster pool only after it has had
   room for at least one replica, with no queued training (as in rule 4: none that a free GPU
   could serve; so replicas come back onto serving-only nodes while a gang waits), for
   ``migrate_back_idle_s`` without a break; then at most ``migrate_back_step`` replicas per
   ``migrate_back_interval_s``, in keep order (highest priority back first), each only where one
   node has all its GPUs free once the replicas not on a node yet (Serve's pending ones, this
   tick's growth) have theirs: room in total is not enough. A job arriving resets the timer
   (hysteresis: a job finishing and another arriving does not make replicas flap).
6. **External capacity** asked of the autoscaler = GPUs of the external replicas wanted, rented
   from the providers cheapest first (`policies.providers`: each provider's share is
   ``RequestExternalCapacity.by_provider``); emitted only when it changes. Asking for 0 lets the
   autoscaler remove idle nodes. A provider whose live GPUs stay below what it was asked for its
   deadline (a stock-out, a quota, a refusal) is *out* for its back-off
   (`PlacementState.providers`): it counts only the GPUs of its live nodes, so its share goes to
   the next provider, what none can host to the cluster pool (rule 4, and admission holds or
   reclaims the GPUs for it); then it is asked again. An external replica still starting keeps
   its place only while the providers have room for it once the running ones are counted: one
   that waits for a node an out provider will not deliver is placed again like growth. With more
   than one provider, a provider holding more than it is allocated has its least used node
   drained (`DrainNode`) once the cheaper providers' live nodes have free GPUs for its replicas:
   Serve starts them there before it stops them (make-before-break). One node at a time
   (`PlacementState.draining_node`), at most one per ``migrate_back_interval_s``.
7. **Pins** (an operator's, `ClusterSnapshot.pinned`): a model pinned to ``cluster`` keeps
   every cluster replica whatever the budget (it takes its budget first), never yields or
   grows to ``external`` (growth the cluster pool cannot host is not started; the note says
   so); a model pinned to ``external`` grows only there and never comes back (rule 5).
8. **Route weights** follow readiness: each pool's share of the model's RUNNING replicas,
   capped at the pool's new target; a pool with none gets 0. Emitted when they differ from
   ``state.route_weights`` (the caller passes what is deployed, so the action repeats until
   it shows).

Worked example: one model, 1 GPU per replica, 6 replicas wanted (min 2), all 6 on the cluster
pool of 8 GPUs; external pool holds 4 GPUs; a queued gang needs 6 GPUs, 2 are free, so admission
claims 4 from serving (``training_claim_gpus=4``). Budget = 6 held - 4 = 2, so the model keeps 2
cluster replicas and 4 must yield; external has room for 4 -> ``MoveServeReplicas(cluster ->
external, 4)`` and ``RequestExternalCapacity(4)``. If external held only 2 GPUs, admission would
not have claimed 4 (it claims what the room hosts); were such a claim made, 2 would move and the
other 2 stay on the cluster pool (note ``external_full``): the model runs all 6 it wants. Only
an ``on_shortfall: yield`` model would fall to 4 (2 cluster + 2 external, at least min_replicas
2), and with no external room at all to min_replicas: 2 on the cluster. Later the gang finishes:
the budget is 8 again, room for 4; after ``migrate_back_idle_s`` (say 60 s) with no queued job,
1 replica per ``migrate_back_interval_s`` (say 30 s) comes back: at t=60, 90, 120, 150 s; the
external request falls 4 -> 3 -> 2 -> 1 -> 0.

Two models: ``ranker`` (priority high = 100, ``min_cluster_replicas`` 2) and ``batch`` (low
= 0), 4 replicas each on the cluster pool of 8 GPUs, and a claim of 5 GPUs. Floors: ranker
keeps 2; the budget beyond them is 8 - 5 - 2 = 1: ranker (first in keep order) keeps 1 more,
batch none. So batch moves 4 and ranker 1 (3 stay). A claim of 7 would need ranker's floor:
admission does not make it; the gang waits, "serving-floor: ... model 'ranker' keeps 2
replica(s) on the cluster pool (min_cluster_replicas)". When the gang ends, ranker's
replica comes back first, then batch's, one per step.

The rooms: `decision` (`decide`, one private function per rule, called in the order above),
`external` (rule 6: `provider_room`, `external_cap_gpus`, the request and the drain), `fit`
(where a replica fits on the cluster pool's nodes, rule 5),
`targets` (`ModelDemand` in, `PoolTargets` out), `config` (`MigrateBackConfig`,
`PlacementConfig`), `state` (`PlacementState`) and `reasons` (`PlacementReason`). Every
public name is re-exported here, so callers import from `policies.placement`.
"""

from __future__ import annotations

from policies.placement.config import MigrateBackConfig, PlacementConfig
from policies.placement.decision import decide
from policies.placement.external import external_cap_gpus, provider_room
from policies.placement.reasons import PlacementReason
from policies.placement.state import PlacementState
from policies.placement.targets import ModelDemand, PoolTargets

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
