"""The frozen picture of the cluster that every policy decides from.

Owns: the typed, immutable data a tick observes once and hands to every pure policy
(`ClusterSnapshot` and its parts: nodes, Serve replicas, queued jobs, running gangs).

Must not: import Ray, read a clock, do I/O, or compute decisions. Whoever builds a snapshot
(the observe phase) resolves everything to plain values first; time arrives as `now_s`.

Conventions the observe phase must keep, because policies rely on them:

- ``NodeView.gpus_free`` is what no one holds: GPUs of running gangs (including gangs that are
  ADMITTED but not yet visible to Ray) and of Serve replicas are already subtracted.
- A `RunningGang` is any job holding GPUs: ADMITTED or RUNNING, including one whose preemption
  was requested (``preempting=True``) until its GPUs are actually released.
- Mappings (labels, placements) are copied into read-only views on construction, so a snapshot
  cannot be changed after the fact by whoever built it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

__all__ = [
    "POOL_LABEL",
    "pool_of",
    "pool_resource",
    "ClusterSnapshot",
    "NodeView",
    "Pool",
    "QueuedJob",
    "ReplicaState",
    "RunningGang",
    "ServeLoad",
    "ServeReplica",
]


class Pool(str, Enum):
    """Where a node (and what runs on it) lives."""

    HEAD = "head"
    """The Ray head: CPU-only, runs the control plane and the Serve ingress."""
    CLUSTER = "cluster"
    """Owned GPU nodes: training gangs and in-cluster Serve replicas."""
    EXTERNAL = "external"
    """Rented, autoscaled GPU nodes (scaled from zero): Serve replicas moved off the cluster."""


POOL_LABEL = "pool"
"""The node label that carries a node's pool."""


def pool_resource(pool: Pool | str) -> str:
    """The custom resource every node of `pool` advertises, e.g. ``pool_external``; work that
    asks for it is pinned to the pool (and makes the autoscaler add such a node)."""
    return f"pool_{Pool(pool).value}"


def pool_of(labels: Mapping[str, str], resources: Mapping[str, float]) -> str:
    """A node's pool: its `pool` label, else the pool resource it advertises, else unknown."""
    label = labels.get(POOL_LABEL)
    if label in {p.value for p in Pool}:
        return str(label)
    for p in Pool:
        if pool_resource(p) in resources:
            return p.value
    return "unknown"


class ReplicaState(str, Enum):
    """Lifecycle of one Serve replica as the observe phase saw it."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"


def _frozen_mapping(value: Mapping[str, object]) -> MappingProxyType[str, object]:
    return MappingProxyType(dict(value))


@dataclass(frozen=True)
class NodeView:
    """One Ray node as seen this tick."""

    node_id: str
    pool: Pool
    gpus_total: int
    """GPUs the node advertises (logical GPUs in local mode)."""
    gpus_free: int
    """GPUs nothing holds right now (see the module docstring)."""
    healthy: bool = True
    """False once telemetry or Ray marks the node bad; its GPUs then count for nothing."""
    labels: Mapping[str, str] = field(default_factory=dict)
    serving_only: bool = False
    """Health found its fabric (InfiniBand, NVLink) bad and its GPUs fine: a live node whose
    GPUs serve replicas but never a gang (`policies.health.Verdict.SERVING_ONLY`)."""

    def __post_init__(self) -> None:
        if self.gpus_total < 0 or not 0 <= self.gpus_free <= self.gpus_total:
            raise ValueError(
                f"node {self.node_id!r}: need 0 <= gpus_free <= gpus_total, "
                f"got gpus_free={self.gpus_free}, gpus_total={self.gpus_total}"
            )
        object.__setattr__(self, "labels", _frozen_mapping(self.labels))


@dataclass(frozen=True)
class ServeReplica:
    """One Serve replica of a model's backend deployment."""

    replica_id: str
    model: str
    pool: Pool
    node_id: str
    gpus: int
    """GPUs the replica holds on `node_id`."""
    state: ReplicaState = ReplicaState.RUNNING


