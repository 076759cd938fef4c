"""The schemes teams run today, as simple schedulers of their own (not this product's policies).

Owns: `StaticSplit`, `EvictFirst` and `TimeOfDay`, each a `step(now)` over the same `World`
and `SimServe` as our scheme, and `SCHEMES`, the registry by name. What they share:

- training: best-effort FIFO gang admission (priority, then arrival): every queued job whose
  whole gang fits on the nodes training may use starts, first fit (whole free nodes for
  node-sized workers, the fullest node with room for a smaller one); a job that does not fit
  waits and does not block later ones; no preemption among training jobs; checkpoints every
  ``baseline_checkpoint_interval_s``;
- serving: each model runs ``ceil(demand / per-replica rate)`` replicas (within its
  min/max) as soon as demand changes, where the scheme lets it;
- health: none (telemetry is not watched; a fault that escalates fails the node);
- failures: every failed gang is re-queued (a worker crash leaves its node up, a node loss
  takes it down), as our scheme did before issue 30;
- spot reclaims: no notice handling (`on_reclaim` does nothing): the rented node serves on
  until its notice runs out, its replicas die with it, and the world rents its replacement
  then (the ask stands); Serve starts theirs where the pool has room. Only evict-first rents,
  so only it meets reclaims.

The schemes:

1. **static split**: the first ``static_serving_share`` of the nodes serve, the rest train;
   no external pool.
2. **evict-first**: one shared cluster; serving grows on free cluster GPUs, else on the
   external pool; a queued job that does not fit kills serving replicas on the nodes it takes
   (no make-before-break) and their replacements start on the external pool (Kueue priority
   preemption of serving by training). Replicas come back to the cluster only as demand falls.
   The external GPUs are rented cheapest provider first, each up to its most
   (`cheapest_first`); a provider in a stock-out is asked all the same and its nodes come
   when the world delivers them (no deadline, no back-off: that rule is ours).
3. **time-of-day lending**: serving owns ``static_serving_share`` by day and
   ``night_serving_share`` from ``night_start_hour`` to ``night_end_hour``; training uses the
   rest; at the morning switch the gangs on the returned nodes checkpoint and are re-queued,
   at the evening switch serving shrinks to its night share, whatever the demand.

Must not: import or call `policies` (these are the comparison, not our scheme).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from controlplane.simulate.engine import EventKind, EventQueue
from controlplane.simulate.nodes import Node, ProviderSpec
from controlplane.simulate.scenario import ModelSpec, Scenario
from controlplane.simulate.serving import SimServe
from controlplane.simulate.training import JobRun
from controlplane.simulate.world import Replace, World
from policies.snapshot import Pool

__all__ = [
    "SCHEMES",
    "BaseScheme",
    "EvictFirst",
    "StaticSplit",
    "TimeOfDay",
    "cheapest_first",
    "serving_nodes",
]

PRIORITY = {"low": 0, "medium": 50, "high": 100}


def fifo(run: JobRun) -> tuple[int, float, str]:
    """The baselines' queue order: priority, then arrival."""
    return -PRIORITY.get(run.spec.priority, 0), run.queued_s, run.spec.job_id


def need_gpus(models: list[ModelSpec], rps: Callable[[ModelSpec], float]) -> int:
    """GPUs the models need at `rps`, sized at their target utilisation."""
    return sum(
        max(
            m.min_replicas,
            min(m.max_replicas, math.ceil(rps(m) / (m.replica_rps * m.target_utilisation))),
        )
        * m.gpus_per_replica
        for m in models
    )


def cheapest_first(providers: tuple[ProviderSpec, ...], gpus: int) -> dict[str, int]:
    """`gpus` over `providers` (cheapest first, ties in the given order), each up to its
    most; what none has room for is asked of no one.

    Example: ``a`` ($2.5, 16 GPUs) and ``b`` ($3.5, 16 GPUs), 20 GPUs: ``a`` 16, ``b`` 4."""
    left = max(0, gpus)
    out = {}
    for p in sorted(providers, key=lambda p: p.price_per_gpu_hour):
        out[p.name] = min(left, p.max_gpus)
        left -= out[p.name]
    return out


def serving_nodes(s: Scenario, night: bool) -> int:
    """Nodes a partition gives serving: the peak need (or the night's highest) plus 10 %."""
    sc = s.schemes
    share = sc.night_serving_share if night else sc.static_serving_share
    if share is not None:
        return min(s.nodes, math.ceil(share * s.nodes))
    models = s.serving.models
    if night:
        hours = [
            h / 4 for h in range(96) if _is_night(h / 4, sc.night_start_hour, sc.night_end_hour)
        ]
        gpus = max(
            (need_gpus(models, functools.partial(ModelSpec.curve_rps, hour=h)) for h in hours),
            default=0,
        )
    else:
        gpus = need_gpus(models, lambda m: m.peak_rps)
    return min(s.nodes, math.ceil(gpus * 1.1 / s.gpus_per_node))


