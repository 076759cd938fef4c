"""The simulated fleet's nodes and the terms its external providers rent them on.

Owns: `ProviderSpec` (one provider of the external pool: its node size, most nodes, price and
stock-out windows) and `Node` (one node's GPUs and who holds how many, whether it is up or
taken out of service, an external node's provider, billing start and reclaim time, and its
row of the snapshot, cached until it changes).

Must not: book GPUs or change a node's state on its own (`controlplane.simulate.world.World`
does both, and never double-books), or decide (schemes do).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.providers import PROVIDER_LABEL
from policies.snapshot import NodeView, Pool

__all__ = ["Node", "ProviderSpec"]


@dataclass(frozen=True)
class ProviderSpec:
    """One provider of the external pool, as the world rents from it."""

    name: str
    gpus_per_node: int
    max_nodes: int
    price_per_gpu_hour: float
    stockouts_s: tuple[tuple[float, float], ...] = ()
    """(start, end) seconds in which it delivers no node."""

    @property
    def max_gpus(self) -> int:
        return self.gpus_per_node * self.max_nodes


@dataclass
class Node:
    node_id: str
    pool: Pool
    gpus: int
    used: int = 0
    up: bool = True
    out: bool = False
    """Taken out of service by a scheme (a cordon, a health drain; an external node drained)."""
    fault: str | None = None
    version: int = 0
    ready_s: float = 0.0
    provider: str = ""
    """An external node's provider."""
    billed_from_s: float = 0.0
    """An external node is billed from then (its provider starts provisioning it)."""
    reclaim_at_s: float | None = None
    """An external node its provider reclaims: when it goes (the notice ends)."""
    _view: NodeView | None = None

    @property
    def free(self) -> int:
        return self.gpus - self.used if self.up and not self.out else 0

    def view(self) -> NodeView:
        """The snapshot's row (cached until the node changes). A drained external node is
        not healthy: its GPUs are leaving."""
        if self._view is None:
            external = self.pool is Pool.EXTERNAL
            self._view = NodeView(
                self.node_id,
                self.pool,
                self.gpus,
                max(0, self.gpus - self.used),
                self.up and not (external and self.out),
                {PROVIDER_LABEL: self.provider} if external else {},
            )
        return self._view

    def touch(self) -> None:
        self._view = None
        self.version += 1
