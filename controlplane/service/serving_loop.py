"""The serving loop inside the controller actor: replicas follow demand and training's claims.

Owns: a thread that every ``policy.tick_s`` runs the serving step of `controlplane.serving`
(observe Serve -> decide with `policies.demand` + `policies.placement` -> act through
`serve.operations`, make-before-break -> record), the GPUs training has claimed from serving
(set by the admission tick from its `MoveServeReplicas` actions), the admission tick's
snapshot (shared, so the inventory is read once per tick; the nodes health took out are
marked in it, so their GPUs leave the pool's serving budget and replicas that no longer fit
in the cluster pool move to the external one), the latest serve replicas (read by the
admission tick for its snapshot), and the serving metrics.

It runs apart from the admission tick because a make-before-break move waits for new replicas
to be RUNNING; admission keeps ticking meanwhile and admits the gang once the GPUs are free.

Crash safety: the replica targets and route weights live in Serve (see `serve.spec`); the
policy state lives in the store (``serving.state``), and a plan being applied is written to
``serving.inflight`` first. A restarted actor records that it resumes, re-observes, and the
policy decides from what is deployed: a half-done move shows up as extra replicas in the
target pool and is either completed (the claim still stands) or unwound by a plain scale-down
that re-routes before it stops anything.

Must not: decide (policies do) or write Serve except through `serve.operations`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

from controlplane.config import Config
from controlplane.policy_config import placement_config
from controlplane.serving import (
    ServingPolicyState,
    ServingStep,
    decision_to_json,
    targets_from_status,
)
from policies.snapshot import ServeReplica

log = logging.getLogger(__name__)

EXTERNAL_GROUP_RECHECK_S = 30.0
STATE_KEY = "serving.state"
INFLIGHT_KEY = "serving.inflight"


class _Metrics:
    """Gauges in Ray's metrics pipeline (the head's Prometheus endpoint, the dashboard)."""

    def __init__(self) -> None:
        from ray.util.metrics import Counter, Gauge

        self.replicas = Gauge(
            "rcp_serve_replicas",
            "Serve replicas per model, pool and state.",
            tag_keys=("model", "pool", "state"),
        )
        self.weight = Gauge(
            "rcp_serve_route_weight", "Route weight per model and pool.", tag_keys=("model", "pool")
        )
        self.external_gpus = Gauge(
            "rcp_external_gpus_requested", "GPUs requested from the external pool."
        )
        self.external_max = Gauge(
            "rcp_external_gpus_max",
            "Most GPUs the external pool may have (max_nodes x gpus_per_node).",
        )
        self.claim = Gauge("rcp_training_claim_gpus", "GPUs training asked serving to give back.")
        self.phase_s = Gauge(
            "rcp_serving_phase_seconds",
            "Duration of the last serving-loop phase.",
            tag_keys=("phase",),
        )
        self.errors = Counter(
            "rcp_serving_errors_total", "Failed serving-loop phases.", tag_keys=("phase",)
        )
        self.moves = Counter(
            "rcp_serve_moves_total", "Make-before-break moves done.", tag_keys=("model",)
        )


class ServingLoop:
    def __init__(self, cfg: Config, store: Any, *, start: bool = True) -> None:
        from serve.load import read_load

        self.cfg = cfg
        self.store = store
        self.step = ServingStep(
            cfg.serving,
            placement_config(cfg),
            load_source=read_load,
        )
        self._claim_gpus = 0
        self._shared: Any = None
        self._kube: Any = None
        self._external_nodes_applied: int | None = None
        self._external_recheck_at = 0.0
        """The Kubernetes actuator, made on first use (only with kubernetes.enabled)."""
        self._replicas: tuple[ServeReplica, ...] = ()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.ticks = 0
        self.failures: dict[str, int] = {}
        self.metrics = _Metrics()
        self._resumed = False
        if start:
            self._thread = threading.Thread(target=self._loop, name="rcp-serving", daemon=True)
            self._thread.start()

    # -- shared with the admission tick --------------------------------------------------------
    def set_training_claim(self, gpus: int) -> None:
        with self._lock:
            self._claim_gpus = max(0, int(gpus))

    def share_snapshot(self, snapshot: Any) -> None:
        """The admission tick's snapshot (nodes and jobs, health applied: the nodes health took
        out or Ray drains are ``healthy=False``, so their GPUs count for nothing here). The
        serving loop reuses it instead of reading the node inventory and the store again."""
        with self._lock:
            self._shared = snapshot

    def serve_replicas(self) -> tuple[ServeReplica, ...]:
        with self._lock:
            return self._replicas

    def stop(self) -> None:
        self._stop.set()

    # -- the loop ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.tick()
            except BaseException:
                log.exception("serving tick failed outside its phases")
            self._stop.wait(max(0.0, self.cfg.policy.tick_s - (time.monotonic() - t0)))

    def _phase(self, name: str, fn: Any, *args: Any) -> Any:
        t0 = time.monotonic()
        try:
            return fn(*args)
        except Exception:
            self.failures[name] = self.failures.get(name, 0) + 1
            self.metrics.errors.inc(tags={"phase": name})
            log.exception("serving phase %s failed", name)
            return None
        finally:
            self.metrics.phase_s.set(time.monotonic() - t0, tags={"phase": name})

    def tick(self) -> None:
        self.ticks += 1
        observed = self._phase("1-observe", self._observe)
        if observed is None:
            return
        status, snapshot, loads = observed
        decided = self._phase("2-decide", self._decide, snapshot, loads)
        if decided is None:
            return
        decision, state = decided
        self._phase("3-act-external-group", self._scale_external_group, state)
        self._phase("3-act", self._act, decision, status)
        self._phase("4-record", self._record, decision, state)

    def _observe(self) -> tuple[dict[str, Any], Any, dict[str, float]] | None:
        from controlplane.inventory import list_nodes
        from controlplane.service.observing import build_snapshot
        from controlplane.store import JobState

        status, replicas = self.step.observe()
        if not status.get("deployed"):
            return None
        with self._lock:
            self._replicas = replicas
        if not self._resumed:
            self._resumed = True
            inflight = self.store.get_value(INFLIGHT_KEY, None)
            if inflight:
                self.store.record_event(
                    "serve.resume", f"resuming after a restart with a plan in flight: {inflight}"
                )
        now = time.time()
        with self._lock:
            shared = self._shared
        if shared is not None and now - shared.now_s <= 2 * self.cfg.policy.tick_s:
            snapshot = dataclasses.replace(shared, now_s=now)
        else:  # no admission tick yet, or it is behind: observe for ourselves
            jobs = self.store.list_jobs(
                states=[JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING]
            )
            snapshot = build_snapshot(now, list_nodes(), jobs)
            if shared is not None:  # the last nodes health took out still are
                out = {n.node_id for n in shared.nodes if not n.healthy}
                nodes = tuple(
                    dataclasses.replace(n, healthy=False) if n.node_id in out else n
                    for n in snapshot.nodes
                )
                snapshot = dataclasses.replace(snapshot, nodes=nodes)
        snapshot = dataclasses.replace(snapshot, serve_replicas=replicas)
        try:
            loads = self.step.load_source()
        except Exception as exc:  # no load reports yet: demand sees 0 ongoing requests
            log.debug("load board unavailable: %r", exc)
            loads = {}
        for model, info in (status.get("models") or {}).items():
            for pool, p in (info.get("pools") or {}).items():
                for st in ("running", "starting", "stopping"):
                    self.metrics.replicas.set(
                        float(p.get(st, 0)), tags={"model": model, "pool": pool, "state": st}
                    )
                self.metrics.weight.set(
                    float(p.get("weight", 0.0)), tags={"model": model, "pool": pool}
                )
        return status, snapshot, dict(loads)

    def _decide(self, snapshot: Any, loads: dict[str, float]) -> Any:
        state = ServingPolicyState.from_dict(self.store.get_value(STATE_KEY, None))
        with self._lock:
            claim = self._claim_gpus
        self.metrics.claim.set(float(claim))
        return self.step.decide(snapshot, loads, state, claim)

    def _act(self, decision: Any, status: dict[str, Any]) -> None:
        current = targets_from_status(status)
        changes = any(
            (t.cluster, t.external)
            != (current.get((t.model, "cluster"), 0), current.get((t.model, "external"), 0))
            for t in decision.targets
        )
        if not decision.actions and not changes:
            return
        self.store.put(INFLIGHT_KEY, decision_to_json(decision))

        def record(kind: str, message: str) -> None:
            log.info("%s: %s", kind, message)
            self.store.record_event(kind, message)
            if kind == "serve.move.done":
                model = message.split(":", 1)[0]
                self.metrics.moves.inc(tags={"model": model})

        self.step.act(decision, current, record)
        self.store.delete(INFLIGHT_KEY)

    def _scale_external_group(self, state: ServingPolicyState) -> None:
        """On Kubernetes with the in-tree autoscaler off, size the external worker group
        through the RayCluster (`request_resources` alone would reach no autoscaler).

        Runs before the act phase, so the nodes a move waits for are on their way, and is
        level-triggered: the group is set to what the policy wants whenever that differs from
        what was last applied, and re-asserted every `EXTERNAL_GROUP_RECHECK_S` (a failed or
        overwritten scale is repaired; an unchanged one costs one read)."""
        kube = self.cfg.kubernetes
        if not kube.enabled or kube.autoscaler_owns_external:
            return
        per_node = max(1, self.cfg.pools.external.gpus_per_node)
        nodes = -(-state.placement.requested_external_gpus // per_node)
        now = time.monotonic()
        if nodes == self._external_nodes_applied and now < self._external_recheck_at:
            return
        if self._kube is None:
            from controlplane.kube import from_config

            self._kube = from_config(self.cfg)
        if self._kube is None:
            return
        result = self._kube.scale_external(nodes)
        self._external_nodes_applied = nodes
        self._external_recheck_at = now + EXTERNAL_GROUP_RECHECK_S
        if result.changed or result.refused:
            self.store.record_event("serve.external_group", result.detail)

    def _record(self, decision: Any, state: ServingPolicyState) -> None:
        self.store.put(STATE_KEY, state.to_dict())
        self.metrics.external_gpus.set(float(state.placement.requested_external_gpus))
        self.metrics.external_max.set(float(self.step.placement.external_max_gpus))
        for t in decision.targets:
            if t.note:
                log.warning("%s", t.note)
