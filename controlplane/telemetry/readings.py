"""What a telemetry source reads: plain, frozen values per GPU and per InfiniBand port.

Owns: the reading types every source returns (`GpuReading`, `IbPortReading`, `SourceReading`),
the clock-throttle reason bits NVML and DCGM share, and `TelemetryError`.
Must not: compute rates (that needs history: `sampling`) or judge health (`policies.health`).

A field is None when the source could not read it (not supported, blank, absent, garbage);
None never counts as bad.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "THERMAL_THROTTLE_REASONS",
    "THROTTLE_REASON_BITS",
    "GpuReading",
    "IbPortReading",
    "SourceReading",
    "TelemetryError",
    "throttle_reason_names",
]


class TelemetryError(RuntimeError):
    """A telemetry source, agent or request cannot do what was asked; the message says why."""


THROTTLE_REASON_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
"""NVML's clocks event (throttle) reason bits, also what DCGM_FI_DEV_CLOCK_THROTTLE_REASONS
reports."""

THERMAL_THROTTLE_REASONS = frozenset({"sw_thermal_slowdown", "hw_thermal_slowdown"})


def throttle_reason_names(mask: int) -> tuple[str, ...]:
    """Names of the reason bits set in `mask`, in bit order; unknown bits as ``bit_0x...``."""
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(THROTTLE_REASON_BITS.get(bit, f"bit_{bit:#x}"))
        bit <<= 1
    return tuple(names)


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant. Counters are cumulative as the source reports them."""

    gpu: int
    uuid: str | None = None
    temp_c: float | None = None
    slowdown_temp_c: float | None = None
    """The temperature at which the GPU starts to slow itself down."""
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    throttle_reasons: tuple[str, ...] = ()
    fb_used_mib: float | None = None
    fb_total_mib: float | None = None
    gpu_util_pct: float | None = None
    """"GPU utilization": the share of time any kernel ran. Reads 100% on a GPU doing little."""
    tensor_active_ratio: float | None = None
    """Share of cycles the tensor pipes were busy (0..1): the efficiency figure to watch."""
    last_xid: int | None = None
    """The most recent XID the GPU reported (0: none since the driver loaded)."""
    new_xids: tuple[int, ...] = ()
    """XIDs the source saw since its previous read (NVML events); empty for a source that only
    knows `last_xid` (the sampler then derives new XIDs from changes of `last_xid`)."""
    ecc_sbe_volatile: int | None = None
    """Corrected (single-bit) ECC errors since the last GPU reset."""
    ecc_dbe_volatile: int | None = None
    """Uncorrectable (double-bit) ECC errors since the last GPU reset."""
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    nvlink_links_total: int | None = None
    nvlink_links_up: int | None = None
    nvlink_error_counts: Mapping[str, int] = field(default_factory=dict)
    """Cumulative NVLink errors summed over links: crc_flit, crc_data, replay, recovery."""

    @property
    def thermal_throttle(self) -> bool:
        return bool(THERMAL_THROTTLE_REASONS.intersection(self.throttle_reasons))


@dataclass(frozen=True)
class IbPortReading:
    """One InfiniBand (or RoCE) port at one instant, as sysfs shows it."""

    device: str
    port: int
    state: str | None = None
    """Logical state name: ACTIVE, INIT, ARMED, DOWN."""
    phys_state: str | None = None
    """Physical state name: LinkUp, Polling, Disabled, ..."""
    rate_gbps: float | None = None
    width: int | None = None
    """Active lanes (4 for 4X)."""
    link_layer: str | None = None
    counters: Mapping[str, int] = field(default_factory=dict)
    """``counters/*``: port_xmit_data and port_rcv_data in 4-byte words, the rest in events."""
    hw_counters: Mapping[str, int] = field(default_factory=dict)
    """``hw_counters/*``: driver-specific counters (mlx5: out_of_buffer, local_ack_timeout_err)."""

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def up(self) -> bool:
        return self.state == "ACTIVE" and self.phys_state == "LinkUp"


@dataclass(frozen=True)
class SourceReading:
    """Everything one read of a source returned."""

    gpus: tuple[GpuReading, ...] = ()
    ports: tuple[IbPortReading, ...] = ()
    problems: tuple[str, ...] = ()
    """What could not be read, one line each (missing files, garbage values, blank fields)."""
