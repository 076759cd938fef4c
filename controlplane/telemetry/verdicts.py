"""The bridge from telemetry summaries to the pure health policy.

Owns: `node_sample` (summary dict -> `policies.health.NodeSample`) and `judge` (summaries of
many nodes -> verdicts, threading `HealthState` through). The ``health`` config section is
the policy's `HealthThresholds` itself, so it goes to the policy as it is.
Must not: talk to Ray or read a clock; callers pass `now_s`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controlplane.config import HealthConfig
from policies.health import (
    GpuSample,
    HealthState,
    NodeSample,
    NodeVerdict,
    PortSample,
    evaluate,
)

__all__ = ["judge", "node_sample"]


def node_sample(summary: Mapping[str, Any]) -> NodeSample:
    gpus = tuple(
        GpuSample(
            gpu=int(g["gpu"]),
            temp_c=g.get("temp_c"),
            thermal_throttle=bool(g.get("thermal_throttle")),
            new_xids=tuple(int(x) for x in g.get("new_xids") or ()),
            ecc_uncorrectable_total=g.get("ecc_dbe_volatile"),
            row_remap_failure=bool(g.get("row_remap_failure")),
            row_remap_pending=bool(g.get("row_remap_pending")),
            nvlink_links_total=g.get("nvlink_links_total"),
            nvlink_links_up=g.get("nvlink_links_up"),
            nvlink_errors_per_s=g.get("nvlink_errors_per_s"),
        )
        for g in summary.get("gpus", ())
    )
    ports = tuple(
        PortSample(
            port=str(p["port"]),
            up=bool(p.get("up")),
            width=p.get("width"),
            rate_gbps=p.get("rate_gbps"),
            errors_per_s=p.get("errors_per_s"),
            link_downed_delta=int(p.get("link_downed_delta") or 0),
        )
        for p in summary.get("ib_ports", ())
        # RoCE ports are Ethernet: their state is judged by the network, not here.
        if p.get("link_layer") in (None, "InfiniBand")
    )
    return NodeSample(
        node_id=str(summary["node_id"]),
        sampled_s=float(summary["sampled_s"]),
        gpus=gpus,
        ports=ports,
        gpus_expected=summary.get("gpus_expected"),
    )


def judge(
    samples_by_node: Mapping[str, Sequence[Mapping[str, Any]]],
    cfg: HealthConfig,
    state: HealthState | None,
    now_s: float,
) -> tuple[dict[str, NodeVerdict], HealthState]:
    """Verdicts for every node from its recent summaries; the state to keep for next time.

    A summary whose source failed (``source_ok`` false: e.g. dcgm-exporter down) is no sample
    at all: it neither clears nor condemns the node, which turns degraded (no_telemetry) once
    nothing usable has come for `health.stale_after_s`.
    """
    state = state or HealthState()

    def unseen(node_id: str, summary: Mapping[str, Any]) -> bool:
        # Parsing is most of the cost (the policy skips seen samples anyway): skip them first.
        node = state.nodes.get(node_id)
        last = node.last_sampled_s if node is not None else None
        return last is None or float(summary["sampled_s"]) > last

    samples = {
        node_id: [
            node_sample(s) for s in summaries if s.get("source_ok", True) and unseen(node_id, s)
        ]
        for node_id, summaries in samples_by_node.items()
    }
    return evaluate(samples, cfg, state, now_s)
