"""The simulated serving plane: Serve's replicas, pool targets and routes over the World's nodes.

Owns: `SimServe`, which behaves as Ray Serve does for the control loop and implements the
loop's `ServePlane` protocol (`controlplane.adapters.serve`), so the real make-before-break
operations (`controlplane.loop.act.operations`) run on it unchanged. Per (model, pool) it
keeps a target and starts or stops replicas toward it (`reconcile`): a new replica takes its
GPUs on a node with room (cluster nodes the scheme lets serving use, most-used first; an
external node that is up, the cheapest provider's first) and is RUNNING ``replica_start_s``
later; a stopping replica drains for ``replica_stop_s`` before its GPUs are free. Serve stops
STARTING replicas first, then ones on nodes a move in flight names (`prefer_stop`), then the
newest. A replica on a failed node is gone at once. One on a drained external node does not
count toward its pool's target: its replacement starts elsewhere, and it stops once the
replacements RUNNING cover the target (with no room elsewhere it keeps serving).

The serving figures: per model, seconds in which the RUNNING replicas' capacity is below the
demand, by `CAUSES`, the cause of the stop that left the model short (held until capacity is
back; a move's stop overrides an earlier cause): ``moves`` (a move's BREAK step; also a
scheme's untagged write: the baselines' moves and evictions), ``policy`` (a placement or
demand scale-down: serving yielded to training by policy), ``failures`` (a node failure),
``reclaims`` (a spot reclaim's notice ran out with it on the node), ``scaling`` (no stop: the
external pool lacks the capacity, or demand rose faster than replicas start). The write's
cause is `writer`, which the scheme sets before each target write.

Beside them, `taken_gpu_s`: GPU-seconds serving's demand needed that the scheme gave to
training instead. Per instant: the GPUs of the replicas demand asks for (`wanted`, what every
scheme sizes by), less those of the replicas RUNNING in either pool or starting on the
cluster pool, less the cluster's free GPUs, at most what training holds there. The providers
could not host the rest then and no cluster GPU was free, so a scheme that serves that demand
trains that much less (the report's evict-first at equal service). A failed node's GPUs
count as free, so the figure errs low.

Must not: decide how many replicas a model runs or where (schemes do).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from controlplane.adapters.serve import PoolView, ServeView
from controlplane.simulate.engine import EventKind, EventQueue
from controlplane.simulate.nodes import Node
from controlplane.simulate.world import World
from policies.ingress import IngressTraffic
from policies.providers import provider_resource
from policies.snapshot import Pool, ReplicaState, ServeReplica

__all__ = ["SimServe", "SimReplica"]

POOLS = (Pool.CLUSTER, Pool.EXTERNAL)
CAUSES = ("moves", "policy", "failures", "reclaims", "scaling")


@dataclass
class SimReplica:
    replica_id: str
    model: str
    pool: Pool
    node_id: str
    gpus: int
    state: ReplicaState
    since_s: float
    version: int = 0


@dataclass
class ModelFigures:
    short_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    cause: str | None = None
    """Why the model is short now (set by the event that made it short)."""
    demand_rps_s: float = 0.0
    served_rps_s: float = 0.0


class SimServe:
    def __init__(
        self,
        world: World,
        queue: EventQueue,
        gpus_per_replica: Mapping[str, int],
        replica_rps: Mapping[str, float],
        utilisation: Mapping[str, float],
        start_s: float,
        stop_s: float,
        replica_bounds: Mapping[str, tuple[int, int]] | None = None,
    ) -> None:
        self.world = world
        self.bounds = dict(replica_bounds or {})
        """(min_replicas, max_replicas) per model, for `taken_gpus`; absent: unbounded."""
        self.taken_gpu_s = 0.0
        self.events = queue
        self.gpus = dict(gpus_per_replica)
        self.replica_rps = dict(replica_rps)
        self.utilisation = dict(utilisation)
        self.start_s = start_s
        self.stop_s = stop_s
        self.targets: dict[tuple[str, Pool], int] = {}
        self.weights: dict[str, dict[Pool, float]] = {}
        self.replicas: dict[str, SimReplica] = {}
        self.by_model: dict[str, list[SimReplica]] = {m: [] for m in self.gpus}
        self.rps: dict[str, float] = dict.fromkeys(self.gpus, 0.0)
        self.figures = {m: ModelFigures() for m in self.gpus}
        self.generation = 0
        self.prefer_stop: set[str] = set()
        self.writer = "moves"
        """Who the target writes now come from (``moves`` or ``policy``): a replica they stop
        while demand needs it is blamed on it."""
        self.cluster_ok: Callable[[Node], bool] = lambda n: True
        """Which cluster nodes serving may use (a static split's partition)."""
        self._seq = 0
        self._changes = 0
        self._view: ServeView | None = None
        self._view_at = (-1, -1)

    # -- figures -------------------------------------------------------------------------------

    def running(self, model: str, pool: Pool | None = None) -> int:
        return sum(
            1
            for r in self.by_model[model]
            if r.state is ReplicaState.RUNNING and (pool is None or r.pool is pool)
        )

    def needed(self, model: str) -> int:
        return math.ceil(round(self.rps[model] / self.replica_rps[model], 9))

    def sized(self, model: str) -> float:
        """Replicas demand asks for at the model's target utilisation (what schemes size by)."""
        return self.rps[model] / (self.replica_rps[model] * self.utilisation[model])

    def wanted(self, model: str) -> int:
        """The sized count (`sized`), rounded up and clamped to the model's bounds."""
        low, high = self.bounds.get(model, (0, 10**9))
        return max(low, min(high, math.ceil(round(self.sized(model), 9))))

    def short(self, model: str) -> bool:
        return self.running(model) < self.needed(model)

    def taken_gpus(self) -> int:
        """GPUs of serving's sized demand training holds now (see the module doc)."""
        wanted = sum(self.wanted(m) * g for m, g in self.gpus.items())
        held = sum(
            r.gpus
            for r in self.replicas.values()
            if r.state is ReplicaState.RUNNING
            or (r.pool is Pool.CLUSTER and r.state is ReplicaState.STARTING)
        )
        free = self.world.cluster_gpus - self.world.cluster_used
        return max(0, min(self.world.training_used, wanted - held - free))

    def advance(self, dt_s: float) -> None:
        if dt_s <= 0:
            return
        self.taken_gpu_s += self.taken_gpus() * dt_s
        for m, f in self.figures.items():
            cap = self.running(m) * self.replica_rps[m]
            f.demand_rps_s += self.rps[m] * dt_s
            f.served_rps_s += min(cap, self.rps[m]) * dt_s
            if cap < self.rps[m]:
                f.short_s[f.cause or "scaling"] += dt_s

    def _mark(self, model: str, cause: str) -> None:
        f = self.figures[model]
        if self.short(model):
            if f.cause is None or cause == "moves":
                f.cause = cause
        else:
            f.cause = None

    def _settle_cause(self, model: str) -> None:
        if not self.short(model):
            self.figures[model].cause = None

    # -- Serve's controller --------------------------------------------------------------------

    def _place(self, model: str, pool: Pool) -> Node | None:
        g = self.gpus[model]
        if pool is Pool.EXTERNAL:
            for p in self.world.by_price:
                for n in self.world.external_of[p.name].values():
                    if n.free >= g:
                        return n
            return None
        best: Node | None = None
        for node_id in self.world.cluster_ids:
            n = self.world.nodes[node_id]
            if n.free >= g and self.cluster_ok(n) and (best is None or n.used > best.used):
                best = n
                if n.free == g:
                    break
        return best

    def reconcile(self) -> None:
        """Start or stop replicas toward every pool's target (Serve's controller)."""
        now = self.world.now_s
        for (model, pool), target in sorted(
            self.targets.items(), key=lambda kv: (kv[0][0], kv[0][1].value)
        ):
            live = [
                r
                for r in self.by_model[model]
                if r.pool is pool and r.state is not ReplicaState.STOPPING
            ]
            drained = [r for r in live if self._drained(r)] if self.world.draining else []
            if drained:
                gone = {r.replica_id for r in drained}
                live = [r for r in live if r.replica_id not in gone]
            extra = len(live) - target
            if extra > 0:
                order = sorted(
                    live,
                    key=lambda r: (
                        r.state is ReplicaState.RUNNING,
                        r.node_id not in self.prefer_stop,
                        -r.since_s,
                        r.replica_id,
                    ),
                )
                for r in order[:extra]:
                    self._stop(r, now)
                self._mark(model, self.writer)
            if drained:
                # Make-before-break off a drained node: stop what the replacements RUNNING
                # (with the drained ones left) cover beyond the target.
                kept = sum(1 for r in live if r.state is ReplicaState.RUNNING)
                covered = kept + len(drained) - target
                order = sorted(
                    drained, key=lambda r: (r.state is ReplicaState.RUNNING, r.replica_id)
                )
                for r in order[: max(0, covered)]:
                    self._stop(r, now)
                if covered > 0:
                    self._mark(model, self.writer)
            for _ in range(max(0, -extra)):
                node = self._place(model, pool)
                if node is None:
                    break
                self._seq += 1
                r = SimReplica(
                    f"r{self._seq}",
                    model,
                    pool,
                    node.node_id,
                    self.gpus[model],
                    ReplicaState.STARTING,
                    now,
                )
                self.world.take(node.node_id, r.gpus, training=False)
                self.replicas[r.replica_id] = r
                self.by_model[model].append(r)
                self._changes += 1
                self.events.push(
                    now + self.start_s, EventKind.REPLICA_READY, r.replica_id, r.version
                )

    def _drained(self, r: SimReplica) -> bool:
        n = self.world.external.get(r.node_id) if r.pool is Pool.EXTERNAL else None
        return n is not None and n.out

    def _stop(self, r: SimReplica, now: float) -> None:
        self._changes += 1
        r.state = ReplicaState.STOPPING
        r.version += 1
        self.events.push(now + self.stop_s, EventKind.REPLICA_GONE, r.replica_id, r.version)

    def ready(self, replica_id: str, version: int) -> None:
        r = self.replicas.get(replica_id)
        if r is not None and r.version == version and r.state is ReplicaState.STARTING:
            r.state = ReplicaState.RUNNING
            r.version += 1
            self._changes += 1
            self._settle_cause(r.model)
            if self.world.draining:
                self.reconcile()  # a replacement for a drained node's replica may be up

    def gone(self, replica_id: str, version: int) -> None:
        r = self.replicas.get(replica_id)
        if r is not None and r.version == version and r.state is ReplicaState.STOPPING:
            self._remove(r)

    def _remove(self, r: SimReplica) -> None:
        self._changes += 1
        del self.replicas[r.replica_id]
        self.by_model[r.model].remove(r)
        self.world.give(r.node_id, r.gpus, training=False)  # the node may be down

    def node_lost(self, node_id: str, cause: str = "failures") -> int:
        """A node failed (or its provider took it back: `cause` ``reclaims``): its replicas
        are gone at once. Returns how many of them were not stopping already."""
        gone = [r for r in self.replicas.values() if r.node_id == node_id]
        for r in gone:
            self._remove(r)
        for model in sorted({r.model for r in gone}):
            self._mark(model, cause)
        return sum(1 for r in gone if r.state is not ReplicaState.STOPPING)

    def evict(self, model: str, node_ids: set[str], n: int) -> int:
        """Kill up to `n` cluster replicas of `model` on `node_ids` at once (evict-first)."""
        victims = [
            r
            for r in self.by_model[model]
            if r.pool is Pool.CLUSTER
            and r.node_id in node_ids
            and r.state is not ReplicaState.STOPPING
        ][:n]
        for r in victims:
            self._remove(r)
        if victims:
            self._mark(model, "moves")
        return len(victims)

    def set_demand(self, model: str, rps: float) -> None:
        self.rps[model] = rps
        self._settle_cause(model)

    # -- ServePlane (the loop's protocol) ------------------------------------------------------

    def view(self) -> ServeView:
        """What Serve runs now (cached until a replica, target or route changes)."""
        key = (self._changes, self.generation)
        if self._view is None or self._view_at != key:
            self._view = self._build_view()
            self._view_at = key
        return self._view

    def _build_view(self) -> ServeView:
        pools: dict[tuple[str, Pool], PoolView] = {}
        rows: list[ServeReplica] = []
        for model in sorted(self.by_model):
            counts = {p: dict.fromkeys(ReplicaState, 0) for p in POOLS}
            for r in self.by_model[model]:
                counts[r.pool][r.state] += 1
                rows.append(ServeReplica(r.replica_id, model, r.pool, r.node_id, r.gpus, r.state))
            for p in POOLS:
                c = counts[p]
                if (model, p) in self.targets or any(c.values()):
                    pools[(model, p)] = PoolView(
                        target=self.targets.get((model, p), 0),
                        running=c[ReplicaState.RUNNING],
                        starting=c[ReplicaState.STARTING],
                        stopping=c[ReplicaState.STOPPING],
                        weight=self.weights.get(model, {}).get(p, 0.0),
                    )
        return ServeView(deployed=True, pools=pools, replicas=tuple(rows))

    def loads(self) -> Mapping[str, float]:
        return {}

    def ingress_traffic(self) -> IngressTraffic:
        """Not simulated: the view's ``ingress_target`` is 0, so the loop never scales it."""
        return IngressTraffic()

    def scale_ingress(self, num_replicas: int) -> None:
        raise NotImplementedError("the simulator does not model the ingress")

    def request_external(self, bundles: list[dict[str, float]]) -> None:
        """The autoscaler's answer to ``request_resources``: each bundle's GPUs from the
        provider its ``provider_<name>`` resource names (none named: the first provider)."""
        names = list(self.world.providers)
        gpus = dict.fromkeys(names, 0)
        for b in bundles:
            name = next(
                (k for k in names if b.get(provider_resource(k))), names[0] if names else ""
            )
            if name:
                gpus[name] += int(b.get("GPU", 0.0))
        self.world.want_external(gpus)

    def scale_pool(self, model: str, pool: Pool, num_replicas: int) -> None:
        if num_replicas < self.targets.get((model, pool), 0):
            planned = {p: self.targets.get((model, p), 0) for p in POOLS}
            planned[pool] = num_replicas
            self.route_for_targets(model, planned)
        self.targets[(model, pool)] = num_replicas
        self._changes += 1
        self.reconcile()

    def set_route_weights(self, model: str, weights: Mapping[Pool, float]) -> None:
        self.weights[model] = dict(weights)
        self.generation += 1

    def set_pool_target(self, model: str, pool: Pool, num_replicas: int) -> None:
        if self.targets.get((model, pool)) != num_replicas:
            self.targets[(model, pool)] = num_replicas
            self._changes += 1
            self.reconcile()

    def pool_running(self, model: str, pool: Pool, target: int) -> bool:
        return self.targets.get((model, pool)) == target and self.running(model, pool) >= target

    def pool_settled(self, model: str, pool: Pool, target: int) -> bool:
        mine = [r for r in self.by_model[model] if r.pool is pool]
        return self.targets.get((model, pool)) == target and all(
            r.state is ReplicaState.RUNNING for r in mine
        )

    def route_for_targets(self, model: str, planned: Mapping[Pool, int]) -> int:
        running = {p: min(self.running(model, p), planned.get(p, 0)) for p in POOLS}
        total = sum(running.values())
        if total:
            self.set_route_weights(model, {p: n / total for p, n in running.items()})
        return self.generation

    def route_applied(self, generation: int) -> bool:
        return self.generation >= generation
