"""The agent's Prometheus endpoint: the latest summary as metrics, in its own registry.

Owns: `SummaryCollector` (a prometheus-client collector that renders the newest summary at
scrape time) and `start_exporter` (an HTTP server on one address, port 0 = a free one).
Metric names follow dcgm-exporter where it has one (DCGM_FI_DEV_GPU_TEMP, ...); the rest are
``rcp_*``. Labels: node, pool, gpu (GPU metrics), port (``mlx5_0/1``, IB metrics), plus counter
or reason where a metric has several. Every metric is a gauge: the values are copies of what
the source read, rates already computed by the sampler.
Must not: sample (scrapes never touch the hardware) or bind anything but the given address.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.telemetry.dcgm import NVLINK_ERROR_FIELDS

__all__ = ["GPU_METRICS", "SummaryCollector", "start_exporter"]

GPU_METRICS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_GPU_TEMP", "temp_c", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_SLOWDOWN_TEMP", "slowdown_temp_c", "Slowdown temperature threshold (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", "Power draw (in W)."),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_limit_w", "Enforced power limit (in W)."),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "mem_clock_mhz", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_FB_USED", "fb_used_mib", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gpu_util_pct", "GPU utilization (in %)."),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "tensor_active_ratio",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
    ),
    ("DCGM_FI_DEV_XID_ERRORS", "last_xid", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_sbe_volatile", "Single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_dbe_volatile", "Double-bit volatile ECC errors."),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "remapped_rows_correctable",
        "Remapped rows for correctable errors.",
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "remapped_rows_uncorrectable",
        "Remapped rows for uncorrectable errors.",
    ),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "row_remap_pending", "Whether a row remap is pending."),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "row_remap_failure", "Whether remapping of rows has failed."),
    ("rcp_gpu_nvlink_links", "nvlink_links_total", "NVLink links present."),
    ("rcp_gpu_nvlink_links_up", "nvlink_links_up", "NVLink links up."),
    (
        "rcp_gpu_nvlink_errors_per_second",
        "nvlink_errors_per_s",
        "NVLink CRC, replay and recovery errors per second, all links.",
    ),
)
"""(metric name, summary key, help) for per-GPU values."""

_PORT_METRICS: tuple[tuple[str, str, str], ...] = (
    ("rcp_ib_port_up", "up", "1 when the port is ACTIVE and LinkUp."),
    ("rcp_ib_port_rate_gbps", "rate_gbps", "Port rate (in Gb/s)."),
    ("rcp_ib_port_width_lanes", "width", "Active lanes (4 for 4X)."),
    ("rcp_ib_port_xmit_bytes_per_second", "xmit_bytes_per_s", "Transmitted bytes per second."),
    ("rcp_ib_port_rcv_bytes_per_second", "rcv_bytes_per_s", "Received bytes per second."),
    ("rcp_ib_port_errors_per_second", "errors_per_s", "Error counter increase per second."),
    ("rcp_ib_port_xmit_wait_per_second", "xmit_wait_per_s", "port_xmit_wait ticks per second."),
)


def _gauges(
    metrics: tuple[tuple[str, str, str], ...], rows: list[Any], label: str, node: str, pool: str
) -> Iterator[GaugeMetricFamily]:
    """One family per (name, key, help) of `metrics`: each row's number under `key`, labelled
    with the row's `label` (its ``gpu`` or ``port``); None and text are left out."""
    for name, key, help_text in metrics:
        family = GaugeMetricFamily(name, help_text, labels=["node", "pool", label])
        for row in rows:
            value = row.get(key)
            if value is not None and not isinstance(value, str):
                family.add_metric([node, pool, str(row[label])], float(value))
        yield family


class SummaryCollector(Collector):
    """Renders whatever `latest()` returns at scrape time (nothing before the first sample)."""

    def __init__(self, latest: Callable[[], dict[str, Any] | None]) -> None:
        self.latest = latest

    def collect(self) -> Iterator[GaugeMetricFamily]:
        summary = self.latest()
        if summary is None:
            return
        node, pool = str(summary["node_id"]), str(summary["pool"])
        gpus = summary.get("gpus", [])
        yield from _gauges(GPU_METRICS, gpus, "gpu", node, pool)
        for counter, name in NVLINK_ERROR_FIELDS.items():
            family = GaugeMetricFamily(
                name, f"NVLink {counter} errors, all links.", labels=["node", "pool", "gpu"]
            )
            for g in gpus:
                value = (g.get("nvlink_error_counts") or {}).get(counter)
                if value is not None:
                    family.add_metric([node, pool, str(g["gpu"])], float(value))
            yield family
        throttle = GaugeMetricFamily(
            "rcp_gpu_throttle_reason",
            "1 for each clock throttle (event) reason active now.",
            labels=["node", "pool", "gpu", "reason"],
        )
        for g in gpus:
            for reason in g.get("throttle_reasons") or ():
                throttle.add_metric([node, pool, str(g["gpu"]), reason], 1.0)
        yield throttle
        ports = summary.get("ib_ports", [])
        yield from _gauges(_PORT_METRICS, ports, "port", node, pool)
        for group in ("counters", "hw_counters"):
            family = GaugeMetricFamily(
                f"rcp_ib_port_{group}",
                f"Raw IB {group}/* values (data counters in 4-byte words).",
                labels=["node", "pool", "port", "counter"],
            )
            for p in ports:
                for counter, value in sorted((p.get(group) or {}).items()):
                    family.add_metric([node, pool, str(p["port"]), counter], float(value))
            yield family
        info = GaugeMetricFamily(
            "rcp_telemetry_sample_seq",
            "Sequence number of the sample shown; problems counts what could not be read.",
            labels=["node", "pool", "source"],
        )
        info.add_metric([node, pool, str(summary.get("source"))], float(summary.get("seq", 0)))
        yield info
        problems = GaugeMetricFamily(
            "rcp_telemetry_problems",
            "Things the last sample could not read.",
            labels=["node", "pool"],
        )
        problems.add_metric([node, pool], float(len(summary.get("problems", []))))
        yield problems


def start_exporter(collector: Collector, host: str, port: int = 0) -> tuple[Any, int]:
    """Serve `collector` at ``http://host:port/metrics``; returns (server, bound port)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, int(server.server_port)
