"""The breaker: how many nodes health may newly take out of service per window.

Owns: `RemovalBudget` (the ``health.breaker`` config section), `BreakerState` (its memory:
removals within the window, held nodes, whether it is open) and the pure step
`limit_removals` (past the budget, verdicts are shown and alerted on but held, not acted on),
with `reset_breaker`, the operator's reset.
Must not: act, or read a clock (time arrives as `now_s`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from policies.health.verdicts import NodeVerdict, Verdict
from policies.snapshot import ClusterSnapshot, Pool

__all__ = [
    "BreakerState",
    "RemovalBudget",
    "limit_removals",
    "reset_breaker",
]


@dataclass
class RemovalBudget:
    """The breaker: how many nodes health may newly take out of service per window.

    Both limits apply: at most `max_nodes` across the fleet, and at most
    ``max(1, floor(max_pool_fraction * nodes in the pool))`` from one pool, per `window_s`.
    The count bounds what a systematic fault (an exporter rollout answering empty, a driver
    bug, a policy bug) can take, whatever the fleet's size; the fraction keeps a small pool
    from losing a large share of its capacity; the floor of 1 lets a pool of one still have
    its broken node replaced. Config: the ``health.breaker`` section embeds this class (not
    frozen for that reason: omegaconf makes frozen dataclasses read-only nodes).
    """

    max_nodes: int = 2
    """New removals across all pools per window; 0 holds every removal (report only)."""
    max_pool_fraction: float = 0.1
    """New removals from one pool per window, as a fraction of the pool's nodes (at least 1)."""
    window_s: float = 600.0
    """The window (default: one drain deadline, the time a removal takes)."""


@dataclass(frozen=True)
class BreakerState:
    """The breaker's memory: removals admitted within the window, whether it is open (latched)
    and since when, and what it holds now."""

    removals: tuple[tuple[str, str, float], ...] = ()
    """(node id, pool, caller time) of each removal admitted within the window. Kept after the
    node is gone: a replaced node still counts until its window ends."""
    held: tuple[str, ...] = ()
    """Nodes judged UNHEALTHY whose removal the breaker holds now."""
    opened_s: float | None = None
    """Caller time the breaker opened (a removal was held because the budget was spent); None
    while closed. Once open it stays open, holding every new removal, until `reset_breaker`."""

    @property
    def open(self) -> bool:
        return self.opened_s is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "removals": [list(r) for r in self.removals],
            "held": list(self.held),
            "opened_s": self.opened_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BreakerState:
        removals = tuple((str(n), str(p), float(t)) for n, p, t in data.get("removals", ()))
        held = tuple(str(n) for n in data.get("held", ()))
        opened = data.get("opened_s")
        return cls(removals, held, None if opened is None else float(opened))


def reset_breaker(state: BreakerState) -> BreakerState:
    """The operator's reset: the breaker closes and forgets what it held. The removals within
    the window still count (a reset lifts the latch, not the rate limit): if nodes are still
    unhealthy past the budget, the next `limit_removals` opens it again."""
    return BreakerState(removals=state.removals)


def _pool_cap(budget: RemovalBudget, pool_nodes: int) -> int:
    return max(1, int(budget.max_pool_fraction * pool_nodes))


def limit_removals(
    verdicts: Mapping[str, NodeVerdict],
    snapshot: ClusterSnapshot,
    budget: RemovalBudget,
    state: BreakerState,
    out: Iterable[str],
    now_s: float,
) -> tuple[dict[str, NodeVerdict], BreakerState]:
    """The verdicts to act on, with new removals past the budget held; the breaker's state.

    A new removal is an UNHEALTHY verdict for a cluster or external node of `snapshot` that is
    not in `out` (nodes already cordoned or drained) nor admitted earlier in the window. New
    removals are admitted in node id order while the fleet and pool budgets allow; the rest
    keep their verdict, marked `held`, with a detail saying why: `with_verdicts` and
    `remediate` leave them alone, while the verdict is still shown and exported (so both the
    node's and the breaker's alerts fire). Nodes already out are never held.

    The breaker latches: the first held removal opens it, and while it is open every new
    removal is held, whatever the budget, until an operator resets it (`reset_breaker`).
    A budget that refilled with time would only slow a fleet-wide fault, never stop it: 30
    nodes at 2 per 10 minutes are all gone in 2.5 hours. Removals admitted before it opened
    (and nodes already out) go on.

    Worked example (max_nodes 2, max_pool_fraction 0.1, window_s 600): a cluster pool of 30
    nodes (pool cap max(1, floor(3.0)) = 3) where an empty dcgm answer makes all 30 UNHEALTHY
    at t=1000 s. Nodes ``n00`` and ``n01`` are admitted (fleet cap 2 reached), ``n02``..``n29``
    are held; the breaker opens (opened_s 1000). At t=1601 s the window has passed, but the
    breaker is open: nothing is admitted, at t=10000 s neither. If an operator fixes the
    exporter, the verdicts clear and nothing is held, but the breaker stays open (a new
    fault on one node is held too) until the reset; after it, one unhealthy node is admitted.
    """
    out_set = set(out)
    removals = tuple(r for r in state.removals if now_s - r[2] < budget.window_s)
    admitted = {r[0] for r in removals}
    pools: dict[str, int] = {}
    for n in snapshot.nodes:
        pools[n.pool.value] = pools.get(n.pool.value, 0) + 1
    held: list[str] = []
    opened_s = state.opened_s
    acting = dict(verdicts)
    for n in sorted(snapshot.nodes, key=lambda n: n.node_id):
        v = verdicts.get(n.node_id)
        if (
            v is None
            or v.verdict is not Verdict.UNHEALTHY
            or n.pool is Pool.HEAD
            or n.node_id in out_set
            or n.node_id in admitted
        ):
            continue
        pool = n.pool.value
        in_pool = sum(1 for r in removals if r[1] == pool)
        cap = _pool_cap(budget, pools[pool])
        if state.opened_s is None and len(removals) < budget.max_nodes and in_pool < cap:
            removals = (*removals, (n.node_id, pool, now_s))
            admitted.add(n.node_id)
            continue
        held.append(n.node_id)
        if state.opened_s is None:
            opened_s = now_s
            why = (
                f"not acted on: health breaker open ({len(removals)} of {budget.max_nodes} "
                f"removals in the fleet, {in_pool} of {cap} in pool {pool}, "
                f"in the last {budget.window_s:g} s)"
            )
        else:
            why = (
                f"not acted on: health breaker open since t={state.opened_s:.0f} s; it holds "
                "every removal until an operator resets it"
            )
        acting[n.node_id] = replace(v, held=True, details=(*v.details, why))
    return acting, BreakerState(removals, tuple(held), opened_s)
