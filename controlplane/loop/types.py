"""The loop's data: what a tick observed, what it decided, and the policies' memory.

Owns: `Observation` (observe's output), `Decision` (decide's output: each policy's plan and
new state, one batch), `ServingPolicyState` (the serving policies' memory, stored as
``serving.state``) and the adapters' protocols the loop is built from (`JobActions`,
`NodeInventory`, `Telemetry`, `MetricSink`). No field is `Any`.

Must not: do anything. These are values and interfaces.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, cast

from controlplane.adapters.serve import ServeView
from controlplane.inventory import NodeRow
from controlplane.store import JobRecord
from policies.admission import AdmissionState
from policies.attempts import JobAction, JobsView
from policies.demand import DemandState, Direction
from policies.forecast import DailyProfile, ServingForecast
from policies.health import NodeVerdict, RemediationAction
from policies.ingress import IngressTraffic
from policies.placement import PlacementState, PoolTargets
from policies.plan import Action, AdmitJob, MoveServeReplicas, Plan, PreemptJob
from policies.providers import ProviderState
from policies.snapshot import ClusterSnapshot, Pool

__all__ = [
    "Decision",
    "JobActions",
    "JsonValue",
    "MetricSink",
    "NodeInventory",
    "Observation",
    "ServingPolicyState",
    "Telemetry",
]

JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]
"""What the store's kv holds (`Store.put`)."""


@dataclass(frozen=True)
class Observation:
    """One tick's view of the world, health applied (unhealthy and draining nodes count for
    no capacity). ``serve`` is the empty view when the serving plane is not deployed."""

    snapshot: ClusterSnapshot
    jobs: tuple[JobRecord, ...] = ()
    draining: frozenset[str] = frozenset()
    serve: ServeView = field(default_factory=ServeView)
    loads: Mapping[str, float] = field(default_factory=dict)
    ingress: IngressTraffic = field(default_factory=IngressTraffic)
    """The ingress replicas' request rate and CPU per request (the load board)."""
    verdicts: Mapping[str, NodeVerdict] = field(default_factory=dict)
    jobs_view: JobsView = field(default_factory=JobsView)
    """Every gang and every ended job whose Ray Job may still run, as the runner observed
    them (`JobActions.observe`), for `policies.attempts`."""


@dataclass(frozen=True)
class ServingPolicyState:
    """The demand and placement policies' memory between ticks (stored by the loop)."""

    demand: Mapping[str, DemandState] = field(default_factory=dict)
    placement: PlacementState = field(default_factory=PlacementState)
    ingress: DemandState = field(default_factory=DemandState)
    """The ingress scaling policy's downscale timer (`policies.ingress`)."""
    unplaced_gpus: int = 0
    """GPUs placement could place nowhere, held by the next tick's admission
    (`controlplane.loop.decide.unplaced_gpus`)."""
    forecast: Mapping[str, DailyProfile] = field(default_factory=dict)
    """Per served model, its daily demand profile (`policies.forecast`)."""
    unstarted_gpus: int = 0
    """GPUs of cluster replicas that hold no node yet, kept free by the next tick's admission
    (`controlplane.loop.decide.unstarted_cluster_gpus`)."""
    replicas: Mapping[str, int] = field(default_factory=dict)
    """Per served model, the replicas demand decided last tick: the next decision's current
    count (placement may target fewer while it can place no more)."""

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            "demand": {m: _demand_dict(s) for m, s in self.demand.items()},
            "forecast": {m: cast(JsonValue, f.to_dict()) for m, f in self.forecast.items()},
            "replicas": dict(self.replicas),
            "ingress": _demand_dict(self.ingress),
            "unplaced_gpus": self.unplaced_gpus,
            "unstarted_gpus": self.unstarted_gpus,
            "placement": {
                **asdict(self.placement),
                "route_weights": {
                    m: [[pool.value, w] for pool, w in ws]
                    for m, ws in self.placement.route_weights.items()
                },
            },
        }

    @classmethod
    def from_dict(cls, data: object) -> ServingPolicyState:
        if not isinstance(data, Mapping) or not data:
            return cls()
        p = data.get("placement") or {}
        forecast = data.get("forecast")
        replicas = data.get("replicas")
        return cls(
            demand={str(m): _demand_state(s) for m, s in (data.get("demand") or {}).items()},
            ingress=_demand_state(data["ingress"]) if data.get("ingress") else DemandState(),
            placement=PlacementState(
                room_since_s=p.get("room_since_s"),
                last_step_back_s=p.get("last_step_back_s"),
                requested_external_gpus=int(p.get("requested_external_gpus", 0)),
                draining_node=str(p["draining_node"]) if p.get("draining_node") else None,
                last_drain_s=_float_or_none(p.get("last_drain_s")),
                providers={
                    str(name): ProviderState(
                        requested_gpus=int(s.get("requested_gpus") or 0),
                        owed_since_s=_float_or_none(s.get("owed_since_s")),
                        out_until_s=_float_or_none(s.get("out_until_s")),
                    )
                    for name, s in (p.get("providers") or {}).items()
                    if isinstance(s, Mapping)
                },
                route_weights={
                    str(m): tuple((Pool(pool), float(w)) for pool, w in ws)
                    for m, ws in (p.get("route_weights") or {}).items()
                },
            ),
            unplaced_gpus=int(data.get("unplaced_gpus") or 0),
            unstarted_gpus=int(data.get("unstarted_gpus") or 0),
            forecast={
                str(m): DailyProfile.from_dict(f)
                for m, f in (forecast.items() if isinstance(forecast, Mapping) else ())
            },
            replicas={
                str(m): int(n)
                for m, n in (replicas.items() if isinstance(replicas, Mapping) else ())
                if isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 1_000_000
            },
        )


