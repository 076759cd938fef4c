"""The example's training loop with the two usual other ways to checkpoint, for comparison.

`bench/bench_job_checkpoint.py` runs these through the control plane's job path next to the
example itself (`jobs.examples.train_mnistlike`, which checkpoints through
`jobs.checkpointing`), with the same model, extra state, step time and checkpoint interval:

* ``sync_loop``: ``torch.save`` of the state to a local file, then an upload of that file to
  the job's checkpoint prefix with boto3's transfer manager, both on the training thread
  (what a loop without any checkpoint machinery does);
* ``ray_async_loop``: ``torch.save`` into a local directory, then ``ray.train.report`` with
  ``checkpoint_upload_mode=ASYNC``, so Ray Train uploads it to the run's storage in the
  background (Ray Train's own asynchronous checkpointing).

Each writes ``{"stall_s", "wall_s", "saves"}`` to ``result_path`` when it ends: the seconds
the training thread spent checkpointing, the loop's wall time, and how many saves it took.
These are benchmark baselines, not a way to run real jobs: they do not restore, and the
control plane's preemption and hang handling do not see them.

Config (``RCP_TRAIN_CONFIG`` JSON): ``num_steps``, ``step_sleep_s``, ``state_mb`` (as the
example), ``interval_s`` (seconds between saves) and ``result_path``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import torch

from jobs.examples.train_mnistlike import _batch, _model
from jobs.signals.environment import (
    ENV_CHECKPOINT_URI,
    ENV_STORAGE_ENDPOINT_URL,
    ENV_STORAGE_REGION,
)

__all__ = ["ray_async_loop", "sync_loop"]


def _run(config: dict[str, Any], save: Callable[[int, dict[str, object]], None]) -> None:
    """The example's steps on one rank; `save(step, state)` every ``interval_s``."""
    num_steps = int(config["num_steps"])
    interval_s = float(config["interval_s"])
    step_sleep_s = float(config.get("step_sleep_s", 0.0))
    model = _model()
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    extra = torch.rand(int(float(config.get("state_mb", 0)) * (1 << 20)) // 4)
    stall_s, saves = 0.0, 0
    started = last_save = time.monotonic()
    for step in range(num_steps):
        x, y = _batch(step, 0)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        if extra.numel():
            extra[step % extra.numel()] += 1.0
        if time.monotonic() - last_save >= interval_s or step == num_steps - 1:
            t0 = time.perf_counter()
            save(step, {"model": model.state_dict(), "optim": optim.state_dict(), "extra": extra})
            stall_s += time.perf_counter() - t0
            saves += 1
            last_save = time.monotonic()
        if step_sleep_s:
            time.sleep(step_sleep_s)
    result = {"stall_s": stall_s, "wall_s": time.monotonic() - started, "saves": saves}
    Path(config["result_path"]).write_text(json.dumps(result))


def sync_loop(config: dict[str, Any]) -> None:
    """Save to a local file and upload it, both blocking the loop (see the module doc)."""
    import boto3

    uri = urlsplit(os.environ[ENV_CHECKPOINT_URI])
    s3 = boto3.client(
        "s3",
        endpoint_url=os.environ.get(ENV_STORAGE_ENDPOINT_URL) or None,
        region_name=os.environ.get(ENV_STORAGE_REGION) or None,
    )
    scratch = Path(tempfile.mkdtemp(prefix="rcp-sync-baseline-"))

    def save(step: int, state: dict[str, object]) -> None:
        local = scratch / "state.pt"
        torch.save(state, local)
        key = f"{uri.path.strip('/')}/baseline-sync/step-{step:08d}.pt"
        s3.upload_file(str(local), uri.netloc, key)

    try:
        _run(config, save)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def ray_async_loop(config: dict[str, Any]) -> None:
    """Save to a local directory; Ray Train uploads it in the background (module doc)."""
    import ray.train
    from ray.train import Checkpoint, CheckpointUploadMode

    def save(step: int, state: dict[str, object]) -> None:
        local = tempfile.mkdtemp(prefix="rcp-ray-async-baseline-")
        torch.save(state, os.path.join(local, "state.pt"))
        ray.train.report(
            {"step": step},
            checkpoint=Checkpoint.from_directory(local),
            checkpoint_dir_name=f"step-{step:08d}",
            checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
        )

    _run(config, save)
