"""A simulated node for local mode and tests: plausible GPU and IB readings, injectable faults.

Owns: `SimulatedSource` and the fault kinds (`FAULT_KINDS`). Readings are deterministic (no
clock, no randomness): each read advances an internal step; counters grow by fixed amounts.
Must not: pretend to be anything but simulated (its summaries say source=simulated).

Faults (all on GPU 0 / the first IB port, until ``clear``):

- ``hot-gpu``: GPU 0 reads `HOT_GPU_TEMP_C` (91.5 C) with a hardware thermal slowdown.
- ``xid``: GPU 0 reports XID 79 (fell off the bus) once, on the next read.
- ``nvlink-errors``: GPU 0's NVLink CRC flit errors grow by 500 per read.
- ``ib-errors``: the first port's symbol_error and port_rcv_errors grow by 100 per read.
- ``ib-link-down``: the first port goes DOWN/Disabled and link_downed grows by 1.
- ``clear``: all of the above stop; counters keep their values (they are cumulative).
"""

from __future__ import annotations

from controlplane.telemetry.readings import (
    GpuReading,
    IbPortReading,
    SourceReading,
    TelemetryError,
)

__all__ = ["FAULT_KINDS", "HOT_GPU_TEMP_C", "INJECTED_XID", "SimulatedSource"]

FAULT_KINDS = ("hot-gpu", "xid", "nvlink-errors", "ib-errors", "ib-link-down", "clear")
HOT_GPU_TEMP_C = 91.5
INJECTED_XID = 79
_NVLINKS_PER_GPU = 4
_WORDS_PER_READ = 250_000_000  # 1 GB per read each way
_IB_COUNTERS = (
    "port_xmit_data",
    "port_rcv_data",
    "symbol_error",
    "port_rcv_errors",
    "link_downed",
    "port_xmit_wait",
)


class SimulatedSource:
    kind = "simulated"

    def __init__(self, num_gpus: int, num_ib_ports: int = 2) -> None:
        if num_gpus < 0 or num_ib_ports < 0:
            raise ValueError(f"need num_gpus, num_ib_ports >= 0, got {num_gpus}, {num_ib_ports}")
        self.num_gpus = num_gpus
        self.num_ib_ports = num_ib_ports if num_gpus else 0
        self.faults: set[str] = set()
        self._pending_xid = False
        self._step = 0
        self._nvlink_crc_flit = [0] * num_gpus
        self._ib = [dict.fromkeys(_IB_COUNTERS, 0) for _ in range(self.num_ib_ports)]
        self._last_xid = [0] * num_gpus

    def inject_fault(self, kind: str) -> None:
        if kind not in FAULT_KINDS:
            raise TelemetryError(f"unknown fault {kind!r}; one of: {', '.join(FAULT_KINDS)}")
        if kind == "clear":
            self.faults.clear()
            self._pending_xid = False
            return
        if kind in {"hot-gpu", "xid", "nvlink-errors"} and not self.num_gpus:
            raise TelemetryError(f"fault {kind!r} needs a node with GPUs; this one has none")
        if kind in {"ib-errors", "ib-link-down"} and not self.num_ib_ports:
            raise TelemetryError(f"fault {kind!r} needs a node with IB ports; this one has none")
        if kind == "xid":
            self._pending_xid = True
        if kind == "ib-link-down" and kind not in self.faults:
            self._ib[0]["link_downed"] += 1
        self.faults.add(kind)

    def _gpu(self, i: int) -> GpuReading:
        hot = i == 0 and "hot-gpu" in self.faults
        new_xids: tuple[int, ...] = ()
        if i == 0 and self._pending_xid:
            new_xids = (INJECTED_XID,)
            self._last_xid[0] = INJECTED_XID
        if i == 0 and "nvlink-errors" in self.faults:
            self._nvlink_crc_flit[0] += 500
        busy = 0.55 + 0.05 * ((self._step + i) % 4)
        return GpuReading(
            gpu=i,
            uuid=f"GPU-sim-{i:04d}",
            temp_c=HOT_GPU_TEMP_C if hot else 45.0 + 2 * i + (self._step % 3),
            slowdown_temp_c=87.0,
            power_w=(650.0 if hot else 300.0 + 100 * busy),
            power_limit_w=700.0,
            sm_clock_mhz=1200.0 if hot else 1980.0,
            mem_clock_mhz=2619.0,
            throttle_reasons=("hw_thermal_slowdown",) if hot else (),
            fb_used_mib=40_000.0,
            fb_total_mib=81_559.0,
            gpu_util_pct=100.0,
            tensor_active_ratio=round(busy, 3),
            last_xid=self._last_xid[i],
            new_xids=new_xids,
            ecc_sbe_volatile=0,
            ecc_dbe_volatile=0,
            remapped_rows_correctable=0,
            remapped_rows_uncorrectable=0,
            row_remap_pending=False,
            row_remap_failure=False,
            nvlink_links_total=_NVLINKS_PER_GPU,
            nvlink_links_up=_NVLINKS_PER_GPU,
            nvlink_error_counts={
                "crc_flit": self._nvlink_crc_flit[i],
                "crc_data": 0,
                "replay": 0,
                "recovery": 0,
            },
        )

    def _port(self, p: int) -> IbPortReading:
        c = self._ib[p]
        down = p == 0 and "ib-link-down" in self.faults
        if not down:
            c["port_xmit_data"] += _WORDS_PER_READ
            c["port_rcv_data"] += _WORDS_PER_READ
            c["port_xmit_wait"] += 1000
        if p == 0 and "ib-errors" in self.faults:
            # Real 16-bit error counters saturate at 65535; these do not, so a fault lasts
            # until `clear` however long the demo runs.
            c["symbol_error"] += 100
            c["port_rcv_errors"] += 100
        return IbPortReading(
            device=f"mlx5_{p}",
            port=1,
            state="DOWN" if down else "ACTIVE",
            phys_state="Disabled" if down else "LinkUp",
            rate_gbps=400.0,
            width=4,
            link_layer="InfiniBand",
            counters=dict(c),
            hw_counters={"out_of_buffer": 0, "local_ack_timeout_err": 0},
        )

    def read(self) -> SourceReading:
        gpus = tuple(self._gpu(i) for i in range(self.num_gpus))
        self._pending_xid = False
        ports = tuple(self._port(p) for p in range(self.num_ib_ports))
        self._step += 1
        return SourceReading(gpus=gpus, ports=ports)
