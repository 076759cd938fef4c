"""The `Checkpointing` helper: one object a training loop holds on every rank.

Owns: the helper's state across a run (the engine, the memory tier, the cadence in use, the
open checkpoint-now or drain request, the attempt's saves and stalls) and the order of its
steps; the package doc (`jobs.checkpointing`) says what each step does.

Must not: import `controlplane` (everything comes from ``RCP_*`` variables, see `settings`);
log or print the signal token or storage credentials; let a slow or missing signals actor
stop training.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Literal

import ray
import ray.train
import torch

from jobs.checkpoint import (
    CheckpointEngine,
    MemoryTier,
    RayMemoryTier,
    RestoredCheckpoint,
    SaveHandle,
)
from jobs.checkpoint.saving import check_step
from jobs.checkpointing.agreement import (
    ASK_RAY_TRAIN,
    ASKED,
    DUE,
    GangAgreement,
    agree_on_restore,
)
from jobs.checkpointing.cadence import check_cadence, is_due, young_daly_s
from jobs.checkpointing.credentials import SignalsCredentials
from jobs.checkpointing.reporting import (
    INTERVAL_SECONDS,
    RAY_TRAIN_REPORT_INTERVAL_S,
    STARTED_UNIX_SECONDS,
    open_link,
    publish_restored_commit,
)
from jobs.checkpointing.settings import detect_gang, settings_from_env
from jobs.signals.environment import ENV_CHECKPOINT_URI
from jobs.signals.handle import SignalsHandle
from policies.checkpointing import IntervalConfig

__all__ = ["PREEMPTED_WAIT_S", "Checkpointing", "PreemptedError"]

log = logging.getLogger(__name__)

PREEMPTED_WAIT_S = 300.0
"""How long `Checkpointing.finish` waits, after answering a checkpoint-now request, for the
control plane to stop the gang (it does so once it sees the step's manifest, within a tick or
two) before it raises `PreemptedError`."""


class PreemptedError(RuntimeError):
    """The loop stopped for a checkpoint-now request and the gang was not stopped for it."""


class Checkpointing:
    """A training loop's checkpoints and its conversation with the control plane (see the
    package doc, `jobs.checkpointing`). Construct it on every rank, after
    ``torch.distributed`` is initialised.

    Arguments override the environment; all are optional:

    * `uri`, `endpoint_url`, `region`: where checkpoints go (``s3://bucket/prefix`` or
      ``file:///path``); default ``RCP_CHECKPOINT_URI`` and friends. No URI: disabled.
    * `enabled`: False turns saving and restoring off (step reports still go out).
    * `every_n_steps` / `interval_s` / `interval_bounds` / `mtbf_s`: the cadence (package
      doc).
    * `keep_last`: committed steps retention keeps (default ``RCP_CHECKPOINT_KEEP_LAST``, else
      the engine's 3).
    * `memory_tier`: ``"auto"`` (a `RayMemoryTier` named after the job when Ray is up), None,
      or any `MemoryTier`.
    * `engine_options`: passed to `CheckpointEngine` (e.g. ``commit_poll_interval_s``).

    `env`, `signals`, `clock` and `sleep` are for tests: they replace ``os.environ``, the
    handle on the signals actor (given: no ``ray.init`` here), the monotonic clock and
    ``time.sleep``.
    """

    def __init__(
        self,
        uri: str | None = None,
        *,
        enabled: bool | None = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        every_n_steps: int | None = None,
        interval_s: float | None = None,
        interval_bounds: IntervalConfig | None = None,
        mtbf_s: float | None = None,
        keep_last: int | None = None,
        memory_tier: MemoryTier | Literal["auto"] | None = "auto",
        preempted_wait_s: float = PREEMPTED_WAIT_S,
        env: Mapping[str, str] | None = None,
        signals: SignalsHandle | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        **engine_options: Any,
    ) -> None:
        check_cadence(every_n_steps, interval_s, mtbf_s)
        if not (math.isfinite(preempted_wait_s) and preempted_wait_s >= 0):
            raise ValueError(f"preempted_wait_s must be finite and >= 0, got {preempted_wait_s}")
        settings = settings_from_env(env)
        self.settings = settings
        self.gang = detect_gang(env)
        self.rank = self.gang.rank
        self.world_size = self.gang.world_size
        self.job_id = settings.job_id
        self.run_name = settings.job_id or self.gang.run_name or "local"
        self.uri = uri or settings.uri
        self.enabled = (settings.enabled if enabled is None else enabled) and bool(self.uri)
        self.every_n_steps = every_n_steps
        self.fixed_interval_s = interval_s if interval_s is not None else settings.interval_s
        self.interval_bounds = interval_bounds or IntervalConfig()
        self.mtbf_s = mtbf_s if mtbf_s is not None else settings.mtbf_s
        self.preempted_wait_s = preempted_wait_s
        self.preempted = False
        """True once a save answered the control plane's checkpoint-now request (committed):
        the loop should stop; `finish` then waits to be stopped."""
        self.restored: RestoredCheckpoint | None = None
        self._clock = clock
        self._sleep = sleep
        self._started_s = clock()
        self._last_save_s = self._started_s
        self._stalls_s: deque[float] = deque(maxlen=16)
        self._stall_total_s = 0.0
        self._saves = 0
        self._last_step: int | None = None
        self._answered = False  # this request was answered: do not save for it again
        self._drain_answered = False
        self._pending_request = False
        self._pending_drain = False
        self._next_ray_train_check_s = self._started_s
        self._next_ray_train_report_s = self._started_s
        self._warned: set[str] = set()
        self._agreement = GangAgreement(self.rank, self.world_size)

        self._link = open_link(
            signals, self.gang, settings, enabled=self.enabled, now_s=self._started_s
        )

        self.engine: CheckpointEngine | None = None
        self._tier: MemoryTier | None = None
        self.interval_s: float | None = None
        if not self.enabled:
            if self.uri is None and settings.enabled and enabled is not False:
                log.info("checkpointing off: no checkpoint URI (%s unset)", ENV_CHECKPOINT_URI)
            return
        assert self.uri is not None
        if memory_tier == "auto":
            self._tier = RayMemoryTier(self.run_name) if ray.is_initialized() else None
        else:
            self._tier = memory_tier
        options = dict(engine_options)
        keep = keep_last if keep_last is not None else settings.keep_last
        if keep is not None:
            options["keep_last"] = keep
        if settings.credentials_from_signals and settings.job_id and "credentials" not in options:
            # Scoped: every rank fetches the job's credentials from the signals actor.
            options["credentials"] = SignalsCredentials(
                signals if signals is not None else SignalsHandle(),
                settings.job_id,
                settings.attempt,
                settings.token,
            )
        self.engine = CheckpointEngine(
            self.uri,
            endpoint_url=endpoint_url or settings.endpoint_url,
            region=region or settings.region,
            rank=self.rank,
            world_size=self.world_size,
            run_name=self.run_name,
            memory_tier=self._tier,
            **options,
        )
        if self.every_n_steps is None:
            self._set_interval(self.fixed_interval_s or self.interval_bounds.min_interval_s)
        if self.rank == 0:
            STARTED_UNIX_SECONDS.labels(self.run_name).set(time.time())

    # -- restore -------------------------------------------------------------------------------

    def restore(self, *, map_location: str | torch.device = "cpu") -> RestoredCheckpoint | None:
        """The newest committed checkpoint every rank can verify, or None (all ranks start
        fresh). Ranks propose the newest step they verified; while proposals differ, ranks
        above the smallest try again at most that step, until all hold the same one."""
        if self.engine is None:
            return None
        started_s = time.monotonic()
        restored = agree_on_restore(self.engine, self._agreement, map_location)
        if restored is None:
            self.engine.reset_step_order(None)
        else:
            log.info(
                "checkpointing: restored step %d from %s (%s)",
                restored.step,
                restored.source,
                self.uri,
            )
            if self.rank == 0:
                publish_restored_commit(self.engine, self.run_name, restored.step)
                if self._link is not None:
                    elapsed_s = time.monotonic() - started_s
                    self._link.tell_restored(restored.step, restored.source, elapsed_s)
        self.restored = restored
        self._last_save_s = self._clock()
        return restored

    # -- when ----------------------------------------------------------------------------------

    def _set_interval(self, interval_s: float) -> None:
        self.interval_s = interval_s
        if self.rank == 0:
            INTERVAL_SECONDS.labels(self.run_name).set(interval_s)

    def _controller_asks(self, now_s: float) -> bool:
        """Rank 0's view of a checkpoint-now request (`ControlPlaneLink.asks`)."""
        return self._link is not None and self.rank == 0 and self._link.asks(now_s)

    def _ray_train_check_due(self, now_s: float) -> bool:
        """Whether the gang asks Ray Train for its preemption signal this step (rank 0's
        clock; the all-reduce makes every rank call it, as Ray Train requires)."""
        if not self.gang.in_ray_train or self.rank != 0 or now_s < self._next_ray_train_check_s:
            return False
        self._next_ray_train_check_s = now_s + self.settings.signal_poll_s
        return True

    def should_checkpoint(self, step: int) -> bool:
        """Whether to save after `step`; the same answer on every rank. Call it once per
        step on every rank (it is a collective). Also reports the step (`report`)."""
        check_step(step)
        self._progress(step)
        if self.engine is None:
            return False
        now_s = self._clock()
        due = is_due(
            step,
            now_s,
            every_n_steps=self.every_n_steps,
            interval_s=self.interval_s,
            last_save_s=self._last_save_s,
        )
        flags = (
            (DUE if due else 0)
            | (ASKED if self._controller_asks(now_s) else 0)
            | (ASK_RAY_TRAIN if self._ray_train_check_due(now_s) else 0)
        )
        [flags] = self._agreement.all_reduce([flags], "max")
        if flags & ASK_RAY_TRAIN and ray.train.get_preemption_info() is not None:
            self._pending_drain = not self._drain_answered
        asked = bool(flags & ASKED)
        if not asked:  # no request (or it was withdrawn): a new one gets a new checkpoint
            self._answered = False
            self.preempted = False
        self._pending_request = asked and not self._answered
        return bool(flags & DUE) or self._pending_request or self._pending_drain

    # -- save ----------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        state: Any,
        *,
        keep: bool = False,
        metadata: Mapping[str, Any] | None = None,
    ) -> SaveHandle | None:
        """Snapshot `state` for `step` and upload it in the background (every rank, with its
        own state). Returns the engine's handle (``stall_s``; ``result()`` waits for it), or
        None when checkpointing is off.

        For a checkpoint-now request (or Ray Train's preemption signal) the step is kept
        (`keep`), the call waits for the commit and rank 0 reports it; `preempted` is then
        True if the control plane asked.
        """
        check_step(step)
        if self.engine is None:
            self._warn_once("save", "checkpointing is off: save() keeps nothing")
            return None
        request, drain = self._pending_request, self._pending_drain
        handle = self.engine.save(state, step, keep=keep or request or drain, metadata=metadata)
        self._last_save_s = self._clock()
        self._last_step = step
        if handle is not None:
            self._saves += 1
            self._stall_total_s += handle.stall_s
            self._stalls_s.append(handle.stall_s)
            if self.every_n_steps is None and self.fixed_interval_s is None:
                upload_s = self.engine.stats()["checkpoint_upload_s"]
                self._set_interval(
                    young_daly_s(
                        self._stalls_s,
                        mtbf_s=self.mtbf_s,
                        persist_s=upload_s,
                        bounds=self.interval_bounds,
                    )
                )
        if (request or drain) and handle is not None:
            committed = self._wait_for_commit(handle)
            if committed and request:
                if self.rank == 0 and self._link is not None and self.uri is not None:
                    self._link.tell_checkpointed(self.uri, step)
                self._answered = True
                self.preempted = True
            if committed and drain:
                self._drain_answered = True
                self._pending_drain = False
        return handle

    def _wait_for_commit(self, handle: SaveHandle) -> bool:
        """Wait for this save (rank 0: its manifest); True on every rank only if it
        committed everywhere. A failed one is retried at the next step (still asked)."""
        ok = True
        try:
            handle.result()
        except Exception as exc:
            log.warning("checkpointing: requested step %d did not commit: %s", handle.step, exc)
            ok = False
        return self._agreement.all_reduce([int(ok)], "min") == [1]

    # -- report --------------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """The engine's numbers plus this attempt's totals (all floats)."""
        return {
            **(self.engine.stats() if self.engine is not None else {}),
            "checkpoint_stall_total_s": self._stall_total_s,
            "checkpoint_wall_s": self._clock() - self._started_s,
            "checkpoint_saves": float(self._saves),
            "checkpoint_interval_s": float(self.interval_s or 0.0),
        }

    def report(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Report `metrics` for `step`: the step to the control plane (rank 0, at most every
        ``RCP_STEP_REPORT_S``) and, inside Ray Train, `metrics` with `stats` through
        ``ray.train.report`` at most every `RAY_TRAIN_REPORT_INTERVAL_S` (rank 0's clock,
        agreed by every rank with one all-reduce: the call is a collective there)."""
        check_step(step)
        self._progress(step)
        if not self.gang.in_ray_train:
            return
        now_s = self._clock()
        [due] = self._agreement.all_reduce(
            [int(self.rank == 0 and now_s >= self._next_ray_train_report_s)], "max"
        )
        if due:
            self._next_ray_train_report_s = now_s + RAY_TRAIN_REPORT_INTERVAL_S
            ray.train.report({**(metrics or {}), **self.stats(), "step": step})

    def _progress(self, step: int, *, force: bool = False) -> None:
        self._last_step = step if self._last_step is None else max(step, self._last_step)
        if self.rank != 0 or self._link is None:
            return
        now_s = self._clock()
        if not self._link.progress_due(now_s, force=force):
            return
        stats: dict[str, float] = {
            "stall_s": self._stall_total_s,
            "wall_s": now_s - self._started_s,
            "saves": self._saves,
        }
        if self.engine is not None:
            committed = self.engine.stats()["checkpoint_last_committed_step"]
            if committed >= 0:
                stats["committed_step"] = int(committed)
        self._link.report_progress(step, stats)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    # -- the end -------------------------------------------------------------------------------

    def finish(self) -> None:
        """Wait for the uploads in flight and let go of the engine. Call it on every rank at
        the end of the loop. A normal end drops this rank's memory-tier copy. After a
        checkpoint-now request was answered it does not return: it waits for the control
        plane to stop the gang and raises `PreemptedError` after `preempted_wait_s`."""
        if self.engine is not None:
            self.engine.close()
        if self._last_step is not None:  # with the commits the close waited for
            self._progress(self._last_step, force=True)
        if self.preempted:
            self._wait_to_be_stopped()
        if isinstance(self._tier, RayMemoryTier):
            with contextlib.suppress(Exception):  # the control plane cleans up after the job
                self._tier.clear_rank(self.rank)

    def _wait_to_be_stopped(self) -> None:
        """Sleep until the control plane stops the gang; rank 0 gives up early when the
        request is withdrawn (nobody will stop it). Either way: `PreemptedError`."""
        deadline_s = self._clock() + self.preempted_wait_s
        while self._clock() < deadline_s:
            self._sleep(min(1.0, self.settings.signal_poll_s))
            if self.rank == 0 and not self._controller_asks(self._clock()):
                break
        raise PreemptedError(
            f"job {self.job_id}: the loop stopped at step {self._last_step} for the control "
            "plane's checkpoint-now request (committed), and the gang was not stopped for it "
            f"within {self.preempted_wait_s:g}s; ending with an error, not as a finished job"
        )
