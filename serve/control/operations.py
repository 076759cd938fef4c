"""The primitives the control plane calls to change the serving plane.

Owns: `deploy` (first deploy or config update, keeping the targets, weights and ingress
replica count already deployed), `scale_pool`, `scale_ingress`, `set_route_weights`,
`set_route_weights_from_readiness`, and the writes of a make-before-break move the control
loop advances one step per tick (`set_pool_target`, `route_for_targets`; the move itself is
`controlplane.loop.act.operations`). Each reads the desired
state from Serve (where it is stored, see `serve.spec`), changes it, writes it back with one declarative apply, and optionally waits
until Serve shows the effect. Writes inside one process are serialized by a lock; the
policy actor is meant to be the only writer.

Make-before-break, in the writes here: (1) raise the target pool by n (`set_pool_target`);
once its replicas are RUNNING, (2) route by readiness with the source's planned target
(`route_for_targets`); once every ingress replica applied that route table and another
``serving.ingress.edge_table_max_age_s`` passed (the settle wait,
`serve.control.waiting.route_applied`), (3) lower the source pool by n; Serve stops those
replicas gracefully, finishing in-flight requests, and a request that still lands on a
stopping replica is retried (by the ingress, or by the edge) elsewhere.

Why the settle wait, and what Serve shows that each wait reads: `serve.control.waiting`
(``ServingTimeoutError`` when it does not show in time).

A pool at zero has no Serve application (Serve refuses ``num_replicas=0`` on a static
deployment); reaching zero deletes that pool's app and leaving zero re-creates it. The other
pool's app keeps an identical config, so its replicas are never restarted.

Must not: decide how many replicas a model needs (that is `policies.demand` and the policy
actor); it only carries out what it is told.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from serve.config import POOLS, ServingConfig, validate_serving
from serve.control import client as control
from serve.control import waiting
from serve.routing import weights_from_readiness
from serve.spec import (
    DesiredState,
    build_app_configs,
    declarative_configs,
    desired_from_app_configs,
    initial_state,
)

__all__ = [
    "ServingNotDeployedError",
    "deploy",
    "read_state",
    "route_for_targets",
    "scale_ingress",
    "scale_pool",
    "set_pool_target",
    "set_route_weights",
    "set_route_weights_from_readiness",
]

_lock = threading.RLock()


class ServingNotDeployedError(RuntimeError):
    """The serving plane's ingress app is not deployed on this cluster."""


# --- reading and writing ---------------------------------------------------------------


def read_state() -> DesiredState | None:
    """The desired state stored in Serve, or None when the serving plane is not deployed."""
    return desired_from_app_configs(declarative_configs(control.read_details()))


def _require_state() -> DesiredState:
    state = read_state()
    if state is None:
        raise ServingNotDeployedError(
            "the serving plane is not deployed on this cluster; deploy it first "
            "(rcp up, or serve.control.operations.deploy(ServingConfig()))"
        )
    return state


def _apply(state: DesiredState) -> None:
    control.apply_app_configs(build_app_configs(state))


def _timeout(state: DesiredState, timeout_s: float | None) -> float:
    return float(timeout_s if timeout_s is not None else state.serving.ready_timeout_s)


def _route(
    state: DesiredState, model: str, weights: Mapping[str, float], timeout_s: float, wait: bool
) -> DesiredState:
    """Write `model`'s route weights; with `wait`, return once the new table settled
    (`waiting.until_route_settled`: applied by every ingress replica, then the edges' table
    age)."""
    new = state.with_weights(model, weights)
    _apply(new)
    if wait:
        waiting.wait(
            f"every ingress replica to apply route table generation {new.generation} "
            "and the edges' table age to pass",
            waiting.until_route_settled(new.generation),
            timeout_s,
        )
    return new


# --- primitives ----------------------------------------------------------------------------


def deploy(
    serving: ServingConfig,
    *,
    http_host: str | None = None,
    http_port: int | None = None,
    wait: bool = True,
    timeout_s: float | None = None,
) -> DesiredState:
    """Deploy the serving plane, or update it to `serving`, and return the desired state.

    A model already deployed keeps its replica targets and route weights; a new model gets
    `min_replicas` in its `initial_pool`; a model no longer declared is removed. With
    `http_port`, Serve is started on `http_host` (default 127.0.0.1) first. With `wait`,
    returns once the backends are RUNNING and traffic is routed to them.
    """
    errors = validate_serving(serving)
    if errors:
        raise ValueError("invalid serving configuration:\n  " + "\n  ".join(errors))
    if http_port is not None:
        control.start_serve(http_host or "127.0.0.1", http_port)
    with _lock:
        current = read_state()
        fresh = initial_state(serving)
        if current is None:
            state = fresh
        else:
            declared = {m.name for m in serving.models}
            deployed = {m.name for m in current.serving.models}
            targets = dict(fresh.targets)
            weights = {m: dict(ws) for m, ws in fresh.weights.items()}
            for name in declared & deployed:
                for pool in POOLS:
                    targets[(name, pool)] = current.target(name, pool)
                weights[name] = {p: current.weight(name, p) for p in POOLS}
            state = DesiredState(
                serving=serving,
                targets=targets,
                weights=weights,
                generation=current.generation,
                ingress_replicas=current.ingress_replicas,
            )
        _apply(state)
        if not wait:
            return state
        limit_s = _timeout(state, timeout_s)
        for m in serving.models:
            for pool in POOLS:
                n = state.target(m.name, pool)
                if n > 0:
                    waiting.wait(
                        f"{n} RUNNING replica(s) of {m.name} in {pool}",
                        waiting.until_pool_running(m.name, pool, n),
                        limit_s,
                    )
        for m in serving.models:
            state = set_route_weights_from_readiness(m.name, timeout_s=limit_s)
        return state


