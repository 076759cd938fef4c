"""How many nodes each external provider's worker group should have, and which go (pure).

On KubeRay with the in-tree autoscaler off (``kubernetes.autoscaler_owns_external: false``)
the control plane sizes each provider's worker group ``gpu-external-<provider>`` itself. When
it lowers ``replicas``, KubeRay's operator deletes the pods named in the group's
``scaleStrategy.workersToDelete`` first and then, still over, whichever pods come first in its
list: often one that serves. So a shrink is a decision about *which* nodes go, made here:

1. **Size** (`nodes_wanted`): ``ceil(requested GPUs / gpus_per_node)`` nodes per provider.
2. **Emptied** (`emptied_nodes`): an external node of the provider that holds no Serve replica
   (starting, running or stopping), no gang (admitted or running), nothing Ray accounts on
   its GPUs (``gpus_free == gpus_total``: a replica or placement group Ray placed that the
   view does not show yet) and that no pending placement names (`reserved`, e.g. the nodes a
   move in flight works on). Unhealthy or draining ones first, then by node id.
3. **Which go** (`decide`): when the provider has more nodes than it wants, up to the surplus of
   its emptied nodes, named (`ExternalGroupSize.remove_node_ids`). The actuator lowers
   ``replicas`` by the pods it names and never by more, so a node that serves is never taken:
   without an emptied node the group stays as large as it is.
4. **Again at the write** (`recheck`): the actuator's caller re-reads what holds each named node
   just before the write; a node that gained work since the decision is dropped.

Example: provider ``rent-a`` (2 GPUs a node) runs nodes ``n1`` (a replica of ``llm``), ``n2``
and ``n3`` (both emptied by a return to the cluster pool); placement now asks 2 GPUs of it.
Wanted: 1 node, surplus 2, emptied ``n2``, ``n3``: ``ExternalGroupSize("rent-a", 1, ("n2",
"n3"), ...)``. Had placement asked 0 GPUs, still only ``n2`` and ``n3`` are named (``n1``
serves), and the group stays at 1 node until ``n1`` is emptied too.

Must not: import Ray or a Kubernetes client, read a clock, do I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from policies.providers import Provider, provider_of
from policies.snapshot import ClusterSnapshot, NodeView, Pool

__all__ = ["ExternalGroupSize", "decide", "emptied_nodes", "nodes_wanted", "recheck"]


@dataclass(frozen=True)
class ExternalGroupSize:
    """One provider's worker group as the policy wants it."""

    provider: str
    num_nodes: int
    """Nodes placement's request needs (`nodes_wanted`)."""
    remove_node_ids: tuple[str, ...]
    """Ray node ids of emptied nodes to take on a shrink, at most the surplus; empty when the
    group grows, stays, or has no emptied node."""
    reason: str


def nodes_wanted(requested_gpus: int, gpus_per_node: int) -> int:
    """Whole nodes for `requested_gpus`, e.g. 3 GPUs at 2 a node -> 2 nodes."""
    if requested_gpus < 0:
        raise ValueError(f"requested_gpus must be >= 0, got {requested_gpus}")
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    return -(-requested_gpus // gpus_per_node)


def _holders(snapshot: ClusterSnapshot) -> set[str]:
    """Nodes where a Serve replica (any state) or a gang (admitted or running) holds GPUs."""
    held = {r.node_id for r in snapshot.serve_replicas}
    for gang in snapshot.running:
        held.update(n for n, gpus in gang.gpus_by_node.items() if gpus > 0)
    return held


def emptied_nodes(
    snapshot: ClusterSnapshot,
    provider: str,
    providers: Sequence[Provider],
    reserved: Collection[str] = (),
) -> tuple[str, ...]:
    """The provider's external nodes that hold nothing (rule 2), unhealthy first, then by id."""
    held = _holders(snapshot)

    def empty(n: NodeView) -> bool:
        return (
            n.pool is Pool.EXTERNAL
            and provider_of(n, providers) == provider
            and n.node_id not in held
            and n.node_id not in reserved
            and n.gpus_free == n.gpus_total
        )

    nodes = sorted((n for n in snapshot.nodes if empty(n)), key=lambda n: (n.healthy, n.node_id))
    return tuple(n.node_id for n in nodes)


def decide(
    snapshot: ClusterSnapshot,
    requested_gpus: Mapping[str, int],
    gpus_per_node: Mapping[str, int],
    providers: Sequence[Provider],
    reserved: Collection[str] = (),
) -> tuple[ExternalGroupSize, ...]:
    """Each provider's group size (one per name of `gpus_per_node`, in its order) from what
    placement asks of it (`requested_gpus`, a name not in it: 0); on a shrink, the emptied
    nodes that go (rules 1-3)."""
    unknown = sorted(set(requested_gpus) - set(gpus_per_node))
    if unknown:
        raise ValueError(f"requested_gpus names providers without a node shape: {unknown}")
    sizes: list[ExternalGroupSize] = []
    for name, gpn in gpus_per_node.items():
        wanted = nodes_wanted(requested_gpus.get(name, 0), gpn)
        have = sum(
            1
            for n in snapshot.nodes
            if n.pool is Pool.EXTERNAL and provider_of(n, providers) == name
        )
        surplus = have - wanted
        if surplus <= 0:
            sizes.append(ExternalGroupSize(name, wanted, (), f"{name}: {wanted} node(s) wanted"))
            continue
        emptied = emptied_nodes(snapshot, name, providers, reserved)[:surplus]
        kept = surplus - len(emptied)
        reason = (
            f"{name}: {wanted} node(s) wanted of {have}; "
            + (f"take emptied {', '.join(emptied)}" if emptied else "no node is emptied")
            + (f"; {kept} more stay(s) until emptied (they hold work)" if kept else "")
        )
        sizes.append(ExternalGroupSize(name, wanted, emptied, reason))
    return tuple(sizes)


def recheck(size: ExternalGroupSize, busy: Collection[str]) -> ExternalGroupSize:
    """`size` without the named nodes found holding work at the write (rule 4): `busy` is
    what a fresh read shows holding a Serve replica or GPUs."""
    gained = [n for n in size.remove_node_ids if n in busy]
    if not gained:
        return size
    return replace(
        size,
        remove_node_ids=tuple(n for n in size.remove_node_ids if n not in busy),
        reason=f"{size.reason}; not {', '.join(gained)}: gained work since the decision",
    )
