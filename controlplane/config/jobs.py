"""The ``jobs`` section: the training queue, its store, retention, starts and restarts.

Owns: `JobsConfig`, which embeds the admission policy's own `PreemptionConfig` and names its
`QueueShare` queues, and adds the control plane's keys, each documented.

Must not: copy a field of the policy's dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from controlplane.config.checks import (
    MAX_BATCH,
    MAX_DEADLINE_S,
    MAX_RETENTION_DAYS,
    MAX_RETRIES,
    MAX_SCRAPE_TIMEOUT_S,
    MAX_SUBMIT_TIMEOUT_S,
    waits,
)
from policies.admission import DEFAULT_QUEUE, PreemptionConfig, QueueShare
from policies.validation import at_least, at_most

__all__ = ["JobsConfig"]


def _default_queues() -> dict[str, QueueShare]:
    return {DEFAULT_QUEUE: QueueShare()}


@dataclass
class JobsConfig(PreemptionConfig):
    """The training queue: priority classes, team queues, preemption caps, the job store
    (`controlplane.policy_config.admission_config` builds the policy's config from it)."""

    db_path: str | None = None
    """The job store (SQLite, WAL); null means ``<state_dir>/controlplane.db``."""
    retention_days: Annotated[
        float, at_least(0, "0 keeps jobs forever"), at_most(MAX_RETENTION_DAYS, "a hundred years")
    ] = 30.0
    """Finished jobs (SUCCEEDED, FAILED, CANCELLED, their Ray Job ended) last changed longer
    ago than this are deleted with their history and events; 0 keeps them forever."""
    event_retention_days: Annotated[
        float, at_least(0, "0 keeps events forever"), at_most(MAX_RETENTION_DAYS, "a hundred years")
    ] = 7.0
    """Events older than this are deleted (job state histories follow `retention_days`);
    0 keeps them forever."""
    prune_interval_s: Annotated[float, at_least(1), waits()] = 3600.0
    """How often the controller prunes; a backlog larger than one batch is worked off one
    batch per tick until it is gone."""
    prune_batch_size: Annotated[int, at_least(1), at_most(MAX_BATCH, "one tick's batch")] = 1000
    """The most jobs, and the most events, one prune deletes (bounds the write it holds)."""
    default_priority_class: str = "medium"
    """Class of a job that names none (must be one of priority_classes)."""
    queues: dict[str, QueueShare] = field(default_factory=_default_queues)
    """Team queues by name with their shares of live capacity."""
    gang_start_timeout_s: Annotated[float, at_least(1), waits(MAX_DEADLINE_S)] = 120.0
    """An admitted gang not fully running after this long is stopped and re-queued."""
    backoff_initial_s: Annotated[float, at_least(0)] = 5.0
    """Backoff after the first failed gang start; doubles with each further failure."""
    backoff_max_s: Annotated[float, waits()] = 300.0
    """Upper bound of the gang-start backoff."""
    max_start_attempts: Annotated[int, at_least(1), at_most(MAX_RETRIES, "retries")] = 5
    """Failed gang starts after which the job is marked FAILED."""
    storage_path: str | None = None
    """Where Ray Train keeps its runs' own records (shared by all nodes: a local path in local
    mode, a URI such as ``s3://bucket/ray-train`` on a cluster); null: ``<state_dir>/train``.
    The control plane's checkpoints go to ``storage.uri``, not here."""
    job_signal_poll_s: Annotated[float, at_least(0.01), waits(MAX_SCRAPE_TIMEOUT_S)] = 0.5
    """How often a training loop's preemption helper asks the controller (cached in between)."""
    submit_timeout_s: Annotated[float, at_least(0.1), waits(MAX_SUBMIT_TIMEOUT_S)] = 10.0
    """Longest the loop waits for Ray to accept a job submission (it runs on a worker thread);
    past it the start counts as failed and is retried with backoff."""
    stall_timeout_s: Annotated[float, at_least(1), waits(MAX_DEADLINE_S)] = 600.0
    """A running job that reports no new step for this long is hung (its stacks go to its
    logs, then it restarts from its last checkpoint); a job's ``stall_timeout_s`` overrides."""
    step_report_interval_s: Annotated[float, at_least(0.1), waits()] = 5.0
    """How often a training loop's rank 0 reports its step and checkpoint stall to the control
    plane (`jobs.checkpointing`). A job's stall_timeout_s may not be shorter."""
    restart_backoff_initial_s: Annotated[float, at_least(0)] = 10.0
    """Wait before restarting a gang that failed or hung; doubles with each restart."""
    restart_backoff_max_s: Annotated[float, waits()] = 600.0
    """Upper bound of the restart backoff."""
    checkpoint_scan_interval_s: Annotated[float, at_least(0.1), waits()] = 30.0
    """How often the controller reads a running job's committed checkpoints from object
    storage (sooner when the job says it committed one, every tick while preempting)."""
    gpu_mtbf_prior_hours: Annotated[float, at_least(1), at_most(1e9, "hours")] = 50_000.0
    """Mean GPU-hours between failures a new cluster assumes (gang failures plus node removals
    by health, per GPU-hour); the cluster's own record replaces it as GPU-hours accrue. It
    sets the Young/Daly checkpoint interval of jobs that give no checkpoint.interval_s."""
