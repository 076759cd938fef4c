"""Checkpointing inside a Ray Train loop: the helpers a training script imports.

This module owns the glue between the checkpoint engine and a TorchTrainer worker:

* rank and world size come from Ray Train's context; the run's name keys the memory tier;
* `restore()` makes every rank agree on one step (an all-reduce of the newest step each
  rank could verify, repeated with that cap until all ranks hold the same one), so no
  rank resumes from a different checkpoint than the others;
* `should_save(step)` is the same answer on every rank (one tiny all-reduce): a fixed
  `every_n_steps`, or the Young/Daly interval from `policies.checkpointing` fed with the
  engine's measured stall and upload times and the job's MTBF, or a preemption request;
* checkpoint-before-preempt: the queue writes a ``PREEMPT`` marker next to the run's
  checkpoints (`request_preemption_checkpoint`); the next `should_save` sees it, `save`
  then waits for the commit and `preempted` tells the loop to return;
* `report()` sends the loop's metrics plus the engine's through `ray.train.report`.

It must not import `controlplane`; the runner passes the StorageConfig's fields in.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import torch

from jobs.checkpoint import (
    CheckpointEngine,
    InProcessMemoryTier,
    MemoryTier,
    RayMemoryTier,
    RestoredCheckpoint,
    SaveHandle,
    open_storage,
)
from policies.checkpointing import (
    IntervalConfig,
    IntervalInputs,
    checkpoint_interval,
    typical_stall_s,
)

PREEMPT_KEY = "PREEMPT"
DEFAULT_MTBF_S = 4 * 3600.0


def request_preemption_checkpoint(
    uri: str, *, endpoint_url: str | None = None, region: str | None = None, reason: str = ""
) -> None:
    """Ask the job checkpointing to `uri` to checkpoint now and stop (checkpoint-before-preempt)."""
    storage = open_storage(uri, endpoint_url=endpoint_url, region=region)
    try:
        storage.put_bytes(PREEMPT_KEY, reason.encode("utf-8"))
    finally:
        storage.close()


def _all_reduce_int(value: int, op: str) -> int:
    """All-reduce one int over the default process group (identity without one)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN if op == "min" else dist.ReduceOp.MAX)
    return int(tensor.item())


