"""The sections of a simulator scenario: the rented pool, failures, training, serving and the
baselines' knobs, each field documented, defaulted (the default scenario's) and bounded.

Owns: `ExternalSpec`, `FailureSpec`, `TrainingSpec`, `ModelSpec`, `ServingSpec`, `SchemeSpec`
(their fields' checks declared on them, ``Annotated``: `controlplane.simulate.checks`) and
`META_GPU_MTTF_HOURS`.

Must not: check across fields or read files (`controlplane.simulate.scenario` does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated

from controlplane.simulate.checks import Number, Whole, within

__all__ = [
    "META_GPU_MTTF_HOURS",
    "ExternalSpec",
    "FailureSpec",
    "ModelSpec",
    "RecoverySpec",
    "SchemeSpec",
    "ServingSpec",
    "TrainingSpec",
]

Seconds = Annotated[Number, within(0, 86400)]
Hours = Annotated[Number, within(0.01, 8760)]
Share = Annotated[Number, within(0, 1)]
HourOfDay = Annotated[Number, within(0, 24)]
PerNodeYear = Annotated[Number, within(0, 365)]

META_GPU_MTTF_HOURS = 7.9 * 1024
"""Meta's Llama 3 report: one interruption every 7.9 h for a 1,024-GPU job, i.e. a mean time
to failure of 7.9 x 1,024 = 8,090 h per GPU (1,011 h per 8-GPU node)."""


@dataclass
class ExternalSpec:
    """The rented pool: how fast a node comes up, when a provider delivers nothing, and how
    often a spot provider takes a node back. Its providers (each one's name, price, node
    size and most nodes) are the control plane's ``pools.external.providers`` (``config``
    overrides), so our scheme, the baselines and the report read one list."""

    provision_s: Seconds = 300.0
    """Request to a node that can take a replica (cloud node start plus Ray join)."""
    stockout_start_hours: list[Number] = field(default_factory=list)
    """Stock-outs: hours since the start at which `stockout_provider` stops delivering nodes
    for ``stockout_hours`` (a node due then comes up ``provision_s`` after the outage ends
    and is not billed before it; the ones already up stay). Every scheme meets the same
    outages."""
    stockout_hours: Hours = 6.0
    """How long each stock-out lasts."""
    stockout_provider: str | None = None
    """The provider the stock-outs hit (a name in ``pools.external.providers``); None: the
    cheapest (the first of the cheapest, in the config's order)."""
    spot_reclaims_per_node_day: Annotated[Number, within(0, 24)] = 0.05
    """Spot reclaims: each node of a `spot_providers` provider that is up is taken back at
    this rate a day (a Poisson process per node: 0.05 is about a 5 % chance a day), after
    ``reclaim_notice_s`` of notice; the provider is not out of stock, so it may be asked for
    a node again at once. 0: no reclaims. The trace draws the instants and which rented node
    each hits (`controlplane.simulate.trace`), so every scheme meets the same reclaims."""
    reclaim_notice_s: Annotated[Number, within(0, 3600)] = 120.0
    """The notice before a reclaimed node goes (AWS spot's two minutes; `rcp fault reclaim
    --notice-s` plays one on the local cluster). 0: no notice."""
    spot_providers: list[str] | None = None
    """The providers whose nodes are reclaimed (names in ``pools.external.providers``);
    None: the cheapest (the first of the cheapest: cheap capacity is the spot kind); []:
    none."""


@dataclass
class FailureSpec:
    """Hard failures and the faults telemetry sees first."""

    gpu_mttf_hours: Annotated[Number, within(1, 1e9)] = META_GPU_MTTF_HOURS
    """Mean time to failure of one GPU; a node fails at gpus_per_node times that rate."""
    repair_hours: Annotated[Number, within(0, 8760)] = 4.0
    """A failed or drained node is back this long after it left."""
    hot_faults_per_node_year: PerNodeYear = 2.0
    """GPU overheating episodes per node per year (telemetry: a GPU above the threshold)."""
    fabric_faults_per_node_year: PerNodeYear = 2.0
    """InfiniBand error bursts per node per year (telemetry: IB errors above the threshold)."""
    fault_escalation_probability: Share = 0.5
    """Share of faults that end in a hard failure if the node is still in service."""
    fault_escalation_s: Seconds = 1800.0
    """When an escalating fault turns into a hard failure, after it started."""
    fault_clear_s: Seconds = 3600.0
    """When a fault that does not escalate clears by itself."""
    crash_share: Share = 0.5
    """Share of the hard failures that are a worker crash (a process or GPU error: the node
    survives and stays in service; only the gangs on it fail) rather than a node loss (down
    for ``repair_hours``). The trace draws which, after everything else, so the failures'
    instants and nodes are the same whatever this says. 0.5: of the 419 interruptions of
    Meta's Llama 3 report, about half were software, NCCL, HBM/SRAM ECC and GPU processor
    errors a process restart (after a GPU reset) recovers from, the other half faulty GPUs,
    network, host and power faults that take the node out."""


@dataclass
class TrainingSpec:
    """The training jobs: from a trace file, or generated from the seed."""

    jobs: Annotated[Whole, within(0, 1_000_000)] = 5000
    """Jobs generated over the horizon (Poisson arrivals); ignored with a trace."""
    trace: str | None = None
    """A JSON or YAML list of jobs (``submit_h``, ``num_workers``, ``gpus_per_worker``,
    ``hours``, ``priority``); relative to the scenario file."""
    offered_load: Annotated[Number, within(0, 100)] = 1.0
    """Generated GPU-hours of training as a share of the owned cluster's GPU-hours over the
    horizon (durations are scaled to hit it)."""
    median_hours: Hours = 6.0
    """Median run time before scaling (lognormal)."""
    sigma: Annotated[Number, within(0, 5)] = 1.2
    """Lognormal sigma of run times."""
    max_hours: Hours = 96.0
    """Longest run time."""
    gang_gpus: dict[str, Number] = field(
        default_factory=lambda: {
            "8": 0.45,
            "16": 0.2,
            "32": 0.15,
            "64": 0.1,
            "128": 0.07,
            "256": 0.03,
        }
    )
    """Gang size (GPUs) -> share of jobs; gangs of 8 or more take whole 8-GPU workers."""
    priorities: dict[str, Number] = field(
        default_factory=lambda: {"low": 0.3, "medium": 0.5, "high": 0.2}
    )
    """Priority class -> share of jobs (classes of the control plane's ``jobs`` section)."""
    runtime_limit_factor: Annotated[Number, within(1, 100)] = 1.5
    """A job's max runtime (what admission backfills by) is its run time times this."""
    checkpoint_stall_s: Seconds = 30.0
    """Training-visible stall per checkpoint (async snapshot)."""
    checkpoint_persist_s: Seconds = 60.0
    """Background upload per checkpoint (bounds the interval from below)."""
    restore_s: Seconds = 300.0
    """Restart from a checkpoint: reschedule, load, warm up."""
    baseline_checkpoint_interval_s: Annotated[Number, within(1, 1e7)] = 3600.0
    """The baselines checkpoint on a fixed clock (ours asks `policies.checkpointing`)."""


@dataclass
class RecoverySpec:
    """How our scheme recovers a gang from a failure (issue 30). Every scheme meets the same
    failures (`FailureSpec`); the baselines and ``ours-requeue`` (our scheme before issue 30)
    re-queue every failed gang."""

    restart_in_place: bool = True
    """A worker crash restarts the gang's worker group inside its run on the same nodes
    (Ray Train's FailureConfig, `jobs.launcher.in_place`): no re-queue, no admission wait."""
    in_place_restart_s: Seconds = 60.0
    """A crash to the first resumed step in place: Ray Train finds the dead worker (0.5 s
    poll), stops the group, starts a new one on the same nodes, which restores from the
    memory tier. The local cluster measures 8 s (22 s through the queue); at scale, process
    start, NCCL setup over hundreds of ranks and reading tens of GB from host memory take
    tens of seconds."""
    replace_lost_node: bool = True
    """A node loss under a gang restarts the gang at full size at once on a free cluster
    node of the shape, else on a cluster node freed from serving (its replicas stopped, only
    where every model keeps its ``min_replicas`` and the replicas demand needs RUNNING
    elsewhere), instead of re-queueing it; the borrowed node goes back to serving (the gang
    checkpoints and moves to the repaired node) when the lost node is back."""
    replacement_restart_s: Seconds = 120.0
    """A node loss to the first resumed step on the replacement node: the group restarts
    with a worker scheduled on a new node, and the ranks whose memory-tier copy the lost
    node held read storage (the re-queue path's ``restore_s`` adds the queue's scheduling
    and a full restore from storage)."""


@dataclass
class ModelSpec:
    """One served model and its daily request curve."""

    name: str = "model"
    gpus_per_replica: Annotated[Whole, within(1, 64)] = 1
    replica_rps: Annotated[Number, within(1e-9, 1e9)] = 10.0
    """Requests per second one replica serves at its latency target."""
    peak_rps: Annotated[Number, within(0, 1e12)] = 100.0
    trough_fraction: Share = 0.3
    """Night-time demand as a share of the peak."""
    peak_hour: HourOfDay = 14.0
    min_replicas: Annotated[Whole, within(0, 100_000)] = 2
    max_replicas: Annotated[Whole, within(0, 100_000)] = 1000
    target_utilisation: Annotated[Number, within(0.05, 1)] = 0.8
    """Every scheme sizes the model for demand / (replica_rps x this): the headroom that
    absorbs demand rising faster than a replica starts. Shortfall is counted against
    demand / replica_rps (full capacity)."""

    def curve_rps(self, hour: float) -> float:
        """The daily curve's demand at `hour` (0-24): a cosine from the trough to the peak."""
        shape = (1 + math.cos(2 * math.pi * (hour - self.peak_hour) / 24.0)) / 2
        return self.peak_rps * (self.trough_fraction + (1 - self.trough_fraction) * shape)


def _default_models() -> list[ModelSpec]:
    return [
        ModelSpec("chat", 8, 20.0, 1600.0, 0.3, 14.0, 4, 200),
        ModelSpec("code", 4, 25.0, 2000.0, 0.25, 11.0, 4, 200),
        ModelSpec("embed", 1, 200.0, 40000.0, 0.35, 16.0, 8, 500),
    ]


@dataclass
class ServingSpec:
    models: list[ModelSpec] = field(default_factory=_default_models)
    demand_step_s: Annotated[Number, within(10, 86400)] = 300.0
    """The request curves step this often (the load board's resolution in the model)."""
    noise: Share = 0.05
    """Relative standard deviation of each step's demand around the curve."""
    replica_start_s: Seconds = 120.0
    """A replica's start to RUNNING on a node that has room (model load, warm up)."""
    replica_stop_s: Seconds = 20.0
    """A stopping replica drains this long (the models' graceful shutdown) before its GPUs
    are free."""


@dataclass
class SchemeSpec:
    """The baselines' knobs."""

    static_serving_share: Share | None = None
    """Share of the cluster's nodes fixed for serving; None: the peak need plus 10 %."""
    night_serving_share: Share | None = None
    """Time-of-day lending: serving's share at night; None: the trough need plus 10 %."""
    night_start_hour: HourOfDay = 22.0
    night_end_hour: HourOfDay = 7.0
