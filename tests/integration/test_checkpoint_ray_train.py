"""A Ray Train job whose worker is killed mid-run resumes from the last committed
checkpoint, with the same step and bit-identical model and optimizer state.

Two runs of the same 2-worker TorchTrainer job (gloo) checkpoint to a loopback S3 server:
a reference run, and a run whose rank 1 kills its own process right after step 5's
checkpoint is committed. Ray Train restarts the worker group; the new workers restore
(from the memory tier: the holders survive the worker) and finish. Both runs' final and
step-5 checkpoints must be equal byte for byte.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import torch

from jobs.checkpoint import CheckpointEngine
from tests.integration.test_checkpoint_s3 import REGION, MotoS3
from tests.unit.test_checkpoint_engine import assert_state_equal

pytestmark = pytest.mark.integration

NUM_STEPS = 10
KILL_AT_STEP = 6
SAVE_EVERY_N_STEPS = 2  # saves after steps 1, 3, 5, 7, 9


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    # Ray Train waits this long for a dead gang's process group to shut down before it
    # restarts the workers (30 s by default). Raylets inherit it from this process.
    saved = os.environ.get("TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S")
    os.environ["TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S"] = "2"
    # address="local": start our own cluster, never join another test's on this machine.
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S", None)
        else:
            os.environ["TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S"] = saved


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[MotoS3]:
    server = MotoS3()
    yield server
    server.stop()


def train_loop(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    from jobs.checkpointing_helpers import TrainCheckpointing

    rank = ray.train.get_context().get_world_rank()
    ckpt = TrainCheckpointing(
        config["uri"],
        endpoint_url=config["endpoint_url"],
        region=REGION,
        every_n_steps=SAVE_EVERY_N_STEPS,
        memory_tier="ray",
        run_name=config["run_name"],
        keep_last=3,
        commit_poll_interval_s=0.02,
    )
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    )
    optim = torch.optim.AdamW(model.parameters(), lr=0.01)
    restored = ckpt.restore()
    start = 0
    if restored is not None:
        model.load_state_dict(restored.state["model"])
        optim.load_state_dict(restored.state["optim"])
        torch.set_rng_state(restored.state["rng"])
        start = restored.step + 1
    with open(config["log"], "a") as log:
        log.write(
            json.dumps(
                {"rank": rank, "start": start, "source": restored.source if restored else None}
            )
            + "\n"
        )
    for step in range(start, NUM_STEPS):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        noise = torch.randn(1)  # draws from the global RNG, so its state must be restored
        loss = torch.nn.functional.mse_loss(model(x) + 0 * noise, y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        if ckpt.should_save(step):
            state = {
                "model": model.state_dict(),
                "optim": optim.state_dict(),
                "rng": torch.get_rng_state(),
                "step": step,
            }
            handle = ckpt.save(state, step, keep=step == NUM_STEPS - 1)
            if step == KILL_AT_STEP - 1 and handle is not None:
                handle.result()  # rank 0's result includes the commit
                dist.barrier()
        if config["kill"] and step == KILL_AT_STEP and rank == 1:
            marker = Path(config["log"]).with_suffix(".killed")
            if not marker.exists():
                marker.write_text("killed")
                os._exit(1)  # the worker process dies mid-run, without cleanup
    ckpt.finish()


def run_job(tmp_path: Path, s3: MotoS3, name: str, *, kill: bool) -> tuple[str, Path]:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    bucket = s3.create_bucket(f"train-{name}")
    log = tmp_path / f"{name}.jsonl"
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "uri": f"s3://{bucket}/job",
            "endpoint_url": s3.endpoint_url,
            "run_name": f"test-{name}",
            "log": str(log),
            "kill": kill,
        },
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path / "ray"),
            failure_config=FailureConfig(max_failures=2),
        ),
    )
    result = trainer.fit()
    assert result.error is None, result.error
    return f"s3://{bucket}/job", log


def load(uri: str, s3: MotoS3, rank: int, max_step: int | None = None) -> tuple[int, Any]:
    engine = CheckpointEngine(
        uri, endpoint_url=s3.endpoint_url, region=REGION, rank=rank, world_size=2
    )
    restored = engine.restore(max_step=max_step)
    engine.close()
    assert restored is not None
    return restored.step, restored.state


def test_killed_worker_resumes_bit_identically(
    cluster: None, moto_s3: MotoS3, tmp_path: Path
) -> None:
    reference_uri, _ = run_job(tmp_path, moto_s3, "reference", kill=False)
    killed_uri, log = run_job(tmp_path, moto_s3, "killed", kill=True)

    starts = [json.loads(line) for line in log.read_text().splitlines()]
    assert (tmp_path / "killed.killed").exists()
    first, resumed = starts[:2], starts[2:]
    assert sorted(s["rank"] for s in first) == [0, 1] and all(s["start"] == 0 for s in first)
    # Both ranks resume right after the last committed step (5), from the memory tier.
    assert {s["rank"] for s in resumed} == {0, 1}, resumed
    assert all(s["start"] == KILL_AT_STEP for s in resumed), resumed
    assert all(s["source"] == "memory" for s in resumed), resumed

    for rank in (0, 1):
        final_ref = load(reference_uri, moto_s3, rank)
        final_killed = load(killed_uri, moto_s3, rank)
        assert final_ref[0] == final_killed[0] == NUM_STEPS - 1
        assert_state_equal(final_killed[1], final_ref[1])
        resumed_ref = load(reference_uri, moto_s3, rank, max_step=KILL_AT_STEP - 1)
        resumed_killed = load(killed_uri, moto_s3, rank, max_step=KILL_AT_STEP - 1)
        assert resumed_ref[0] == resumed_killed[0] == KILL_AT_STEP - 1
        assert_state_equal(resumed_killed[1], resumed_ref[1])
    # And the run did train: the final weights differ from step 5's.
    assert any(
        not torch.equal(final_ref[1]["model"][key], resumed_ref[1]["model"][key])
        for key in final_ref[1]["model"]
    )
