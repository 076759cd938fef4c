"""A served model's class: how it stands when training claims the cluster pool.

Owns: `ModelClass` (a model's priority value, its floor on the ``cluster`` pool, whether its
latency SLO is at risk now) and `yield_key`, the one order both sides of a claim use:
admission (`policies.admission`) claims replicas in that order and never the floor ones, and
placement (`policies.placement`) keeps cluster replicas and brings them back in the reverse.

The order, first to yield: lowest priority value first; within a value, a model whose SLO is
not at risk before one whose SLO is; then by name. Migration back runs the other way.

Worked example: ``ranker`` (high = 100, floor 2), ``batch`` (low = 0) and ``chat`` (low, SLO
at risk). Yield order: ``batch``, ``chat``, ``ranker``; back to the cluster pool: ``ranker``,
``chat``, ``batch``; of ``ranker``'s cluster replicas 2 are never claimed.

Must not: read config or a clock; the caller maps its config (priority class names, the
measured p99 against the SLO) to these values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ModelClass", "yield_key"]


@dataclass(frozen=True)
class ModelClass:
    """One model's standing under a training claim."""

    priority: int = 0
    """The value of the model's priority class (the job classes' values: higher keeps its
    cluster replicas longer)."""
    min_cluster_replicas: int = 0
    """Cluster-pool replicas a training claim never takes (a gang that needs them waits)."""
    slo_at_risk: bool = False
    """Whether the model's measured p99 is over its SLO now: it yields last in its class."""
    yields_on_shortfall: bool = False
    """``on_shortfall: yield``: a claim may take its cluster replicas though no rented GPU can
    host them (it shrinks toward ``min_replicas``), and it grows only where there is room.
    False (``reclaim``): its demand is a guarantee (`policies.placement`)."""

    def __post_init__(self) -> None:
        if self.min_cluster_replicas < 0:
            raise ValueError(f"min_cluster_replicas must be >= 0, got {self.min_cluster_replicas}")


def yield_key(model: str, classes: Mapping[str, ModelClass]) -> tuple[int, bool, str]:
    """Sort key, first to yield first (see the module doc); a model without a class is
    ``ModelClass()``: the lowest value, no floor, not at risk."""
    c = classes.get(model, _DEFAULT)
    return (c.priority, c.slo_at_risk, model)


_DEFAULT = ModelClass()
