"""What counts as bad: `HealthThresholds` and the fatal XID class.

Owns: every threshold of the health policy and its default, defined once here; the
``health`` config section embeds `HealthThresholds` (`controlplane.config.HealthConfig`).
Must not: read the config or the environment; the caller builds it (or passes the config
section, which is one).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_FATAL_XIDS",
    "HealthThresholds",
]


DEFAULT_FATAL_XIDS: tuple[int, ...] = (48, 61, 62, 64, 74, 79, 95, 119, 120, 140)
"""XIDs that mean the GPU (not the application) is broken: 48 double-bit ECC, 61/62
micro-controller halt, 64 row-remap failure, 74 NVLink error, 79 GPU fell off the bus,
95 uncontained ECC, 119/120 GSP errors, 140 unrecovered ECC. Application faults such as 13,
31, 43 or 45 are not in it."""


@dataclass
class HealthThresholds:
    """What counts as bad. The ``health`` config section is this class plus what the control
    plane does with verdicts (`controlplane.config.HealthConfig`), so each threshold and its
    default is defined here only (not frozen for that reason, like `RemovalBudget`; the
    policy never changes it)."""

    gpu_temp_c: float = 78.0
    """A GPU hotter than this is removed (after `hot_samples` samples)."""
    hot_samples: int = 2
    """Consecutive samples above gpu_temp_c before the node is unhealthy."""
    missing_samples: int = 3
    """Consecutive samples with fewer GPUs than the node advertises before it is unhealthy:
    one short read (a driver hiccup, an exporter restarting) is not a lost GPU."""
    fatal_xids: tuple[int, ...] = DEFAULT_FATAL_XIDS
    """XIDs that mean broken hardware; any other XID only marks the node degraded."""
    nvlink_errors_per_s: float = 1.0
    """NVLink CRC, replay and recovery errors per second on one GPU (all links) above which
    it is unhealthy."""
    ib_errors_per_s: float = 1.0
    """InfiniBand error counter increase per second on one port (all error counters) above
    which it is unhealthy."""
    ib_expected_width: int = 4
    """Lanes a healthy IB port runs at (4X); fewer marks the node degraded (0: no check)."""
    ib_min_rate_gbps: float = 0.0
    """A port slower than this marks the node degraded (0: no check)."""
    recover_after_samples: int = 3
    """Clean samples in a row before an unhealthy node is healthy again."""
    stale_after_s: float = 10.0
    """No new sample from a node's agent for this long (the caller's clock) marks it
    degraded (no_telemetry)."""
    lemon_count: int = 3
    """A node that turns unhealthy this many times within lemon_window_s is a lemon: it stays
    out until an operator clears it."""
    lemon_window_s: float = 86400.0
    """The lemon window."""

    def __post_init__(self) -> None:
        if self.hot_samples < 1:
            raise ValueError(f"hot_samples must be >= 1, got {self.hot_samples}")
        if self.missing_samples < 1:
            raise ValueError(f"missing_samples must be >= 1, got {self.missing_samples}")
        if self.recover_after_samples < 1:
            raise ValueError(
                f"recover_after_samples must be >= 1, got {self.recover_after_samples}"
            )
        if self.lemon_count < 1:
            raise ValueError(f"lemon_count must be >= 1, got {self.lemon_count}")
        self.fatal_xids = tuple(self.fatal_xids)
