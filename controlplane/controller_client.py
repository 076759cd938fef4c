"""The controller actor as a driver sees it: ask it something and get the answer or a clear
error. Used by the node views the demo prints (the CLI reaches the controller through the API).

Owns: calling a method of the running local cluster's controller actor (`ask_controller`) and
its health view (`controller_health`); the caller is a connected Ray driver
(`controlplane.ray_connection.connect`).
Must not: change what it is asked for (the actor's methods do the work), or find the actor any
other way than `controlplane.controller.actor.get_controller` (always None on Kubernetes,
where the controller runs in-process and has no actor).
"""

from __future__ import annotations

from typing import Any

from controlplane.controller.actor import get_controller

__all__ = ["ControllerCallError", "NoControllerError", "ask_controller", "controller_health"]


class NoControllerError(RuntimeError):
    """No controller actor runs (none started, or Kubernetes, where it has no actor)."""


class ControllerCallError(RuntimeError):
    """The controller's method raised; the message is its error's, for the user."""


def ask_controller(method: str, *args: Any, timeout_s: float = 30.0) -> Any:
    """`method(*args)` on the controller actor, waited for up to `timeout_s`."""
    handle = get_controller()
    if handle is None:
        raise NoControllerError("no controller actor runs")
    import ray  # deferred: heavy, and only a connected driver gets here

    try:
        return ray.get(getattr(handle, method).remote(*args), timeout=timeout_s)
    except ray.exceptions.RayTaskError as exc:
        raise ControllerCallError(str(getattr(exc, "cause", None) or exc)) from exc


def controller_health(timeout_s: float = 5.0) -> dict[str, Any] | None:
    """The policy actor's `health()` (the verdicts it acts on, cordoned nodes), or None when
    no controller actor runs or it does not answer in time. Local mode only: on Kubernetes
    the controller runs in-process in the head pod's rcp-controller container and there is
    no actor to ask, so this is None there."""
    try:
        result: dict[str, Any] = ask_controller("health", timeout_s=timeout_s)
    except Exception:
        return None
    return result
