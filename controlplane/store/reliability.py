"""The fleet's failure record: how often this cluster breaks a gang, per GPU-hour.

Owns one store record (`RELIABILITY_KEY`) with two decayed counters:

* ``failures``: gang failures (a worker crashed, a node was lost, the job hung: recorded by
  `controlplane.loop.act.jobs`) plus nodes removed by health (recorded by
  `controlplane.loop.act.nodes`);
* ``gpu_hours``: cluster-pool GPU-hours the controller watched (accrued every tick from the
  live pool's GPUs).

Both decay with a half-life of `HALF_LIFE_S`, so the rate follows what the cluster shows now,
not a year ago. `job_mtbf_s` turns the rate into a gang's mean time between failures, which
the runner hands to every job (``RCP_MTBF_S``) for its Young/Daly checkpoint interval. A new
cluster has no record: the configured prior (``jobs.gpu_mtbf_prior_hours``) counts as one
failure in that many GPU-hours, and the cluster's own evidence outweighs it as it accrues.

Must not: decide anything (the interval is `policies.checkpointing`'s).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypedDict

from controlplane.config import Config
from controlplane.store import Store

__all__ = [
    "FAILURE_KINDS",
    "HALF_LIFE_S",
    "RELIABILITY_KEY",
    "FleetRecord",
    "accrue_gpu_hours",
    "fleet_record",
    "gpu_failure_rate_per_hour",
    "job_mtbf_s",
    "record_failure",
]

RELIABILITY_KEY = "reliability.fleet"
HALF_LIFE_S = 30 * 86400.0
"""Evidence half as old counts half as much: a month-old failure weighs half a new one."""
FAILURE_KINDS = ("gang-crash", "gang-hang", "node-lost", "node-removed-by-health")
MIN_MTBF_S = 60.0
"""The shortest MTBF handed to a job, whatever the record says (keeps the interval sane)."""
MAX_MTBF_S = 10 * 365 * 86400.0


class FleetRecord(TypedDict):
    """The record as stored (`RELIABILITY_KEY`), decayed to ``at_s``."""

    at_s: float
    failures: float
    gpu_hours: float
    by_kind: dict[str, float]
    """Failures by kind (`FAILURE_KINDS`)."""


def _decayed(record: dict[str, Any], now: float) -> FleetRecord:
    """`record` with both counters decayed to `now`."""
    since = float(record.get("at_s", now))
    factor = math.pow(0.5, max(0.0, now - since) / HALF_LIFE_S)
    by_kind = {k: float(v) * factor for k, v in dict(record.get("by_kind") or {}).items()}
    return {
        "at_s": now,
        "failures": float(record.get("failures", 0.0)) * factor,
        "gpu_hours": float(record.get("gpu_hours", 0.0)) * factor,
        "by_kind": by_kind,
    }


def fleet_record(store: Store, now: float) -> FleetRecord:
    """The record decayed to `now`: ``{"failures", "gpu_hours", "by_kind", "at_s"}``."""
    raw = store.get_value(RELIABILITY_KEY, {}) or {}
    return _decayed(raw if isinstance(raw, dict) else {}, now)


def _update(store: Store, now: float, change: Callable[[FleetRecord], None]) -> None:
    record = fleet_record(store, now)
    change(record)
    store.put(RELIABILITY_KEY, record)


def record_failure(store: Store, kind: str, now: float) -> None:
    """Count one failure of `kind` (one of `FAILURE_KINDS`)."""
    if kind not in FAILURE_KINDS:
        raise ValueError(f"unknown failure kind {kind!r}; one of {', '.join(FAILURE_KINDS)}")

    def add(record: FleetRecord) -> None:
        record["failures"] += 1.0
        record["by_kind"][kind] = record["by_kind"].get(kind, 0.0) + 1.0

    _update(store, now, add)


def accrue_gpu_hours(store: Store, gpus: int, dt_s: float, now: float) -> None:
    """Add `gpus` GPUs watched for `dt_s` seconds (called once per tick)."""
    if gpus <= 0 or not math.isfinite(dt_s) or dt_s <= 0:
        return

    def add(record: FleetRecord) -> None:
        record["gpu_hours"] += gpus * dt_s / 3600.0

    _update(store, now, add)


def gpu_failure_rate_per_hour(store: Store, cfg: Config, now: float) -> float:
    """Failures per GPU-hour: the record plus the prior (one failure per
    ``jobs.gpu_mtbf_prior_hours``), so a new cluster gets exactly the prior."""
    record = fleet_record(store, now)
    prior_h = cfg.jobs.gpu_mtbf_prior_hours
    return (record["failures"] + 1.0) / (record["gpu_hours"] + prior_h)


def job_mtbf_s(store: Store, cfg: Config, gpus: int, now: float) -> float:
    """The mean time between failures of a gang of `gpus` GPUs (any one failing stops it),
    in seconds, within [`MIN_MTBF_S`, `MAX_MTBF_S`]. A CPU-only gang counts as one GPU."""
    rate_per_s = gpu_failure_rate_per_hour(store, cfg, now) * max(1, gpus) / 3600.0
    return min(MAX_MTBF_S, max(MIN_MTBF_S, 1.0 / rate_per_s))
