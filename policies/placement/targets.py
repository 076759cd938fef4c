"""What placement is asked and what it answers, per model: `ModelDemand` in, `PoolTargets` out."""

from __future__ import annotations

from dataclasses import dataclass

from policies.model_classes import ModelClass


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


@dataclass(frozen=True)
class PoolTargets:
    """The decided replica count per pool for one model (what the actuator scales to)."""

    model: str
    cluster: int
    external: int
    note: str = ""
    """Why the targets fall short of the demand (e.g. the external pool is full), if they do."""
