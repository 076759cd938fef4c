"""The record phase: events, metrics and the vocabulary both use.

Owns: `EventKind` (every kind of event the loop writes to the store's event log),
`PlanEvents` (writes each plan action once, when it first appears: level-triggered actions
repeat every tick), `METRICS` (every gauge and counter the loop exports, by name) and
`RayMetrics`, the `MetricSink` through Ray's metrics pipeline.

Must not: decide or act; event messages are for people, never parsed back (what code needs
travels as data in the plan and the operation records).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from policies.health import CordonNode, RemediationAction
from policies.plan import (
    Action,
    AdmitJob,
    DrainNode,
    MoveServeReplicas,
    PreemptJob,
    RejectJob,
    RequestExternalCapacity,
    ScaleIngress,
    ScaleServePool,
    SetRouteWeights,
    WaitJob,
)

__all__ = [
    "METRICS",
    "EventKind",
    "MetricDef",
    "PlanEvents",
    "Recorder",
    "event_key",
    "RayMetrics",
    "policy_event_kind",
]


class EventKind(str, Enum):
    CONTROLLER_START = "controller.start"
    SERVE_MOVE_START = "serve.move.start"
    SERVE_MOVE_DONE = "serve.move.done"
    SERVE_MOVE_UNWOUND = "serve.move.unwound"
    SERVE_RESUME = "serve.resume"
    SERVE_SCALE = "serve.scale"
    SERVE_SCALE_WAIT = "serve.scale.wait"
    SERVE_INGRESS_SCALE = "serve.app.ingress.scale"
    SERVE_EXTERNAL_CAPACITY = "serve.external_capacity"
    SERVE_EXTERNAL_GROUP = "serve.external_group"
    SERVE_PROVIDER_DRAIN = "serve.provider_drain"
    HEALTH_CORDON = "health.cordon"
    HEALTH_DRAIN = "health.drain"
    HEALTH_CLEAR = "health.clear"
    HEALTH_RELEASE = "health.release"
    HEALTH_AGENT_IMPOSTOR = "health.agent_impostor"
    HEALTH_BREAKER = "health.breaker"
    HEALTH_BREAKER_RESET = "health.breaker_reset"
    HEALTH_SERVING_ONLY = "health.serving_only"
    HEALTH_SERVING_ONLY_END = "health.serving_only_end"
    POLICY_ADMIT = "policy.AdmitJob"
    POLICY_PREEMPT = "policy.PreemptJob"
    POLICY_REJECT = "policy.RejectJob"
    POLICY_MOVE = "policy.MoveServeReplicas"
    POLICY_CORDON = "policy.CordonNode"
    POLICY_DRAIN = "policy.DrainNode"
    POLICY_SCALE = "policy.ScaleServePool"
    POLICY_SCALE_INGRESS = "policy.ScaleIngress"
    POLICY_ROUTE = "policy.SetRouteWeights"
    POLICY_EXTERNAL = "policy.RequestExternalCapacity"
    POLICY_WAIT = "policy.WaitJob"
    POLICY_HELD = "policy.held"
    """An action the policies wanted while the loop was paused (it was not applied)."""
    POLICY_PAUSE = "policy.pause"
    POLICY_RESUME = "policy.resume"
    SERVE_PIN = "serve.pin"
    SERVE_UNPIN = "serve.unpin"
    NODE_CORDON = "node.cordon"
    NODE_UNCORDON = "node.uncordon"
    FAULT_INJECT = "fault.inject"


Recorder = Callable[[EventKind, str], None]


_POLICY_KINDS: dict[type, EventKind] = {
    AdmitJob: EventKind.POLICY_ADMIT,
    PreemptJob: EventKind.POLICY_PREEMPT,
    RejectJob: EventKind.POLICY_REJECT,
    MoveServeReplicas: EventKind.POLICY_MOVE,
    CordonNode: EventKind.POLICY_CORDON,
    DrainNode: EventKind.POLICY_DRAIN,
    ScaleServePool: EventKind.POLICY_SCALE,
    ScaleIngress: EventKind.POLICY_SCALE_INGRESS,
    SetRouteWeights: EventKind.POLICY_ROUTE,
    RequestExternalCapacity: EventKind.POLICY_EXTERNAL,
    WaitJob: EventKind.POLICY_WAIT,
}


def policy_event_kind(action: Action | RemediationAction) -> EventKind:
    return _POLICY_KINDS[type(action)]


def event_key(action: Action | RemediationAction) -> tuple[str, ...]:
    """What makes an action new for the event log. Health actions are keyed by their node (and
    model, for moves), a job's wait by its code: their reasons carry live figures ("for 12
    samples", "in about 2h15m") that change while the action itself does not."""
    kind = type(action).__name__
    if isinstance(action, MoveServeReplicas) and action.node_ids:
        return (kind, action.model, *action.node_ids)
    if isinstance(action, CordonNode | DrainNode):
        return (kind, action.node_id)
    if isinstance(action, WaitJob):
        return (kind, action.job_id, action.code or action.reason)
    job_id = getattr(action, "job_id", "")
    return (kind, str(job_id), action.reason)


class PlanEvents:
    """Writes each plan action to the event log in the first tick it appears."""

    def __init__(self, record: Callable[[EventKind, str, str | None], None]) -> None:
        self._record = record
        self._last: set[tuple[str, ...]] = set()

    def record(self, actions: Iterable[Action | RemediationAction]) -> None:
        current: set[tuple[str, ...]] = set()
        for action in actions:
            key = event_key(action)
            current.add(key)
            if key not in self._last:
                job_id = getattr(action, "job_id", None)
                self._record(policy_event_kind(action), action.reason, job_id)
        self._last = current


