"""Rule 6 of placement (`policies.placement`): the external pool's capacity, rented from the
providers cheapest first, and the drain back to the cheapest.

Owns: what each provider can have now (`provider_room`, `external_cap_gpus`, which admission
reads too), the providers' delivery record advanced to this tick, the `RequestExternalCapacity`
for the external replicas placement wants, and the one `DrainNode` that moves replicas from a
dearer provider to a cheaper one. The arithmetic of shares, stock-outs and back-offs is
`policies.providers`'; this module applies it to placement's state.
Must not: place replicas (rules 2-5 decide the counts it is handed) or read a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from policies.placement.config import PlacementConfig
from policies.placement.reasons import PlacementReason
from policies.placement.state import PlacementState
from policies.plan import DrainNode, RequestExternalCapacity
from policies.providers import (
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
class Providers:
    """The providers this tick, before placement asks them for anything."""

    held: dict[str, int]
    """GPUs each provider's nodes hold now (`policies.providers.delivered_by_provider`)."""
    delivered: dict[str, ProviderState]
    """Each provider's request and delivery record, advanced to this tick."""
    room: dict[str, int]
    """GPUs each provider can have now (`provider_room` over the advanced record)."""

    @property
    def room_gpus(self) -> int:
        """GPUs the external pool can have now."""
        return sum(self.room.values())


def providers_now(
    snapshot: ClusterSnapshot, config: PlacementConfig, state: PlacementState
) -> Providers:
    """The providers' record advanced to ``snapshot.now_s`` (an out provider's back-off
    begins or ends) and the room each has after it."""
    held = delivered_by_provider(snapshot, config.providers)
    delivered = advance(config.providers, state.providers, held, snapshot.now_s)
    room = provider_room(snapshot, config, replace(state, providers=delivered))
    return Providers(held, delivered, room)


@dataclass(frozen=True)
class CapacityRequest:
    """What rule 6 asks of the providers this tick."""

    by_provider: dict[str, int]
    """GPUs allocated to each provider, cheapest first (`policies.providers.allocate`)."""
    providers: dict[str, ProviderState]
    """Each provider's record once asked for its share."""
    requested_gpus: int
    """The request the autoscaler now has (the new one, or the last one if unchanged)."""
    action: RequestExternalCapacity | None
    """The request, only when it changes."""


def request_capacity(
    external_gpus: int,
    config: PlacementConfig,
    state: PlacementState,
    providers: Providers,
    now_s: float,
) -> CapacityRequest:
    """Ask the providers, cheapest first, for the `external_gpus` the external replicas
    need; the action is emitted only when the total or a provider's share changes."""
    requested = state.requested_external_gpus
    alloc = allocate(config.providers, providers.room, external_gpus)
    asked = {
        k: ask(s, alloc[k], providers.held.get(k, 0), now_s) for k, s in providers.delivered.items()
    }
    by_provider = tuple(sorted(alloc.items()))
    asked_before = tuple((k, g) for k, g in state.provider_requests() if g)
    if external_gpus == requested and tuple((k, g) for k, g in by_provider if g) == asked_before:
        return CapacityRequest(alloc, asked, requested, None)
    out = [p.name for p in config.providers if is_out(providers.delivered[p.name], now_s)]
    action = RequestExternalCapacity(
        num_gpus=external_gpus,
        reason=(
            f"{PlacementReason.EXTERNAL_CAPACITY.value}: external replicas need "
            f"{external_gpus} GPU(s) (was {requested}): "
            + ", ".join(f"{k} {v}" for k, v in alloc.items())
            + (f"; out: {', '.join(out)}" if out else "")
        ),
        by_provider=by_provider,
    )
    return CapacityRequest(alloc, asked, external_gpus, action)


@dataclass(frozen=True)
class Drain:
    """Rule 6's drain back to the cheaper providers this tick."""

    draining_node: str | None
    """The node drained last while it is still listed; None once it left."""
    last_drain_s: float | None
    action: DrainNode | None
    """A new drain, at most one per ``migrate_back_interval_s`` and only while no other
    node drains."""


def drain_to_cheaper(
    snapshot: ClusterSnapshot,
    config: PlacementConfig,
    state: PlacementState,
    by_provider: dict[str, int],
) -> Drain:
    """With more than one provider: drain the least used node of a provider holding more
    than its allocation once the cheaper providers' live nodes have room for its replicas
    (`policies.providers.migrate_back`), one node at a time."""
    now = snapshot.now_s
    draining = state.draining_node
    # A drained node is unhealthy in the snapshot until it leaves: it is gone once Ray no
    # longer lists it at all.
    ext_all = {n.node_id for n in snapshot.nodes if n.pool is Pool.EXTERNAL}
    if draining is not None and draining not in ext_all:
        draining = None
    last_drain = state.last_drain_s
    paced = last_drain is None or now - last_drain >= config.migrate_back_interval_s
    if len(config.providers) <= 1 or draining is not None or not paced:
        return Drain(draining, last_drain, None)
    active = (ReplicaState.RUNNING, ReplicaState.STARTING)
    used: dict[str, int] = {}
    for r in snapshot.serve_replicas:
        if r.pool is Pool.EXTERNAL and r.state in active:
            used[r.node_id] = used.get(r.node_id, 0) + r.gpus
    drain = migrate_back(config.providers, by_provider, snapshot.live_nodes(Pool.EXTERNAL), used)
    if drain is None:
        return Drain(draining, last_drain, None)
    return Drain(drain.node_id, now, drain)
