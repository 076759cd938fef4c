"""The controller: the detached ``rcp-controller`` actor that makes the training queue real.

Owns: the job store (SQLite, WAL, at ``Config.jobs_db_path``), the HTTP API (on
``ray.node_ip:api.port``) and the tick loop, each tick in numbered phases that each catch,
log and count their own failure, so the loop never dies:

0. retention - at most every ``jobs.prune_interval_s``, one bounded batch of finished jobs and
   old events leaves the store (`retention.Retention`);
1. observe - node inventory from Ray, active jobs from the store (by index: never the finished
   jobs of the past), and `JobRunner.reconcile` (Ray
   Job states and the job signals move jobs along: RUNNING, SUCCEEDED, preemption done...);
   then one frozen `ClusterSnapshot`; a node Ray is draining counts as capacity no more;
2. health - a telemetry agent on every node (`telemetry.manager.ensure_agents`), their recent
   samples, and one verdict per node from `policies.health` (its memory, lemon records
   included, lives in the store's kv); unhealthy nodes leave the snapshot's capacity at once
   (`with_verdicts`) and the serving loop is told, so no new gang or replica lands there;
3. decide - ``policies.admission.decide(snapshot, config, state)`` and, with ``health.act``,
   ``policies.health.remediate(snapshot, verdicts)``;
4. act - `JobRunner.admit` / `preempt` for each action, `RejectJob` fails the job; remediation
   through `remediation.Remediator` (cordon = Ray drain, Serve then migrates replicas
   make-before-break; gangs there are preempted with a checkpoint first and re-queued; the
   empty node is removed so its node group replaces it);
5. record - the admission state (preemption history for the caps) goes to the store's kv,
   and every action that is new since the last tick goes to the event log;
6. metrics - gauges through Ray's metrics pipeline, among them each active job's checkpoint
   and restart gauges and the fleet's GPU MTBF (`job_metrics`); the cluster pool's GPU-hours
   go to the fleet's failure record once a minute (`job_metrics.GpuHoursMeter`).

The actor lives on the head (``resources={"pool_head": 1}``, ``num_cpus=0``), is detached and
restarts forever (``max_restarts=-1``); a restarted actor reads everything from the store and
acts idempotently (see `runner`). `deploy(cfg)` creates it or finds the running one, waits for
the API and returns its URL; the API token is created once at ``<state_dir>/api-token``
(0600) and the URL written to ``<state_dir>/api-url`` for the SDK and CLI. That is local
mode. On Kubernetes the same class runs in-process in a Ray driver instead
(`controlplane.service.run`), in a container where Ray starts no worker: no actor exists
there, so `get_controller` is None and the actor methods below are plain methods.

Must not: decide admissions itself (the policy does) or touch Ray beyond the runner and the
node inventory.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from controlplane.config import Config, from_dict, to_dict
from controlplane.pools import Pool, pool_resource
from controlplane.ray_connection import connect, ray_connection_env
from controlplane.service import reliability
from controlplane.service.job_metrics import GpuHoursMeter, JobMetrics
from controlplane.service.tokens import ensure_token, write_url
from controlplane.store import StoreError
from policies.health import BreakerState, RemovalBudget

__all__ = ["ACTOR_NAME", "NAMESPACE", "Controller", "TickStats", "deploy", "get_controller"]

log = logging.getLogger(__name__)

ACTOR_NAME = "rcp-controller"
NAMESPACE = "rcp"
STATE_KEY = "admission.state"
HEALTH_STATE_KEY = "health.state"
CORDONED_KEY = "health.cordoned"
BREAKER_KEY = "health.breaker"
AGENTS_KEY = "health.agents"
"""Node id -> actor id of the telemetry agent this controller created (the only ones trusted)."""
PROMETHEUS_REFRESH_S = 5.0
TICK_STALL_TICKS = 10
TICK_STALL_MIN_S = 30.0
"""/healthz fails once no tick has started for ``max(TICK_STALL_TICKS * policy.tick_s,
TICK_STALL_MIN_S)`` seconds (`tick_stalled`): a tick hung in a phase shows, never a green
health check over a dead loop."""
HEALTH_SAMPLES = 16
"""Newest samples read from each agent per tick; the policy skips those it has seen."""


@dataclass
class TickStats:
    """Counters the controller reports through `Controller.stats` (tests and debugging)."""

    ticks: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    last_duration_s: dict[str, float] = field(default_factory=dict)


class Controller:
    """The actor's body. Tests may build it directly with a fake runner; `deploy` runs it in Ray."""

    def __init__(self, cfg_data: dict[str, Any], token: str, *, start: bool = True) -> None:
        from controlplane.service.api import ApiServer
        from controlplane.service.queueing import JobService
        from controlplane.service.retention import Retention
        from controlplane.service.runner import JobRunner, RayJobs
        from controlplane.store import Store

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        self.cfg: Config = from_dict(cfg_data)
        self.store_problem: str | None = None
        try:
            self.store = Store(self.cfg.jobs_db_path)
        except StoreError as exc:
            # Stay up, serve nothing and say why (`get_store_problem`, which `deploy` reports)
            # rather than die in the constructor and be restarted into the same error.
            log.error("the control plane cannot start: %s", exc)
            self.store_problem = str(exc)
            return
        self.runner = JobRunner(self.store, self.cfg, RayJobs(self.cfg))
        self.retention = Retention(self.store, self.cfg.jobs, forget_many=self.runner.forget_many)
        self.service = JobService(self.store, self.cfg, log_window=self.runner.read_logs)
        from controlplane.service.serving_loop import ServingLoop

        # The serving half of the loop runs in its own thread: a make-before-break move waits
        # for new replicas, and admission must keep ticking meanwhile.
        self.serving = ServingLoop(self.cfg, self.store, start=start and self.cfg.serve.deploy_app)
        self.stats = TickStats()
        self._last_actions: set[tuple[str, str, str]] = set()
        self.gpu_hours = GpuHoursMeter(self.store, self.cfg)
        """Cluster-pool GPU-hours watched, for the fleet's failure record (MTBF)."""
        self._active_jobs: list[Any] = []
        """The QUEUED, ADMITTED and RUNNING jobs this tick's observe phase read."""
        from controlplane.service.remediation import Breaker, RayNodeControl, Remediator

        self.verdicts: dict[str, Any] = {}
        """The verdicts the last tick acted on, by node id."""
        self._health_lock = threading.Lock()
        """Held while the stored health state is read and written (tick vs operator clear)."""
        self._prometheus_targets: set[str] = set()
        self._prometheus_next_s = 0.0
        self._agent_nodes: set[str] = set()
        self._verdict_series: set[tuple[str, str]] = set()
        """(node, pool) pairs whose verdict gauges were exported, to zero departed nodes."""
        self._tick_starts: collections.deque[float] = collections.deque(maxlen=600)
        self._draining: set[str] = set()
        """Nodes Ray drains, as of this tick's observe phase."""
        self._drained_by_others: frozenset[str] = frozenset()
        self._released: set[str] = set()
        """Draining nodes (not ours) our agent has left."""
        """Draining nodes this controller did not cordon (nothing wrong with their hardware:
        gangs there are checkpointed and moved, but the node is not removed or tainted)."""
        self.remediator = Remediator(
            RayNodeControl(),
            drain_deadline_s=self.cfg.health.drain_deadline_s,
            replace_drained=self.cfg.health.replace_drained,
            record=lambda kind, message: self.store.record_event(kind, message),
            kube_remove=_kube_remove(self.cfg),
            count_removal=lambda now_s: reliability.record_failure(
                self.store, "node-removed-by-health", now_s
            ),
        )
        # The drains this controller asked for survive a restart (Ray does not say who asked).
        self.remediator.cordoned.update(self.store.get_value(CORDONED_KEY, {}) or {})
        self._saved_cordons: dict[str, float] = dict(self.remediator.cordoned)
        self.breaker = Breaker(
            self.cfg.health.breaker,
            record=lambda kind, message: self.store.record_event(kind, message),
            state=BreakerState.from_dict(self.store.get_value(BREAKER_KEY, {}) or {}),
        )
        self._breaker_lock = threading.Lock()
        """Held while the breaker steps and is stored (tick vs operator reset)."""
        self._agent_ids: dict[str, str] = dict(self.store.get_value(AGENTS_KEY, {}) or {})
        self._stop = threading.Event()
        self._created_s = time.time()
        self.api = ApiServer(
            self.service, token, self.cfg.ray.node_ip, self.cfg.api.port, liveness=self.liveness
        )
        if start:
            self.api.start()
            self._thread = threading.Thread(target=self._loop, name="rcp-tick", daemon=True)
            self._thread.start()
            self.store.record_event("controller.start", f"controller serving {self.api.url}")

    # -- actor methods -------------------------------------------------------------------------

    def url(self) -> str:
        return self.api.url

    def get_store_problem(self) -> str | None:
        """Why the job store could not be opened (the actor then serves nothing), or None."""
        return self.store_problem

    def liveness(self) -> str | None:
        """None while the tick loop is alive, else why not (what /healthz answers 503 with):
        no tick has started for a while (`tick_stalled`: a tick hung in a phase, or the loop died)."""
        last = self._tick_starts[-1] if self._tick_starts else self._created_s
        return tick_stalled(last, time.time(), self.cfg.policy.tick_s)

    def get_stats(self) -> dict[str, Any]:
        return {
            "ticks": self.stats.ticks,
            "failures": dict(self.stats.failures),
            "last_duration_s": dict(self.stats.last_duration_s),
            "tick_starts_s": list(self._tick_starts),
        }

    def health(self) -> dict[str, Any]:
        """The policy actor's view of node health: verdicts (JSON) by node id, and the nodes it
        has cordoned (Ray drain) and replaced, with when."""
        from controlplane.telemetry.manager import verdict_json

        return {
            "verdicts": {n: verdict_json(v) for n, v in self.verdicts.items()},
            "cordoned": dict(self.remediator.cordoned),
            "replaced": dict(self.remediator.replaced),
        }

    def clear_node(self, node: str) -> dict[str, Any]:
        """The operator's clear: forget `node`'s lemon record and held verdict (id, prefix or
        suffix). A node already drained is not brought back (Ray cannot undo a drain); its
        replacement starts with a clean record anyway."""
        from policies.health import HealthState, clear_lemon

        with self._health_lock:
            state = HealthState.from_dict(self.store.get_value(HEALTH_STATE_KEY, {}) or {})
            matches = [
                n for n in state.nodes if n == node or n.startswith(node) or n.endswith(node)
            ]
            if len(matches) != 1:
                known = ", ".join(sorted(state.nodes)) or "none"
                raise ValueError(
                    f"{'no' if not matches else 'more than one'} node with a health record "
                    f"matches {node!r}; nodes with records: {known}"
                )
            (node_id,) = matches
            self.store.put(HEALTH_STATE_KEY, clear_lemon(state, [node_id]).to_dict())
        self.store.record_event("health.clear", f"node {node_id}: lemon record cleared by operator")
        return {"node_id": node_id, "cordoned": node_id in self.remediator.cordoned}

    def breaker_status(self) -> dict[str, Any]:
        """The removal breaker: open (latched) and since when, its budget, the removals it
        admitted within the window (node, pool, time) and the nodes it holds."""
        with self._breaker_lock:
            state = self.breaker.state
        return _breaker_json(state, self.cfg.health.breaker, act=self.cfg.health.act)

    def reset_breaker(self) -> dict[str, Any]:
        """The operator's reset: close the breaker so that health may take nodes out again
        (within the budget; removals in the window still count). Stored at once and logged
        (`health.breaker_reset`). Returns the state before the reset."""
        with self._breaker_lock:
            before = self.breaker.reset()
            self.store.put(BREAKER_KEY, self.breaker.state.to_dict())
        return _breaker_json(before, self.cfg.health.breaker, act=self.cfg.health.act)

    # -- the loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except BaseException:  # never let the loop die
                log.exception("tick failed outside its phases")
            self._stop.wait(max(0.0, self.cfg.policy.tick_s - (time.monotonic() - started)))

    def _phase(self, name: str, fn: Any, *args: Any) -> Any:
        t0 = time.monotonic()
        try:
            return fn(*args)
        except Exception:
            self.stats.failures[name] = self.stats.failures.get(name, 0) + 1
            log.exception("tick phase %s failed", name)
            return None
        finally:
            self.stats.last_duration_s[name] = time.monotonic() - t0

    def tick(self) -> None:
        """One observe -> health -> decide -> act -> record pass."""
        from policies.health import with_verdicts

        self.stats.ticks += 1
        self._tick_starts.append(time.time())
        self._phase("0-retention", self.retention.run, time.time())
        snapshot = self._phase("1-observe", self._observe)
        if snapshot is None:
            return
        verdicts = self._phase("2-health", self._health, snapshot)
        if verdicts is None:  # telemetry failed this tick: act on the last verdicts
            verdicts = self.verdicts
        self.verdicts = verdicts
        snapshot = with_verdicts(snapshot, verdicts)
        self.serving.share_snapshot(snapshot)
        decided = self._phase("3-decide", self._decide, snapshot, verdicts)
        if decided is None:
            return
        plan, remediation, state = decided
        self._phase("4-act", self._act, plan)
        self._phase("4-act-health", self._act_health, remediation, snapshot.now_s)
        self._phase("4-act-health-save", self._save_cordons)
        self._phase("5-record", self._record, plan + remediation, state)
        self._phase("6-metrics", self._export_metrics, snapshot, plan)
        self._phase("6-metrics-targets", self._refresh_prometheus_targets)
        self._phase("6-metrics-health", self._export_health_metrics, snapshot)
        self._phase("6-metrics-jobs", self._export_job_metrics, snapshot)

    def _export_job_metrics(self, snapshot: Any) -> None:
        """The fleet record's GPU-hours (summed here, written once a minute) and the recovery
        gauges: each active job's checkpoints and restarts, and the fleet's GPU MTBF."""
        from policies.snapshot import Pool

        self.gpu_hours.tick(snapshot.live_gpus_total(Pool.CLUSTER), snapshot.now_s)
        if not hasattr(self, "_job_metrics"):
            self._job_metrics = JobMetrics()
        self._job_metrics.export(self._active_jobs, self.gpu_hours.gpu_mtbf_hours)

    def _export_metrics(self, snapshot: Any, plan: Any) -> None:
        """Queue depth, GPUs by owner per pool, admission wait, phase durations and errors."""
        from policies.plan import AdmitJob
        from policies.snapshot import Pool, ReplicaState

        m = self._metrics()
        m["queue"].set(float(len(snapshot.queued)))
        for pool in (Pool.CLUSTER, Pool.EXTERNAL):
            nodes = {n.node_id for n in snapshot.live_nodes(pool)}
            total = snapshot.live_gpus_total(pool)
            training = sum(
                g for gang in snapshot.running for n, g in gang.gpus_by_node.items() if n in nodes
            )
            serving = sum(
                r.gpus
                for r in snapshot.serve_replicas
                if r.node_id in nodes and r.state is not ReplicaState.STOPPING
            )
            for owner, gpus in (
                ("training", training),
                ("serving", serving),
                ("idle", max(0, total - training - serving)),
            ):
                m["gpus"].set(float(gpus), tags={"pool": pool.value, "owner": owner})
        submitted = {j.job_id: j.submitted_s for j in snapshot.queued}
        for action in plan:
            if isinstance(action, AdmitJob) and action.job_id in submitted:
                m["wait"].set(snapshot.now_s - submitted[action.job_id])
        for phase, seconds in self.stats.last_duration_s.items():
            m["phase"].set(seconds, tags={"phase": phase})
        for phase, n in self.stats.failures.items():
            m["errors"].set(float(n), tags={"phase": phase})

    def _metrics(self) -> dict[str, Any]:
        if not hasattr(self, "_metric_set"):
            from ray.util.metrics import Counter, Gauge

            self._metric_set = {
                "queue": Gauge("rcp_queue_depth", "Training jobs waiting in the queue."),
                "gpus": Gauge(
                    "rcp_gpus",
                    "GPUs per pool by owner (training, serving, idle).",
                    tag_keys=("pool", "owner"),
                ),
                "wait": Gauge(
                    "rcp_admission_wait_seconds",
                    "Submission (or re-queue) to admission of the last admitted job.",
                ),
                "phase": Gauge(
                    "rcp_tick_phase_seconds",
                    "Duration of the last admission-tick phase.",
                    tag_keys=("phase",),
                ),
                "errors": Gauge(
                    "rcp_tick_phase_errors",
                    "Failed admission-tick phases since start.",
                    tag_keys=("phase",),
                ),
                "verdict": Gauge(
                    "rcp_node_verdict",
                    "1 for the node's current health verdict (healthy, degraded, unhealthy).",
                    tag_keys=("node", "pool", "verdict"),
                ),
                "cordoned": Gauge(
                    "rcp_nodes_cordoned", "Nodes this controller has taken out of service."
                ),
                "breaker_open": Gauge(
                    "rcp_health_breaker_open",
                    "1 while the health breaker holds removals (health.breaker budget spent).",
                ),
                "removals_held": Gauge(
                    "rcp_health_removals_held",
                    "Unhealthy nodes the health breaker keeps from being taken out.",
                ),
                "health_actions": Counter(
                    "rcp_health_actions_total",
                    "Remediation steps taken: cordon (Ray drain), preempt, replace.",
                    tag_keys=("action",),
                ),
            }
        return self._metric_set

    def _observe(self) -> Any:
        from controlplane.inventory import list_nodes
        from controlplane.service.observing import build_snapshot
        from controlplane.store import JobState

        self.runner.reconcile()
        jobs = self.store.list_jobs(states=[JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING])
        self._active_jobs = jobs
        snapshot = build_snapshot(time.time(), list_nodes(), jobs)
        draining = set(self.remediator.nodes.draining())
        self._draining = draining
        nodes = tuple(
            dataclasses.replace(n, healthy=False) if n.node_id in draining else n
            for n in snapshot.nodes
        )
        return dataclasses.replace(
            snapshot, nodes=nodes, serve_replicas=self.serving.serve_replicas()
        )

    def _health(self, snapshot: Any) -> dict[str, Any]:
        """Verdicts by node id; the policy's memory goes back to the store."""
        from controlplane.telemetry import manager
        from controlplane.telemetry.verdicts import judge
        from policies.health import HealthState, acting_verdicts, keep_nodes

        refs = manager.ensure_agents(
            self.cfg,
            exclude=set(self.remediator.cordoned) | self._draining,
            trusted=self._agent_ids,
        )
        self._trust_agents(refs)
        self._agent_nodes = {r.node_id for r in refs if not r.idle_external}
        self._release_drained_by_others(snapshot)
        with self._health_lock:
            state = HealthState.from_dict(self.store.get_value(HEALTH_STATE_KEY, {}) or {})
            samples = manager.collect_samples(
                max_samples=HEALTH_SAMPLES,
                timeout_s=self.cfg.policy.tick_s,
                seen_until={n: s.last_sampled_s for n, s in state.nodes.items()},
                trusted=self._agent_ids,
            )
            verdicts, new_state = judge(samples, self.cfg.health, state, snapshot.now_s)
            new_state = keep_nodes(new_state, (n.node_id for n in snapshot.nodes))
            self.store.put(HEALTH_STATE_KEY, new_state.to_dict())
        verdicts, self._drained_by_others = acting_verdicts(
            verdicts, self.verdicts, self.remediator.cordoned, self._draining, snapshot
        )
        self.remediator.forget({n.node_id for n in snapshot.nodes})
        if self.cfg.health.act:
            out = set(self.remediator.cordoned) | self._draining
            with self._breaker_lock:
                before = self.breaker.state
                verdicts = self.breaker.step(verdicts, snapshot, out, snapshot.now_s)
                if self.breaker.state != before:
                    self.store.put(BREAKER_KEY, self.breaker.state.to_dict())
        return verdicts

    def _trust_agents(self, refs: Any) -> None:
        """Record the actor id of every agent this controller created; an actor under an
        agent's name with another id was killed by `ensure_agents` and is logged here."""
        ids = {}
        for r in refs:
            if r.impostor is not None:
                self.store.record_event(
                    "health.agent_impostor",
                    f"node {r.node_id}: actor {r.impostor} held the telemetry agent's name but "
                    "was not started by this controller (a user's job, or an agent started "
                    "before agent ids were recorded); killed, its readings ignored, a trusted "
                    "agent replaces it",
                )
            elif r.started and r.actor_id is not None:
                ids[r.node_id] = r.actor_id
            elif r.node_id in self._agent_ids:
                ids[r.node_id] = self._agent_ids[r.node_id]
        if ids != self._agent_ids:
            self._agent_ids = ids
            self.store.put(AGENTS_KEY, dict(ids))

    def _release_drained_by_others(self, snapshot: Any) -> None:
        """Stop our agent on a node Ray drains for someone else once nothing else runs there.

        A drained raylet exits when its node is idle, and Ray counts our agent as work: left
        running, it would keep an operator's ``ray drain-node`` from ever finishing. (Our own
        cordons are removed by `Remediator.replace`.)"""
        from controlplane.telemetry import manager

        for node_id in sorted(self._draining - set(self.remediator.cordoned)):
            if node_id in self._released:
                continue
            busy = any(g.gpus_by_node.get(node_id, 0) > 0 for g in snapshot.running) or any(
                r.node_id == node_id for r in snapshot.serve_replicas
            )
            if busy or self.remediator.nodes.holds_gpus(node_id):
                continue
            self._released.add(node_id)
            if manager.stop_agent(node_id):
                self.store.record_event(
                    "health.release",
                    f"node {node_id}: drained by Ray and empty; our agent left it",
                )
        self._released &= self._draining

    def _refresh_prometheus_targets(self) -> None:
        """Local mode's Prometheus: rewrite the agents' target list when the agents change
        (a new agent may not answer yet: what was written is compared, not what was asked),
        at most every `PROMETHEUS_REFRESH_S`. Its own phase: a failure here never stops
        health from judging."""
        if not self.cfg.observability.prometheus or self.cfg.kubernetes.enabled:
            return
        agent_nodes = self._agent_nodes
        now = time.monotonic()
        if agent_nodes == self._prometheus_targets or now < self._prometheus_next_s:
            return
        self._prometheus_next_s = now + PROMETHEUS_REFRESH_S
        from controlplane.observability import telemetry_targets_file, write_telemetry_targets

        path = telemetry_targets_file(self.cfg)
        groups = write_telemetry_targets(path, timeout_s=self.cfg.policy.tick_s)
        self._prometheus_targets = {g["labels"]["rcp_node"] for g in groups}

    def _decide(self, snapshot: Any, verdicts: dict[str, Any]) -> Any:
        from controlplane.policy_config import admission_config
        from policies.admission import AdmissionState, decide
        from policies.health import remediate

        state = AdmissionState.from_dict(self.store.get_value(STATE_KEY, {}) or {})
        plan, state = decide(snapshot, admission_config(self.cfg), state)
        remediation = remediate(snapshot, verdicts) if self.cfg.health.act else ()
        return plan, remediation, state

    def _act_health(self, remediation: Any, now_s: float) -> None:
        """Cordon, checkpoint-and-requeue, drain: see `remediation` and `policies.health`."""
        from policies.health import CordonNode
        from policies.plan import DrainNode, PreemptJob

        for action in remediation:
            try:
                done = None
                if isinstance(action, CordonNode):
                    if self.remediator.cordon(action.node_id, action.reason, now_s):
                        done = "cordon"
                elif isinstance(action, PreemptJob):
                    self.runner.preempt(action)
                    done = "preempt"
                elif isinstance(action, DrainNode) and action.node_id in self._drained_by_others:
                    pass  # whoever drains it removes it; its host did nothing wrong
                elif isinstance(action, DrainNode) and self.remediator.replace(
                    action.node_id, action.reason, now_s, cause=self._cause(action.node_id)
                ):
                    done = "replace"
                if done is not None:
                    self._metrics()["health_actions"].inc(tags={"action": done})
                # MoveServeReplicas: Serve migrates replicas off the drained node
                # make-before-break, and the serving loop, told the node is unhealthy, counts
                # its GPUs out of the cluster pool (moving replicas to the external pool when
                # the other cluster nodes are full).
            except Exception:
                self.stats.failures["4-act-health"] = self.stats.failures.get("4-act-health", 0) + 1
                log.exception("acting on %r failed", action)

    def _save_cordons(self) -> None:
        """The nodes this controller drained, for a restarted controller (Ray only says which
        nodes drain, not who asked)."""
        if self.remediator.cordoned != self._saved_cordons:
            self.store.put(CORDONED_KEY, dict(self.remediator.cordoned))
            self._saved_cordons = dict(self.remediator.cordoned)

    def _cause(self, node_id: str) -> str:
        """The short reason a node was taken out (``gpu_overheated,xid_fatal``)."""
        v = self.verdicts.get(node_id)
        return ",".join(r.value for r in v.reasons) if v is not None and v.reasons else "unhealthy"

    def _export_health_metrics(self, snapshot: Any) -> None:
        from policies.health import Verdict

        m = self._metrics()
        exported = set()
        for node in snapshot.nodes:
            verdict = self.verdicts.get(node.node_id)
            current = verdict.verdict if verdict is not None else Verdict.HEALTHY
            exported.add((node.node_id, node.pool.value))
            for v in Verdict:
                m["verdict"].set(
                    1.0 if v is current else 0.0,
                    tags={"node": node.node_id, "pool": node.pool.value, "verdict": v.value},
                )
        # A departed node's series are not set again: Ray 2.60's metrics agent drops a gauge
        # series not set for two report intervals (20 s by default), so the exported series
        # follow the live nodes. Zeroing them instead kept one series per node ever seen.
        self._verdict_series = exported
        m["cordoned"].set(float(len(self.remediator.cordoned)))
        m["breaker_open"].set(1.0 if self.breaker.state.open else 0.0)
        m["removals_held"].set(float(len(self.breaker.state.held)))

    def _act(self, plan: Any) -> None:
        from controlplane.store import JobState
        from policies.plan import AdmitJob, MoveServeReplicas, PreemptJob, RejectJob

        # GPUs the admission policy wants serving to hand back: the serving loop moves that
        # many replicas' worth to the external pool, make-before-break.
        gpus = {m.name: max(1, math.ceil(m.num_gpus)) for m in self.cfg.serving.models}
        self.serving.set_training_claim(
            sum(
                a.num_replicas * gpus.get(a.model, 1)
                for a in plan
                if isinstance(a, MoveServeReplicas)
            )
        )
        for action in plan:
            try:
                if isinstance(action, PreemptJob):
                    self.runner.preempt(action)
                elif isinstance(action, AdmitJob):
                    self.runner.admit(action)
                elif isinstance(action, RejectJob):
                    job = self.store.get(action.job_id)
                    if job.state is JobState.QUEUED:
                        self.store.transition(
                            action.job_id, JobState.FAILED, f"rejected: {action.reason}"
                        )
            except Exception:
                self.stats.failures["4-act"] = self.stats.failures.get("4-act", 0) + 1
                log.exception("acting on %r failed", action)

    def _record(self, plan: Any, state: Any) -> None:
        self.store.put(STATE_KEY, state.to_dict())
        current = set()
        for action in plan:
            key = _event_key(action)
            current.add(key)
            if key not in self._last_actions:
                self.store.record_event(
                    f"policy.{type(action).__name__}",
                    action.reason,
                    job_id=getattr(action, "job_id", None),
                )
        self._last_actions = current

    def shutdown(self) -> None:
        if self.store_problem is not None:
            return  # nothing was started
        self._stop.set()
        self.serving.stop()
        self.api.stop()


