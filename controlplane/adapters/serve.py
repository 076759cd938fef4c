"""The Serve adapter: the control loop's only way to read and change the serving plane.

Owns: `ServeView` (what Serve runs, read once per tick: targets, RUNNING/STARTING/STOPPING
counts and route weights per model and pool, the ingress's replica target, and the replica
rows of the snapshot), the load board reads, the Ray autoscaler's `request_resources` for the
external pool, and the writes the act phase makes (`ServePlane`), including the non-blocking
steps and checks of a make-before-break move (`serve.control.operations`, `.waiting`).

Must not: decide (the policies do), or wait for a replica: every method here returns at once
(a scale-down's re-route waits only for the ingress to apply its route table).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from policies.ingress import IngressTraffic
from policies.snapshot import Pool, ReplicaState, ServeReplica
from serve.control.status import serve_status

__all__ = ["PoolView", "RayServe", "ServePlane", "ServeView", "view_from_status"]

log = logging.getLogger(__name__)

_STATES = {
    "RUNNING": ReplicaState.RUNNING,
    "STARTING": ReplicaState.STARTING,
    "UPDATING": ReplicaState.STARTING,
    "RECOVERING": ReplicaState.STARTING,
    "PENDING_MIGRATION": ReplicaState.STARTING,
    "STOPPING": ReplicaState.STOPPING,
}


@dataclass(frozen=True)
class PoolView:
    """One model's backend in one pool, as Serve shows it now."""

    target: int = 0
    running: int = 0
    starting: int = 0
    stopping: int = 0
    weight: float = 0.0


@dataclass(frozen=True)
class ServeView:
    """The serving plane as observed this tick (``deployed`` False: nothing to act on)."""

    deployed: bool = False
    pools: Mapping[tuple[str, Pool], PoolView] = field(default_factory=dict)
    replicas: tuple[ServeReplica, ...] = ()
    ingress_target: int = 0
    """The ingress deployment's replica target (0: not known; the loop then leaves it)."""

    def pool(self, model: str, pool: Pool) -> PoolView:
        return self.pools.get((model, pool), PoolView())

    def target(self, model: str, pool: Pool) -> int:
        return self.pool(model, pool).target

    def weights(self, model: str) -> tuple[tuple[Pool, float], ...]:
        """The deployed route weights of `model` (cluster, external), () when unrouted."""
        ws = tuple((p, self.pool(model, p).weight) for p in (Pool.CLUSTER, Pool.EXTERNAL))
        return ws if any(w > 0 for _, w in ws) else ()

    def others_ready(self, model: str, pool: Pool) -> bool:
        """Whether every pool of `model` other than `pool` runs all of its target."""
        return all(
            v.running >= v.target for (m, p), v in self.pools.items() if m == model and p != pool
        )


def view_from_status(status: Mapping[str, Any], gpus_per_replica: Mapping[str, float]) -> ServeView:
    """A `ServeView` from `serve.control.status.serve_status()` output."""
    if not status.get("deployed"):
        return ServeView()
    pools: dict[tuple[str, Pool], PoolView] = {}
    rows: list[ServeReplica] = []
    for model, info in (status.get("models") or {}).items():
        for pool_name, p in (info.get("pools") or {}).items():
            pool = Pool(pool_name)
            pools[(model, pool)] = PoolView(
                target=int(p.get("target") or 0),
                running=int(p.get("running", 0)),
                starting=int(p.get("starting", 0)),
                stopping=int(p.get("stopping", 0)),
                weight=float(p.get("weight", 0.0)),
            )
            for r in p.get("replicas") or []:
                state = _STATES.get(str(r.get("state")))
                if state is None:
                    continue
                rows.append(
                    ServeReplica(
                        replica_id=str(r.get("replica_id")),
                        model=model,
                        pool=pool,
                        node_id=str(r.get("node_id") or ""),
                        gpus=math.ceil(gpus_per_replica.get(model, 1.0)),
                        state=state,
                    )
                )
    ingress = status.get("ingress") or {}
    return ServeView(
        deployed=True,
        pools=pools,
        replicas=tuple(rows),
        ingress_target=int(ingress.get("target") or 0),
    )


