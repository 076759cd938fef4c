"""Serving as the spare pool: whether a gang that lost a node borrows one from serving now or
waits for the node's replacement.

Owns: `BorrowConfig` (what a replacement and a move take), `replacement_eta_left_s` (when the
cluster pool's replacement for a lost node is due) and `weigh_borrow` (the choice, in
GPU-seconds).

A gang whose node died or was taken out by health is re-queued (`policies.attempts`) with the
time it lost the node (`QueuedJob.lost_s`). When it heads the queue and fits only once Serve
replicas on the cluster pool move out (`policies.admission.preemption.choose_room` chose
them, floors, pins and the external room already respected), admission asks `weigh_borrow`:

- no replacement is coming (every cluster node the pool should have is still there: health
  took it out, the node lives on), so borrowing is the only way back: borrow;
- else waiting costs the gang's GPUs idle until the replacement is due,
  ``gang_gpus x eta_left``, each idle training GPU-second weighing ``idle_training_weight``
  rented ones (training is worth the most); borrowing costs the gang's GPUs idle during the
  move, ``gang_gpus x move_s`` (weighed the same), plus the moved replicas' rented GPUs until
  they come back to the replacement, ``moved_gpus x (eta_left + 2 x move_s)`` (the move out
  runs both copies, make before break, and so does the way back). It borrows when that is
  less.

The borrowed node goes back to serving by placement's way back (rule 5): once the replacement
has joined (or the gang ended) and no training waits for the room. It is not held for serving
while training waits: a waiting gang that fits there would claim those replicas again at once,
as it would have claimed them before the loss (a flap, two moves for nothing).

A replacement that is overdue (it was due ``replacement_eta_s`` after the loss and has not
come: a stock-out, a quota) is expected as long again, so a gang never waits forever on one.

Worked example: a 2 x 2 gang lost one 2-GPU node 30 s ago; the pool replaces a node in 600 s,
a move takes 60 s, the weight is 2. Borrowing 2 GPUs of replicas: 2 x 4 x 60 + 2 x (570 +
120) = 1,860 GPU-s against waiting 2 x 4 x 570 = 4,560: it borrows. Had the loss been 500 s
ago (100 s left), borrowing costs 480 + 2 x 220 = 920 against 800: it waits for the
replacement. A gang on one node that lost it all borrows as many GPUs as it idles: that pays
only when the replacement is more than ``move_s x (w + 2) / (w - 1)`` away (w the weight:
4 moves, 240 s, at w = 2).

Must not: choose which replicas move (`choose_room` does), read a clock or do I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Borrow", "BorrowConfig", "replacement_eta_left_s", "weigh_borrow"]


@dataclass
class BorrowConfig:
    """What a lost cluster node's replacement and a replica's move take. The ``pools.cluster``
    config section embeds this class (`controlplane.config.ClusterPoolConfig`), so each field
    and default is defined here only."""

    replacement_eta_s: float = 600.0
    """How long the cluster pool takes to replace a dead node (the autoscaler or KubeRay
    launching one and it joining Ray): a gang that lost a node weighs waiting this long
    against borrowing a node from serving."""
    replica_move_s: float = 60.0
    """How long one replica's make-before-break move takes (a rented node's start included)."""
    idle_training_weight: float = 2.0
    """What an idle training GPU-second costs, in rented GPU-seconds: above 1, since training
    is worth the most (2: an hour of a training GPU is worth two of a rented one)."""

    def __post_init__(self) -> None:
        for name in ("replacement_eta_s", "replica_move_s", "idle_training_weight"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class Borrow:
    """`weigh_borrow`'s answer, with both costs for the reason and the events."""

    borrow: bool
    reason: str
    wait_gpu_s: float
    """Weighed GPU-seconds lost waiting for the replacement (inf when none is coming)."""
    borrow_gpu_s: float
    """Weighed GPU-seconds borrowing costs: the gang's move, the rented GPUs until the way
    back."""


def replacement_eta_left_s(
    lost_s: float, now_s: float, nodes_seen: int, nodes_expected: int, cfg: BorrowConfig
) -> float | None:
    """Seconds until the replacement for a node lost at `lost_s` is due; None when none is
    coming (the pool has every node it should: `nodes_seen` >= `nodes_expected`). Overdue:
    expected ``replacement_eta_s`` again."""
    if nodes_seen >= nodes_expected:
        return None
    left = lost_s + cfg.replacement_eta_s - now_s
    return left if left > 0 else cfg.replacement_eta_s


def weigh_borrow(
    gang_gpus: int, moved_gpus: int, eta_left_s: float | None, cfg: BorrowConfig
) -> Borrow:
    """Borrow `moved_gpus` of serving's cluster GPUs for a gang of `gang_gpus` now, or wait
    `eta_left_s` for the replacement (None: none is coming)? See the module doc."""
    move, weight = cfg.replica_move_s, cfg.idle_training_weight
    if eta_left_s is None:
        cost = weight * gang_gpus * move + moved_gpus * 2 * move
        return Borrow(True, "no replacement node is coming: serving lends one", math.inf, cost)
    wait = weight * gang_gpus * eta_left_s
    cost = weight * gang_gpus * move + moved_gpus * (eta_left_s + 2 * move)
    if cost < wait:
        reason = (
            f"borrowing {moved_gpus} serving GPU(s) costs {cost:,.0f} GPU-s, less than "
            f"{wait:,.0f} waiting {eta_left_s:,.0f}s for the replacement node"
        )
        return Borrow(True, reason, wait, cost)
    reason = (
        f"waits {eta_left_s:,.0f}s for the replacement node: {wait:,.0f} GPU-s, less than the "
        f"{cost:,.0f} borrowing {moved_gpus} serving GPU(s) would cost"
    )
    return Borrow(False, reason, wait, cost)
