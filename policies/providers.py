"""Which rented-GPU provider hosts the external pool's GPUs (pure).

The external pool is one pool to placement and to Serve (a model's ``external`` app), rented
from several providers: each a node group with its own price, size and delivery record.
This module decides, each tick, over the providers in the config's order:

1. **Delivery** (`advance`): a provider whose live GPUs stay below what it was asked for
   ``deadline_s`` (a stock-out, a quota, a refusal) is *out* for ``backoff_s``; one that has
   delivered what it was asked owes nothing. An out provider is asked again when its back-off
   ends.
2. **Room** (`caps`): an in provider can have its ``max_gpus``; an out one only the GPUs of its
   live nodes (what it already delivered keeps serving). The pool's room is their sum, which
   placement and admission use (`policies.placement.external_cap_gpus`).
3. **Who rents** (`allocate`): the GPUs placement wants on the external pool, cheapest provider
   first, each up to its room (ties keep the config's order). A provider that is out gets none
   beyond its live GPUs, so its share goes to the next.
4. **Back to the cheapest** (`migrate_back`): when a provider holds GPUs beyond what it was
   allocated (a more expensive one took the load while a cheaper one was out or full) and the
   cheaper providers' live nodes have the room for one of its nodes' replicas, drain that node
   (`DrainNode`): Serve starts the replicas on the cheaper nodes before it stops them there
   (make-before-break), and the autoscaler then removes the idle node. Only a node whose
   going leaves its provider what it is allocated; the most expensive provider first, its
   least used node first; one at a time (placement paces the drains with
   ``migrate_back_interval_s`` and waits until the drained node is gone).

Example: providers ``a`` ($2/GPU-h, 4 GPUs) and ``b`` ($3, 4 GPUs); placement wants 6 external
GPUs: ``a`` 4, ``b`` 2. ``a`` delivers nothing for 900 s: ``a`` is out (room 0), so ``b`` is
asked for 4 and the pool's room falls to 4 (the rest goes to the cluster pool, reclaimed from
training if it must). After the back-off ``a`` is asked again; once it delivers, ``b``'s nodes
are drained one at a time and the load runs on ``a``.

Must not: read clocks or the cluster (everything comes in as arguments), do I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from policies.plan import DrainNode
from policies.snapshot import ClusterSnapshot, NodeView, Pool

__all__ = [
    "PROVIDER_LABEL",
    "PROVIDER_NAME_RE",
    "Provider",
    "ProviderState",
    "advance",
    "allocate",
    "ask",
    "by_price",
    "caps",
    "delivered_by_provider",
    "is_out",
    "live_by_provider",
    "migrate_back",
    "provider_of",
    "provider_resource",
]

PROVIDER_LABEL = "provider"
"""The node label naming an external node's provider."""
PROVIDER_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?")
"""A provider's name: it names a node type, a KubeRay worker group and a Ray resource."""


def provider_resource(name: str) -> str:
    """The custom resource every node of provider `name` advertises, e.g. ``provider_a``:
    a capacity request that carries it can only be met by that provider's nodes."""
    return f"provider_{name}"


@dataclass(frozen=True)
class Provider:
    """One provider of rented GPUs, as placement sees it (from ``pools.external.providers``)."""

    name: str
    max_gpus: int
    """Its most: max_nodes x gpus_per_node."""
    price_per_gpu_hour: float
    deadline_s: float = 900.0
    """GPUs asked for and not up within this long mark it out."""
    backoff_s: float = 1800.0
    """How long it stays out."""

    def __post_init__(self) -> None:
        if not PROVIDER_NAME_RE.fullmatch(self.name):
            raise ValueError(f"provider name {self.name!r}: [a-z0-9-], 1-32 characters")
        if self.max_gpus < 0:
            raise ValueError(f"provider {self.name}: max_gpus must be >= 0")
        if not (math.isfinite(self.price_per_gpu_hour) and self.price_per_gpu_hour >= 0):
            raise ValueError(f"provider {self.name}: price_per_gpu_hour must be finite and >= 0")
        if not self.deadline_s > 0 or not self.backoff_s > 0:
            raise ValueError(f"provider {self.name}: deadline_s and backoff_s must be > 0")


@dataclass(frozen=True)
class ProviderState:
    """One provider's memory; the caller stores it and hands it back next tick."""

    requested_gpus: int = 0
    """What it was last asked for."""
    owed_since_s: float | None = None
    """Since when its live GPUs have been below what it was asked for."""
    out_until_s: float | None = None
    """It did not deliver in time: out until then."""


def by_price(providers: Sequence[Provider]) -> tuple[Provider, ...]:
    """Cheapest first; equal prices keep the config's order."""
    return tuple(sorted(providers, key=lambda p: p.price_per_gpu_hour))


def provider_of(node: NodeView, providers: Sequence[Provider]) -> str:
    """The provider an external node belongs to: the one its label names, else the first
    configured (a node from before providers were labelled, or a pool of one provider)."""
    label = node.labels.get(PROVIDER_LABEL, "")
    names = [p.name for p in providers]
    return label if label in names else (names[0] if names else "")


def live_by_provider(snapshot: ClusterSnapshot, providers: Sequence[Provider]) -> dict[str, int]:
    """Live (healthy, not draining) external GPUs per provider: what it can host now."""
    return _gpus_by_provider(snapshot.live_nodes(Pool.EXTERNAL), providers)


