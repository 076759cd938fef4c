"""The telemetry adapter: the loop's way to the telemetry agents on every node.

Owns: `RayTelemetry`, the `controlplane.loop.types.Telemetry` the controller runs with:
start an agent on every alive node that lacks one (trusting only the actor ids this
controller recorded), read their recent samples, stop one (a node Ray drains for someone
else). The agents themselves live in `controlplane.telemetry`.

Must not: judge health (`controlplane.telemetry.verdicts` and `policies.health` do).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from controlplane.config import Config
from controlplane.telemetry import manager

__all__ = ["RayTelemetry"]


class RayTelemetry:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def ensure_agents(
        self, exclude: Collection[str], trusted: Mapping[str, str]
    ) -> list[manager.AgentRef]:
        return manager.ensure_agents(self.cfg, exclude=exclude, trusted=trusted)

    def collect_samples(
        self,
        max_samples: int,
        timeout_s: float,
        seen_until: Mapping[str, float | None],
        trusted: Mapping[str, str],
    ) -> Mapping[str, Sequence[Mapping[str, object]]]:
        return manager.collect_samples(
            max_samples=max_samples, timeout_s=timeout_s, seen_until=seen_until, trusted=trusted
        )

    def stop_agent(self, node_id: str) -> bool:
        return manager.stop_agent(node_id)
