"""Where this process is in the job, and what the control plane said in its environment.

Owns: `Gang` and `detect_gang` (rank and world size: Ray Train's context, else an
initialised ``torch.distributed``, else torchrun's ``RANK``/``WORLD_SIZE``, else a single
process), `Settings` and `settings_from_env` (the ``RCP_*`` variables the runner sets, each
checked, a malformed one a ValueError naming it), the defaults used without them, and
`connect_ray` (a plain process joining the node's Ray cluster).

Must not: import `controlplane`, log or print the signal token, or fail training when the
Ray cluster cannot be reached (it warns and goes on without it).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import ray
import ray.train
import torch.distributed as dist

from jobs.signals.environment import (
    ENV_ATTEMPT,
    ENV_CHECKPOINT_ENABLED,
    ENV_CHECKPOINT_INTERVAL_S,
    ENV_CHECKPOINT_KEEP_LAST,
    ENV_CHECKPOINT_URI,
    ENV_JOB_ID,
    ENV_MTBF_S,
    ENV_SIGNAL_POLL_S,
    ENV_SIGNAL_TOKEN,
    ENV_STEP_REPORT_S,
    ENV_STORAGE_CREDENTIALS,
    ENV_STORAGE_ENDPOINT_URL,
    ENV_STORAGE_REGION,
    STORAGE_CREDENTIALS_FROM_SIGNALS,
)
from jobs.signals.mailbox import MAX_RANKS

__all__ = [
    "DEFAULT_MTBF_S",
    "DEFAULT_SIGNAL_POLL_S",
    "DEFAULT_STEP_REPORT_S",
    "MAX_KEEP_LAST",
    "MAX_SECONDS",
    "Gang",
    "Settings",
    "connect_ray",
    "detect_gang",
    "settings_from_env",
]

log = logging.getLogger(__name__)

DEFAULT_MTBF_S = 4 * 3600.0
"""The MTBF Young/Daly assumes without ``RCP_MTBF_S`` (outside the control plane)."""
DEFAULT_STEP_REPORT_S = 5.0
"""Step report interval without ``RCP_STEP_REPORT_S`` (the control plane always sets it)."""
DEFAULT_SIGNAL_POLL_S = 0.5
"""Checkpoint-now poll interval without ``RCP_SIGNAL_POLL_S``."""
MAX_SECONDS = 1e10
"""Upper bound (317 years) of every duration read from the environment or given: any
interval or MTBF the control plane passes fits; only absurd values are refused."""
MAX_KEEP_LAST = 10_000


# -- where this process is ---------------------------------------------------------------------


@dataclass(frozen=True)
class Gang:
    """This process's place in the job: rank, world size, and whether Ray Train runs it."""

    rank: int
    world_size: int
    in_ray_train: bool
    run_name: str | None = None
    """Ray Train's run (experiment) name; None in a plain process."""


def _ray_train_context() -> ray.train.TrainContext | None:
    """Ray Train's context inside a Train worker, else None (v2 raises RuntimeError)."""
    try:
        return ray.train.get_context()
    except RuntimeError:
        return None


