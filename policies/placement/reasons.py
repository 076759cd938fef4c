"""Why placement's targets and actions are what they are: the words that open every reason."""

from __future__ import annotations

from enum import Enum


class PlacementReason(str, Enum):
    YIELD_TO_TRAINING = "yield_to_training"
    LEAVE_UNHEALTHY_NODE = "leave_unhealthy_node"
    EXTERNAL_FULL = "external_full"
    MIGRATE_BACK = "migrate_back"
    EXTERNAL_CAPACITY = "external_capacity"
    ROUTE_BY_READINESS = "route_by_readiness"
    PINNED = "pinned"
