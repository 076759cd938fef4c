"""The admission policy's config: priority classes, preemption caps and team queues.

Owns: `AdmissionConfig` and its parts. `PreemptionConfig` (priority classes, the preemption
switch and caps) and `QueueShare` (one queue's share) are embedded by the ``jobs`` config
section (`controlplane.config.JobsConfig`), so each field and default is defined here only;
`controlplane.policy_config.admission_config` builds an `AdmissionConfig` from that section.
Invalid values raise ValueError naming the field.
Must not: read the control plane's config or the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.admission.borrow import BorrowConfig

__all__ = [
    "DEFAULT_PRIORITY_CLASSES",
    "DEFAULT_QUEUE",
    "AdmissionConfig",
    "PreemptionConfig",
    "QueueConfig",
    "QueueShare",
]

DEFAULT_PRIORITY_CLASSES: Mapping[str, int] = {"low": 0, "medium": 50, "high": 100}


@dataclass
class QueueShare:
    """A team queue's share of live `cluster` capacity. The ``jobs.queues.<name>`` config
    entries are this class (the name is the key); `QueueConfig` adds the name."""

    share: float = 1.0
    """Fraction of live capacity the queue owns, in (0, 1]; shares sum to at most 1."""
    borrowing_limit: float | None = None
    """Fraction of live capacity it may borrow beyond its share; None means any idle GPUs."""


@dataclass
class _QueueName:
    name: str


@dataclass
class QueueConfig(QueueShare, _QueueName):
    """A named team queue: ``QueueConfig(name, share=1.0, borrowing_limit=None)``.

    (`_QueueName` is the last base so that `name` is the first field.)"""


DEFAULT_QUEUE = "default"
"""The one queue of a cluster that configures none; it owns all of the capacity."""


def _default_queues() -> tuple[QueueConfig, ...]:
    return (QueueConfig(DEFAULT_QUEUE),)


def _default_priority_classes() -> dict[str, int]:
    return dict(DEFAULT_PRIORITY_CLASSES)


@dataclass(kw_only=True)
class PreemptionConfig:
    """Priority classes and the preemption between them. The ``jobs`` config section embeds
    this class (`controlplane.config.JobsConfig`), so each field and default is defined here
    only; `AdmissionConfig` adds the queues. The config classes here are not frozen because
    omegaconf makes a frozen dataclass a read-only node; the policy never changes them."""

    priority_classes: dict[str, int] = field(default_factory=_default_priority_classes)
    """Priority class name -> integer value; higher runs first and may preempt lower."""
    preemption_enabled: bool = True
    """Whether a higher-priority gang may preempt (checkpoint, stop, re-queue) a lower one."""
    max_preemptions_per_hour: int = 20
    """Preemptions allowed in any rolling hour, all jobs together."""
    max_preemptions_per_job_per_hour: int = 2
    """Times one job may be preempted in a rolling hour."""


@dataclass
class AdmissionConfig(PreemptionConfig):
    """Knobs of the admission policy. Invalid values raise ValueError naming the field."""

    queues: tuple[QueueConfig, ...] = field(default_factory=_default_queues)
    """Team queues with their shares of live capacity."""
    move_serve_replicas: bool = True
    """Count in-cluster Serve GPUs as reclaimable and ask for replicas to move."""
    cluster_nodes: int | None = None
    """The nodes the cluster pool should have (``pools.cluster.num_nodes``): fewer seen means a
    replacement is on its way. None: unknown, and a gang that lost a node never waits for one."""
    borrow: BorrowConfig = field(default_factory=BorrowConfig)
    """What a replacement node and a replica's move take (`policies.admission.borrow`)."""

    def __post_init__(self) -> None:
        errors: list[str] = []
        if not self.priority_classes:
            errors.append("priority_classes: at least one class is required")
        for name, value in self.priority_classes.items():
            if not name or isinstance(value, bool) or not isinstance(value, int):
                errors.append(f"priority_classes.{name}: must be an integer, got {value!r}")
        if not self.queues:
            errors.append("queues: at least one queue is required")
        seen: set[str] = set()
        for q in self.queues:
            if q.name in seen:
                errors.append(f"queues.{q.name}: defined twice")
            seen.add(q.name)
            if not 0.0 < q.share <= 1.0:
                errors.append(f"queues.{q.name}.share: must be in (0, 1], got {q.share!r}")
            if q.borrowing_limit is not None and q.borrowing_limit < 0:
                errors.append(
                    f"queues.{q.name}.borrowing_limit: must be >= 0 or None, "
                    f"got {q.borrowing_limit!r}"
                )
        total_share = sum(q.share for q in self.queues)
        if total_share > 1.0 + 1e-6:
            errors.append(f"queues: shares must sum to at most 1, got {total_share:g}")
        for name in ("max_preemptions_per_hour", "max_preemptions_per_job_per_hour"):
            if getattr(self, name) < 0:
                errors.append(f"{name}: must be >= 0, got {getattr(self, name)!r}")
        if self.cluster_nodes is not None and self.cluster_nodes < 0:
            errors.append(f"cluster_nodes: must be >= 0 or None, got {self.cluster_nodes!r}")
        if errors:
            raise ValueError("invalid admission config: " + "; ".join(errors))
        self.priority_classes = dict(self.priority_classes)

    def queue(self, name: str) -> QueueConfig | None:
        for q in self.queues:
            if q.name == name:
                return q
        return None