def _is_night(hour: float, start: float, end: float) -> bool:
    return hour >= start or hour < end if start > end else start <= hour < end


class BaseScheme:
    name = "base"

    def __init__(self, s: Scenario, world: World, serve: SimServe, queue: EventQueue) -> None:
        self.s = s
        self.world = world
        self.serve = serve
        self.events = queue
        self.models = {m.name: m for m in s.serving.models}
        self.training_nodes: list[str] = list(world.cluster_ids)

    # The world's hooks: the baselines watch no telemetry, ignore reclaim notices and
    # re-queue every failed gang.
    in_place_s: float | None = None
    replace: Replace | None = None

    def node_back(self, node_id: str) -> None: ...

    def on_failure(self, node_id: str) -> None: ...

    def on_fault(self, node_id: str, kind: str | None) -> None: ...

    def on_reclaim(self, node_id: str) -> None: ...

    # -- training: best-effort FIFO gangs, first fit -------------------------------------------

    def admit_fitting(self) -> None:
        w = self.world
        if not w.queued:
            return
        gpn = self.s.gpus_per_node
        nodes = [w.nodes[i] for i in self.training_nodes]
        whole = [n for n in nodes if n.free == n.gpus]
        partial = sorted((n for n in nodes if 0 < n.free < n.gpus), key=lambda n: n.free)
        free_total = sum(n.free for n in nodes)
        now = w.now_s
        for run in sorted(w.queued.values(), key=fifo):
            if free_total <= 0:
                break
            if run.not_before_s is not None and run.not_before_s > now:
                continue
            g, k = run.spec.gpus_per_worker, run.spec.num_workers
            if g * k > free_total:
                continue
            placement: dict[str, int] | None = None
            if g == gpn:
                if len(whole) >= k:
                    placement = {n.node_id: g for n in whole[:k]}
                    del whole[:k]
            elif k == 1:
                fit = next((n for n in partial if n.free >= g), None) or (
                    whole[0] if whole else None
                )
                if fit is not None:
                    placement = {fit.node_id: g}
            if placement is None:
                continue
            self.start(run, placement)
            free_total -= g * k
            partial = sorted((n for n in nodes if 0 < n.free < n.gpus), key=lambda n: n.free)
            whole = [n for n in whole if n.free == n.gpus]

    def start(self, run: JobRun, placement: dict[str, int]) -> None:
        run.interval_s = self.s.training.baseline_checkpoint_interval_s
        self.world.admit(run.spec.job_id, placement)

    def scale_serving(self, pool: Pool = Pool.CLUSTER) -> None:
        for model in sorted(self.models):
            self.serve.targets[(model, pool)] = self.serve.wanted(model)
        self.serve.reconcile()

    def step(self, now: float) -> None:
        raise NotImplementedError


class StaticSplit(BaseScheme):
    name = "static-split"

    def __init__(self, s: Scenario, world: World, serve: SimServe, queue: EventQueue) -> None:
        super().__init__(s, world, serve, queue)
        k = serving_nodes(s, night=False)
        mine = set(world.cluster_ids[:k])
        serve.cluster_ok = lambda n: n.node_id in mine
        self.training_nodes = world.cluster_ids[k:]

    def step(self, now: float) -> None:
        self.scale_serving()
        self.admit_fitting()