def _demand_dict(s: DemandState) -> dict[str, JsonValue]:
    return {
        "direction": s.direction.value,
        "since_s": s.since_s,
        "highest_wanted": s.highest_wanted,
    }


def _float_or_none(value: object) -> float | None:
    return None if value is None else float(str(value))


def _demand_state(s: Mapping[str, Any]) -> DemandState:
    return DemandState(Direction(s["direction"]), float(s["since_s"]), int(s["highest_wanted"]))


@dataclass(frozen=True)
class Decision:
    """Every policy's plan for one tick, decided in one batch.

    ``claims`` are admission's `MoveServeReplicas` (the training claim), handed to placement;
    ``serving`` is placement's and demand's plan, None when the serving policies did not run
    this tick (no serving plane, or a move in flight: the operation owns the model's replicas
    and routes until it ends)."""

    admission: Plan
    admission_state: AdmissionState
    lifecycle: tuple[JobAction, ...] = ()
    """The jobs' lifecycle plan (`policies.attempts`), applied before admission's."""
    remediation: tuple[RemediationAction, ...] = ()
    claims: tuple[MoveServeReplicas, ...] = ()
    serving: Plan | None = None
    serving_state: ServingPolicyState | None = None
    targets: tuple[PoolTargets, ...] = ()
    wanted: tuple[tuple[str, int], ...] = ()
    """Per served model, the replicas the load asks for now (`controlplane.loop.decide.
    wanted_now`); set whenever a serving plane is deployed, a move in flight or not."""
    held: tuple[Action | RemediationAction, ...] = ()
    """What the policies wanted but the loop held back while paused (`guards.hold`)."""
    forecast: ServingForecast | None = None
    """The serving forecast admission read this tick (`controlplane.loop.decide.forecast_now`),
    which `rcp serve status` and the metrics show."""


class JobActions(Protocol):
    """The Ray Jobs adapter as the loop uses it (`controlplane.loop.act.jobs.runner.JobRunner`)."""

    def observe(self) -> JobsView: ...

    def apply(self, plan: Sequence[JobAction], failed: Callable[[], None]) -> None: ...

    def admit(self, action: AdmitJob) -> None: ...

    def preempt(self, action: PreemptJob) -> None: ...


class NodeInventory(Protocol):
    """The node rows of the cluster (`controlplane.adapters.nodes.RayNodes`)."""

    def list_nodes(self) -> Sequence[NodeRow]: ...


class AgentRefLike(Protocol):
    """What the loop reads of a telemetry agent reference (`telemetry.manager.AgentRef`)."""

    @property
    def node_id(self) -> str: ...

    @property
    def idle_external(self) -> bool: ...

    @property
    def started(self) -> bool: ...

    @property
    def actor_id(self) -> str | None: ...

    @property
    def impostor(self) -> str | None: ...


class Telemetry(Protocol):
    """The telemetry agents (`controlplane.adapters.telemetry.RayTelemetry`)."""

    def ensure_agents(
        self, exclude: Collection[str], trusted: Mapping[str, str]
    ) -> Sequence[AgentRefLike]: ...

    def collect_samples(
        self,
        max_samples: int,
        timeout_s: float,
        seen_until: Mapping[str, float | None],
        trusted: Mapping[str, str],
    ) -> Mapping[str, Sequence[Mapping[str, object]]]: ...

    def stop_agent(self, node_id: str) -> bool: ...


class MetricSink(Protocol):
    """Where the record phase puts gauges and counters (`record.RayMetrics`; a dict in tests)."""

    def set(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None: ...

    def inc(self, name: str, tags: Mapping[str, str] | None = None) -> None: ...
