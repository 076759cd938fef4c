"""An example a researcher can copy: a tiny torch classifier trained as a Ray Train gang.

Run it through the control plane::

    rcp submit --workers 2 --gpus-per-worker 1 -- python -m jobs.examples.train_mnistlike
    # or, as a module:function entrypoint in a JOB.yaml:
    #   entrypoint: jobs.examples.train_mnistlike:train_loop

What it shows: reporting metrics every step, checkpointing every ``checkpoint_every`` steps
and whenever the control plane (or Ray Train's preemption signal) asks, and resuming from the
latest checkpoint with the step counter continuing. The data are synthetic 28x28 "digits"
(a fixed random projection decides the label), so nothing is downloaded.

Config (``RCP_TRAIN_CONFIG`` JSON, all optional): ``num_steps`` (20), ``checkpoint_every``
(10), ``step_sleep_s`` (0: pause per step, to make a short job last), ``log_path`` (a file
rank 0 appends one JSON line per step to).
"""

from __future__ import annotations

import json
import time
from typing import Any

import torch

from jobs.launcher import run_gang
from jobs.signals import Preemption


def _batch(step: int, rank: int, batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(batch_size, 28 * 28, generator=gen)
    proj = torch.Generator().manual_seed(7)
    w = torch.randn(28 * 28, 10, generator=proj)
    return x, (x @ w).argmax(dim=1)


def train_loop(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch

    num_steps = int(config.get("num_steps", 20))
    checkpoint_every = int(config.get("checkpoint_every", 10))
    step_sleep_s = float(config.get("step_sleep_s", 0.0))
    log_path = config.get("log_path")
    rank = ray.train.get_context().get_world_rank()

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(28 * 28, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)
    )
    # Logical GPUs (local mode) have no CUDA device behind them: keep the model on the CPU.
    device = True if torch.cuda.is_available() else torch.device("cpu")
    model = ray.train.torch.prepare_model(model, move_to_device=device)
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    pre = Preemption()

    start = 0
    restored = pre.restore()
    if restored is not None:
        step, state = restored
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start = step + 1

    for step in range(start, num_steps):
        x, y = _batch(step, rank)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        metrics = {"loss": float(loss.item()), "resumed_from": start}
        if rank == 0 and log_path:
            with open(log_path, "a") as f:
                f.write(json.dumps({"step": step, "loss": metrics["loss"], "start": start}) + "\n")
        asked = pre.should_checkpoint()
        if asked or (step + 1) % checkpoint_every == 0 or step == num_steps - 1:
            state = {"model": model.state_dict(), "optim": optim.state_dict()}
            pre.save(step, state, metrics)
        else:
            pre.report(step, metrics)
        if step_sleep_s:
            time.sleep(step_sleep_s)


if __name__ == "__main__":
    run_gang(train_loop)
