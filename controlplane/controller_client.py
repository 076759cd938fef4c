"""The controller actor as a driver sees it: its health view, for the node views the demo
prints (the CLI reaches the controller through the API).

Owns: asking the running local cluster's controller actor for the verdicts it acts on
(`controller_health`); the caller is a connected Ray driver
(`controlplane.ray_connection.connect`).
Must not: change anything, or find the actor any other way than
`controlplane.controller.actor.get_controller` (always None on Kubernetes, where the
controller runs in-process and has no actor).
"""

from __future__ import annotations

from typing import Any

from controlplane.controller.actor import get_controller

__all__ = ["controller_health"]


def controller_health(timeout_s: float = 5.0) -> dict[str, Any] | None:
    """The policy actor's `health()` (the verdicts it acts on, cordoned nodes), or None when
    no controller actor runs (always so on Kubernetes) or it does not answer in time."""
    import ray  # deferred: heavy, and only a connected driver gets here

    try:
        handle = get_controller()
        if handle is None:
            return None
        result: dict[str, Any] = ray.get(handle.health.remote(), timeout=timeout_s)
    except Exception:
        return None
    return result