class ServePlane(Protocol):
    """What the loop needs from Serve (`RayServe`; a fake in unit tests)."""

    def view(self) -> ServeView: ...

    def loads(self) -> Mapping[str, float]:
        """Ongoing requests per model (the ingress's load board); {} when none reported."""

    def ingress_traffic(self) -> IngressTraffic:
        """The ingress replicas' request rate and CPU per request (the load board)."""

    def request_external(self, bundles: list[dict[str, float]]) -> None:
        """Ask the Ray autoscaler for these resource bundles ([] lets it scale down)."""

    def scale_ingress(self, num_replicas: int) -> None:
        """Set the ingress deployment's replica count."""

    def scale_pool(self, model: str, pool: Pool, num_replicas: int) -> None:
        """Set a pool's target; a scale-down first routes away from the leaving replicas."""

    def set_route_weights(self, model: str, weights: Mapping[Pool, float]) -> None: ...

    def set_pool_target(self, model: str, pool: Pool, num_replicas: int) -> None:
        """Set a pool's target only (a move's make, break or unwind step)."""

    def pool_running(self, model: str, pool: Pool, target: int) -> bool: ...

    def pool_settled(self, model: str, pool: Pool, target: int) -> bool: ...

    def route_for_targets(self, model: str, planned: Mapping[Pool, int]) -> int:
        """Route by readiness with `planned` targets; the route table's generation."""

    def route_applied(self, generation: int) -> bool: ...


def _operations() -> Any:
    # Deferred: serve.control.operations imports ray.serve (heavy; the loop's unit tests never load it).
    from serve.control import operations

    return operations


def _waiting() -> Any:
    # Deferred: serve.control.waiting imports ray.serve (heavy; the loop's unit tests never load it).
    from serve.control import waiting

    return waiting


class RayServe:
    """`ServePlane` through `serve.control.operations`, `serve.control.waiting` and
    `serve.control.status` on the connected cluster."""

    def __init__(self, gpus_per_replica: Mapping[str, float]) -> None:
        self.gpus_per_replica = dict(gpus_per_replica)

    def view(self) -> ServeView:
        return view_from_status(serve_status(), self.gpus_per_replica)

    def loads(self) -> Mapping[str, float]:
        from serve.app.load import read_load  # deferred: imports ray (heavy)

        try:
            return dict(read_load())
        except Exception as exc:  # no load reports yet: demand sees 0 ongoing requests
            log.debug("load board unavailable: %r", exc)
            return {}

    def ingress_traffic(self) -> IngressTraffic:
        from serve.app.load import read_ingress_traffic  # deferred: imports ray (heavy)

        try:
            return IngressTraffic(*read_ingress_traffic())
        except Exception as exc:  # no reports yet: the ingress keeps its count
            log.debug("load board unavailable: %r", exc)
            return IngressTraffic()

    def request_external(self, bundles: list[dict[str, float]]) -> None:
        from ray.autoscaler.sdk import request_resources  # deferred: ray is heavy

        request_resources(bundles=bundles)

    def scale_pool(self, model: str, pool: Pool, num_replicas: int) -> None:
        _operations().scale_pool(model, pool.value, num_replicas, wait=False)

    def scale_ingress(self, num_replicas: int) -> None:
        _operations().scale_ingress(num_replicas)

    def set_route_weights(self, model: str, weights: Mapping[Pool, float]) -> None:
        by_name = {p.value: w for p, w in weights.items()}
        _operations().set_route_weights(model, by_name, wait=False)

    def set_pool_target(self, model: str, pool: Pool, num_replicas: int) -> None:
        _operations().set_pool_target(model, pool.value, num_replicas)

    def pool_running(self, model: str, pool: Pool, target: int) -> bool:
        return bool(_waiting().pool_running(model, pool.value, target))

    def pool_settled(self, model: str, pool: Pool, target: int) -> bool:
        return bool(_waiting().pool_settled(model, pool.value, target))

    def route_for_targets(self, model: str, planned: Mapping[Pool, int]) -> int:
        planned_by_name = {p.value: n for p, n in planned.items()}
        return int(_operations().route_for_targets(model, planned_by_name))

    def route_applied(self, generation: int) -> bool:
        return bool(_waiting().route_applied(generation))
