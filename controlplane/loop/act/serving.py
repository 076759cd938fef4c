"""The Serve actuator: applies the serving plan and advances the moves in flight.

Owns: carrying out, item by item, what the serving policies returned:

* `RequestExternalCapacity` -> the Ray autoscaler's ``request_resources``, one bundle per
  external replica wanted (`ServeActuator.external_bundles`);
* `MoveServeReplicas` -> a tracked `operations.MoveOperation`, stored (``serving.operations``)
  before its first write and advanced one step per tick (`advance`);
* `ScaleServePool` -> the pool's target: a scale-up at once; a scale-down waits
  (``serve.scale.wait``, retried next tick) until every other pool of the model runs all of
  its target, then routes away from the leaving replicas before it lowers the target;
* `SetRouteWeights` -> the route table, when it differs from what is deployed;
* `ScaleIngress` -> the ingress deployment's replica count, at once;
* on Kubernetes with the in-tree autoscaler off, each external group's size (`ExternalGroup`).

While a model has a move in flight, the operation owns its replicas and routes (the single
writer): scale and route items for it are left for the policies to decide again once the move
ends. A restarted controller reads the operations back (`load`), says so once
(``serve.resume``) and resumes them where they were.

Must not: decide, or wait for a replica to start or stop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from controlplane.adapters.serve import ServePlane, ServeView
from controlplane.loop.act import operations
from controlplane.loop.act.operations import MoveOperation, MoveOutcome
from controlplane.loop.record import EventKind, Recorder
from controlplane.loop.types import MetricSink
from controlplane.store import Store
from policies import external_shrink
from policies.external_shrink import ExternalGroupSize
from policies.placement import PoolTargets
from policies.plan import (
    Action,
    MoveServeReplicas,
    RequestExternalCapacity,
    ScaleIngress,
    ScaleServePool,
    SetRouteWeights,
)
from policies.providers import provider_resource
from policies.snapshot import ReplicaState
from serve.config import ServingConfig

__all__ = [
    "EXTERNAL_GROUP_RECHECK_S",
    "OPERATIONS_KEY",
    "ExternalGroup",
    "ScaleExternal",
    "ScaleOutcome",
    "ServeActuator",
]

log = logging.getLogger(__name__)

OPERATIONS_KEY = "serving.operations"
LEGACY_INFLIGHT_KEY = "serving.inflight"
"""Where a controller before the single loop kept the plan it was applying."""
EXTERNAL_GROUP_RECHECK_S = 30.0


class ServeActuator:
    def __init__(
        self,
        serve: ServePlane,
        serving: ServingConfig,
        store: Store,
        record: Recorder,
        metrics: MetricSink,
    ) -> None:
        self.serve = serve
        self.models = {m.name: m for m in serving.models}
        self.timeout_s = float(serving.ready_timeout_s)
        self.store = store
        self._record = record
        self.metrics = metrics
        self.operations: list[MoveOperation] = self.load()
        self._resumed = False

    def load(self) -> list[MoveOperation]:
        raw = self.store.get_value(OPERATIONS_KEY, None) or []
        ops: list[MoveOperation] = []
        for item in raw:
            try:
                ops.append(MoveOperation.from_dict(item))
            except (KeyError, ValueError, AssertionError):
                log.exception("dropping an unreadable stored move %r", item)
        return ops

    def _save(self) -> None:
        if self.operations:
            self.store.put(OPERATIONS_KEY, [op.to_dict() for op in self.operations])
        else:
            self.store.delete(OPERATIONS_KEY)

    @property
    def busy(self) -> bool:
        """Whether a move is in flight (the serving policies then wait for it)."""
        return bool(self.operations)

    def moving(self) -> set[str]:
        return {op.model for op in self.operations}

    # -- each tick -----------------------------------------------------------------------------

    def advance(self, now_s: float, wanted: Mapping[str, int] | None = None) -> None:
        """Take every move in flight one step further (see `operations`); ``wanted``: what
        demand wants of each model this tick (`Decision.wanted`)."""
        wanted = wanted or {}
        if not self._resumed:
            self._resumed = True
            self.store.delete(LEGACY_INFLIGHT_KEY)
            if self.operations:
                shown = "; ".join(f"{op.describe()} ({op.phase.value})" for op in self.operations)
                self._record(
                    EventKind.SERVE_RESUME,
                    f"resuming after a restart with {len(self.operations)} move(s) in flight: "
                    f"{shown}",
                )
        if not self.operations:
            return
        left: list[MoveOperation] = []
        changed = False
        for op in self.operations:
            new, outcome = operations.advance(
                op, self.serve, now_s, self.timeout_s, wanted.get(op.model)
            )
            if outcome is MoveOutcome.DONE:
                changed = True
                self._record(
                    EventKind.SERVE_MOVE_DONE,
                    f"{op.model}: moved {op.num_replicas} in {now_s - op.started_s:.1f}s"
                    + self._freed(op),
                )
                self.metrics.inc("rcp_serve_moves_total", {"model": op.model})
            elif outcome is MoveOutcome.UNWOUND:
                changed = True
                self._record(
                    EventKind.SERVE_MOVE_UNWOUND,
                    f"{op.describe()}: the {op.phase.value} step did not finish within "
                    f"{self.timeout_s:g}s; "
                    + (
                        f"{op.to_pool.value} put back to {op.to_target - op.num_replicas}"
                        if op.phase is operations.MovePhase.MAKE
                        else "left where it got; the policies settle the rest"
                    ),
                )
            else:
                changed = changed or new != op
                left.append(new)
        self.operations = left
        if changed:
            self._save()

    def _freed(self, op: MoveOperation) -> str:
        """Whether the nodes the move named are free of its source replicas now (Serve picks
        which replica stops, so this is checked, not assumed)."""
        if not op.node_ids:
            return ""
        named = set(op.node_ids)
        left = sorted(
            r.node_id
            for r in self.serve.view().replicas
            if r.model == op.model
            and r.pool is op.from_pool
            and r.node_id in named
            and r.state is not ReplicaState.STOPPING
        )
        if not left:
            return f"; {', '.join(sorted(named))} freed"
        return f"; Serve kept {len(left)} on {', '.join(sorted(set(left)))} (it picks which stop)"

    def apply(
        self,
        plan: tuple[Action, ...],
        targets: tuple[PoolTargets, ...],
        view: ServeView,
        now_s: float,
    ) -> None:
        """Apply the serving plan in its order (external capacity, moves, scales, routes)."""
        started: set[str] = set()
        for a in plan:
            if isinstance(a, RequestExternalCapacity):
                self.serve.request_external(self.external_bundles(targets, a.by_provider))
                self._record(EventKind.SERVE_EXTERNAL_CAPACITY, a.reason)
            elif isinstance(a, MoveServeReplicas):
                if self._start(a, view, now_s):
                    started.add(a.model)
            elif isinstance(a, ScaleIngress):
                self._record(
                    EventKind.SERVE_INGRESS_SCALE,
                    f"ingress: {view.ingress_target} -> {a.num_replicas} replicas: {a.reason}",
                )
                self.serve.scale_ingress(a.num_replicas)
            elif isinstance(a, ScaleServePool | SetRouteWeights):
                if a.model in started or a.model in self.moving():
                    continue  # the move owns this model's replicas and routes until it ends
                if isinstance(a, ScaleServePool):
                    self._scale(a, view)
                elif a.weights != view.weights(a.model):
                    self.serve.set_route_weights(a.model, dict(a.weights))

    def _start(self, a: MoveServeReplicas, view: ServeView, now_s: float) -> bool:
        if a.num_replicas <= 0 or a.model in self.moving():
            return False
        op = operations.start(a, view, now_s)
        if op is None:
            return False
        self.operations.append(op)
        self._save()  # before the first write: a restarted controller resumes it
        self._record(EventKind.SERVE_MOVE_START, f"{op.describe()}: {a.reason}")
        new, _ = operations.advance(op, self.serve, now_s, self.timeout_s)
        if new != op:
            self.operations[-1] = new
            self._save()
        return True

    def _scale(self, a: ScaleServePool, view: ServeView) -> None:
        have = view.target(a.model, a.pool)
        if a.num_replicas < have and not view.others_ready(a.model, a.pool):
            self._record(
                EventKind.SERVE_SCALE_WAIT,
                f"{a.model}/{a.pool.value}: {have} -> {a.num_replicas} waits for the other pool",
            )
            return
        self._record(EventKind.SERVE_SCALE, f"{a.model}/{a.pool.value}: {a.reason}")
        self.serve.scale_pool(a.model, a.pool, a.num_replicas)

    def external_bundles(
        self, targets: tuple[PoolTargets, ...], by_provider: tuple[tuple[str, int], ...] = ()
    ) -> list[dict[str, float]]:
        """One resource bundle per external replica wanted, for ``request_resources``, each
        naming the provider whose share (`by_provider`: GPUs per provider, in order) holds it
        whole, so the autoscaler launches that provider's nodes; past the split, none."""
        left: dict[str, float] = {name: float(g) for name, g in by_provider if g > 0}
        bundles: list[dict[str, float]] = []
        for t in targets:
            m = self.models[t.model]
            for _ in range(t.external):
                bundle = {"GPU": float(m.num_gpus), "CPU": float(m.num_cpus), "pool_external": 1.0}
                need = max(1.0, float(m.num_gpus))
                name = next((k for k, gpus in left.items() if gpus >= need), None)
                if name is not None:
                    left[name] -= need
                    bundle[provider_resource(name)] = 1.0
                bundles.append(bundle)
        return bundles


