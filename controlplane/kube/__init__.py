"""Kubernetes: the actuator that cordons and taints bad nodes, deletes their Ray pods and sizes
the RayCluster's external worker group (production on KubeRay).

Owns: every call to the Kubernetes API (``controlplane.kube.actuator``). Must not: decide
anything (policies do), or be needed in local mode (`from_config` returns None there).
"""

from __future__ import annotations

from controlplane.kube.actuator import (
    CordonResult,
    KubeConflictError,
    KubeNotFoundError,
    KubernetesActuator,
    KubernetesActuatorError,
    RemoveNodeResult,
    ScaleResult,
    UncordonResult,
    from_config,
    reason_slug,
)

__all__ = [
    "CordonResult",
    "KubeConflictError",
    "KubeNotFoundError",
    "KubernetesActuator",
    "KubernetesActuatorError",
    "RemoveNodeResult",
    "ScaleResult",
    "UncordonResult",
    "from_config",
    "reason_slug",
]
