"""Node health in the loop: verdicts (observe) and taking bad nodes out (act).

Owns: the health half of a tick and its memory, `HealthKeeper`, kept in the store under the
``health.*`` keys below so a restarted controller carries on:

* observe (`judge`): a telemetry agent on every node (trusting only the actor ids this
  controller recorded), their recent samples, one verdict per node
  (`controlplane.telemetry.verdicts.judge`), the verdicts to act on
  (`policies.health.acting_verdicts`) and the breaker (`act.nodes.Breaker`). Our agent leaves
  a node Ray drains for someone else once it is empty;
* act (`act`): `CordonNode` -> Ray drain, `PreemptJob` -> the job runner (checkpoint first,
  re-queue), `DrainNode` -> the node is replaced (`act.nodes.Remediator`);
* serving-only nodes (`note_serving_only`: fabric faults, GPUs fine): not drained; admission
  leaves them out of every gang while Serve replicas keep running and starting there;
* the operator's requests (`clear_node`, `breaker_state`, `reset_breaker`), which may come
  from the API thread while a tick runs: each holds its lock.

Replicas on a bad node are not health's to move: Serve replaces them elsewhere on the cordon
(a Ray drain), and placement moves them off the unhealthy node (``leave_unhealthy_node``).

Must not: decide (the health policy does) or touch Ray except through the adapters.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from controlplane.config import Config
from controlplane.loop.act.nodes import Breaker, NodeActions, Remediator
from controlplane.loop.record import EventKind, Recorder
from controlplane.loop.types import AgentRefLike, JobActions, MetricSink, Telemetry
from controlplane.store import Store
from controlplane.telemetry.verdicts import judge
from policies.health import (
    BreakerState,
    CordonNode,
    HealthState,
    NodeVerdict,
    RemediationAction,
    Verdict,
    acting_verdicts,
    clear_lemon,
    keep_nodes,
)
from policies.plan import DrainNode, PreemptJob
from policies.snapshot import ClusterSnapshot

__all__ = [
    "AGENTS_KEY",
    "BREAKER_KEY",
    "CORDONED_KEY",
    "HEALTH_SAMPLES",
    "HEALTH_STATE_KEY",
    "SERVING_ONLY_KEY",
    "HealthKeeper",
]

log = logging.getLogger(__name__)

HEALTH_STATE_KEY = "health.state"
"""The health policy's memory, lemon records included."""
CORDONED_KEY = "health.cordoned"
"""Node id -> when this controller asked Ray to drain it (Ray does not say who asked)."""
SERVING_ONLY_KEY = "health.serving_only"
"""Node id -> ``{"since_s", "reason"}`` of every node kept for serving only."""
BREAKER_KEY = "health.breaker"
AGENTS_KEY = "health.agents"
"""Node id -> actor id of the telemetry agent this controller created (the only ones trusted)."""
HEALTH_SAMPLES = 16
"""Newest samples read from each agent per tick; the policy skips those it has seen."""


