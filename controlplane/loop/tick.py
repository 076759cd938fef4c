"""The control loop: one thread, one tick every ``policy.tick_s``, in four phases.

Owns: `Loop`, the only decider in the control plane. Each tick, in numbered phases that each
catch, log and count their own failure, so the loop never dies:

0. retention - one bounded batch of finished jobs and old events leaves the store (the
   shell's hook, at most every ``jobs.prune_interval_s``);
1. observe - `observe.observe`, health's verdicts (`health.HealthKeeper.judge`: unhealthy
   nodes leave the snapshot's capacity at once) and the operators' guards (`guards`);
2. decide - `decide.decide`, every policy in one batch (held back while paused: `guards.hold`);
3. act - the jobs' plans through the job runner (`act.jobs`), remediation through
   `health.HealthKeeper.act`, the serving plan through `act.serving.ServeActuator` (moves in
   flight advanced one step first: a move is a tracked operation, never a wait), the
   external groups on Kubernetes (`policies.external_shrink`);
4. record - policy state to the store, new plan actions to the event log (held ones as
   ``policy.held``), metrics, local Prometheus targets, per-job gauges (the shell's hook).

Tests call `tick` directly, with fake adapters (tests/unit/loop_fakes.py).

Must not: touch an external system except through its adapter (`Adapters`), or decide
anything itself.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from controlplane.adapters.serve import ServePlane
from controlplane.config import Config
from controlplane.loop.act.jobs import apply_admission
from controlplane.loop.act.nodes import NodeActions
from controlplane.loop.act.serving import ExternalGroup, ScaleExternal, ServeActuator
from controlplane.loop.decide import Policies, decide
from controlplane.loop.guards import Guards, GuardStore, hold, with_guards
from controlplane.loop.health import HealthKeeper
from controlplane.loop.observe import observe, with_health
from controlplane.loop.record import EventKind, PlanEvents
from controlplane.loop.tick_metrics import SERVING_STATE_KEY, TickMetrics, TickStats
from controlplane.loop.types import (
    Decision,
    JobActions,
    MetricSink,
    NodeInventory,
    Observation,
    ServingPolicyState,
    Telemetry,
)
from controlplane.loop.what_if import WhatIf, what_if
from controlplane.store import JobRecord, Store
from policies import external_shrink
from policies.admission import AdmissionState
from policies.external_shrink import ExternalGroupSize
from policies.plan import DrainNode
from policies.snapshot import ClusterSnapshot, Pool, QueuedJob, ServeLoad

__all__ = [
    "ADMISSION_STATE_KEY",
    "SERVING_STATE_KEY",
    "TICK_STALL_MIN_S",
    "TICK_STALL_TICKS",
    "Adapters",
    "Loop",
    "TickStats",
    "tick_stalled",
]

log = logging.getLogger(__name__)

ADMISSION_STATE_KEY = "admission.state"
TICK_STALL_TICKS = 10
TICK_STALL_MIN_S = 30.0
"""/healthz fails once no tick has started for ``max(TICK_STALL_TICKS * policy.tick_s,
TICK_STALL_MIN_S)`` seconds (`tick_stalled`): a tick hung in a phase shows, never a green
health check over a dead loop."""

SERVING_PHASES = frozenset({"3-act-serve-moves", "3-act-serve", "3-act-external-group"})
"""Phases also reported as ``rcp_serving_phase_seconds`` / ``rcp_serving_errors_total`` (the
serving plane's own dashboard panel and alert)."""

T = TypeVar("T")


@dataclass
class Adapters:
    """Everything outside the loop that it reads or changes, one adapter per system."""

    jobs: JobActions
    nodes: NodeInventory
    node_actions: NodeActions
    telemetry: Telemetry
    metrics: MetricSink
    serve: ServePlane | None = None
    """None when the control plane runs no serving plane (``serve.deploy_app`` false)."""
    latency: Callable[[], Mapping[str, float]] | None = None
    """p99 ms per served model (`controlplane.adapters.latency.PrometheusLatency.read`); None:
    no latency source, so models scale on ongoing requests alone."""
    prometheus_targets: Callable[[set[str]], None] | None = None
    kube_remove: Callable[[str, str], object] | None = None
    kube_scale_external: Callable[[], ScaleExternal | None] | None = None
    count_removal: Callable[[float], object] | None = None


@dataclass
class Hooks:
    """The shell's own per-tick work the loop runs in its phases."""

    retention: Callable[[float], object] | None = None
    job_metrics: Callable[[ClusterSnapshot, tuple[JobRecord, ...]], None] | None = None


def tick_stalled(last_start_s: float, now_s: float, tick_s: float) -> str | None:
    """Why the tick loop counts as stalled, or None: the last tick (or, before the first,
    the loop's start) began more than ``max(TICK_STALL_TICKS * tick_s, TICK_STALL_MIN_S)``
    ago. E.g. tick_s=2: stalled after 30 s; tick_s=10: after 100 s."""
    limit_s = max(TICK_STALL_TICKS * tick_s, TICK_STALL_MIN_S)
    since_s = now_s - last_start_s
    if since_s <= limit_s:
        return None
    return (
        f"tick-stalled: no control loop tick has started for {since_s:.0f}s (limit "
        f"{limit_s:g}s = max({TICK_STALL_TICKS} x policy.tick_s, {TICK_STALL_MIN_S:g}s)); "
        "a tick phase hangs or the loop died: see the controller's log"
    )


class Loop:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        adapters: Adapters,
        policies: Policies,
        *,
        hooks: Hooks | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.adapters = adapters
        self.policies = policies
        self.hooks = hooks or Hooks()
        self.clock = clock
        self.stats = TickStats()
        self.tick_starts: collections.deque[float] = collections.deque(maxlen=600)
        self.created_s = clock()
        self.metrics = adapters.metrics
        self.health = HealthKeeper(
            cfg,
            store,
            adapters.telemetry,
            adapters.node_actions,
            self.record_event,
            kube_remove=adapters.kube_remove,
            count_removal=adapters.count_removal,
        )
        self.serve = (
            ServeActuator(adapters.serve, cfg.serving, store, self.record_event, self.metrics)
            if adapters.serve is not None
            else None
        )
        kube = cfg.kubernetes
        self.external_group = (
            ExternalGroup(
                {p.name: p.gpus_per_node for p in cfg.pools.external.providers},
                adapters.kube_scale_external,
                self.record_event,
                hostname=adapters.node_actions.hostname,
                busy_now=self._busy_now,
            )
            if kube.enabled
            and not kube.autoscaler_owns_external
            and adapters.kube_scale_external is not None
            else None
        )
        self.plan_events = PlanEvents(self._record_policy)
        self.held_events = PlanEvents(self._record_held)
        self.guard_store = GuardStore(store, clock)
        self.guards = Guards()
        """The guards the last tick obeyed (kept when a read fails)."""
        self.last: Decision | None = None
        """The last tick's decision (tests and debugging)."""
        self.last_observed: Observation | None = None
        """The last tick's observation, guards applied (dry runs decide on it: `what_if`)."""
        self.tick_metrics = TickMetrics(self.metrics, policies, store)
        self.serve_load: tuple[ServeLoad, ...] = ()
        """The last tick's per-model load and p99 (`rcp serve status` shows them)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the thread ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rcp-tick", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the thread to end and wait (up to `timeout_s`) for the tick in flight to finish."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def alive(self) -> bool:
        """Whether the loop's thread runs (False before `start` and after it ended)."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except BaseException:  # never let the loop die
                log.exception("tick failed outside its phases")
            self._stop.wait(max(0.0, self.cfg.policy.tick_s - (time.monotonic() - started)))

    def liveness(self) -> str | None:
        """None while the loop is alive, else why not (what /healthz answers 503 with)."""
        last = self.tick_starts[-1] if self.tick_starts else self.created_s
        return tick_stalled(last, self.clock(), self.cfg.policy.tick_s)

    # -- one tick ------------------------------------------------------------------------------

    def _phase(self, name: str, fn: Callable[..., T], *args: object) -> T | None:
        t0 = time.monotonic()
        try:
            return fn(*args)
        except Exception:
            self._failed(name)
            if name in SERVING_PHASES:
                self.metrics.inc("rcp_serving_errors_total", {"phase": name})
            log.exception("tick phase %s failed", name)
            return None
        finally:
            took_s = time.monotonic() - t0
            self.stats.last_duration_s[name] = took_s
            if name in SERVING_PHASES:
                self.metrics.set("rcp_serving_phase_seconds", took_s, {"phase": name})

    def _failed(self, name: str) -> None:
        self.stats.failures[name] = self.stats.failures.get(name, 0) + 1

    def tick(self) -> None:
        """One observe -> decide -> act -> record pass."""
        self.stats.ticks += 1
        now_s = self.clock()
        self.tick_starts.append(now_s)
        if self.hooks.retention is not None:
            self._phase("0-retention", self.hooks.retention, now_s)
        observed = self._phase("1-observe", self._observe, now_s)
        if observed is None:
            return
        self.serve_load = observed.snapshot.serve_load
        verdicts = self._phase("1-observe-health", self.health.judge, observed.snapshot)
        if verdicts is None:  # telemetry failed this tick: act on the last verdicts
            verdicts = self.health.verdicts
        self.health.verdicts = verdicts
        observed = with_health(observed, verdicts)
        guards = self._phase("1-observe-guards", self.guard_store.load)
        if guards is not None:  # a failed read keeps the last guards: never unpause by error
            self.guards = guards
        observed = with_guards(observed, self.guards)
        self.last_observed = observed
        decided = self._phase("2-decide", self._decide, observed)
        if decided is None:
            return
        self.last = decided
        now = observed.snapshot.now_s
        self._phase("3-act-jobs", self._act_jobs, decided)
        self._phase("3-act-health", self._act_health, decided, now)
        self._phase("3-act-health-save", self.health.save_cordons)
        if self.serve is not None:
            self._phase("3-act-serve-moves", self.serve.advance, now, dict(decided.wanted))
            self._phase("3-act-serve", self._act_serve, decided, observed)
        if self.external_group is not None and decided.serving_state is not None:
            sizes = self._phase(
                "2-decide-external-group", self._decide_external_group, decided, observed
            )
            if sizes is not None:
                self._phase("3-act-external-group", self.external_group.apply, sizes)
        self._phase("4-record", self._record, decided)
        serving = self.serve is not None
        export = self.tick_metrics.export
        self._phase("4-record-metrics", export, observed, decided, self.guards, self.stats, serving)
        if self.adapters.prometheus_targets is not None:
            targets = self.adapters.prometheus_targets
            self._phase("4-record-targets", targets, set(self.health.agent_nodes))
        self._phase("4-record-health", self.health.export_metrics, observed.snapshot, self.metrics)
        if self.hooks.job_metrics is not None:
            self._phase("4-record-jobs", self.hooks.job_metrics, observed.snapshot, observed.jobs)

    # -- phases --------------------------------------------------------------------------------

    def _observe(self, now_s: float) -> Observation:
        draining = self.health.observe_draining()
        a = self.adapters
        return observe(now_s, a.jobs, self.store, a.nodes, draining, a.serve, a.latency)

    def _states(self) -> tuple[AdmissionState, ServingPolicyState]:
        admission = AdmissionState.from_dict(self.store.get_value(ADMISSION_STATE_KEY, {}) or {})
        serving = ServingPolicyState.from_dict(self.store.get_value(SERVING_STATE_KEY, None))
        return admission, serving

    def what_if(self, job: QueuedJob) -> WhatIf | None:
        """A dry run: what this tick's decision would be for `job` were it queued
        (`controlplane.loop.what_if`); None before the first observation."""
        observed = self.last_observed
        if observed is None:
            return None
        admission, serving = self._states()
        return what_if(observed, self.policies, admission, serving, job)

    def _decide(self, observed: Observation) -> Decision:
        admission, serving = self._states()
        busy = self.serve is not None and self.serve.busy
        decided = decide(observed, self.policies, admission, serving, serving_busy=busy)
        return hold(decided, admission) if self.guards.paused else decided

    def _decide_external_group(
        self, decided: Decision, observed: Observation
    ) -> tuple[ExternalGroupSize, ...]:
        """Each provider's group size (`policies.external_shrink`); a move in flight holds the
        nodes it names, and one into the external pool every external node."""
        assert self.external_group is not None and decided.serving_state is not None
        snapshot = observed.snapshot
        reserved: set[str] = set()
        for op in self.serve.operations if self.serve is not None else ():
            reserved.update(op.node_ids)
            if op.to_pool is Pool.EXTERNAL:
                reserved.update(n.node_id for n in snapshot.nodes if n.pool is Pool.EXTERNAL)
        return external_shrink.decide(
            snapshot,
            dict(decided.serving_state.placement.provider_requests()),
            self.external_group.gpus_per_node,
            self.policies.placement.providers,
            frozenset(reserved),
        )

    def _busy_now(self, node_ids: Sequence[str]) -> set[str]:
        """Which of `node_ids` hold work now, read afresh just before the group is written:
        a Serve replica in the serving plane's view, or GPUs Ray accounts as held."""
        named = set(node_ids)
        busy: set[str] = set()
        if self.adapters.serve is not None:
            busy.update(
                r.node_id for r in self.adapters.serve.view().replicas if r.node_id in named
            )
        busy.update(n for n in named - busy if self.adapters.node_actions.holds_gpus(n))
        return busy

    def _act_jobs(self, decided: Decision) -> None:
        failed = lambda: self._failed("3-act-jobs")  # noqa: E731
        self.adapters.jobs.apply(decided.lifecycle, failed)
        apply_admission(decided.admission, self.adapters.jobs, self.store, failed)

    def _act_health(self, decided: Decision, now_s: float) -> None:
        self.health.act(
            decided.remediation,
            now_s,
            self.adapters.jobs,
            self.metrics,
            lambda: self._failed("3-act-health"),
        )

    def _act_serve(self, decided: Decision, observed: Observation) -> None:
        if self.serve is None or decided.serving is None:
            return
        self.serve.apply(decided.serving, decided.targets, observed.serve, observed.snapshot.now_s)
        for a in decided.serving:
            if isinstance(a, DrainNode):  # placement's way back to a cheaper provider
                accepted = self.adapters.node_actions.drain(
                    a.node_id, a.reason, self.cfg.health.drain_deadline_s
                )
                self.record_event(
                    EventKind.SERVE_PROVIDER_DRAIN,
                    f"{a.node_id}: {a.reason}" + ("" if accepted else " (Ray refused the drain)"),
                )

    def _record(self, decided: Decision) -> None:
        self.store.put(ADMISSION_STATE_KEY, decided.admission_state.to_dict())
        if decided.serving_state is not None:
            self.store.put(SERVING_STATE_KEY, decided.serving_state.to_dict())
        for t in decided.targets:
            if t.note:
                log.warning("%s", t.note)
        self.plan_events.record(decided.admission + decided.remediation)
        self.held_events.record(decided.held)

    def record_event(self, kind: EventKind, message: str) -> None:
        log.info("%s: %s", kind.value, message)
        self.store.record_event(kind.value, message)

    def _record_policy(self, kind: EventKind, message: str, job_id: str | None) -> None:
        self.store.record_event(kind.value, message, job_id=job_id)

    def _record_held(self, kind: EventKind, message: str, job_id: str | None) -> None:
        pause = self.guards.pause
        by = "" if pause is None else f" by {pause.by} ({pause.reason})"
        action = kind.value.removeprefix("policy.")
        self.store.record_event(
            EventKind.POLICY_HELD.value,
            f"{action} held, the policy actor is paused{by}: {message}",
            job_id=job_id,
        )