def scale_pool(
    model: str,
    pool: str,
    num_replicas: int,
    *,
    wait: bool = True,
    timeout_s: float | None = None,
) -> DesiredState:
    """Set the replica target of `model` in `pool` (a lightweight update; 0 deletes the
    pool's app, above 0 re-creates it).

    Scaling down first takes the leaving replicas out of the route weights (and waits for the
    ingress to apply that), then lowers the target. Scaling up raises the target; with `wait`,
    it waits for the replicas to be RUNNING and then routes to them.
    """
    with _lock:
        state = _require_state()
        new = state.with_target(model, pool, num_replicas)
        limit_s = _timeout(state, timeout_s)
        current = state.target(model, pool)
        if num_replicas < current:
            running = waiting.running_replicas(control.read_details(), model)
            planned = {p: new.target(model, p) for p in POOLS}
            weights = weights_from_readiness(running, planned)
            if weights != {p: state.weight(model, p) for p in POOLS}:
                state = _route(state, model, weights, limit_s, wait=True)
                new = state.with_target(model, pool, num_replicas)
            _apply(new)
            if wait:
                waiting.wait(
                    f"{model} in {pool} to settle at {num_replicas} replica(s)",
                    waiting.until_pool_settled(model, pool, num_replicas),
                    limit_s,
                )
            return new
        if num_replicas == current:
            return state
        _apply(new)
        if not wait:
            return new
        waiting.wait(
            f"{num_replicas} RUNNING replica(s) of {model} in {pool}",
            waiting.until_pool_running(model, pool, num_replicas),
            limit_s,
        )
        return set_route_weights_from_readiness(model, timeout_s=limit_s)


def scale_ingress(num_replicas: int) -> DesiredState:
    """Run `num_replicas` ingress replicas (never fewer than ``serving.ingress.num_replicas``)
    and return at once: a lightweight update of the ingress's ``num_replicas``, its route
    table untouched. Serve starts new replicas with the deployed table and drains a stopping
    one; until the count settles, `route_applied` waits for every replica to run the table."""
    with _lock:
        state = _require_state()
        new = state.with_ingress_replicas(num_replicas)
        if new.ingress_target != state.ingress_target:
            _apply(new)
        return new


def set_route_weights(
    model: str, weights: Mapping[str, float], *, wait: bool = True, timeout_s: float | None = None
) -> DesiredState:
    """Set the route weights of `model` per pool (missing pools get 0). With `wait`, returns
    once every ingress replica applied them."""
    with _lock:
        state = _require_state()
        return _route(state, model, weights, _timeout(state, timeout_s), wait)


def set_route_weights_from_readiness(
    model: str, *, wait: bool = True, timeout_s: float | None = None
) -> DesiredState:
    """Route `model` to each pool in proportion to its RUNNING replicas (capped at target)."""
    with _lock:
        state = _require_state()
        running = waiting.running_replicas(control.read_details(), model)
        targets = {p: state.target(model, p) for p in POOLS}
        weights = weights_from_readiness(running, targets)
        if weights == {p: state.weight(model, p) for p in POOLS}:
            return state
        return _route(state, model, weights, _timeout(state, timeout_s), wait)


# --- one step at a time (for a caller that advances a move across ticks) -------------------
#
# The control loop keeps a move as a tracked operation and advances it one step per tick
# with these (each writes at most once and returns at once) and `serve.control.waiting`'s
# checks (`pool_running`, `pool_settled`, `route_applied`: each reads Serve's details once).


def set_pool_target(model: str, pool: str, num_replicas: int) -> DesiredState:
    """Set `model`'s replica target in `pool` and return at once (no re-route, no wait).
    Unchanged targets are not written again."""
    with _lock:
        state = _require_state()
        if state.target(model, pool) == num_replicas:
            return state
        new = state.with_target(model, pool, num_replicas)
        _apply(new)
        return new


def route_for_targets(model: str, planned: Mapping[str, int]) -> int:
    """Route `model` by readiness with the `planned` targets per pool (those about to drop
    get their planned share, 0 when planned 0) and return the route table's generation."""
    with _lock:
        state = _require_state()
        running = waiting.running_replicas(control.read_details(), model)
        targets = {p: int(planned.get(p, state.target(model, p))) for p in POOLS}
        return _route(state, model, weights_from_readiness(running, targets), 0.0, False).generation
