"""The health policy's input: what a node's telemetry agent saw, as plain frozen values.

Owns: `NodeSample` with its `GpuSample` and `PortSample` readings. ``None`` in a reading means
the source could not read it; it never counts as bad.
Must not: read telemetry; `controlplane.telemetry.verdicts.node_sample` builds these from an
agent's summary.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "GpuSample",
    "NodeSample",
    "PortSample",
]


@dataclass(frozen=True)
class GpuSample:
    """One GPU in one sample. None means the source could not read it (not counted as bad)."""

    gpu: int
    temp_c: float | None = None
    thermal_throttle: bool = False
    """The GPU reports a hardware or software thermal slowdown."""
    new_xids: tuple[int, ...] = ()
    """XIDs that occurred since the previous sample."""
    ecc_uncorrectable_total: int | None = None
    """Volatile uncorrectable ECC errors since the last GPU reset."""
    row_remap_failure: bool = False
    row_remap_pending: bool = False
    nvlink_links_total: int | None = None
    nvlink_links_up: int | None = None
    nvlink_errors_per_s: float | None = None


@dataclass(frozen=True)
class PortSample:
    """One InfiniBand port in one sample."""

    port: str
    """``<device>/<port number>``, e.g. ``mlx5_0/1``."""
    up: bool = True
    """State ACTIVE and physical state LinkUp."""
    width: int | None = None
    """Active lanes (4 for 4X)."""
    rate_gbps: float | None = None
    errors_per_s: float | None = None
    link_downed_delta: int = 0
    """Increase of the ``link_downed`` counter since the previous sample."""


@dataclass(frozen=True)
class NodeSample:
    """What a node's telemetry agent saw at `sampled_s` (the agent's clock)."""

    node_id: str
    sampled_s: float
    gpus: tuple[GpuSample, ...] = ()
    ports: tuple[PortSample, ...] = ()
    gpus_expected: int | None = None
    """GPUs the node advertises; more than `len(gpus)` means some are unreachable."""