def tick_stalled(last_start_s: float, now_s: float, tick_s: float) -> str | None:
    """Why the tick loop counts as stalled, or None: the last tick (or, before the first,
    the controller's start) began more than ``max(TICK_STALL_TICKS * tick_s,
    TICK_STALL_MIN_S)`` ago. E.g. tick_s=2: stalled after 30 s; tick_s=10: after 100 s."""
    limit_s = max(TICK_STALL_TICKS * tick_s, TICK_STALL_MIN_S)
    since_s = now_s - last_start_s
    if since_s <= limit_s:
        return None
    return (
        f"tick-stalled: no control loop tick has started for {since_s:.0f}s (limit "
        f"{limit_s:g}s = max({TICK_STALL_TICKS} x policy.tick_s, {TICK_STALL_MIN_S:g}s)); "
        "a tick phase hangs or the loop died: see the controller's log"
    )


def _event_key(action: Any) -> tuple[str, ...]:
    """What makes an action new for the event log. Health actions are keyed by their node (and
    model, for moves): their reasons carry live figures ("for 12 samples") that change every
    tick while the action itself does not."""
    kind = type(action).__name__
    node_ids = getattr(action, "node_ids", None)
    if node_ids is not None:
        return (kind, str(getattr(action, "model", "")), *node_ids)
    if hasattr(action, "node_id"):
        return (kind, str(action.node_id))
    return (kind, str(getattr(action, "job_id", "")), action.reason)