class EvictFirst(BaseScheme):
    name = "evict-first"

    def step(self, now: float) -> None:
        self._scale()
        self.admit_fitting()
        self._evict_for_head()
        self._request_external()

    def _scale(self) -> None:
        sv = self.serve
        for model in sorted(self.models):
            g = self.models[model].gpus_per_replica
            c = sv.targets.get((model, Pool.CLUSTER), 0)
            e = sv.targets.get((model, Pool.EXTERNAL), 0)
            want = sv.wanted(model)
            if want > c + e:
                room = (
                    sum(n.free // g for n in self.world.nodes.values())
                    if not self.world.queued
                    else 0
                )
                grow = min(want - c - e, room)
                c, e = c + grow, e + want - c - e - grow
            elif want < c + e:
                drop = c + e - want
                e_drop = min(e, drop)
                e, c = e - e_drop, c - (drop - e_drop)
            sv.targets[(model, Pool.CLUSTER)] = c
            sv.targets[(model, Pool.EXTERNAL)] = e
        sv.reconcile()

    def _evict_for_head(self) -> None:
        w = self.world
        now = w.now_s
        heads = sorted(
            (r for r in w.queued.values() if r.not_before_s is None or r.not_before_s <= now),
            key=fifo,
        )
        if not heads:
            return
        head = heads[0]
        g, k = head.spec.gpus_per_worker, head.spec.num_workers
        serving_on: dict[str, int] = {}
        for r in self.serve.replicas.values():
            if r.pool is Pool.CLUSTER:
                serving_on[r.node_id] = serving_on.get(r.node_id, 0) + r.gpus
        # Nodes whose free plus serving GPUs hold a worker, the cheapest eviction first.
        cands = sorted(
            (
                n
                for n in w.nodes.values()
                if n.up and not n.out and n.free + serving_on.get(n.node_id, 0) >= g
            ),
            key=lambda n: (serving_on.get(n.node_id, 0), n.node_id),
        )
        chosen: list[Node] = []
        slots = 0
        for n in cands:
            if slots >= k:
                break
            if n.used - serving_on.get(n.node_id, 0) > n.gpus - g:
                continue  # training holds too much of it
            chosen.append(n)
            slots += (n.free + serving_on.get(n.node_id, 0)) // g
        if slots < k or not any(serving_on.get(n.node_id) for n in chosen):
            return
        node_ids = {n.node_id for n in chosen}
        for model in sorted(self.models):
            killed = self.serve.evict(model, node_ids, 10**9)
            if killed:
                c = self.serve.targets.get((model, Pool.CLUSTER), 0)
                e = self.serve.targets.get((model, Pool.EXTERNAL), 0)
                self.serve.targets[(model, Pool.CLUSTER)] = max(0, c - killed)
                self.serve.targets[(model, Pool.EXTERNAL)] = e + killed
        placement: dict[str, int] = {}
        left = k
        for n in chosen:
            take = min(left, n.free // g)
            if take:
                placement[n.node_id] = take * g
                left -= take
        if left == 0:
            self.start(head, placement)
        self.serve.reconcile()

    def _request_external(self) -> None:
        gpus = sum(
            self.serve.targets.get((m, Pool.EXTERNAL), 0) * spec.gpus_per_replica
            for m, spec in self.models.items()
        )
        asked = cheapest_first(self.world.by_price, gpus)
        if asked != self._asked or gpus == 0:
            self.world.want_external(asked)
            self._asked = asked

    _asked: dict[str, int] | None = None


class TimeOfDay(BaseScheme):
    name = "time-of-day"

    def __init__(self, s: Scenario, world: World, serve: SimServe, queue: EventQueue) -> None:
        super().__init__(s, world, serve, queue)
        self.day_nodes = serving_nodes(s, night=False)
        self.night_nodes = serving_nodes(s, night=True)
        self.current = -1
        sc = s.schemes
        day = 0.0
        while day < s.horizon_s:
            for hour in (sc.night_start_hour, sc.night_end_hour):
                if day + hour * 3600 < s.horizon_s:
                    queue.push(day + hour * 3600.0, EventKind.WAKE, "schedule")
            day += 86400.0

    def step(self, now: float) -> None:
        sc = self.s.schemes
        night = _is_night((now / 3600.0) % 24.0, sc.night_start_hour, sc.night_end_hour)
        k = self.night_nodes if night else self.day_nodes
        ids = self.world.cluster_ids
        if k != self.current:
            mine = set(ids[:k])
            self.serve.cluster_ok = lambda n, mine=mine: n.node_id in mine  # type: ignore[misc]
            self.training_nodes = ids[k:]
            if k > self.current >= 0:  # morning: the gangs on returned nodes checkpoint out
                for run in list(self.world.running.values()):
                    if any(n in mine for n in run.placement):
                        self.world.preempt(run.spec.job_id, checkpoint_first=True)
            self.current = k
        self.serve.prefer_stop = set(ids[k:])
        fits = self._fit_targets(k)
        for model in sorted(self.models):
            self.serve.targets[(model, Pool.CLUSTER)] = fits[model]
        self.serve.reconcile()
        self.admit_fitting()

    def _fit_targets(self, k: int) -> dict[str, int]:
        """Each model's wanted count, cut (largest replicas first) to what k nodes hold."""
        budget = k * self.s.gpus_per_node
        out: dict[str, int] = {}
        for model in sorted(self.models, key=lambda m: -self.models[m].gpus_per_replica):
            g = self.models[model].gpus_per_replica
            n = min(self.serve.wanted(model), budget // g)
            out[model] = n
            budget -= n * g
        return out


SCHEMES: dict[str, type[BaseScheme]] = {c.name: c for c in (StaticSplit, EvictFirst, TimeOfDay)}
"""The baselines by name (our scheme is `controlplane.simulate.ours.OurScheme`)."""
