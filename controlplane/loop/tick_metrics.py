"""The record phase's metrics: what one tick exports, and what `rcp serve status` shows of it.

Owns `TickMetrics.export` (phase 4: the jobs' queue and GPUs, the phases, the operators'
guards, the serving plane, its providers and forecast, every name in `record.METRICS`), the
loop's counters (`TickStats`) and the last tick's rows the API's serve status returns
(`provider_rows`, `forecast_rows`).

Must not: decide or act (it reads the tick's observation and decision).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from controlplane.loop.decide import Policies
from controlplane.loop.guards import Guards
from controlplane.loop.types import Decision, MetricSink, Observation, ServingPolicyState
from controlplane.store import Store
from policies.forecast import DailyProfile, profile_ahead
from policies.plan import AdmitJob
from policies.providers import ProviderState, is_out, live_by_provider
from policies.snapshot import ClusterSnapshot, Pool, ReplicaState

__all__ = ["SERVING_STATE_KEY", "TickMetrics", "TickStats"]

SERVING_STATE_KEY = "serving.state"


@dataclass
class TickStats:
    """Counters the loop reports (`Controller.get_stats`; tests and debugging)."""

    ticks: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    last_duration_s: dict[str, float] = field(default_factory=dict)


class TickMetrics:
    def __init__(self, metrics: MetricSink, policies: Policies, store: Store) -> None:
        self.metrics = metrics
        self.policies = policies
        self.store = store
        self.provider_rows: list[dict[str, Any]] = []
        """Each external provider as the last tick saw it (`rcp serve status`)."""
        self.forecast_rows: dict[str, Any] = {}
        """Serving's forecast as the last tick saw it (`rcp serve status`)."""

    def export(
        self,
        observed: Observation,
        decided: Decision,
        guards: Guards,
        stats: TickStats,
        serving_plane: bool,
    ) -> None:
        m = self.metrics
        snapshot = observed.snapshot
        m.set("rcp_queue_depth", float(len(snapshot.queued)))
        m.set("rcp_policy_paused", 1.0 if guards.paused else 0.0)
        m.set("rcp_policy_held_actions", float(len(decided.held)))
        m.set("rcp_serve_pinned_models", float(len(guards.pins)))
        m.set("rcp_nodes_cordoned_by_hand", float(len(guards.cordons)))
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
                m.set("rcp_gpus", float(gpus), {"pool": pool.value, "owner": owner})
        submitted = {j.job_id: j.submitted_s for j in snapshot.queued}
        for action in decided.admission:
            if isinstance(action, AdmitJob) and action.job_id in submitted:
                m.set("rcp_admission_wait_seconds", snapshot.now_s - submitted[action.job_id])
        for phase, seconds in stats.last_duration_s.items():
            m.set("rcp_tick_phase_seconds", seconds, {"phase": phase})
        for phase, n in stats.failures.items():
            m.set("rcp_tick_phase_errors", float(n), {"phase": phase})
        if not serving_plane or not observed.serve.deployed:
            return
        for (model, pool), v in observed.serve.pools.items():
            tags = {"model": model, "pool": pool.value}
            counts = {"running": v.running, "starting": v.starting, "stopping": v.stopping}
            for state, count in counts.items():
                m.set("rcp_serve_replicas", float(count), {**tags, "state": state})
            m.set("rcp_serve_route_weight", v.weight, tags)
        for model, demand in self.policies.demand.items():
            p99 = snapshot.load_of(model).p99_ms
            m.set("rcp_model_p99_ms", math.nan if p99 is None else p99, {"model": model})
            if demand.target_p99_ms is not None:
                m.set("rcp_model_slo_p99_ms", demand.target_p99_ms, {"model": model})
        claim = sum(c.num_replicas * self.policies.replica_gpus(c.model) for c in decided.claims)
        m.set("rcp_training_claim_gpus", float(claim))
        if decided.serving_state is not None:
            requested = decided.serving_state.placement.requested_external_gpus
            m.set("rcp_external_gpus_requested", float(requested))
        m.set("rcp_external_gpus_max", float(self.policies.placement.external_max_gpus))
        # A tick whose serving policies did not run (a move in flight) keeps the last state.
        serving_state = decided.serving_state or ServingPolicyState.from_dict(
            self.store.get_value(SERVING_STATE_KEY, None)
        )
        self._providers(snapshot, serving_state)
        self._forecast(snapshot, serving_state, decided)

    def _providers(self, snapshot: ClusterSnapshot, serving: ServingPolicyState) -> None:
        """Per external provider: its price, most, live and requested GPUs, whether it is out."""
        m = self.metrics
        providers = self.policies.placement.providers
        live = live_by_provider(snapshot, providers)
        states = serving.placement.providers
        rows: list[dict[str, Any]] = []
        for p in providers:
            tags = {"provider": p.name}
            state = states.get(p.name, ProviderState())
            out = is_out(state, snapshot.now_s)
            rows.append(
                {
                    "name": p.name,
                    "price_per_gpu_hour": p.price_per_gpu_hour,
                    "gpus_max": p.max_gpus,
                    "gpus_live": live.get(p.name, 0),
                    "gpus_requested": state.requested_gpus,
                    "out": out,
                    "out_for_s": (state.out_until_s or 0.0) - snapshot.now_s if out else None,
                    "owed_for_s": None
                    if state.owed_since_s is None
                    else snapshot.now_s - state.owed_since_s,
                }
            )
            m.set("rcp_external_provider_price_per_gpu_hour", p.price_per_gpu_hour, tags)
            m.set("rcp_external_provider_gpus_max", float(p.max_gpus), tags)
            m.set("rcp_external_provider_gpus_live", float(live.get(p.name, 0)), tags)
            m.set("rcp_external_provider_gpus_requested", float(state.requested_gpus), tags)
            m.set("rcp_external_provider_out", 1.0 if out else 0.0, tags)
        self.provider_rows = rows

    def _forecast(
        self, snapshot: ClusterSnapshot, serving: ServingPolicyState, decided: Decision
    ) -> None:
        """Per served model, its forecast's peak over the next 24 h and when; and the most
        cluster GPUs serving's forecast needs beyond the providers."""
        config = self.policies.forecast
        if not config.enabled or not self.policies.demand:
            self.forecast_rows = {}
            return
        models: list[dict[str, Any]] = []
        for name in sorted(self.policies.demand):
            day = profile_ahead(serving.forecast.get(name, DailyProfile()), snapshot.now_s, config)[
                : config.slots_per_day
            ]
            k = max(range(len(day)), key=lambda i: (day[i], -i))
            peak = math.ceil(day[k] - 1e-9)
            models.append({"model": name, "peak_replicas": peak, "peak_in_s": k * config.bin_s})
            self.metrics.set("rcp_serving_forecast_peak_replicas", float(peak), {"model": name})
        ahead = decided.forecast
        need = 0 if ahead is None else max(ahead.need_gpus)
        self.metrics.set("rcp_serving_forecast_cluster_gpus", float(need))
        self.forecast_rows = {
            "models": models,
            "cluster_gpus": need,
            "cluster_gpus_in_s": None
            if ahead is None
            else ahead.need_gpus.index(need) * ahead.bin_s,
            "horizon_s": config.horizon_slots * config.bin_s,
        }
