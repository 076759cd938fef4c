"""Kubernetes: the actuator that cordons and taints bad nodes, deletes their Ray pods and sizes
the RayCluster's external worker group (production on KubeRay).

Owns: every call to the Kubernetes API (``controlplane.kube.actuator``, put together from
``kube.client``, ``kube.pods``, ``kube.nodes`` and ``kube.raycluster``); the
``rcp-kube-actuator`` service that alone holds the Kubernetes credential in production and
checks every request as if its caller were hostile (``controlplane.kube.service``); the
controller's HTTP client of that service (``controlplane.kube.remote``); and `from_config`,
which picks one (``controlplane.kube.connect``). Must not: decide anything (policies do), or be
needed in local mode (`from_config` returns None there).
"""

from __future__ import annotations

from controlplane.kube.actuator import KubernetesActuator
from controlplane.kube.connect import from_config
from controlplane.kube.errors import (
    KubeConflictError,
    KubeNotFoundError,
    KubeRateLimitedError,
    KubeRefusedError,
    KubernetesActuatorError,
)
from controlplane.kube.remote import RemoteKubernetesActuator
from controlplane.kube.results import reason_slug

__all__ = [
    "KubeConflictError",
    "KubeNotFoundError",
    "KubeRateLimitedError",
    "KubeRefusedError",
    "KubernetesActuator",
    "KubernetesActuatorError",
    "RemoteKubernetesActuator",
    "from_config",
    "reason_slug",
]
