"""What the Kubernetes actuator raises: one error class per way a request can fail.

Owns: `KubernetesActuatorError` and its kinds (not found, conflict, refused, rate limited), and
`api_message`, the one reading of a Kubernetes error answer into a line a user can act on.
Must not: call the Kubernetes API (``controlplane.kube.client`` and the modules above it do).
The actuator service (``controlplane.kube.service``) maps each kind to its HTTP status, and
the controller's HTTP client (``controlplane.kube.remote``) maps them back.
"""

from __future__ import annotations

import json

from kubernetes.client.exceptions import ApiException

__all__ = [
    "KubeConflictError",
    "KubeNotFoundError",
    "KubeRateLimitedError",
    "KubeRefusedError",
    "KubernetesActuatorError",
    "api_message",
]


class KubernetesActuatorError(RuntimeError):
    """The actuator could not do what was asked; the message says what and why."""


class KubeNotFoundError(KubernetesActuatorError):
    """A node, RayCluster or worker group the call needs does not exist."""


class KubeConflictError(KubernetesActuatorError):
    """Other writers kept changing the object: every retry ended in 409 Conflict."""


class KubeRefusedError(KubernetesActuatorError):
    """The object is not ours to touch: not a worker pod of our RayCluster, or a node that
    hosts none. Never retried into success: the request itself is wrong."""


class KubeRateLimitedError(KubernetesActuatorError):
    """The actuator service's own cap on node actions per window is reached; try later."""


def api_message(exc: ApiException) -> str:
    """The Kubernetes `Status` message of an error response, else its HTTP reason."""
    try:
        body = json.loads(exc.body or "")
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    except ValueError:
        pass
    return f"HTTP {exc.status} {exc.reason or ''}".strip()