class ScaleOutcome(Protocol):
    @property
    def changed(self) -> bool: ...

    @property
    def refused(self) -> str | None: ...

    @property
    def detail(self) -> str: ...


class ScaleExternal(Protocol):
    """The Kubernetes actuator's ``scale_external``: a provider's group to `replicas` nodes,
    a shrink only by the pods `workers_to_delete` names."""

    def __call__(
        self, replicas: int, provider: str | None = None, workers_to_delete: Sequence[str] = ()
    ) -> ScaleOutcome: ...


class ExternalGroup:
    """Each external provider's worker group, sized through the RayCluster on Kubernetes with
    the in-tree autoscaler off (``request_resources`` alone would reach no autoscaler).

    A group grows to what `policies.external_shrink.decide` wants; it shrinks only by the
    emptied nodes the policy named, as their pods' names (`hostname`; a node without one is
    not named), less any that gained work since the decision (`busy_now`, read afresh just
    before the write: `policies.external_shrink.recheck`). Level-triggered: a group is set
    when its size changed or it names nodes, and every group is re-asserted every
    `EXTERNAL_GROUP_RECHECK_S` (a failed or overwritten scale is repaired, names of pods that
    are gone are cleared). `scale` makes the Kubernetes adapter's ``scale_external`` on first
    use."""

    def __init__(
        self,
        gpus_per_node: Mapping[str, int],
        scale: Callable[[], ScaleExternal | None],
        record: Recorder,
        *,
        hostname: Callable[[str], str | None] = lambda _node_id: None,
        busy_now: Callable[[Sequence[str]], Collection[str]] = lambda _node_ids: (),
    ) -> None:
        self.gpus_per_node = {name: max(1, g) for name, g in gpus_per_node.items()}
        self._make = scale
        self._scale: ScaleExternal | None = None
        self._record = record
        self._hostname = hostname
        self._busy_now = busy_now
        self.applied: dict[str, int] = {}
        self.recheck_at = 0.0

    def apply(self, sizes: Sequence[ExternalGroupSize]) -> None:
        """Write each provider's group as `sizes` (one per provider) says."""
        wanted = {s.provider: s.num_nodes for s in sizes}
        taking = any(s.remove_node_ids for s in sizes)
        now = time.monotonic()
        if wanted == self.applied and not taking and now < self.recheck_at:
            return
        if self._scale is None:
            self._scale = self._make()
        if self._scale is None:
            return
        recheck = now >= self.recheck_at
        named = [n for s in sizes for n in s.remove_node_ids]
        busy = self._busy_now(named) if named else ()
        for size in sizes:
            if not (
                recheck
                or size.remove_node_ids
                or self.applied.get(size.provider) != wanted[size.provider]
            ):
                continue
            size = external_shrink.recheck(size, busy)
            pods = tuple(p for p in map(self._hostname, size.remove_node_ids) if p)
            result = self._scale(size.num_nodes, size.provider, pods)
            self.applied[size.provider] = size.num_nodes
            if result.changed or result.refused:
                self._record(EventKind.SERVE_EXTERNAL_GROUP, f"{result.detail} ({size.reason})")
        if recheck:
            self.recheck_at = now + EXTERNAL_GROUP_RECHECK_S
