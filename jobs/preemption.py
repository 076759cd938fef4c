"""Checkpoint-before-preempt: the signal between the control plane and a training loop.

Owns two things:

* `JobSignals`, a small named Ray actor (namespace ``rcp``, name ``rcp-job-signals``) that the
  control plane creates. It holds, per job and attempt, which workers have started, the
  latest checkpoint the job reported (step, path, time) and whether the control plane asked
  for a checkpoint now. It is a mailbox, not a source of truth: the control plane copies what
  it reads into its durable store every tick.
* `Preemption`, the helper a training loop polls once per step::

      pre = Preemption()                      # inside the Ray Train worker function
      for step in range(start, num_steps):
          ...train one step...
          if pre.should_checkpoint() or step % 50 == 0:
              path = pre.save(step, state, metrics)   # ray.train.report + tell the controller

  `should_checkpoint()` is cheap: rank 0 asks the actor at most every ``poll_interval_s``
  (cached in between), and Ray Train's own signal (`ray.train.get_preemption_info`, a node
  being preempted) is checked every call. The answer is agreed by every rank with one
  one-element all-reduce, so all ranks checkpoint at the same step (``ray.train.report`` is
  collective). After a requested checkpoint the loop keeps going; the control plane stops the
  gang once the checkpoint is reported (or its deadline passes) and later restarts it, and
  `restore()` then returns the state saved at that step.

Must not: import `controlplane` (the runner passes everything through environment variables:
``RCP_JOB_ID``, ``RCP_ATTEMPT``, ``RCP_RESUME_FROM``, ``RCP_SIGNAL_POLL_S``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ray

__all__ = [
    "ENV_ATTEMPT",
    "ENV_JOB_ID",
    "ENV_RESUME_FROM",
    "ENV_SIGNAL_POLL_S",
    "SIGNALS_ACTOR_NAME",
    "SIGNALS_NAMESPACE",
    "JobSignals",
    "Preemption",
    "get_signals",
]

SIGNALS_ACTOR_NAME = "rcp-job-signals"
SIGNALS_NAMESPACE = "rcp"
ENV_JOB_ID = "RCP_JOB_ID"
ENV_ATTEMPT = "RCP_ATTEMPT"
ENV_RESUME_FROM = "RCP_RESUME_FROM"
ENV_SIGNAL_POLL_S = "RCP_SIGNAL_POLL_S"
_STATE_FILE = "state.pt"


class _JobSignals:
    """Per-job mailbox between the control plane and training loops (see the module doc)."""

    def __init__(self) -> None:
        self._jobs: dict[str, dict[str, Any]] = {}

    def _job(self, job_id: str) -> dict[str, Any]:
        return self._jobs.setdefault(
            job_id,
            {"attempt": None, "started_ranks": [], "checkpoint": None, "requested_at_s": None},
        )

    def worker_started(self, job_id: str, attempt: int, rank: int) -> None:
        job = self._job(job_id)
        if job["attempt"] != attempt:
            job["attempt"] = attempt
            job["started_ranks"] = []
        if rank not in job["started_ranks"]:
            job["started_ranks"].append(rank)

    def checkpointed(self, job_id: str, attempt: int, step: int, path: str, at_s: float) -> None:
        job = self._job(job_id)
        job["checkpoint"] = {
            "attempt": attempt,
            "step": step,
            "path": path,
            "at_s": at_s,
            # True when this checkpoint was taken while a checkpoint-now request was pending.
            "answers_request": job["requested_at_s"] is not None,
        }

    def request_checkpoint(self, job_id: str, at_s: float) -> None:
        self._job(job_id)["requested_at_s"] = at_s

    def clear_request(self, job_id: str) -> None:
        self._job(job_id)["requested_at_s"] = None

    def poll(self, job_id: str) -> bool:
        """True while a checkpoint-now request is pending for `job_id`."""
        return self._job(job_id)["requested_at_s"] is not None

    def status(self, job_id: str) -> dict[str, Any]:
        return dict(self._job(job_id))

    def forget(self, job_id: str) -> None:
        self._jobs.pop(job_id, None)


JobSignals = ray.remote(num_cpus=0, max_restarts=-1)(_JobSignals)
"""The actor class; the control plane creates the one named `SIGNALS_ACTOR_NAME`."""


def get_signals() -> Any:
    """The running signals actor, or None (e.g. a script run outside the control plane)."""
    try:
        return ray.get_actor(SIGNALS_ACTOR_NAME, namespace=SIGNALS_NAMESPACE)
    except ValueError:
        return None


def _all_reduce_max(flag: bool) -> bool:
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


class Preemption:
    """The training loop's side of checkpoint-before-preempt (see the module doc).

    Construct it inside the Ray Train worker function. Outside the control plane (no
    ``RCP_JOB_ID``) it still follows Ray Train's own preemption signal.
    """

    def __init__(self, poll_interval_s: float | None = None) -> None:
        import ray.train

        self.job_id = os.environ.get(ENV_JOB_ID)
        self.attempt = int(os.environ.get(ENV_ATTEMPT, "0"))
        self.poll_interval_s = (
            poll_interval_s
            if poll_interval_s is not None
            else float(os.environ.get(ENV_SIGNAL_POLL_S, "0.5"))
        )
        ctx = ray.train.get_context()
        self.rank = ctx.get_world_rank()
        self._signals = get_signals() if self.job_id else None
        self._last_poll_s = 0.0
        self._requested = False
        self._pending = False
        self._honoured = False
        self.last_saved_step: int | None = None

    # -- asking --------------------------------------------------------------------------------

    def _controller_asks(self) -> bool:
        if self._signals is None or self.rank != 0:
            return False
        now = time.monotonic()
        if now - self._last_poll_s >= self.poll_interval_s:
            self._last_poll_s = now
            # A slow or restarting actor must not stop training: keep the last answer.
            with contextlib.suppress(Exception):
                self._requested = bool(ray.get(self._signals.poll.remote(self.job_id), timeout=5))
        return self._requested

    def should_checkpoint(self) -> bool:
        """Whether to checkpoint now; the same answer on every rank. Call it once per step."""
        import ray.train

        ray_train_says = ray.train.get_preemption_info() is not None
        asked = _all_reduce_max(self._controller_asks() or ray_train_says)
        if asked and self._honoured:
            return False  # already checkpointed for this request; the gang is being stopped
        self._pending = asked
        return asked

    # -- saving and restoring --------------------------------------------------------------------

    def save(self, step: int, state: Mapping[str, Any], metrics: Mapping[str, Any]) -> str | None:
        """Checkpoint `state` at `step` through ``ray.train.report`` (every rank calls it).

        Rank 0 writes the state; the checkpoint lands in the run's storage under
        ``step-<step>`` and rank 0 tells the control plane where. Returns that path.
        """
        import ray.train
        import torch
        from ray.train import Checkpoint

        name = f"step-{step:08d}"
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if self.rank == 0:
                torch.save({"step": step, "state": dict(state)}, Path(tmp) / _STATE_FILE)
                checkpoint = Checkpoint.from_directory(tmp)
            ray.train.report(
                {**metrics, "step": step}, checkpoint=checkpoint, checkpoint_dir_name=name
            )
        self.last_saved_step = step
        if self._pending:
            self._honoured = True
        ctx = ray.train.get_context()
        path = str(Path(ctx.get_storage().experiment_fs_path) / name)
        if self.rank == 0 and self._signals is not None:
            with contextlib.suppress(Exception):
                ray.get(
                    self._signals.checkpointed.remote(
                        self.job_id, self.attempt, step, path, time.time()
                    ),
                    timeout=10,
                )
        return path

    def report(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Report metrics without a checkpoint (every rank calls it)."""
        import ray.train

        ray.train.report({**metrics, "step": step})

    def restore(self) -> tuple[int, dict[str, Any]] | None:
        """The (step, state) of the checkpoint to resume from, or None for a fresh start.

        Ray Train's own first (``ray.train.get_checkpoint()``: a restarted worker group, or a
        run restored from its storage), else the checkpoint the control plane recorded for the
        job (``RCP_RESUME_FROM``, set by the runner when it restarts a preempted job).
        """
        import ray.train
        import torch
        from ray.train import Checkpoint

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            path = os.environ.get(ENV_RESUME_FROM)
            if not path or not (Path(path) / _STATE_FILE).is_file():
                return None
            checkpoint = Checkpoint(path)
        with checkpoint.as_directory() as d:
            data = torch.load(Path(d) / _STATE_FILE, weights_only=False)
        return int(data["step"]), dict(data["state"])
