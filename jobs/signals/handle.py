"""A job's handle on the signals actor: looked up by name, and again after it died.

Owns: `get_signals` (the running actor, by name) and `SignalsHandle`, which drops a handle
on a dead actor and looks the name up again, at most every `SIGNALS_RESOLVE_INTERVAL_S`.

Must not: create the actor (the control plane does, `controlplane.adapters.ray_jobs`); log
or print the token a call carries.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import ray
from ray.actor import ActorHandle

from jobs.signals.mailbox import SIGNALS_ACTOR_NAME, SIGNALS_NAMESPACE, _JobSignals

__all__ = ["SIGNALS_RESOLVE_INTERVAL_S", "SignalsHandle", "get_signals"]


def get_signals() -> ActorHandle[_JobSignals] | None:
    """The running signals actor, or None (e.g. a script run outside the control plane)."""
    try:
        return ray.get_actor(SIGNALS_ACTOR_NAME, namespace=SIGNALS_NAMESPACE)
    except ValueError:
        return None


SIGNALS_RESOLVE_INTERVAL_S = 5.0
"""How often a job looks the signals actor up by name again while it has none (the actor it
held died: the controller replaces a killed or impostor actor on its next tick)."""


class SignalsHandle:
    """A job's handle on the signals actor: found by name, and found again after it died.

    The controller may replace the actor (killed, an impostor, a lost pin); a job holding the
    old handle would talk to a dead actor forever. A call that fails because the actor is dead
    (``RayActorError``: died, or unavailable) drops the handle; the next call looks the name
    up again, at most every `resolve_interval_s`. Other errors (a timeout) keep it.
    """

    def __init__(
        self,
        resolve_interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resolve_interval_s = (
            SIGNALS_RESOLVE_INTERVAL_S if resolve_interval_s is None else resolve_interval_s
        )
        self._clock = clock
        self._handle: ActorHandle[_JobSignals] | None = None
        self._next_resolve_s: float | None = None

    def get(self) -> ActorHandle[_JobSignals] | None:
        """The actor's handle, or None (none under the name, or looked up too recently)."""
        now = self._clock()
        if self._handle is None and (self._next_resolve_s is None or now >= self._next_resolve_s):
            self._next_resolve_s = now + self.resolve_interval_s
            self._handle = get_signals()
        return self._handle

    def call(self, method: str, *args: object, timeout_s: float) -> object:
        """``ray.get(actor.method.remote(*args))``; LookupError when there is no actor."""
        handle = self.get()
        if handle is None:
            raise LookupError(f"no {SIGNALS_ACTOR_NAME} actor (looked up by name)")
        try:
            return ray.get(getattr(handle, method).remote(*args), timeout=timeout_s)
        except ray.exceptions.RayActorError:
            self._handle = None  # dead: look the name up again (the controller replaced it)
            raise
