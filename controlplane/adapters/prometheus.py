"""The Prometheus targets adapter: local mode's file_sd list of the telemetry agents.

Owns: `PrometheusTargets.refresh(agent_nodes)`: rewrite the agents' target list when the
set of agents changes (a new agent may not answer yet: what was written is compared, not
what was asked), at most every `REFRESH_S`. Off on Kubernetes and without the local
Prometheus (``observability.prometheus``).

Must not: start or stop Prometheus (`controlplane.local.prometheus` does).
"""

from __future__ import annotations

import time

from controlplane.config import Config
from controlplane.observability import telemetry_targets_file, write_telemetry_targets

__all__ = ["REFRESH_S", "PrometheusTargets"]

REFRESH_S = 5.0


class PrometheusTargets:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.written: set[str] = set()
        self._next_s = 0.0

    def refresh(self, agent_nodes: set[str]) -> None:
        if not self.cfg.observability.prometheus or self.cfg.kubernetes.enabled:
            return
        now = time.monotonic()
        if agent_nodes == self.written or now < self._next_s:
            return
        self._next_s = now + REFRESH_S
        path = telemetry_targets_file(self.cfg)
        groups = write_telemetry_targets(path, timeout_s=self.cfg.policy.tick_s)
        self.written = {str(g["labels"]["rcp_node"]) for g in groups}
