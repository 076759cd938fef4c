"""Placement's memory (`PlacementState`): the caller stores it and hands it back next tick."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.providers import ProviderState
from policies.snapshot import Pool


@dataclass(frozen=True)
class PlacementState:
    """The policy's memory; the caller stores it and hands it back next tick."""

    room_since_s: float | None = None
    last_step_back_s: float | None = None
    requested_external_gpus: int = 0
    route_weights: Mapping[str, tuple[tuple[Pool, float], ...]] = field(default_factory=dict)
    providers: Mapping[str, ProviderState] = field(default_factory=dict)
    """Each provider's request and delivery record (rule 6, `policies.providers`)."""
    draining_node: str | None = None
    """The external node rule 6 drained last; no other is drained while it is live."""
    last_drain_s: float | None = None

    def provider_requests(self) -> tuple[tuple[str, int], ...]:
        """What each provider was asked for, by name."""
        return tuple(sorted((k, s.requested_gpus) for k, s in self.providers.items()))