@dataclass(frozen=True)
class MetricDef:
    description: str
    tags: tuple[str, ...] = ()
    kind: str = "gauge"
    """``gauge`` or ``counter``."""


METRICS: dict[str, MetricDef] = {
    "rcp_queue_depth": MetricDef("Training jobs waiting in the queue."),
    "rcp_gpus": MetricDef("GPUs per pool by owner (training, serving, idle).", ("pool", "owner")),
    "rcp_admission_wait_seconds": MetricDef(
        "Submission (or re-queue) to admission of the last admitted job."
    ),
    "rcp_tick_phase_seconds": MetricDef("Duration of the last control-loop phase.", ("phase",)),
    "rcp_tick_phase_errors": MetricDef("Failed control-loop phases since start.", ("phase",)),
    "rcp_node_verdict": MetricDef(
        "1 for the node's current health verdict (healthy, degraded, serving_only, unhealthy).",
        ("node", "pool", "verdict"),
    ),
    "rcp_nodes_cordoned": MetricDef("Nodes this controller has taken out of service."),
    "rcp_node_serving_only": MetricDef(
        "1 while health keeps the node for serving only (fabric faults: no gang, replicas yes).",
        ("node", "pool"),
    ),
    "rcp_health_breaker_open": MetricDef(
        "1 while the health breaker holds removals (health.breaker budget spent)."
    ),
    "rcp_health_removals_held": MetricDef(
        "Unhealthy nodes the health breaker keeps from being taken out."
    ),
    "rcp_health_actions_total": MetricDef(
        "Remediation steps taken: cordon (Ray drain), preempt, replace.", ("action",), "counter"
    ),
    "rcp_serve_replicas": MetricDef(
        "Serve replicas per model, pool and state.", ("model", "pool", "state")
    ),
    "rcp_serve_route_weight": MetricDef("Route weight per model and pool.", ("model", "pool")),
    "rcp_model_p99_ms": MetricDef(
        "Each served model's p99 latency (ms) over serving.latency_window_s, both pools' "
        "backends (NaN: no reading).",
        ("model",),
    ),
    "rcp_model_slo_p99_ms": MetricDef(
        "Each served model's latency goal, slo_p99_ms (models with one).", ("model",)
    ),
    "rcp_external_gpus_requested": MetricDef("GPUs requested from the external pool."),
    "rcp_external_gpus_max": MetricDef(
        "Most GPUs the external pool may have (max_nodes x gpus_per_node)."
    ),
    "rcp_external_provider_price_per_gpu_hour": MetricDef(
        "What one GPU-hour of each external provider costs.", ("provider",)
    ),
    "rcp_external_provider_gpus_max": MetricDef(
        "Most GPUs each external provider may have (max_nodes x gpus_per_node).", ("provider",)
    ),
    "rcp_external_provider_gpus_live": MetricDef(
        "GPUs of each external provider's live nodes.", ("provider",)
    ),
    "rcp_external_provider_gpus_requested": MetricDef(
        "GPUs placement asks of each external provider (cheapest first).", ("provider",)
    ),
    "rcp_external_provider_out": MetricDef(
        "1 while an external provider is out: it did not deliver what it was asked within its "
        "delivery deadline, so it gets no more requests until its back-off ends.",
        ("provider",),
    ),
    "rcp_serving_forecast_peak_replicas": MetricDef(
        "The most replicas a model's daily profile foresees over the next 24 hours.", ("model",)
    ),
    "rcp_serving_forecast_cluster_gpus": MetricDef(
        "The most cluster GPUs serving's forecast needs over the horizon that the providers "
        "cannot host: admission keeps long gangs off them."
    ),
    "rcp_training_claim_gpus": MetricDef("GPUs training asked serving to give back."),
    "rcp_serving_phase_seconds": MetricDef(
        "Duration of the last serving phase of the control loop.", ("phase",)
    ),
    "rcp_serving_errors_total": MetricDef(
        "Failed serving phases of the control loop.", ("phase",), "counter"
    ),
    "rcp_serve_moves_total": MetricDef("Make-before-break moves done.", ("model",), "counter"),
    "rcp_policy_paused": MetricDef(
        "1 while an operator has paused the policy actor (no new moves or admissions)."
    ),
    "rcp_policy_held_actions": MetricDef(
        "Actions the policies wanted in the last tick but the pause held back."
    ),
    "rcp_serve_pinned_models": MetricDef("Models an operator pinned to a pool."),
    "rcp_nodes_cordoned_by_hand": MetricDef("Nodes an operator cordoned by hand."),
}


class RayMetrics:
    """`MetricSink` through `ray.util.metrics`; each metric is made on first use."""

    def __init__(self) -> None:
        self._made: dict[str, Any] = {}

    def _metric(self, name: str) -> Any:
        metric = self._made.get(name)
        if metric is None:
            from ray.util import metrics  # deferred: ray is heavy

            d = METRICS[name]
            make = metrics.Gauge if d.kind == "gauge" else metrics.Counter
            metric = self._made[name] = make(name, d.description, tag_keys=d.tags)
        return metric

    def set(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self._metric(name).set(value, tags=dict(tags or {}))

    def inc(self, name: str, tags: Mapping[str, str] | None = None) -> None:
        self._metric(name).inc(tags=dict(tags or {}))