def _kube_remove(cfg: Config) -> Any:
    """The Kubernetes actuator's node removal when one is configured, else None (local)."""
    if not cfg.kubernetes.enabled:
        return None
    from controlplane.kube import KubeNotFoundError, from_config

    made: list[Any] = []

    def remove(pod_name: str, reason: str) -> Any:
        # Made on first use: bad credentials then fail one removal (logged, retried next
        # tick) instead of the controller's start.
        if not made:
            made.append(from_config(cfg))
        try:
            return made[0].remove_node(pod_name, reason)
        except KubeNotFoundError as exc:
            # The pod's Kubernetes node is gone, and its pods with it: nothing left to do.
            log.warning("removing pod %s: %s; treating it as gone", pod_name, exc)
            return None

    return remove


def get_controller() -> Any:
    """The running controller actor's handle, or None (always None on Kubernetes, where the
    controller runs in-process, not as an actor: `controlplane.service.run`)."""
    import ray

    try:
        return ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


def _breaker_json(state: BreakerState, budget: RemovalBudget, *, act: bool) -> dict[str, Any]:
    return {
        "open": state.open,
        "opened_s": state.opened_s,
        "held": list(state.held),
        "removals": [{"node_id": n, "pool": p, "at_s": t} for n, p, t in state.removals],
        "max_nodes": budget.max_nodes,
        "max_pool_fraction": budget.max_pool_fraction,
        "window_s": budget.window_s,
        "act": act,
    }


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def deploy(cfg: Config, timeout_s: float = 120.0) -> str:
    """Create (or find) the controller actor, wait until its API answers, return the API URL.

    The caller is a connected Ray driver (`controlplane.ray_connection.connect`). StoreError
    (its message names the file and what to do) when the actor cannot open the job store; the
    actor is then removed, so the next deploy, once the file is fixed, opens it again.
    """
    import ray

    if not ray.is_initialized():
        connect(cfg)
    token = ensure_token(cfg.state_path)
    actor_cls: Any = ray.remote(Controller)
    handle: Any = actor_cls.options(
        name=ACTOR_NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        resources={pool_resource(Pool.HEAD): 1},
        max_restarts=-1,
        max_task_retries=-1,
        runtime_env={"env_vars": ray_connection_env()},
    ).remote(to_dict(cfg), token)
    url = f"http://{cfg.ray.node_ip}:{cfg.api.port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            problem = ray.get(handle.get_store_problem.remote(), timeout=10)
        except Exception as exc:  # still starting (or restarting)
            log.debug("controller not ready yet: %s", exc)
            problem = None
        if problem:
            ray.kill(handle, no_restart=True)
            raise StoreError(str(problem))
        try:
            url = str(ray.get(handle.url.remote(), timeout=10))
            if _healthy(url):
                write_url(cfg.state_path, url)
                return url
        except Exception as exc:  # still starting (or restarting)
            log.debug("controller not ready yet: %s", exc)
        time.sleep(0.5)
    raise RuntimeError(
        f"the control-plane API did not answer at {url} within {timeout_s:.0f}s; see the "
        f"actor {ACTOR_NAME!r} in the dashboard's Actors tab"
    )
