"""An example a researcher can copy: a small torch classifier whose training survives
preemption, crashes, hangs and node loss, checkpointing through `jobs.checkpointing`.

The same file runs both ways the control plane starts a job::

    # A plain torch.distributed script: every rank runs it with torchrun's environment.
    rcp submit --workers 2 --gpus-per-worker 1 -- python -m jobs.examples.train_mnistlike
    # A Ray Train loop (the entrypoint in JOB.yaml is jobs.examples.train_mnistlike:train_loop).
    rcp submit jobs/examples/mnistlike.yaml

What it shows: resuming from the newest committed checkpoint with the step counter going on
(every rank restores the same step), checkpointing when the helper says so (its interval
policy, or every ``checkpoint_every`` steps, and whenever the control plane asks before a
preemption), stopping once a requested checkpoint is committed, and reporting each step (the
control plane's hang watchdog and ``rcp status`` read these). The data are synthetic 28x28
"digits" (a fixed random projection decides the label), so nothing is downloaded.

Config (``RCP_TRAIN_CONFIG`` JSON, all optional; an unknown key is an error):

* ``num_steps`` (20): steps to train;
* ``checkpoint_every`` (null): checkpoint after every n-th step; null lets the helper choose
  (the job's ``checkpoint.interval_s``, else Young/Daly from the measured stall and the MTBF);
* ``step_sleep_s`` (0): a pause per step, to make a short job last;
* ``state_mb`` (0): extra MiB of state per rank, saved and restored with the model, to try
  checkpoints of a realistic size (drop it in a real job);
* ``log_path``: a file rank 0 appends one JSON line per step to: the step, the loss, the
  step it started from, and the step and tier (``memory`` or ``storage``) it restored,
  how long the restore took (``restore_s``) and how much of it the restore's bounds checks
  (``restore_check_s``, `RestoredCheckpoint.check_s`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from jobs.checkpointing import Checkpointing

__all__ = ["ExampleConfig", "main", "train", "train_loop"]

MAX_STATE_MB = 1 << 20


@dataclass(frozen=True)
class ExampleConfig:
    num_steps: int = 20
    checkpoint_every: int | None = None
    step_sleep_s: float = 0.0
    state_mb: float = 0.0
    log_path: str | None = None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ExampleConfig:
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(
                f"RCP_TRAIN_CONFIG: unknown key(s) {unknown}; known: "
                f"{sorted(cls.__dataclass_fields__)}"
            )
        config = cls(**raw)
        if not isinstance(config.num_steps, int) or config.num_steps < 0:
            raise ValueError(f"num_steps must be an int >= 0, got {config.num_steps!r}")
        for key, high in (("step_sleep_s", 3600.0), ("state_mb", MAX_STATE_MB)):
            value = getattr(config, key)
            if not isinstance(value, int | float) or not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{key} must be a finite number >= 0, got {value!r}")
            if value > high:
                raise ValueError(f"{key} must be at most {high:g}, got {value!r}")
        return config


def _model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    return torch.nn.Sequential(
        torch.nn.Linear(28 * 28, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    )


def _batch(step: int, rank: int, batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(batch_size, 28 * 28, generator=gen)
    proj = torch.Generator().manual_seed(7)
    w = torch.randn(28 * 28, 10, generator=proj)
    return x, (x @ w).argmax(dim=1)


def train(config: ExampleConfig, model: torch.nn.Module) -> None:
    """The loop, the same under Ray Train and torchrun: `model` is already wrapped for
    data parallelism (DDP) and on its device."""
    ckpt = Checkpointing(every_n_steps=config.checkpoint_every)
    device = next(model.parameters()).device
    core = model.module if isinstance(model, DistributedDataParallel) else model  # unwrapped
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    # Stand-in for the rest of a real job's state (e.g. a larger model's optimizer moments).
    extra = torch.rand(int(config.state_mb * (1 << 20)) // 4, generator=torch.Generator())

    restore_began = time.perf_counter()
    start, restored = 0, ckpt.restore()
    restore_s = time.perf_counter() - restore_began
    if restored is not None:
        core.load_state_dict(restored.state["model"])
        optim.load_state_dict(restored.state["optim"])
        extra.copy_(restored.state["extra"])
        start = restored.step + 1

    for step in range(start, config.num_steps):
        x, y = _batch(step, ckpt.rank)
        loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
        optim.zero_grad()
        loss.backward()
        optim.step()
        if extra.numel():
            extra[step % extra.numel()] += 1.0  # the extra state changes, as real state does
        if ckpt.rank == 0 and config.log_path:
            line = {
                "step": step,
                "loss": float(loss.item()),
                "start": start,
                "restored_step": restored.step if restored else None,
                "source": restored.source if restored else None,
                "restore_s": round(restore_s, 4),
                "restore_check_s": round(restored.check_s, 6) if restored else None,
            }
            with open(config.log_path, "a") as f:
                f.write(json.dumps(line) + "\n")
        # Every rank asks every step (the answer is agreed across ranks); the last step is
        # saved too, so the finished model is in storage.
        if ckpt.should_checkpoint(step) or step == config.num_steps - 1:
            state = {"model": core.state_dict(), "optim": optim.state_dict(), "extra": extra}
            ckpt.save(step, state)
            if ckpt.preempted:
                break  # the control plane asked for this checkpoint and stops the gang now
        ckpt.report(step, {"loss": float(loss.item()), "resumed_from": start})
        if config.step_sleep_s:
            time.sleep(config.step_sleep_s)
    ckpt.finish()


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train's per-worker loop (``entrypoint: jobs.examples.train_mnistlike:train_loop``):
    Ray Train has set up the process group; `prepare_model` wraps the model in DDP."""
    # Logical GPUs (local mode) have no CUDA device behind them: keep the model on the CPU.
    device: bool | torch.device = True if torch.cuda.is_available() else torch.device("cpu")
    model = ray.train.torch.prepare_model(_model(), move_to_device=device)
    train(ExampleConfig.from_dict(config), model)


def main() -> None:
    """A plain torch.distributed process (``python -m jobs.examples.train_mnistlike``): one
    per rank, with torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...)."""
    config = ExampleConfig.from_dict(json.loads(os.environ.get("RCP_TRAIN_CONFIG") or "{}"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if world_size > 1:
        dist.init_process_group("nccl" if cuda else "gloo")  # env:// from torchrun's variables
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    model = _model().to(device)
    if world_size > 1:
        model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    try:
        train(config, model)
    finally:
        if world_size > 1:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
