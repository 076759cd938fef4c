"""The health policy's memory between ticks, which the caller stores and hands back.

Owns: `HealthState` (per node: hot and missing streaks, held verdicts, lemon records) with
its JSON form, `keep_nodes` (forget nodes that are gone) and `clear_lemon` (the operator's
way to let a lemon back in).
Must not: judge samples (`policies.health.evaluation` does) or store anything itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Any

from policies.health.verdicts import HealthReason

__all__ = [
    "HealthState",
    "NodeHealthState",
    "clear_lemon",
    "keep_nodes",
]


@dataclass(frozen=True)
class NodeHealthState:
    """One node's memory between ticks."""

    last_sampled_s: float | None = None
    """Agent time of the newest sample already evaluated."""
    last_new_sample_now_s: float | None = None
    """Caller time at which a new sample was last seen (for staleness)."""
    hot_streaks: tuple[tuple[int, int], ...] = ()
    """(gpu, consecutive hot samples) for GPUs currently hot."""
    missing_streak: int = 0
    """Consecutive samples with fewer GPUs than expected."""
    unhealthy: bool = False
    held_reasons: tuple[HealthReason, ...] = ()
    """Reasons that made the node unhealthy, kept until it recovers."""
    clean_samples: int = 0
    """Clean samples in a row since the node last had an unhealthy cause."""
    degraded_reasons: tuple[HealthReason, ...] = ()
    """Degraded reasons of the newest sample."""
    details: tuple[str, ...] = ()
    unhealthy_turns_s: tuple[float, ...] = ()
    """Caller times at which the node turned unhealthy, within the lemon window."""
    lemon: bool = False


@dataclass(frozen=True)
class HealthState:
    """The policy's memory: per node, by node id. Store it and pass it back next tick."""

    nodes: Mapping[str, NodeHealthState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", MappingProxyType(dict(self.nodes)))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values, for the caller's store; `from_dict` reads them back."""
        return {node_id: _plain(asdict(n)) for node_id, n in self.nodes.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HealthState:
        def opt(v: Any) -> float | None:
            return None if v is None else float(v)

        return cls(
            {
                str(node_id): NodeHealthState(
                    last_sampled_s=opt(n.get("last_sampled_s")),
                    last_new_sample_now_s=opt(n.get("last_new_sample_now_s")),
                    hot_streaks=tuple((int(g), int(c)) for g, c in n.get("hot_streaks", ())),
                    missing_streak=int(n.get("missing_streak", 0)),
                    unhealthy=bool(n.get("unhealthy", False)),
                    held_reasons=tuple(HealthReason(r) for r in n.get("held_reasons", ())),
                    clean_samples=int(n.get("clean_samples", 0)),
                    degraded_reasons=tuple(HealthReason(r) for r in n.get("degraded_reasons", ())),
                    details=tuple(str(d) for d in n.get("details", ())),
                    unhealthy_turns_s=tuple(float(t) for t in n.get("unhealthy_turns_s", ())),
                    lemon=bool(n.get("lemon", False)),
                )
                for node_id, n in data.items()
            }
        )


def _plain(value: Any) -> Any:
    """`value` with tuples as lists and enums as their values (JSON)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value.value if isinstance(value, Enum) else value


def keep_nodes(state: HealthState, node_ids: Iterable[str]) -> HealthState:
    """`state` with only the records of `node_ids` (the nodes that still exist).

    Ray never reuses a node id, so the record of a node that is gone can never matter again;
    without this, every node an autoscaler ever added would stay in the stored state.
    """
    keep = set(node_ids)
    return HealthState({n: v for n, v in state.nodes.items() if n in keep})


def clear_lemon(state: HealthState, node_ids: Iterable[str]) -> HealthState:
    """The operator's clear: forget the lemon record and held verdict of `node_ids`."""
    nodes = dict(state.nodes)
    for node_id in node_ids:
        if node_id in nodes:
            nodes[node_id] = replace(
                nodes[node_id],
                lemon=False,
                unhealthy=False,
                held_reasons=(),
                unhealthy_turns_s=(),
            )
    return HealthState(nodes)
