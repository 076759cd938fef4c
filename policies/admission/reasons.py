"""The codes that start every reason the admission policy writes (events, ``rcp queue``).

Owns: `Why`. Must not: hold any rule.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Why"]


class Why(str, Enum):
    """The code at the start of every reason this policy writes."""

    FITS = "fits"
    BACKFILL = "backfill"
    PREEMPT_PRIORITY = "preempt-for-priority"
    RECLAIM_SHARE = "reclaim-share"
    SERVE_YIELDS = "serve-yields-to-training"
    SERVING_LENDS = "serving-lends-a-node"
    REPLACEMENT_NODE = "waits-for-replacement-node"
    PINNED_SERVING = "pinned-serving"
    SERVING_FLOOR = "serving-floor"
    SERVING_DEMAND = "serving-demand"
    SERVING_RECLAIMS = "serving-reclaims"
    SERVING_FORECAST = "serving-forecast"
    SERVING_ONLY_NODES = "serving-only-nodes"
    UNKNOWN_QUEUE = "unknown-queue"
    UNKNOWN_PRIORITY_CLASS = "unknown-priority-class"
