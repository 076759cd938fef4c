"""One checkpointing helper for training loops: restore, should_checkpoint, save, report, finish.

Owns the training loop's side of every checkpoint the control plane runs::

    from jobs.checkpointing import Checkpointing

    ckpt = Checkpointing()                 # everything from the RCP_* environment
    restored = ckpt.restore()              # the same step on every rank, or None
    start = restored.step + 1 if restored else 0
    for step in range(start, num_steps):
        loss = train_step()
        if ckpt.should_checkpoint(step):   # the same answer on every rank
            ckpt.save(step, {"model": model.state_dict(), "optim": optim.state_dict()})
            if ckpt.preempted:             # the control plane asked for this one
                break
        ckpt.report(step, {"loss": loss})
    ckpt.finish()

It works in both ways a job runs:

* inside a Ray Train worker (``entrypoint: module:function``, `jobs.launcher.run_gang`): rank
  and world size from ``ray.train.get_context()``, metrics also go to ``ray.train.report``,
  and Ray Train's own preemption signal (a node being drained) triggers a checkpoint;
* inside a plain process (``rcp submit -- python train.py``: the command runs on every rank
  with torchrun's environment): rank and world size from ``torch.distributed`` when it is
  initialised, else ``RANK``/``WORLD_SIZE``. Under the control plane (``RCP_JOB_ID`` set) such
  a process is not a Ray worker, so the helper connects to the node's Ray cluster with
  ``ray.init(address="auto")`` (``RAY_ADDRESS`` when set) to reach the signals actor and the
  memory tier. If that fails it warns and goes on without them: no step reports (the hang
  watchdog never arms), no checkpoint-now requests, no memory tier.

Behind it is `jobs.checkpoint.CheckpointEngine`: a snapshot into host memory on the training
thread, the upload to object storage in the background, the manifest last. The engine writes
straight to ``RCP_CHECKPOINT_URI`` (the job's own prefix) with boto3's usual credential chain
on the node; `restore` reads only that prefix. When Ray is up the newest snapshot is also held
by a `RayMemoryTier` named after the job id, which the control plane cleans up.

When to checkpoint (`should_checkpoint`), first match wins:

1. checkpointing disabled (``RCP_CHECKPOINT_ENABLED=0``, or no URI at all): never;
2. a checkpoint-now request (rank 0 polls the signals actor every ``RCP_SIGNAL_POLL_S``) or
   Ray Train's preemption signal: now, once per request;
3. ``every_n_steps`` given in code: after every n-th step (``(step + 1) % n == 0``);
4. a fixed interval (the ``interval_s`` argument, else ``RCP_CHECKPOINT_INTERVAL_S``): once
   that long has passed since the last save (or the start);
5. else Young/Daly (`policies.checkpointing`) from the measured stalls, the last upload time
   and ``RCP_MTBF_S``; ``IntervalConfig.min_interval_s`` until the first save is measured.

Each rank computes its own answer and one one-element all-reduce (MAX) makes it the gang's,
so every rank saves the same step. On a request `save` waits for the commit (rank 0's
manifest), rank 0 tells the controller (``checkpointed``, a hint: the controller reads the
manifest from storage), and `preempted` turns True; `finish` then waits for the controller to
stop the gang and raises `PreemptedError` if it does not, so a preempted loop never ends as a
success. Rank 0 reports its step to the controller (``progress``) at the first step and then
at most every ``RCP_STEP_REPORT_S``, with the attempt's checkpoint stall, wall time, saves
and newest committed step: the hang watchdog and ``rcp status`` read these.

Metrics (label ``run``: the job id; exported through Ray's metrics agent inside Ray, see
`jobs.checkpoint.metrics`): the engine's ``rcp_checkpoint_*``, plus the two below:
``rcp_checkpoint_started_unix_seconds`` (when this attempt started with checkpointing on) and
``rcp_checkpoint_interval_seconds`` (the interval in use). After a restore rank 0 also sets
the engine's ``rcp_checkpoint_last_commit_unix_seconds`` and ``..._last_committed_step`` from
the restored manifest, so a restarted job's newest commit is known before it commits again.

Must not: import `controlplane` (everything comes from ``RCP_*`` variables); log or print the
signal token or storage credentials; let a slow or missing signals actor stop training.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import ray
import ray.train
import torch
import torch.distributed as dist

from jobs.checkpoint import (
    CheckpointEngine,
    MemoryTier,
    RayMemoryTier,
    RestoredCheckpoint,
    SaveHandle,
)
from jobs.checkpoint import metrics as engine_metrics
from jobs.checkpoint.layout import Manifest, manifest_key, step_dir
from jobs.checkpoint.metrics import MirroredMetric
from jobs.signals import (
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
    ENV_STORAGE_ENDPOINT_URL,
    ENV_STORAGE_REGION,
    MAX_RANKS,
    SignalsHandle,
)
from policies.checkpointing import (
    IntervalConfig,
    IntervalInputs,
    checkpoint_interval,
    typical_stall_s,
)

__all__ = [
    "DEFAULT_MTBF_S",
    "DEFAULT_SIGNAL_POLL_S",
    "DEFAULT_STEP_REPORT_S",
    "INTERVAL_SECONDS",
    "PREEMPTED_WAIT_S",
    "STARTED_UNIX_SECONDS",
    "Checkpointing",
    "Gang",
    "PreemptedError",
    "Settings",
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
PREEMPTED_WAIT_S = 300.0
"""How long `Checkpointing.finish` waits, after answering a checkpoint-now request, for the
control plane to stop the gang (it does so once it sees the step's manifest, within a tick or
two) before it raises `PreemptedError`."""
MAX_SECONDS = 1e10
"""Upper bound (317 years) of every duration read from the environment or given: any
interval or MTBF the control plane passes fits; only absurd values are refused."""
MAX_KEEP_LAST = 10_000
SIGNALS_TIMEOUT_S = 5.0
RAY_TRAIN_REPORT_INTERVAL_S = 10.0
"""The least time between two ``ray.train.report`` calls of `Checkpointing.report`. Ray Train
(v2) keeps one report per worker until its controller polls the workers (every 2 s,
``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``): a report per step blocks the loop about 2 s each
(measured: 1.95 s per call back to back). Spaced this far apart a report finds the slot
empty and returns at once."""
"""Longest one call to the signals actor may block rank 0."""
_DUE, _ASKED, _ASK_RAY_TRAIN = 1, 2, 4
"""Bits of the flags every rank all-reduces in `should_checkpoint`."""

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


class PreemptedError(RuntimeError):
    """The loop stopped for a checkpoint-now request and the gang was not stopped for it."""


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
    return Settings(
        job_id=env.get(ENV_JOB_ID) or None,
        attempt=_env_int(env, ENV_ATTEMPT, 0, 0, 2**31 - 1),
        token=env.get(ENV_SIGNAL_TOKEN, ""),
        enabled=enabled == "1",
        uri=env.get(ENV_CHECKPOINT_URI) or None,
        endpoint_url=env.get(ENV_STORAGE_ENDPOINT_URL) or None,
        region=env.get(ENV_STORAGE_REGION) or None,
        interval_s=_env_seconds(env, ENV_CHECKPOINT_INTERVAL_S),
        keep_last=(
            _env_int(env, ENV_CHECKPOINT_KEEP_LAST, 1, 1, MAX_KEEP_LAST) if keep_last else None
        ),
        mtbf_s=_env_seconds(env, ENV_MTBF_S) or DEFAULT_MTBF_S,
        step_report_s=_env_seconds(env, ENV_STEP_REPORT_S) or DEFAULT_STEP_REPORT_S,
        signal_poll_s=_env_seconds(env, ENV_SIGNAL_POLL_S) or DEFAULT_SIGNAL_POLL_S,
    )


def _connect_ray() -> bool:
    """Join the node's Ray cluster from a plain process (a command the launcher started);
    True when Ray is up afterwards."""
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


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")


# -- the helper --------------------------------------------------------------------------------


class Checkpointing:
    """A training loop's checkpoints and its conversation with the control plane (see the
    module doc). Construct it on every rank, after ``torch.distributed`` is initialised.

    Arguments override the environment; all are optional:

    * `uri`, `endpoint_url`, `region`: where checkpoints go (``s3://bucket/prefix`` or
      ``file:///path``); default ``RCP_CHECKPOINT_URI`` and friends. No URI: disabled.
    * `enabled`: False turns saving and restoring off (step reports still go out).
    * `every_n_steps` / `interval_s` / `interval_bounds` / `mtbf_s`: the cadence (module doc).
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
        if every_n_steps is not None and (
            isinstance(every_n_steps, bool)
            or not isinstance(every_n_steps, int)
            or every_n_steps < 1
        ):
            raise ValueError(f"every_n_steps must be an int >= 1 or None, got {every_n_steps!r}")
        for name, value in (("interval_s", interval_s), ("mtbf_s", mtbf_s)):
            if value is not None and not (math.isfinite(value) and 0 < value <= MAX_SECONDS):
                raise ValueError(f"{name} must be a finite number in (0, {MAX_SECONDS:g}]")
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
        self._asked = False  # rank 0's cached poll answer
        self._next_poll_s = self._started_s
        self._next_ray_train_check_s = self._started_s
        self._next_ray_train_report_s = self._started_s
        self._next_progress_s: float | None = None
        self._warned: set[str] = set()
        self._group: dist.ProcessGroup | None = None

        if signals is None and self.job_id:
            # Under the control plane. A plain process joins the node's Ray cluster: rank 0
            # talks to the signals actor, and every rank feeds the memory tier.
            ray_up = self.gang.in_ray_train or ray.is_initialized()
            if not ray_up and (self.rank == 0 or self.enabled):
                ray_up = _connect_ray()
            signals = SignalsHandle() if ray_up and self.rank == 0 else None
        self._signals = signals if self.job_id else None

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

    # -- agreement -----------------------------------------------------------------------------

    def _all_reduce(self, values: list[int], op: Literal["max", "min"]) -> list[int]:
        """Ints all-reduced over the gang (on a gloo group: no GPU sync per step)."""
        if self.world_size == 1:
            return values
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                f"Checkpointing on rank {self.rank} of {self.world_size} needs "
                "torch.distributed initialised (every rank must agree on when to checkpoint "
                "and what to restore): call torch.distributed.init_process_group() first"
            )
        if self._group is None:
            self._group = (
                dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
            )
        tensor = torch.tensor(values, dtype=torch.int64)
        reduce_op = dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN
        dist.all_reduce(tensor, op=reduce_op, group=self._group)
        return [int(v) for v in tensor.tolist()]

    # -- restore -------------------------------------------------------------------------------

    def restore(self, *, map_location: str | torch.device = "cpu") -> RestoredCheckpoint | None:
        """The newest committed checkpoint every rank can verify, or None (all ranks start
        fresh). Ranks propose the newest step they verified; while proposals differ, ranks
        above the smallest try again at most that step, until all hold the same one."""
        if self.engine is None:
            return None
        restored = self.engine.restore(map_location=map_location)
        while True:
            # Every rank takes part in every round: [min, -max] of the proposals.
            proposal = restored.step if restored is not None else -1
            lowest, highest = self._all_reduce([proposal, -proposal], "min")
            if lowest == -highest:
                break
            if lowest < 0:
                restored = None
                break
            if proposal > lowest:
                restored = self.engine.restore(max_step=lowest, map_location=map_location)
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
                self._publish_restored_commit(restored.step)
        self.restored = restored
        self._last_save_s = self._clock()
        return restored

    def _publish_restored_commit(self, step: int) -> None:
        """Set the engine's newest-commit gauges from the restored manifest, so the
        checkpoint-age alert measures from the real last commit on a restarted job."""
        assert self.engine is not None
        try:
            manifest = Manifest.from_json_bytes(self.engine.storage.get_bytes(manifest_key(step)))
        except Exception as exc:  # a metric must not fail a restore that verified
            log.warning("checkpointing: cannot read step %d's commit time: %s", step, exc)
            return
        engine_metrics.LAST_COMMIT_UNIX_SECONDS.labels(self.run_name).set(manifest.created_unix_s)
        engine_metrics.LAST_COMMITTED_STEP.labels(self.run_name).set(step)

    # -- when ----------------------------------------------------------------------------------

    def _set_interval(self, interval_s: float) -> None:
        self.interval_s = interval_s
        if self.rank == 0:
            INTERVAL_SECONDS.labels(self.run_name).set(interval_s)

    def _due(self, step: int, now_s: float) -> bool:
        if self.every_n_steps is not None:
            return (step + 1) % self.every_n_steps == 0
        assert self.interval_s is not None
        return now_s - self._last_save_s >= self.interval_s

    def _controller_asks(self, now_s: float) -> bool:
        """Rank 0's view of a checkpoint-now request, asked at most every poll interval."""
        if self._signals is None or self.rank != 0 or now_s < self._next_poll_s:
            return self._asked
        self._next_poll_s = now_s + self.settings.signal_poll_s
        # A slow or restarting actor must not stop training: keep the last answer. A dead
        # one is looked up by name again (`SignalsHandle`).
        with contextlib.suppress(Exception):
            self._asked = bool(
                self._signals.call(
                    "poll",
                    self.job_id,
                    self.settings.attempt,
                    self.settings.token,
                    timeout_s=SIGNALS_TIMEOUT_S,
                )
            )
        return self._asked

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
        _check_step(step)
        self._progress(step)
        if self.engine is None:
            return False
        now_s = self._clock()
        flags = (
            (_DUE if self._due(step, now_s) else 0)
            | (_ASKED if self._controller_asks(now_s) else 0)
            | (_ASK_RAY_TRAIN if self._ray_train_check_due(now_s) else 0)
        )
        [flags] = self._all_reduce([flags], "max")
        if flags & _ASK_RAY_TRAIN and ray.train.get_preemption_info() is not None:
            self._pending_drain = not self._drain_answered
        asked = bool(flags & _ASKED)
        if not asked:  # no request (or it was withdrawn): a new one gets a new checkpoint
            self._answered = False
            self.preempted = False
        self._pending_request = asked and not self._answered
        return bool(flags & _DUE) or self._pending_request or self._pending_drain

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
        _check_step(step)
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
                self._set_interval(self._young_daly_s())
        if (request or drain) and handle is not None:
            committed = self._wait_for_commit(handle)
            if committed and request:
                self._tell_checkpointed(step)
                self._answered = True
                self.preempted = True
            if committed and drain:
                self._drain_answered = True
                self._pending_drain = False
        return handle

    def _young_daly_s(self) -> float:
        assert self.engine is not None
        return checkpoint_interval(
            IntervalInputs(
                stall_s=typical_stall_s(list(self._stalls_s)),
                mtbf_s=self.mtbf_s,
                persist_s=self.engine.stats()["checkpoint_upload_s"],
            ),
            self.interval_bounds,
        ).interval_s

    def _wait_for_commit(self, handle: SaveHandle) -> bool:
        """Wait for this save (rank 0: its manifest); True on every rank only if it
        committed everywhere. A failed one is retried at the next step (still asked)."""
        ok = True
        try:
            handle.result()
        except Exception as exc:
            log.warning("checkpointing: requested step %d did not commit: %s", handle.step, exc)
            ok = False
        return self._all_reduce([int(ok)], "min") == [1]

    def _tell_checkpointed(self, step: int) -> None:
        if self.rank != 0 or self._signals is None or self.uri is None:
            return
        path = f"{self.uri.rstrip('/')}/{step_dir(step)}"
        accepted: object = None
        with contextlib.suppress(Exception):
            accepted = self._signals.call(
                "checkpointed",
                self.job_id,
                self.settings.attempt,
                step,
                path,
                time.time(),
                self.settings.token,
                timeout_s=SIGNALS_TIMEOUT_S,
            )
        if accepted is False:
            log.warning(
                "the control plane refused checkpoint %s of job %s attempt %s (wrong token, "
                "stale attempt or a path outside the job's checkpoint prefix)",
                path,
                self.job_id,
                self.settings.attempt,
            )

    # -- report --------------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """The engine's numbers plus this attempt's totals (all floats)."""
        out = dict(self.engine.stats()) if self.engine is not None else {}
        out.update(
            {
                "checkpoint_stall_total_s": self._stall_total_s,
                "checkpoint_wall_s": self._clock() - self._started_s,
                "checkpoint_saves": float(self._saves),
                "checkpoint_interval_s": float(self.interval_s or 0.0),
            }
        )
        return out

    def report(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Report `metrics` for `step`: the step to the control plane (rank 0, at most every
        ``RCP_STEP_REPORT_S``) and, inside Ray Train, `metrics` with `stats` through
        ``ray.train.report`` at most every `RAY_TRAIN_REPORT_INTERVAL_S` (rank 0's clock,
        agreed by every rank with one all-reduce: the call is a collective there)."""
        _check_step(step)
        self._progress(step)
        if not self.gang.in_ray_train:
            return
        now_s = self._clock()
        [due] = self._all_reduce(
            [int(self.rank == 0 and now_s >= self._next_ray_train_report_s)], "max"
        )
        if due:
            self._next_ray_train_report_s = now_s + RAY_TRAIN_REPORT_INTERVAL_S
            ray.train.report({**(metrics or {}), **self.stats(), "step": step})

    def _progress(self, step: int, *, force: bool = False) -> None:
        self._last_step = step if self._last_step is None else max(step, self._last_step)
        if self.rank != 0 or self._signals is None:
            return
        now_s = self._clock()
        if not force and self._next_progress_s is not None and now_s < self._next_progress_s:
            return
        self._next_progress_s = now_s + self.settings.step_report_s
        stats = {
            "stall_s": self._stall_total_s,
            "wall_s": now_s - self._started_s,
            "saves": self._saves,
        }
        if self.engine is not None:
            committed = self.engine.stats()["checkpoint_last_committed_step"]
            if committed >= 0:
                stats["committed_step"] = int(committed)
        accepted: object = None
        with contextlib.suppress(Exception):
            accepted = self._signals.call(
                "progress",
                self.job_id,
                self.settings.attempt,
                step,
                stats,
                self.settings.token,
                timeout_s=SIGNALS_TIMEOUT_S,
            )
        if accepted is False:
            self._warn_once(
                "progress",
                f"the control plane refused the step report of job {self.job_id} attempt "
                f"{self.settings.attempt} (wrong token or a stale attempt)",
            )

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