def _env_int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def _env_seconds(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
        raise ValueError(f"{name} must be a finite number in (0, {MAX_SECONDS:g}], got {raw!r}")
    return value


def detect_gang(env: Mapping[str, str] | None = None) -> Gang:
    """Rank and world size: Ray Train's context, else an initialised ``torch.distributed``,
    else ``RANK``/``WORLD_SIZE`` (torchrun's), else a single process."""
    ctx = _ray_train_context()
    if ctx is not None:
        return Gang(ctx.get_world_rank(), ctx.get_world_size(), True, ctx.get_experiment_name())
    if dist.is_available() and dist.is_initialized():
        return Gang(dist.get_rank(), dist.get_world_size(), False)
    env = os.environ if env is None else env
    world_size = _env_int(env, "WORLD_SIZE", 1, 1, MAX_RANKS)
    rank = _env_int(env, "RANK", 0, 0, MAX_RANKS - 1)
    if rank >= world_size:
        raise ValueError(f"RANK must be below WORLD_SIZE={world_size}, got {rank}")
    return Gang(rank, world_size, False)


# -- what the control plane said --------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """What the runner put in the job's environment (see `jobs.signals` for the names)."""

    job_id: str | None = None
    attempt: int = 0
    token: str = field(default="", repr=False)
    enabled: bool = True
    uri: str | None = None
    endpoint_url: str | None = None
    region: str | None = None
    credentials_from_signals: bool = False
    """The job's S3 credentials come from the signals actor (scoped to its prefix), not the
    node's AWS sources (``RCP_STORAGE_CREDENTIALS``)."""
    interval_s: float | None = None
    keep_last: int | None = None
    mtbf_s: float = DEFAULT_MTBF_S
    step_report_s: float = DEFAULT_STEP_REPORT_S
    signal_poll_s: float = DEFAULT_SIGNAL_POLL_S


def settings_from_env(env: Mapping[str, str] | None = None) -> Settings:
    """`Settings` from ``RCP_*`` variables; a malformed one is a ValueError naming it."""
    env = os.environ if env is None else env
    enabled = env.get(ENV_CHECKPOINT_ENABLED, "1")
    if enabled not in ("0", "1"):
        raise ValueError(f"{ENV_CHECKPOINT_ENABLED} must be 0 or 1, got {enabled!r}")
    keep_last = env.get(ENV_CHECKPOINT_KEEP_LAST)
    credentials = env.get(ENV_STORAGE_CREDENTIALS, "")
    if credentials not in ("", STORAGE_CREDENTIALS_FROM_SIGNALS):
        raise ValueError(
            f"{ENV_STORAGE_CREDENTIALS} must be {STORAGE_CREDENTIALS_FROM_SIGNALS!r} or unset, "
            f"got {credentials!r}"
        )
    return Settings(
        job_id=env.get(ENV_JOB_ID) or None,
        attempt=_env_int(env, ENV_ATTEMPT, 0, 0, 2**31 - 1),
        token=env.get(ENV_SIGNAL_TOKEN, ""),
        enabled=enabled == "1",
        uri=env.get(ENV_CHECKPOINT_URI) or None,
        endpoint_url=env.get(ENV_STORAGE_ENDPOINT_URL) or None,
        region=env.get(ENV_STORAGE_REGION) or None,
        credentials_from_signals=credentials == STORAGE_CREDENTIALS_FROM_SIGNALS,
        interval_s=_env_seconds(env, ENV_CHECKPOINT_INTERVAL_S),
        keep_last=(
            _env_int(env, ENV_CHECKPOINT_KEEP_LAST, 1, 1, MAX_KEEP_LAST) if keep_last else None
        ),
        mtbf_s=_env_seconds(env, ENV_MTBF_S) or DEFAULT_MTBF_S,
        step_report_s=_env_seconds(env, ENV_STEP_REPORT_S) or DEFAULT_STEP_REPORT_S,
        signal_poll_s=_env_seconds(env, ENV_SIGNAL_POLL_S) or DEFAULT_SIGNAL_POLL_S,
    )


def connect_ray() -> bool:
    """Join the node's Ray cluster from a plain process (a command the launcher started, which
    sets ``RAY_ADDRESS`` to its worker's cluster; ``auto`` finds the node's cluster without
    it); True when Ray is up afterwards."""
    if ray.is_initialized():
        return True
    try:
        ray.init(address="auto", log_to_driver=False, logging_level=logging.WARNING)
    except Exception as exc:  # no cluster, or refused: train without the control plane's help
        log.warning(
            "checkpointing: cannot reach the Ray cluster (%s); no step reports (the hang "
            "watchdog cannot see this job), no checkpoint-now requests, no memory tier",
            exc,
        )
        return False
    return True
