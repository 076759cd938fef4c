"""Pure routing decisions: which pool a request goes to, whether to try again, and the route
weights that follow replica readiness.

Owns: weighted pool choice (the random draw comes in as `u`, so tests are exact), the retry
budget, and `weights_from_readiness`. The ingress replica and the operations module call
these; nothing here imports Ray, reads a clock or draws random numbers.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from serve.config import POOLS

__all__ = [
    "RetryDecision",
    "choose_pool",
    "retry_decision",
    "weights_from_readiness",
]


def choose_pool(
    weights: Mapping[str, float], u: float, exclude: Collection[str] = ()
) -> str | None:
    """Pick a pool with probability proportional to its weight, using the uniform draw `u`.

    Pools in `exclude` (already tried for this request) are skipped while another pool with
    a positive weight exists; if every positive pool was tried, the choice is made among all
    positive pools again (a retry may land on another replica of the same pool). Returns None
    when no pool has a positive weight.

    Example: weights {"cluster": 3, "external": 1}; u=0.5 -> "cluster" (0.5*4 = 2 < 3);
    u=0.9 -> "external" (3.6 >= 3).
    """
    live = [(p, float(weights.get(p, 0.0))) for p in POOLS if weights.get(p, 0.0) > 0]
    if not live:
        return None
    fresh = [(p, w) for p, w in live if p not in exclude]
    candidates = fresh or live
    total = sum(w for _, w in candidates)
    point = min(max(u, 0.0), 1.0) * total
    acc = 0.0
    for pool, w in candidates:
        acc += w
        if point < acc:
            return pool
    return candidates[-1][0]


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    reason: str


def retry_decision(
    attempts_made: int, max_attempts: int, elapsed_s: float, request_timeout_s: float
) -> RetryDecision:
    """Whether a request whose last try failed (replica died, stopping or unreachable) is tried
    again. Inference is idempotent, so a retry is safe; the budget keeps a request bounded."""
    if attempts_made >= max_attempts:
        return RetryDecision(False, f"used all {max_attempts} attempts")
    if elapsed_s >= request_timeout_s:
        return RetryDecision(False, f"request deadline of {request_timeout_s:g}s passed")
    return RetryDecision(True, f"attempt {attempts_made + 1} of {max_attempts}")


def weights_from_readiness(
    running: Mapping[str, int], targets: Mapping[str, int]
) -> dict[str, float]:
    """Route weight per pool: its RUNNING replicas, capped at its target.

    A pool whose target is 0 (about to be drained) or that has no RUNNING replica gets 0, so
    traffic follows readiness and each ready replica gets about the same share.

    Example: running {"cluster": 2, "external": 1}, targets {"cluster": 0, "external": 2}
    -> {"cluster": 0.0, "external": 1.0}.
    """
    return {p: float(max(0, min(int(running.get(p, 0)), int(targets.get(p, 0))))) for p in POOLS}
