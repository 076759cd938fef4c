"""The sections that watch the nodes: telemetry, health, and local mode's Prometheus.

Owns: `TelemetryConfig` (the per-node agents and where readings come from), `HealthConfig`
(the health policy's own `HealthThresholds` and `RemovalBudget` plus what the control plane
does with verdicts) and `ObservabilityConfig`.

Must not: copy a field of the policy's dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from controlplane.config.checks import (
    MAX_BATCH,
    MAX_DEADLINE_S,
    MAX_SCRAPE_TIMEOUT_S,
    ExporterPort,
    Port,
    waits,
)
from policies.health import HealthThresholds, RemovalBudget
from policies.validation import at_least, at_most, one_of

__all__ = ["TELEMETRY_SOURCES", "HealthConfig", "ObservabilityConfig", "TelemetryConfig"]


TELEMETRY_SOURCES = ("simulated", "nvml", "dcgm")


@dataclass
class TelemetryConfig:
    """The per-node telemetry agents (GPU, NVLink, InfiniBand) and their Prometheus exporters."""

    interval_s: Annotated[float, at_least(0.05), waits()] = 1.0
    """Seconds between two samples on every node."""
    source: Annotated[str, one_of(TELEMETRY_SOURCES)] = "simulated"
    """Where GPU readings come from: simulated (local mode), nvml or dcgm (a dcgm-exporter)."""
    dcgm_url: str = "http://127.0.0.1:9400/metrics"
    """The node-local dcgm-exporter endpoint scraped when source is dcgm."""
    dcgm_timeout_s: Annotated[float, at_least(0.1), waits(MAX_SCRAPE_TIMEOUT_S)] = 2.0
    """Timeout of one dcgm-exporter scrape."""
    ib_sysfs_root: str = "/sys/class/infiniband"
    """Where InfiniBand ports are read (nvml and dcgm sources); a missing directory: no IB."""
    exporter_port: ExporterPort = 0
    """Port of each agent's Prometheus endpoint; 0 picks a free port per agent (needed when
    several simulated nodes share one IP)."""
    history_samples: Annotated[int, at_least(2), at_most(MAX_BATCH, "samples kept per node")] = 120
    """Samples each agent keeps for the health policy and `rcp health`."""
    simulated_ib_ports: Annotated[int, at_least(0)] = 2
    """InfiniBand ports per simulated GPU node."""
    stop_agents_on_idle_external: bool = True
    """Run no agent on an external node while nothing runs there: Ray counts a node with a
    live actor as busy, so an agent would stop the external pool from scaling to zero."""


@dataclass
class HealthConfig(HealthThresholds):
    """The ``health`` section: when telemetry makes a node degraded or unhealthy (the health
    policy's own `policies.health.HealthThresholds`, each field defined and defaulted there),
    and what the control plane does about it (the fields below)."""

    breaker: RemovalBudget = field(default_factory=RemovalBudget)
    """At most max_nodes (fleet) and max_pool_fraction of a pool (at least 1) newly removed per
    window_s; past it, verdicts are shown and alerted on but not acted on (policies/health
    `RemovalBudget`)."""
    act: bool = True
    """Act on verdicts: cordon, checkpoint-and-restart gangs, move replicas, drain. False only
    reports them (``rcp health``, ``rcp nodes``, metrics)."""
    drain_deadline_s: Annotated[float, at_least(1), waits(MAX_DEADLINE_S)] = 600.0
    """Ray drain deadline of an unhealthy node: Serve moves its replicas off make-before-break
    before it, and nothing new is scheduled there meanwhile."""
    replace_drained: bool = True
    """Once a drained node holds nothing, stop it so its node group replaces it (local mode:
    its raylet; Kubernetes: the actuator deletes its pod)."""

    def __post_init__(self) -> None:
        # No ValueError here: `controlplane.config.validation` checks the policy's fields and
        # names each key (``health.hot_samples: must be >= 1``).
        self.fatal_xids = tuple(self.fatal_xids)


@dataclass
class ObservabilityConfig:
    """Local mode's Prometheus (production runs its own: infra/prometheus)."""

    prometheus: bool = True
    """`rcp up` starts the ``prometheus`` binary on loopback (when installed) scraping every
    node's Ray metrics agent and the telemetry agents, with the alert rules, and points the Ray
    dashboard's Metrics tab at it. Not fatal: without the binary or a free port `up` says so
    and goes on."""
    prometheus_port: Port = 9090
    scrape_interval_s: Annotated[float, at_least(0.5), waits()] = 5.0
