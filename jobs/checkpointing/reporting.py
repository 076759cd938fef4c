"""Progress reporting: rank 0's conversation with the control plane, and the loop's metrics.

Owns: `open_link` (rank 0's link, joining the node's Ray cluster from a plain process) and
`ControlPlaneLink`, rank 0's three calls to the job's signals actor (``poll``: is a
checkpoint-now request open; ``checkpointed``: a hint that a requested step committed;
``progress``: the step with the attempt's stall, wall time, saves and newest committed step),
each with the attempt's token and bounded by `SIGNALS_TIMEOUT_S`; the loop's two gauges
(`STARTED_UNIX_SECONDS`, `INTERVAL_SECONDS`); `publish_restored_commit`, which sets the
engine's newest-commit gauges from a restored manifest; and `RAY_TRAIN_REPORT_INTERVAL_S`.

Must not: let a slow, missing or restarting signals actor stop training (every call here
swallows its failure and says so with None), log the signal token, or decide anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import ray

from jobs.checkpoint import CheckpointEngine
from jobs.checkpoint import metrics as engine_metrics
from jobs.checkpoint.layout import Manifest, manifest_key, step_dir
from jobs.checkpoint.metrics import MirroredMetric
from jobs.checkpointing.settings import Gang, Settings, connect_ray
from jobs.signals.handle import SignalsHandle

__all__ = [
    "INTERVAL_SECONDS",
    "RAY_TRAIN_REPORT_INTERVAL_S",
    "SIGNALS_TIMEOUT_S",
    "STARTED_UNIX_SECONDS",
    "ControlPlaneLink",
    "open_link",
    "publish_restored_commit",
]

log = logging.getLogger(__name__)

SIGNALS_TIMEOUT_S = 5.0
"""Longest one call to the signals actor may block rank 0."""
RAY_TRAIN_REPORT_INTERVAL_S = 10.0
"""The least time between two ``ray.train.report`` calls of `Checkpointing.report`. Ray Train
(v2) keeps one report per worker until its controller polls the workers (every 2 s,
``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``): a report per step blocks the loop about 2 s each
(measured: 1.95 s per call back to back). Spaced this far apart a report finds the slot
empty and returns at once."""

STARTED_UNIX_SECONDS = MirroredMetric(
    "gauge",
    "rcp_checkpoint_started_unix_seconds",
    "When the run's current attempt started with checkpointing on (rank 0 of the training "
    "loop). Present without rcp_checkpoint_last_commit_unix_seconds: never committed.",
    ["run"],
)
INTERVAL_SECONDS = MirroredMetric(
    "gauge",
    "rcp_checkpoint_interval_seconds",
    "The checkpoint interval the training loop uses (fixed, or Young/Daly); unset when the "
    "loop checkpoints every n steps.",
    ["run"],
)


class ControlPlaneLink:
    """Rank 0's calls to the signals actor of job `job_id`, attempt `attempt`. A call that
    fails (slow, missing or restarting actor) changes nothing; a dead actor is looked up by
    name again (`SignalsHandle`). Polls go out at most every `poll_s`, step reports at most
    every `step_report_s` (the first at once)."""

    def __init__(
        self,
        signals: SignalsHandle,
        job_id: str | None,
        attempt: int,
        token: str,
        *,
        poll_s: float,
        step_report_s: float,
        now_s: float,
    ) -> None:
        self.signals = signals
        self.job_id = job_id
        self.attempt = attempt
        self._token = token
        self.poll_s = poll_s
        self.step_report_s = step_report_s
        self._asked = False  # the cached poll answer
        self._next_poll_s = now_s
        self._next_progress_s: float | None = None
        self._progress_refused = False

    def asks(self, now_s: float) -> bool:
        """Whether a checkpoint-now request is open, asked at most every `poll_s`."""
        if now_s < self._next_poll_s:
            return self._asked
        self._next_poll_s = now_s + self.poll_s
        asked = self._call("poll")
        if asked is not None:  # a slow or restarting actor: keep the last answer
            self._asked = bool(asked)
        return self._asked

    def _call(self, method: str, *args: object) -> object:
        """``method(job_id, attempt, *args, token)`` on the signals actor; None when the call
        fails (a slow, missing or restarting actor must not stop training)."""
        try:
            return self.signals.call(
                method, self.job_id, self.attempt, *args, self._token, timeout_s=SIGNALS_TIMEOUT_S
            )
        except Exception:
            return None

    def tell_checkpointed(self, uri: str, step: int) -> None:
        """Tell the controller `step` committed under `uri` (a hint: it reads the manifest)."""
        path = f"{uri.rstrip('/')}/{step_dir(step)}"
        if self._call("checkpointed", step, path, time.time()) is False:
            log.warning(
                "the control plane refused checkpoint %s of job %s attempt %s (wrong token, "
                "stale attempt or a path outside the job's checkpoint prefix)",
                path,
                self.job_id,
                self.attempt,
            )

    def tell_restored(self, step: int, source: str, restore_s: float) -> None:
        """Tell the controller this run restored `step` from `source` (how it times and
        shows the job's recovery)."""
        self._call("restored", step, source, restore_s)

    def progress_due(self, now_s: float, *, force: bool = False) -> bool:
        """Whether a step report goes out now (`force`: regardless of the last one)."""
        if not force and self._next_progress_s is not None and now_s < self._next_progress_s:
            return False
        self._next_progress_s = now_s + self.step_report_s
        return True

    def report_progress(self, step: int, stats: Mapping[str, float]) -> None:
        """Report `step` with the attempt's `stats`; a refusal is logged once."""
        accepted = self._call("progress", step, stats)
        if accepted is False and not self._progress_refused:
            self._progress_refused = True
            log.warning(
                f"the control plane refused the step report of job {self.job_id} attempt "
                f"{self.attempt} (wrong token or a stale attempt)"
            )


def open_link(
    signals: SignalsHandle | None,
    gang: Gang,
    settings: Settings,
    *,
    enabled: bool,
    now_s: float,
) -> ControlPlaneLink | None:
    """Rank 0's link to the job's signals actor, or None (not under the control plane, not
    rank 0, or Ray unreachable). `signals` given (tests): used as is, no ``ray.init``."""
    if signals is None and settings.job_id:
        # Under the control plane. A plain process joins the node's Ray cluster: rank 0
        # talks to the signals actor, and every rank feeds the memory tier.
        ray_up = gang.in_ray_train or ray.is_initialized()
        if not ray_up and (gang.rank == 0 or enabled):
            ray_up = connect_ray()
        signals = SignalsHandle() if ray_up and gang.rank == 0 else None
    if signals is None or not settings.job_id:
        return None
    return ControlPlaneLink(
        signals,
        settings.job_id,
        settings.attempt,
        settings.token,
        poll_s=settings.signal_poll_s,
        step_report_s=settings.step_report_s,
        now_s=now_s,
    )


def publish_restored_commit(engine: CheckpointEngine, run_name: str, step: int) -> None:
    """Set the engine's newest-commit gauges from the restored manifest, so the
    checkpoint-age alert measures from the real last commit on a restarted job."""
    try:
        manifest = Manifest.from_json_bytes(engine.storage.get_bytes(manifest_key(step)))
    except Exception as exc:  # a metric must not fail a restore that verified
        log.warning("checkpointing: cannot read step %d's commit time: %s", step, exc)
        return
    engine_metrics.LAST_COMMIT_UNIX_SECONDS.labels(run_name).set(manifest.created_unix_s)
    engine_metrics.LAST_COMMITTED_STEP.labels(run_name).set(step)