class TrainCheckpointing:
    """Asynchronous checkpoints for one Ray Train worker.

    Example, inside ``train_loop_per_worker``::

        ckpt = TrainCheckpointing(config["uri"], endpoint_url=config["endpoint_url"])
        restored = ckpt.restore()
        start = 0
        if restored:
            model.load_state_dict(restored.state["model"])
            opt.load_state_dict(restored.state["optim"])
            start = restored.step + 1
        for step in range(start, num_steps):
            loss = train_step()
            if ckpt.should_save(step):
                ckpt.save({"model": model.state_dict(), "optim": opt.state_dict()}, step)
                if ckpt.preempted:
                    break
            ckpt.report({"loss": loss.item(), "step": step})
        ckpt.finish()
    """

    def __init__(
        self,
        uri: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        every_n_steps: int | None = None,
        mtbf_s: float = DEFAULT_MTBF_S,
        interval_config: IntervalConfig | None = None,
        memory_tier: str | MemoryTier | None = "ray",
        run_name: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        preempt_poll_interval_s: float = 5.0,
        **engine_kwargs: Any,
    ) -> None:
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(
                f"every_n_steps must be >= 1 (or None for the policy), got {every_n_steps}"
            )
        if rank is None or world_size is None or run_name is None:
            import ray.train

            context = ray.train.get_context()
            rank = context.get_world_rank() if rank is None else rank
            world_size = context.get_world_size() if world_size is None else world_size
            run_name = context.get_experiment_name() if run_name is None else run_name
        tier: MemoryTier | None
        if memory_tier == "ray":
            tier = RayMemoryTier(run_name)
        elif memory_tier == "process":
            tier = InProcessMemoryTier()
        elif memory_tier is None or not isinstance(memory_tier, str):
            tier = memory_tier
        else:
            raise ValueError(
                f"memory_tier must be 'ray', 'process', None or a MemoryTier, got {memory_tier!r}"
            )
        self.engine = CheckpointEngine(
            uri,
            endpoint_url=endpoint_url,
            region=region,
            rank=rank,
            world_size=world_size,
            run_name=run_name,
            memory_tier=tier,
            **engine_kwargs,
        )
        self.rank = rank
        self.world_size = world_size
        self.every_n_steps = every_n_steps
        self.mtbf_s = mtbf_s
        self.interval_config = interval_config or IntervalConfig()
        self.preempt_poll_interval_s = preempt_poll_interval_s
        self.interval_s = self.interval_config.min_interval_s
        self.preempted = False
        self._preempt_requested = False
        self._last_poll_s = float("-inf")
        self._last_save_s = time.monotonic()
        self._stalls_s: deque[float] = deque(maxlen=16)

    def restore(self, *, map_location: str | torch.device = "cpu") -> RestoredCheckpoint | None:
        """The newest checkpoint every rank can verify (None: all ranks start fresh)."""
        cap: int | None = None
        while True:
            restored = self.engine.restore(max_step=cap, map_location=map_location)
            proposal = restored.step if restored is not None else -1
            agreed = _all_reduce_int(proposal, "min")
            if agreed == proposal:
                if restored is None:
                    self.engine.reset_step_order(None)
                return restored
            if agreed < 0:
                self.engine.reset_step_order(None)
                return None
            cap = agreed

    def _poll_preemption(self) -> bool:
        now_s = time.monotonic()
        if self.rank == 0 and now_s - self._last_poll_s >= self.preempt_poll_interval_s:
            self._last_poll_s = now_s
            self._preempt_requested = self.engine.storage.exists(PREEMPT_KEY)
        return self._preempt_requested

    def request_checkpoint(self) -> None:
        """Make the next `should_save` true on every rank and stop after that save."""
        self._preempt_requested = True

    def should_save(self, step: int) -> bool:
        """Whether to checkpoint after `step`; the same answer on every rank."""
        if self.every_n_steps is not None:
            due = (step + 1) % self.every_n_steps == 0
        else:
            due = time.monotonic() - self._last_save_s >= self.interval_s
        preempt = self._poll_preemption()
        flags = _all_reduce_int(int(due) | (int(preempt) << 1), "max")
        self._preempt_requested = bool(flags & 2)
        return bool(flags)

    def save(
        self,
        state: Any,
        step: int,
        *,
        keep: bool = False,
        metadata: Mapping[str, Any] | None = None,
    ) -> SaveHandle | None:
        """Snapshot and persist in the background; under preemption, wait for the commit."""
        handle = self.engine.save(
            state, step, keep=keep or self._preempt_requested, metadata=metadata
        )
        self._last_save_s = time.monotonic()
        if handle is not None:
            self._stalls_s.append(handle.stall_s)
            self.interval_s = checkpoint_interval(
                IntervalInputs(
                    stall_s=typical_stall_s(list(self._stalls_s)),
                    mtbf_s=self.mtbf_s,
                    persist_s=self.engine.stats()["checkpoint_upload_s"],
                ),
                self.interval_config,
            ).interval_s
        if self._preempt_requested:
            self.engine.wait()
            if self.rank == 0:
                self.engine.storage.delete_keys([PREEMPT_KEY])
            self.preempted = True
        return handle

    def stats(self) -> dict[str, float]:
        return {**self.engine.stats(), "checkpoint_interval_s": self.interval_s}

    def report(self, metrics: Mapping[str, Any]) -> None:
        """`ray.train.report` of the loop's metrics plus the checkpoint engine's."""
        import ray.train

        ray.train.report({**metrics, **self.stats()})

    def finish(self, *, clear_memory_tier: bool = True) -> None:
        """Wait for saves in flight; drop the memory tier once the run is done with it."""
        self.engine.close()
        tier = self.engine.memory_tier
        if clear_memory_tier and isinstance(tier, RayMemoryTier):
            tier.clear_rank(self.rank)
