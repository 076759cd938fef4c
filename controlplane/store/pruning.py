"""Retention: the store keeps finished jobs and events for a while, not forever.

Owns: when the controller prunes and how much at once. A finished job (SUCCEEDED, FAILED,
CANCELLED, its Ray Job ended) last changed more than ``jobs.retention_days`` ago is deleted
with its history and events; an event older than ``jobs.event_retention_days`` is deleted.
Each run deletes at most ``jobs.prune_batch_size`` jobs and as many events (a short write
that never stalls a tick), runs at most every ``jobs.prune_interval_s``, and runs again on the
next tick while a full batch shows a backlog is left. Every pruned job is forgotten by the job
signals actor too, all of a batch in one call (`forget_many`: one actor call and one timeout
per run, not one per job), so neither the store nor the actor grows without bound. A forget
that fails is logged and changes nothing here: pruning goes on.

Worked example: 30-day retention, batch 1000, a store holding 2500 jobs that finished 40 days
ago. Tick 1 deletes 1000 (a full batch: run again next tick), tick 2 deletes 1000, tick 3
deletes 500 (not full: next run in an hour).

Must not: decide which jobs are finished or settled (the store's `prune_jobs` does), or read
the wall clock (``now_s`` comes in).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controlplane.config import JobsConfig
from controlplane.store import Store

__all__ = ["DAY_S", "Pruned", "Retention"]

log = logging.getLogger(__name__)

DAY_S = 86_400.0


@dataclass(frozen=True)
class Pruned:
    """What one run deleted."""

    job_ids: tuple[str, ...]
    num_events: int
    backlog: bool
    """A batch came back full: more is left, and the next tick runs again."""


class Retention:
    """Prunes `store` by `cfg`'s retention settings; call `run(now_s)` every tick."""

    def __init__(
        self, store: Store, cfg: JobsConfig, forget_many: Callable[[Sequence[str]], None]
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.forget_many = forget_many
        self.next_s = 0.0
        """When the next run is due (0: on the first tick)."""

    def run(self, now_s: float) -> Pruned | None:
        """Prune one batch if due; None when it was not."""
        if now_s < self.next_s:
            return None
        c = self.cfg
        batch = int(c.prune_batch_size)
        job_ids: list[str] = []
        num_events = 0
        if c.retention_days > 0:
            job_ids = self.store.prune_jobs(now_s - c.retention_days * DAY_S, limit=batch)
        if c.event_retention_days > 0:
            num_events = self.store.prune_events(
                now_s - c.event_retention_days * DAY_S, limit=batch
            )
        if job_ids:
            try:
                self.forget_many(job_ids)
            except Exception as exc:  # the rows are gone already; the actor may keep a few
                log.warning("retention: forgetting %d pruned jobs failed: %s", len(job_ids), exc)
        backlog = len(job_ids) >= batch or num_events >= batch
        self.next_s = now_s if backlog else now_s + c.prune_interval_s
        if job_ids or num_events:
            self.store.record_event(
                "store.prune",
                f"retention: deleted {len(job_ids)} finished jobs older than "
                f"{c.retention_days:g} days and {num_events} events older than "
                f"{c.event_retention_days:g} days" + ("; more next tick" if backlog else ""),
                data={"jobs": len(job_ids), "events": num_events, "backlog": backlog},
            )
        return Pruned(tuple(job_ids), num_events, backlog)
