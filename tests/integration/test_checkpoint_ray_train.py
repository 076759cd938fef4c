"""Ray Train loops on the checkpointing helper (`jobs.checkpointing.Checkpointing`), configured
only by the ``RCP_*`` environment the runner gives a job, against a loopback S3 server.

* A worker killed mid-run: two runs of the same 2-worker TorchTrainer job (gloo), a reference
  and one whose rank 1 kills its own process right after step 5's checkpoint committed. Ray
  Train restarts the worker group; the new workers restore from the memory tier (its holders
  live on another node than their writers) and finish. Both runs' final and step-5
  checkpoints must be equal byte for byte, and rank 0 reported its steps to the signals actor.
* A checkpoint-now request through the real signals actor: the loop saves the next step with
  KEEP, rank 0 reports it only once its manifest is in object storage, the loop stops there,
  and `finish` ends the run with `PreemptedError` rather than as a finished job.
* A plain process (a command the launcher runs as a child of a Ray worker, no Ray Train
  context): the helper joins the cluster with ``ray.init(address="auto")``, reports its steps
  and keeps its memory copy on the other node.

The cluster: a head (pool=head, no CPU for workers) and two pool=cluster nodes, as Ray's
`cluster_utils` builds them in this process.

Marked ``full`` (``bash infra/local/test.sh --full``): the default run resumes a killed
worker, a hung one and a preempted gang bit-exact from object storage in
test_job_durability, a Train loop from its checkpoint after a hot node in test_node_health,
and a copy from the memory tier's peer in test_memory_tier_peer.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from ray.cluster_utils import Cluster

from jobs.checkpoint import CheckpointEngine
from jobs.checkpoint.layout import keep_key, manifest_key
from jobs.signals.mailbox import SIGNALS_ACTOR_NAME, SIGNALS_NAMESPACE, JobSignals
from jobs.signals.trust import admin_auth, token_sha256
from tests.integration.conftest import REGION, MotoS3
from tests.unit.jobs.test_checkpoint_engine import assert_state_equal

pytestmark = [pytest.mark.integration, pytest.mark.full]

# moto accepts any key pair; the cluster's workers inherit these from this process.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")

NUM_STEPS = 10
KILL_AT_STEP = 6
SAVE_EVERY_N_STEPS = 2  # saves after steps 1, 3, 5, 7, 9
SECRET = "signals-admin-secret-of-this-test"
TOKEN = "attempt-token-of-this-test"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    # Ray Train waits this long for a dead gang's process group to shut down before it
    # restarts the workers (30 s by default). Raylets inherit it from this process.
    saved = os.environ.get("TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S")
    os.environ["TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S"] = "2"
    c = Cluster()
    c.add_node(num_cpus=0, labels={"pool": "head"}, include_dashboard=False)
    for _ in range(2):
        c.add_node(num_cpus=2, labels={"pool": "cluster"})
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if saved is None:
            os.environ.pop("TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S", None)
        else:
            os.environ["TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S"] = saved


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[MotoS3]:
    server = MotoS3()
    yield server
    server.stop()


class Signals:
    """The signals actor as the controller creates it, and the controller's calls."""

    def __init__(self) -> None:
        self.actor = JobSignals.options(
            name=SIGNALS_ACTOR_NAME, namespace=SIGNALS_NAMESPACE
        ).remote(SECRET)
        self._nonce = time.time_ns()

    def admin(self, method: str, *args: Any) -> Any:
        self._nonce = max(self._nonce + 1, time.time_ns())
        auth = admin_auth(SECRET, self._nonce, method, args)
        return ray.get(getattr(self.actor, method).remote(*args, auth=auth))


@pytest.fixture(scope="module")
def signals(cluster: Cluster) -> Signals:
    return Signals()