@dataclass(frozen=True)
class ServeLoad:
    """What one served model's backends see, both pools together (the observe phase)."""

    model: str
    ongoing_requests: float = 0.0
    """Requests in flight or queued (the ingress's load board)."""
    p99_ms: float | None = None
    """The p99 latency over the last ``serving.latency_window_s`` (Serve's own histogram via
    Prometheus); None when there is no reading: then nothing acts on latency."""

    def __post_init__(self) -> None:
        if self.p99_ms is not None and not (math.isfinite(self.p99_ms) and self.p99_ms >= 0):
            raise ValueError(f"{self.model}: p99_ms must be finite and >= 0, got {self.p99_ms}")


@dataclass(frozen=True)
class QueuedJob:
    """A training job waiting for its whole gang to fit."""

    job_id: str
    queue: str
    """The team's queue; its share of live capacity is configured by name."""
    priority_class: str
    """A configured priority class name (defaults: low, medium, high)."""
    num_workers: int
    gpus_per_worker: int
    submitted_s: float
    """When the job (last) entered the queue; FIFO order within a priority class."""
    max_runtime_s: float | None = None
    """Upper bound on run time; None means unbounded (such a job never backfills)."""
    not_before_s: float | None = None
    """Backoff after a failed gang start: not admitted (nor reserved for) before this time."""
    lost_s: float | None = None
    """When its last attempt lost a node (it died, or health took it out); None otherwise.
    Admission then weighs borrowing a node from serving against waiting for the replacement
    (`policies.admission.borrow`)."""

    @property
    def gpus_total(self) -> int:
        return self.num_workers * self.gpus_per_worker


@dataclass(frozen=True)
class RunningGang:
    """A training job that holds GPUs: admitted or running."""

    job_id: str
    queue: str
    priority_class: str
    num_workers: int
    gpus_per_worker: int
    gpus_by_node: Mapping[str, int]
    """Placement: GPUs the gang holds on each node."""
    started_s: float
    """When the gang was admitted (work since the last checkpoint counts from here at most)."""
    max_runtime_s: float | None = None
    last_checkpoint_s: float | None = None
    """When the last complete checkpoint was taken; None if never."""
    preempting: bool = False
    """A preemption was requested and the gang is checkpointing/stopping."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus_by_node", _frozen_mapping(self.gpus_by_node))

    @property
    def gpus_total(self) -> int:
        return sum(self.gpus_by_node.values())

    @property
    def expected_end_s(self) -> float | None:
        """Latest time the gang can still be running; None if it has no max runtime."""
        if self.max_runtime_s is None:
            return None
        return self.started_s + self.max_runtime_s

    def work_at_risk_s(self, now_s: float) -> float:
        """Seconds of work lost if the gang stopped now without a new checkpoint."""
        since = self.started_s if self.last_checkpoint_s is None else self.last_checkpoint_s
        return max(0.0, now_s - max(since, self.started_s))


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything a tick observed, at time `now_s`. Built once, read by every policy."""

    now_s: float
    nodes: tuple[NodeView, ...] = ()
    serve_replicas: tuple[ServeReplica, ...] = ()
    queued: tuple[QueuedJob, ...] = ()
    running: tuple[RunningGang, ...] = ()
    serve_load: tuple[ServeLoad, ...] = ()
    """Per served model, its ongoing requests and measured p99 (`load_of`)."""
    pinned: Mapping[str, Pool] = field(default_factory=dict)
    """Models an operator pinned to a pool (model -> pool): placement never moves their
    replicas out of it, and admission's claim never takes their cluster GPUs."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pinned", _frozen_mapping(self.pinned))

    def node(self, node_id: str) -> NodeView | None:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        return None

    def load_of(self, model: str) -> ServeLoad:
        """`model`'s row of ``serve_load`` (no traffic, no reading when it has none)."""
        for load in self.serve_load:
            if load.model == model:
                return load
        return ServeLoad(model)

    def live_nodes(self, pool: Pool) -> tuple[NodeView, ...]:
        """Healthy nodes of `pool`: the only capacity any policy may count on."""
        return tuple(n for n in self.nodes if n.pool is pool and n.healthy)

    def live_gpus_total(self, pool: Pool) -> int:
        return sum(n.gpus_total for n in self.live_nodes(pool))

    def gang_nodes(self, pool: Pool) -> tuple[NodeView, ...]:
        """Live nodes of `pool` a gang may use: the live ones that are not serving-only."""
        return tuple(n for n in self.live_nodes(pool) if not n.serving_only)
