"""What the health policy says about a node: `Verdict`, its `HealthReason` codes and the
`NodeVerdict` that carries them with human-readable details.

Owns: the output types of `policies.health.evaluate`, which `remediate`, the breaker, the
event log, ``rcp health`` and the metrics read.
Must not: decide anything; every rule lives in `policies.health.evaluation`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = [
    "FABRIC_REASONS",
    "HealthReason",
    "NodeVerdict",
    "Verdict",
]


class Verdict(str, Enum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    """Keeps working; an operator should look. Placement may prefer other nodes."""
    SERVING_ONLY = "serving_only"
    """Its fabric (InfiniBand, NVLink) is bad, its GPUs are not: no gang is admitted there
    and gangs on it checkpoint and restart elsewhere, but Serve replicas keep running there
    and may start there. Nothing is drained; it is fit for gangs again once it recovers."""
    UNHEALTHY = "unhealthy"
    """Out of service: nothing new lands, work moves away, the node is drained."""


class HealthReason(str, Enum):
    GPU_OVERHEATED = "gpu_overheated"
    GPU_TEMP_HIGH = "gpu_temp_high"
    GPU_THERMAL_THROTTLE = "gpu_thermal_throttle"
    GPU_MISSING = "gpu_missing"
    XID_FATAL = "xid_fatal"
    XID_NONFATAL = "xid_nonfatal"
    ECC_UNCORRECTABLE = "ecc_uncorrectable"
    ROW_REMAP_FAILURE = "row_remap_failure"
    ROW_REMAP_PENDING = "row_remap_pending"
    NVLINK_DOWN = "nvlink_down"
    NVLINK_ERRORS = "nvlink_errors"
    IB_LINK_DOWN = "ib_link_down"
    IB_LINK_DEGRADED = "ib_link_degraded"
    IB_ERRORS = "ib_errors"
    NO_TELEMETRY = "no_telemetry"
    LEMON = "lemon"


FABRIC_REASONS: frozenset[HealthReason] = frozenset(
    {
        HealthReason.NVLINK_DOWN,
        HealthReason.NVLINK_ERRORS,
        HealthReason.IB_LINK_DOWN,
        HealthReason.IB_ERRORS,
    }
)
"""Unhealthy reasons that concern the fabric between GPUs, not a GPU: a gang's collectives
need it, a replica serving on its own GPUs does not. A node unhealthy for these alone is
`Verdict.SERVING_ONLY`."""


@dataclass(frozen=True)
class NodeVerdict:
    node_id: str
    verdict: Verdict
    reasons: tuple[HealthReason, ...] = ()
    details: tuple[str, ...] = ()
    """Human-readable specifics, e.g. ``gpu 0 at 91.5 C > 78 C for 2 samples``."""
    lemon: bool = False
    held: bool = False
    """UNHEALTHY, but the breaker (`limit_removals`) holds it: shown and alerted on, not acted
    on (the node stays in capacity, nothing is cordoned, preempted or moved)."""

    @property
    def reason(self) -> str:
        """One line for an action's `reason` and the event log."""
        if not self.reasons:
            details = f" ({'; '.join(self.details)})" if self.details else ""
            return f"{self.verdict.value}{details}"
        text = f"{self.verdict.value}: {', '.join(r.value for r in self.reasons)}"
        return f"{text} ({'; '.join(self.details)})" if self.details else text
