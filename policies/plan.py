"""What the policies want done: one frozen dataclass per action, each with a `reason`.

Owns: the vocabulary between the decide phase and the actuators. A `Plan` is a tuple of
actions; the act phase applies each idempotently and the record phase writes each `reason`
to the event log.

Every action here is applied by the control loop (`controlplane.loop.act`) as returned; an
action nobody applies is deleted, not kept for later (how often a job checkpoints is decided
inside the job, by `jobs.checkpointing` with `policies.checkpointing`, from the fleet's MTBF
the controller publishes: no plan item carries it).

Must not: carry behaviour. Actions are data; only actuators (in `controlplane`) change the
world. Requests here are level-triggered: a policy repeats an action every tick for as long as
it still wants it, and the actuator does nothing when its effect is already visible.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.snapshot import Pool

__all__ = [
    "Action",
    "AdmitJob",
    "DrainNode",
    "MoveServeReplicas",
    "Plan",
    "PreemptJob",
    "RejectJob",
    "RequestExternalCapacity",
    "ScaleIngress",
    "ScaleServePool",
    "SetRouteWeights",
    "WaitJob",
    "WorkerPlacement",
]


@dataclass(frozen=True)
class WorkerPlacement:
    """`num_workers` of a gang's workers go on `node_id`."""

    node_id: str
    num_workers: int


@dataclass(frozen=True)
class AdmitJob:
    """Start the whole gang now; every worker has its GPUs on the named nodes."""

    job_id: str
    placement: tuple[WorkerPlacement, ...]
    """Workers per node; empty for a gang that needs no GPUs."""
    num_workers: int
    gpus_per_worker: int
    reason: str


@dataclass(frozen=True)
class PreemptJob:
    """Stop a running gang (checkpoint first when `checkpoint_first`) and re-queue it."""

    job_id: str
    reason: str
    for_job_id: str | None = None
    """The queued job the GPUs are freed for, if any."""
    checkpoint_first: bool = True
    for_serving: bool = False
    """The GPUs are freed for serving's demand (``serving-reclaims``), not for a job."""


@dataclass(frozen=True)
class RejectJob:
    """A queued job can never run as configured (unknown queue/class, bigger than the pool)."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class MoveServeReplicas:
    """Move replicas of `model` off `node_ids` in `from_pool` to `to_pool`, make-before-break.

    The replacement must be RUNNING and receiving traffic before an old replica stops; the
    placement policy and the Serve actuator own that sequence.
    """

    model: str
    from_pool: Pool
    to_pool: Pool
    num_replicas: int
    node_ids: tuple[str, ...]
    reason: str
    for_job_id: str | None = None


@dataclass(frozen=True)
class ScaleServePool:
    """Set the target replica count of `model`'s backend deployment in `pool`."""

    model: str
    pool: Pool
    num_replicas: int
    reason: str


@dataclass(frozen=True)
class ScaleIngress:
    """Set the ingress deployment's replica count (`policies.ingress`)."""

    num_replicas: int
    reason: str


@dataclass(frozen=True)
class SetRouteWeights:
    """Split `model`'s traffic across pools; weights are non-negative and sum to 1."""

    model: str
    weights: tuple[tuple[Pool, float], ...]
    reason: str


@dataclass(frozen=True)
class RequestExternalCapacity:
    """Ask the external pool's autoscaler for at least `num_gpus` GPUs (0 lets it scale down),
    `by_provider` of them from each provider (name, GPUs; `policies.providers`)."""

    num_gpus: int
    reason: str
    by_provider: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class DrainNode:
    """Take a bad node out of service (Ray drain; cordon in production)."""

    node_id: str
    reason: str


@dataclass(frozen=True)
class WaitJob:
    """A queued job waits on something only an operator can change (a pinned model holds the
    GPUs it needs); the reason says what, and is shown with the job (``rcp status``)."""

    job_id: str
    reason: str
    code: str = ""
    """What it waits on, the reason's leading code (`policies.admission.Why`): it stays while
    the reason's figures ("in about 2h15m") change."""

    def __post_init__(self) -> None:
        if self.code and not self.reason.startswith(f"{self.code}: "):
            raise ValueError(
                f"WaitJob {self.job_id!r}: the reason must start with its code "
                f"{self.code!r}, got {self.reason[:60]!r}"
            )


Action = (
    AdmitJob
    | PreemptJob
    | RejectJob
    | MoveServeReplicas
    | ScaleServePool
    | ScaleIngress
    | SetRouteWeights
    | RequestExternalCapacity
    | DrainNode
    | WaitJob
)
"""Every action a policy may put in a plan."""

Plan = tuple[Action, ...]
"""A batch of actions decided in one tick, applied in order."""