class HealthKeeper:
    def __init__(
        self,
        cfg: Config,
        store: Store,
        telemetry: Telemetry,
        nodes: NodeActions,
        record: Recorder,
        *,
        kube_remove: Callable[[str, str], object] | None = None,
        count_removal: Callable[[float], object] | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.telemetry = telemetry
        self._record = record
        self.verdicts: dict[str, NodeVerdict] = {}
        """The verdicts the last tick acted on, by node id."""
        self.agent_nodes: set[str] = set()
        self.latest: dict[str, Mapping[str, object]] = {}
        """The newest telemetry sample of each node (for `rcp nodes` and `rcp health`)."""
        self.draining: set[str] = set()
        """Nodes Ray drains, as of this tick's observe phase."""
        self.drained_by_others: frozenset[str] = frozenset()
        """Draining nodes this controller did not cordon (nothing wrong with their hardware:
        gangs there are checkpointed and moved, but the node is not removed or tainted)."""
        self._released: set[str] = set()
        """Draining nodes (not ours) our agent has left."""
        self._lock = threading.Lock()
        """Held while the stored health state is read and written (tick vs operator clear)."""
        self._breaker_lock = threading.Lock()
        """Held while the breaker steps and is stored (tick vs operator reset)."""
        self.remediator = Remediator(
            nodes,
            drain_deadline_s=cfg.health.drain_deadline_s,
            replace_drained=cfg.health.replace_drained,
            record=record,
            kube_remove=kube_remove,
            count_removal=count_removal,
        )
        self.remediator.cordoned.update(store.get_value(CORDONED_KEY, {}) or {})
        self._saved_cordons: dict[str, float] = dict(self.remediator.cordoned)
        self.breaker = Breaker(
            cfg.health.breaker,
            record=record,
            state=BreakerState.from_dict(store.get_value(BREAKER_KEY, {}) or {}),
        )
        self._agent_ids: dict[str, str] = dict(store.get_value(AGENTS_KEY, {}) or {})
        self.serving_only: dict[str, dict[str, object]] = {
            str(n): dict(v)
            for n, v in (store.get_value(SERVING_ONLY_KEY, {}) or {}).items()
            if isinstance(v, Mapping)
        }
        """Node id -> since when (``since_s``) and why (``reason``) it serves only."""

    # -- observe -------------------------------------------------------------------------------

    def observe_draining(self) -> frozenset[str]:
        self.draining = set(self.remediator.nodes.draining())
        return frozenset(self.draining)

    def judge(self, snapshot: ClusterSnapshot) -> dict[str, NodeVerdict]:
        """Verdicts by node id; the policy's memory goes back to the store."""
        refs = self.telemetry.ensure_agents(
            set(self.remediator.cordoned) | self.draining, self._agent_ids
        )
        self._trust_agents(refs)
        self.agent_nodes = {r.node_id for r in refs if not r.idle_external}
        self._release_drained_by_others(snapshot)
        with self._lock:
            state = HealthState.from_dict(self.store.get_value(HEALTH_STATE_KEY, {}) or {})
            samples = self.telemetry.collect_samples(
                HEALTH_SAMPLES,
                self.cfg.policy.tick_s,
                {n: s.last_sampled_s for n, s in state.nodes.items()},
                self._agent_ids,
            )
            verdicts, new_state = judge(samples, self.cfg.health, state, snapshot.now_s)
            for node_id, node_samples in samples.items():
                if node_samples:
                    self.latest[node_id] = node_samples[-1]
            live = {n.node_id for n in snapshot.nodes}
            self.latest = {n: s for n, s in self.latest.items() if n in live}
            new_state = keep_nodes(new_state, (n.node_id for n in snapshot.nodes))
            self.store.put(HEALTH_STATE_KEY, new_state.to_dict())
        verdicts, self.drained_by_others = acting_verdicts(
            verdicts, self.verdicts, self.remediator.cordoned, self.draining, snapshot
        )
        self.remediator.forget({n.node_id for n in snapshot.nodes})
        if self.cfg.health.act:
            out = set(self.remediator.cordoned) | self.draining
            with self._breaker_lock:
                before = self.breaker.state
                verdicts = self.breaker.step(verdicts, snapshot, out, snapshot.now_s)
                if self.breaker.state != before:
                    self.store.put(BREAKER_KEY, self.breaker.state.to_dict())
        self.note_serving_only(verdicts, snapshot)
        return verdicts

    def note_serving_only(
        self, verdicts: Mapping[str, NodeVerdict], snapshot: ClusterSnapshot
    ) -> None:
        """Keep ``health.serving_only`` in step with the verdicts, and say each change once; a
        node with no verdict this tick (its agent did not answer) keeps its record."""
        now = {
            n: v for n, v in verdicts.items() if v.verdict is Verdict.SERVING_ONLY and not v.held
        }
        live = {n.node_id for n in snapshot.nodes}
        kept = dict(self.serving_only)  # replaced whole: the API thread reads it
        for node_id, v in sorted(now.items()):
            if node_id not in kept:
                kept[node_id] = {"since_s": snapshot.now_s, "reason": v.reason}
                self._record(
                    EventKind.HEALTH_SERVING_ONLY,
                    f"node {node_id}: serving only (no gang is admitted there, its gangs "
                    f"checkpoint and restart elsewhere, Serve replicas stay); {v.reason}",
                )
        for node_id in sorted(set(kept) - set(now)):
            after = verdicts.get(node_id)
            if node_id in live and after is None:
                continue
            del kept[node_id]
            if after is None:
                why = "the node is gone"
            elif after.verdict is Verdict.UNHEALTHY:
                why = f"out of everything now: {after.reason}"
            else:
                why = f"fit for gangs again ({after.verdict.value})"
            self._record(
                EventKind.HEALTH_SERVING_ONLY_END, f"node {node_id}: serving only ends; {why}"
            )
        if kept != self.serving_only:
            self.store.put(SERVING_ONLY_KEY, kept)
            self.serving_only = kept

    def _trust_agents(self, refs: Sequence[AgentRefLike]) -> None:
        """Record the actor id of every agent this controller created; an actor under an
        agent's name with another id was killed by `ensure_agents` and is logged here."""
        ids: dict[str, str] = {}
        for r in refs:
            if r.impostor is not None:
                self._record(
                    EventKind.HEALTH_AGENT_IMPOSTOR,
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

    def _release_drained_by_others(self, snapshot: ClusterSnapshot) -> None:
        """Stop our agent on a node Ray drains for someone else once nothing else runs there:
        Ray counts our agent as work, so it would keep an operator's ``ray drain-node`` (a
        drained raylet exits when idle) from ever finishing."""
        for node_id in sorted(self.draining - set(self.remediator.cordoned)):
            if node_id in self._released:
                continue
            busy = any(g.gpus_by_node.get(node_id, 0) > 0 for g in snapshot.running) or any(
                r.node_id == node_id for r in snapshot.serve_replicas
            )
            if busy or self.remediator.nodes.holds_gpus(node_id):
                continue
            self._released.add(node_id)
            if self.telemetry.stop_agent(node_id):
                self._record(
                    EventKind.HEALTH_RELEASE,
                    f"node {node_id}: drained by Ray and empty; our agent left it",
                )
        self._released &= self.draining

    # -- act -----------------------------------------------------------------------------------

    def act(
        self,
        remediation: Sequence[RemediationAction],
        now_s: float,
        jobs: JobActions,
        metrics: MetricSink,
        failed: Callable[[], None],
    ) -> None:
        """Cordon, checkpoint-and-requeue, drain: see `remediation` and `policies.health`."""
        for action in remediation:
            try:
                done = None
                if isinstance(action, CordonNode):
                    if self.remediator.cordon(action.node_id, action.reason, now_s):
                        done = "cordon"
                elif isinstance(action, PreemptJob):
                    jobs.preempt(action)
                    done = "preempt"
                elif isinstance(action, DrainNode) and action.node_id in self.drained_by_others:
                    pass  # whoever drains it removes it; its host did nothing wrong
                elif isinstance(action, DrainNode) and self.remediator.replace(
                    action.node_id, action.reason, now_s, cause=self._cause(action.node_id)
                ):
                    done = "replace"
                if done is not None:
                    metrics.inc("rcp_health_actions_total", {"action": done})
            except Exception:
                failed()
                log.exception("acting on %r failed", action)

    def save_cordons(self) -> None:
        """The nodes this controller drained, for a restarted controller."""
        if self.remediator.cordoned != self._saved_cordons:
            self.store.put(CORDONED_KEY, dict(self.remediator.cordoned))
            self._saved_cordons = dict(self.remediator.cordoned)

    def _cause(self, node_id: str) -> str:
        """The short reason a node was taken out (``gpu_overheated,xid_fatal``)."""
        v = self.verdicts.get(node_id)
        return ",".join(r.value for r in v.reasons) if v is not None and v.reasons else "unhealthy"

    # -- record --------------------------------------------------------------------------------

    def export_metrics(self, snapshot: ClusterSnapshot, metrics: MetricSink) -> None:
        for node in snapshot.nodes:
            verdict = self.verdicts.get(node.node_id)
            current = verdict.verdict if verdict is not None else Verdict.HEALTHY
            for v in Verdict:
                # A departed node's series are not set again: Ray's metrics agent drops a
                # series not set for two report intervals, so the series follow live nodes.
                metrics.set(
                    "rcp_node_verdict",
                    1.0 if v is current else 0.0,
                    {"node": node.node_id, "pool": node.pool.value, "verdict": v.value},
                )
            metrics.set(
                "rcp_node_serving_only",
                1.0 if node.node_id in self.serving_only else 0.0,
                {"node": node.node_id, "pool": node.pool.value},
            )
        metrics.set("rcp_nodes_cordoned", float(len(self.remediator.cordoned)))
        metrics.set("rcp_health_breaker_open", 1.0 if self.breaker.state.open else 0.0)
        metrics.set("rcp_health_removals_held", float(len(self.breaker.state.held)))

    # -- the operator's requests ---------------------------------------------------------------

    def clear_node(self, node: str, by: str = "operator") -> tuple[str, bool]:
        """Forget `node`'s lemon record (id, prefix or suffix); (node id, cordoned)."""
        with self._lock:
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
        self._record(EventKind.HEALTH_CLEAR, f"node {node_id}: lemon record cleared by {by}")
        return node_id, node_id in self.remediator.cordoned

    def breaker_state(self) -> BreakerState:
        with self._breaker_lock:
            return self.breaker.state

    def reset_breaker(self, by: str = "operator", reason: str = "") -> BreakerState:
        """Close the breaker, store it at once; the state before."""
        with self._breaker_lock:
            before = self.breaker.reset(f"{by} ({reason})" if reason else by)
            self.store.put(BREAKER_KEY, self.breaker.state.to_dict())
        return before

    def cordoned(self) -> Mapping[str, float]:
        return dict(self.remediator.cordoned)

    def replaced(self) -> dict[str, float]:
        return dict(self.remediator.replaced)
