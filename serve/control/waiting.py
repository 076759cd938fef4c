"""What Serve shows of the serving plane, judged from one read of its details, and waiting
until it shows what a primitive of `serve.control.operations` wrote.

Owns: reading replica states out of Serve's details (`running_replicas`), the conditions the
primitives wait for (`until_pool_running`, `until_pool_settled`, `until_route_settled`) and
their one-read checks for a caller that advances a move across ticks (`pool_running`,
`pool_settled`, `route_applied`), `wait` (poll until a condition holds, else
`ServingTimeoutError`), the clock of every wait (`now_s`), and this process's memory of when
it first saw each route table applied.

Why the settle wait: the edge routes by the table it last fetched from the ingress
(``GET v1/models``) and uses it for at most ``edge_table_max_age_s``. A table fetched after
every ingress replica applied generation N has N (or later); one fetched before is out of use
once that much time has passed since N was applied. This process notes when it first saw N
applied (`route_applied`, and `until_route_settled` in a wait), so it cannot know the moment
Serve finished; it errs late, never early.

Must not: write to Serve (`serve.control.operations` does), or decide what the serving plane
should run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from serve.config import POOLS, IngressConfig
from serve.control import client as control
from serve.control.status import STARTING_STATES, deployment, replica_states, state_of
from serve.spec import BACKEND_DEPLOYMENT, INGRESS_APP, INGRESS_DEPLOYMENT, app_name

__all__ = [
    "ServingTimeoutError",
    "now_s",
    "pool_running",
    "pool_settled",
    "route_applied",
    "running_replicas",
    "until_pool_running",
    "until_pool_settled",
    "until_route_settled",
    "wait",
]

_POLL_S = 0.1
_SEEN_KEPT = 64
"""Route table generations `_first_applied_s` remembers (the oldest is forgotten first)."""
_first_applied_s: dict[int, float] = {}
"""Generation -> `now_s` when this process first saw every ingress replica run it or a later
one (the settle wait's start, see the module doc)."""


def now_s() -> float:
    """The clock of every wait, and of `serve.control.operations.move`'s duration (monotonic;
    tests swap it with `_sleep`)."""
    return time.monotonic()


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


class ServingTimeoutError(TimeoutError):
    """Serve did not reach the wanted state in time; the message says what was awaited."""


# --- reading ---------------------------------------------------------------------------


def _backend(details: Mapping[str, Any], model: str, pool: str) -> Mapping[str, Any]:
    return deployment(details, app_name(model, pool), BACKEND_DEPLOYMENT)


def running_replicas(details: Mapping[str, Any], model: str) -> dict[str, int]:
    """RUNNING replicas of `model` per pool in Serve's details."""
    return {p: replica_states(_backend(details, model, p)).count("RUNNING") for p in POOLS}


# --- conditions and waiting ------------------------------------------------------------


def wait(what: str, done: Callable[[Mapping[str, Any]], bool], timeout_s: float) -> None:
    """Read Serve's details until `done` holds; after `timeout_s`, ServingTimeoutError saying
    it waited for `what`."""
    deadline = now_s() + timeout_s
    while True:
        details = control.read_details()
        if done(details):
            return
        if now_s() >= deadline:
            raise ServingTimeoutError(f"timed out after {timeout_s:g}s waiting for {what}")
        _sleep(_POLL_S)


def until_pool_settled(model: str, pool: str, target: int) -> Callable[[Mapping[str, Any]], bool]:
    """At least `target` RUNNING and, for a lowered target, no extra replica still around."""

    def done(details: Mapping[str, Any]) -> bool:
        dep = _backend(details, model, pool)
        states = replica_states(dep)
        running = states.count("RUNNING")
        if target == 0:
            return app_name(model, pool) not in (details.get("applications") or {})
        if int(dep.get("target_num_replicas", -1)) != target:
            return False
        busy = sum(1 for s in states if s in STARTING_STATES or s == "STOPPING")
        return running >= target and busy == 0

    return done


def until_pool_running(model: str, pool: str, target: int) -> Callable[[Mapping[str, Any]], bool]:
    """Target `target` and at least that many RUNNING."""

    def done(details: Mapping[str, Any]) -> bool:
        dep = _backend(details, model, pool)
        return (
            int(dep.get("target_num_replicas", -1)) == target
            and replica_states(dep).count("RUNNING") >= target
        )

    return done


def _ingress(details: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The ingress deployment's details and its deployed ``user_config``."""
    dep = deployment(details, INGRESS_APP, INGRESS_DEPLOYMENT)
    user_config: Mapping[str, Any] = (dep.get("deployment_config") or {}).get("user_config") or {}
    return dep, user_config


def _ingress_applied(details: Mapping[str, Any], generation: int) -> bool:
    """Every ingress replica runs with route table `generation` or a later one (reconfigure
    finished)."""
    dep, user_config = _ingress(details)
    seen = user_config.get("generation")
    if not isinstance(seen, int) or seen < generation:
        return False
    states = replica_states(dep)
    return (
        state_of(dep.get("status", "")) == "HEALTHY"
        and len(states) == int(dep.get("target_num_replicas", -1))
        and all(s == "RUNNING" for s in states)
    )


def _edge_table_max_age_s(user_config: Mapping[str, Any]) -> float:
    value = (user_config.get("settings") or {}).get("edge_table_max_age_s")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return IngressConfig().edge_table_max_age_s


def until_route_settled(generation: int) -> Callable[[Mapping[str, Any]], bool]:
    """Every ingress replica runs route table `generation` (or later), and this process first
    saw that at least ``edge_table_max_age_s`` ago: no edge routes by an older table
    any more (see the module doc)."""

    def done(details: Mapping[str, Any]) -> bool:
        if not _ingress_applied(details, generation):
            return False
        now = now_s()
        first_s = _first_applied_s.setdefault(generation, now)
        while len(_first_applied_s) > _SEEN_KEPT:
            del _first_applied_s[min(_first_applied_s)]
        return now - first_s >= _edge_table_max_age_s(_ingress(details)[1])

    return done


# --- one read each (for a caller that advances a move across ticks) -----------------------


def pool_running(model: str, pool: str, target: int) -> bool:
    """Whether `pool` has target `target` and at least that many RUNNING replicas of `model`."""
    return until_pool_running(model, pool, target)(control.read_details())


def pool_settled(model: str, pool: str, target: int) -> bool:
    """Whether `model` in `pool` settled at `target` (no replica starting or stopping)."""
    return until_pool_settled(model, pool, target)(control.read_details())


def route_applied(generation: int) -> bool:
    """Whether route table `generation` settled: every ingress replica runs it (or a later one),
    and ``serving.ingress.edge_table_max_age_s`` passed since this process first saw that, so no
    edge still routes by an older table (see the module doc). A caller polls it each tick; the
    first True call is at least that long after the first call that saw the table applied."""
    return until_route_settled(generation)(control.read_details())