def delivered_by_provider(
    snapshot: ClusterSnapshot, providers: Sequence[Provider]
) -> dict[str, int]:
    """External GPUs per provider that it delivered and still has, draining or unhealthy ones
    too: what rule 1 holds it to. A node it is taking back with notice (drained) was
    delivered; its replacement can only come once it is gone."""
    return _gpus_by_provider([n for n in snapshot.nodes if n.pool is Pool.EXTERNAL], providers)


def _gpus_by_provider(nodes: Sequence[NodeView], providers: Sequence[Provider]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in nodes:
        key = provider_of(n, providers)
        out[key] = out.get(key, 0) + n.gpus_total
    return out


def advance(
    providers: Sequence[Provider],
    states: Mapping[str, ProviderState],
    live_gpus: Mapping[str, int],
    now_s: float,
) -> dict[str, ProviderState]:
    """Rule 1: each provider's delivery record after this tick's look at its live GPUs."""
    out: dict[str, ProviderState] = {}
    for p in providers:
        s = states.get(p.name, ProviderState())
        until = s.out_until_s if s.out_until_s is not None and now_s < s.out_until_s else None
        # Out, it is not on the clock: back in, it gets its whole deadline again.
        owed = until is None and s.requested_gpus > live_gpus.get(p.name, 0)
        since = (s.owed_since_s if s.owed_since_s is not None else now_s) if owed else None
        if until is None and since is not None and now_s - since >= p.deadline_s:
            until, since = now_s + p.backoff_s, None
        out[p.name] = replace(s, owed_since_s=since, out_until_s=until)
    return out


def ask(state: ProviderState, gpus: int, live_gpus: int, now_s: float) -> ProviderState:
    """`state` asked for `gpus` now: the deadline runs from the tick a shortfall is asked
    for (an unchanged ask keeps its start), and nothing is owed once it is live."""
    if gpus <= live_gpus:
        return replace(state, requested_gpus=gpus, owed_since_s=None)
    since = state.owed_since_s if state.owed_since_s is not None else now_s
    return replace(state, requested_gpus=gpus, owed_since_s=since)


def is_out(state: ProviderState, now_s: float) -> bool:
    return state.out_until_s is not None and now_s < state.out_until_s


def caps(
    providers: Sequence[Provider],
    states: Mapping[str, ProviderState],
    live_gpus: Mapping[str, int],
    now_s: float,
) -> dict[str, int]:
    """Rule 2: GPUs each provider can have now (its most; only its live GPUs while out)."""
    return {
        p.name: (
            min(p.max_gpus, live_gpus.get(p.name, 0))
            if is_out(states.get(p.name, ProviderState()), now_s)
            else p.max_gpus
        )
        for p in providers
    }


def allocate(
    providers: Sequence[Provider], room: Mapping[str, int], wanted_gpus: int
) -> dict[str, int]:
    """Rule 3: `wanted_gpus` over the providers, cheapest first, each up to its `room`. What no
    provider has room for is not asked of anyone (placement keeps it on the cluster pool)."""
    left = max(0, wanted_gpus)
    alloc = dict.fromkeys((p.name for p in providers), 0)
    for p in by_price(providers):
        take = min(left, max(0, room.get(p.name, 0)))
        alloc[p.name] = take
        left -= take
    return alloc


def migrate_back(
    providers: Sequence[Provider],
    allocation: Mapping[str, int],
    nodes: Sequence[NodeView],
    used_gpus: Mapping[str, int],
    draining: frozenset[str] = frozenset(),
) -> DrainNode | None:
    """Rule 4: the one external node to drain now so its replicas move to a cheaper provider,
    or None.

    `nodes`: the live external nodes; `used_gpus`: GPUs the serve replicas hold per node id;
    `draining`: nodes already being drained (nothing else is drained until they are gone).
    A node qualifies when its provider holds more live GPUs than it was allocated, and the
    live nodes of providers cheaper than it have free GPUs (not used, not draining) for all
    its replicas' GPUs, so each replacement can start before the replica it replaces stops.
    """
    if draining:
        return None
    rank = {p.name: i for i, p in enumerate(by_price(providers))}
    price = {p.name: p.price_per_gpu_hour for p in providers}
    live: dict[str, list[NodeView]] = {}
    for n in nodes:
        name = provider_of(n, providers)
        if name in rank and n.healthy:
            live.setdefault(name, []).append(n)
    for name in sorted(live, key=lambda k: -rank[k]):
        held = sum(n.gpus_total for n in live[name])
        if held <= allocation.get(name, 0):
            continue
        cheaper_free = sum(
            max(0, n.gpus_total - used_gpus.get(n.node_id, 0))
            for other, members in live.items()
            if price[other] < price[name]
            for n in members
        )
        # Only a node whose going leaves the provider what it is allocated (else it would be
        # rented again at once).
        busy = [
            n
            for n in live[name]
            if used_gpus.get(n.node_id, 0) > 0 and held - n.gpus_total >= allocation.get(name, 0)
        ]
        if not busy:
            continue  # idle nodes are the autoscaler's to remove
        node = min(busy, key=lambda n: (used_gpus.get(n.node_id, 0), n.node_id))
        need = used_gpus.get(node.node_id, 0)
        if need <= cheaper_free:
            return DrainNode(
                node.node_id,
                f"provider {name} (${price[name]:g}/GPU-h) holds {held} GPU(s), allocated "
                f"{allocation.get(name, 0)}: its {need} GPU(s) of replicas move to cheaper "
                f"providers' free {cheaper_free}",
            )
    return None