def train_loop(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    from jobs.checkpointing import Checkpointing

    rank = ray.train.get_context().get_world_rank()
    ckpt = Checkpointing(
        every_n_steps=config["every_n_steps"],
        preempted_wait_s=60.0,
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
        source = restored.source if restored else None
        log.write(json.dumps({"rank": rank, "start": start, "source": source}) + "\n")
    for step in range(start, config["num_steps"]):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        noise = torch.randn(1)  # draws from the global RNG, so its state must be restored
        loss = torch.nn.functional.mse_loss(model(x) + 0 * noise, y)
        optim.zero_grad()
        loss.backward()
        optim.step()
        if ckpt.should_checkpoint(step):
            state = {
                "model": model.state_dict(),
                "optim": optim.state_dict(),
                "rng": torch.get_rng_state(),
                "step": step,
            }
            handle = ckpt.save(step, state, keep=step == config["num_steps"] - 1)
            if ckpt.preempted:
                with open(config["log"], "a") as log:
                    log.write(json.dumps({"rank": rank, "stopped_at": step}) + "\n")
                break
            if step == KILL_AT_STEP - 1 and handle is not None:
                handle.result()  # rank 0's result includes the commit
                dist.barrier()
        ckpt.report(step, {"loss": float(loss.item())})
        if config["kill"] and step == KILL_AT_STEP and rank == 1:
            marker = Path(config["log"]).with_suffix(".killed")
            if not marker.exists():
                marker.write_text("killed")
                os._exit(1)  # the worker process dies mid-run, without cleanup
        time.sleep(config["step_sleep_s"])
    ckpt.finish()


def trainer_for(
    tmp_path: Path,
    s3: MotoS3,
    signals: Signals,
    name: str,
    max_failures: int = 2,
    **config: Any,
) -> tuple[Any, str, Path]:
    """A TorchTrainer for job `name`, registered with the signals actor, whose workers get
    the environment the runner would give them."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    bucket = s3.create_bucket(f"train-{name}")
    uri = f"s3://{bucket}/jobs/{name}"
    signals.admin("register", name, 1, token_sha256(TOKEN), uri)
    log = tmp_path / f"{name}.jsonl"
    env = {
        "RCP_JOB_ID": name,
        "RCP_ATTEMPT": "1",
        "RCP_SIGNAL_TOKEN": TOKEN,
        "RCP_SIGNAL_POLL_S": "0.1",
        "RCP_STEP_REPORT_S": "0.5",
        "RCP_CHECKPOINT_URI": uri,
        "RCP_STORAGE_ENDPOINT_URL": s3.endpoint_url,
        "RCP_STORAGE_REGION": REGION,
        "RCP_CHECKPOINT_KEEP_LAST": "3",
        # No credentials here: the raylets inherited test_checkpoint_s3's from this process.
    }
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={
            "log": str(log),
            "num_steps": NUM_STEPS,
            "every_n_steps": SAVE_EVERY_N_STEPS,
            "kill": False,
            "step_sleep_s": 0.0,
            **config,
        },
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(
            name=name,
            storage_path=str(tmp_path / "ray"),
            failure_config=FailureConfig(max_failures=max_failures),
            worker_runtime_env={"env_vars": env},
        ),
    )
    return trainer, uri, log


def load(uri: str, s3: MotoS3, rank: int, max_step: int | None = None) -> tuple[int, Any]:
    engine = CheckpointEngine(
        uri, endpoint_url=s3.endpoint_url, region=REGION, rank=rank, world_size=2
    )
    restored = engine.restore(max_step=max_step)
    engine.close()
    assert restored is not None
    return restored.step, restored.state


def test_killed_worker_resumes_bit_identically(
    cluster: Cluster, signals: Signals, moto_s3: MotoS3, tmp_path: Path
) -> None:
    runs = {}
    for name, kill in (("reference", False), ("killed", True)):
        trainer, uri, log = trainer_for(tmp_path, moto_s3, signals, name, kill=kill)
        result = trainer.fit()
        assert result.error is None, result.error
        runs[name] = (uri, log)
    reference_uri, _ = runs["reference"]
    killed_uri, log = runs["killed"]

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
    # Rank 0 told the control plane how far it got, with its checkpoint figures.
    progress = signals.admin("status", "killed")["progress"]
    assert progress["step"] == NUM_STEPS - 1, progress
    assert progress["committed_step"] == NUM_STEPS - 1 and progress["saves"] >= 2, progress
    assert progress["stall_s"] > 0 and progress["wall_s"] > 0, progress


def test_a_checkpoint_now_request_commits_before_the_loop_stops(
    cluster: Cluster, signals: Signals, moto_s3: MotoS3, tmp_path: Path
) -> None:
    name = "asked"
    trainer, uri, log = trainer_for(
        tmp_path,
        moto_s3,
        signals,
        name,
        max_failures=0,  # as under the control plane: restarts are its business
        num_steps=10_000,
        every_n_steps=None,
        step_sleep_s=0.05,
    )
    bucket, prefix = uri[len("s3://") :].split("/", 1)
    seen: dict[str, Any] = {}

    def controller() -> None:
        """Ask once the job reported step 3; when it says it checkpointed, look in storage
        (as the controller does), then withdraw the request so the loop's wait ends."""
        deadline_s = time.monotonic() + 240
        while time.monotonic() < deadline_s:
            job = signals.admin("status", name)
            step = (job.get("progress") or {}).get("step", -1)
            if "asked_at_step" not in seen and step >= 3:
                seen["asked_at_step"] = step
                signals.admin("request_checkpoint", name, time.time())
            reported = job.get("checkpoint")
            if reported and reported.get("answers_request"):
                seen["reported"] = reported
                for key in (manifest_key(reported["step"]), keep_key(reported["step"])):
                    head = moto_s3.client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/{key}")
                    seen[key] = head.get("KeyCount", 0) == 1
                signals.admin("clear_request", name)
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=controller, daemon=True)
    watcher.start()
    with pytest.raises(Exception, match="PreemptedError") as failed:
        trainer.fit()
    watcher.join(timeout=30)
    assert "checkpoint-now request" in str(failed.value)

    step = seen["reported"]["step"]
    assert step >= seen["asked_at_step"]
    assert seen["reported"]["path"] == f"{uri}/step-{step:012d}"
    # The manifest (and KEEP) were in storage when rank 0 reported the step.
    assert seen[manifest_key(step)] and seen[keep_key(step)], seen
    # Both ranks stopped at that step, and it restores on both.
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted((r["rank"], r["stopped_at"]) for r in lines if "stopped_at" in r) == [
        (0, step),
        (1, step),
    ]
    for rank in (0, 1):
        assert load(uri, moto_s3, rank)[0] == step


PLAIN_LOOP = """
import json
import ray
import torch
from jobs.checkpointing import Checkpointing

ckpt = Checkpointing(every_n_steps=2, commit_poll_interval_s=0.02)
restored = ckpt.restore()
out = {"gcs": ray.get_runtime_context().gcs_address, "restored": restored and restored.step}
for step in range(4):
    if ckpt.should_checkpoint(step):
        ckpt.save(step, {"w": torch.full((1024,), float(step))}).result()
    ckpt.report(step)
holder = ray.get_actor("plain/rank-00000", namespace="rcp-checkpoints")
out["holder_node"] = ray.get(holder.node_id.remote())
out["node"] = ray.get_runtime_context().get_node_id()
ckpt.finish()
print(json.dumps(out))
"""


@ray.remote(num_cpus=1)
def run_plain(env: dict[str, str]) -> tuple[int, str, str, str]:
    """What the command launcher does: the job's command as a child of a Ray worker, with
    the worker's environment (and the job's RCP_* variables, which the runtime env sets)."""
    import subprocess
    import sys

    child = subprocess.run(
        [sys.executable, "-c", PLAIN_LOOP],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    return (
        child.returncode,
        child.stdout,
        child.stderr[-3000:],
        ray.get_runtime_context().gcs_address,
    )


def test_a_plain_process_joins_the_cluster_for_step_reports_and_the_memory_tier(
    cluster: Cluster, signals: Signals, moto_s3: MotoS3
) -> None:
    bucket = moto_s3.create_bucket("train-plain")
    uri = f"s3://{bucket}/jobs/plain"
    signals.admin("register", "plain", 1, token_sha256(TOKEN), uri)
    env = {
        "RCP_JOB_ID": "plain",
        "RCP_ATTEMPT": "1",
        "RCP_SIGNAL_TOKEN": TOKEN,
        "RCP_CHECKPOINT_URI": uri,
        "RCP_STORAGE_ENDPOINT_URL": moto_s3.endpoint_url,
        "RCP_STORAGE_REGION": REGION,
        "RCP_STEP_REPORT_S": "0.5",
    }
    code, stdout, stderr, gcs = ray.get(run_plain.remote(env))
    assert code == 0, stderr
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["gcs"] == gcs  # it joined this cluster (ray.init(address="auto"))
    assert out["restored"] is None
    assert out["holder_node"] != out["node"]  # the memory copy lives on another node
    progress = signals.admin("status", "plain")["progress"]
    assert progress["step"] == 3 and progress["committed_step"] == 3, progress
    assert load_one(uri, moto_s3) == 3


def load_one(uri: str, s3: MotoS3) -> int:
    engine = CheckpointEngine(uri, endpoint_url=s3.endpoint_url, region=REGION)
    restored = engine.restore()
    engine.close()
    assert restored is not None
    return restored.step
