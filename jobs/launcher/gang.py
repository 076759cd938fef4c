"""The Ray Train gang of an admitted job, described by the environment the runner sets.

Owns: the ``RCP_*`` variables that describe the gang (workers, GPUs and CPUs per worker, the
admitted nodes, the run's storage; the run's name is the job id, so a restarted run finds its
checkpoints there), the gang's `ScalingConfig` and `RunConfig` (`gang_configs`: one
placement group on the `cluster` pool, pinned to the nodes admission chose, restarted in place
by Ray Train at most ``RCP_RESTARTS_IN_PLACE`` times: `jobs.launcher.in_place`), and running a ``module:function`` job on every worker under ``TorchTrainer``
(`run_gang`: gloo without a real GPU, else nccl, unless ``RCP_TORCH_BACKEND`` says).

Must not: import `controlplane`, or import Ray at module level (the control plane reads the
names here without Ray Train, and the driver sets ``RAY_DEDUP_LOGS`` first).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from jobs.launcher.worker_started import started_then

if TYPE_CHECKING:
    from ray.train import Result, RunConfig, ScalingConfig

__all__ = [
    "ENV_BACKEND",
    "ENV_CPUS_PER_WORKER",
    "ENV_GPUS_PER_WORKER",
    "ENV_NODE_IDS",
    "ENV_NUM_WORKERS",
    "ENV_STORAGE_PATH",
    "ENV_TRAIN_CONFIG",
    "NODE_ID_LABEL",
    "POOL_LABEL_SELECTOR",
    "POOL_RESOURCE",
    "gang_configs",
    "gang_label_selector",
    "run_gang",
]

ENV_NUM_WORKERS = "RCP_NUM_WORKERS"
ENV_GPUS_PER_WORKER = "RCP_GPUS_PER_WORKER"
ENV_CPUS_PER_WORKER = "RCP_CPUS_PER_WORKER"
ENV_STORAGE_PATH = "RCP_STORAGE_PATH"
ENV_TRAIN_CONFIG = "RCP_TRAIN_CONFIG"
ENV_BACKEND = "RCP_TORCH_BACKEND"
ENV_NODE_IDS = "RCP_NODE_IDS"
"""Comma-separated Ray node ids admission placed the gang on; workers go only there."""
NODE_ID_LABEL = "ray.io/node-id"
POOL_RESOURCE = "pool_cluster"
POOL_LABEL_SELECTOR = {"pool": "cluster"}


def _has_real_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def gang_label_selector(env: Mapping[str, str]) -> dict[str, str]:
    """The workers' label selector: the cluster pool, and the admitted nodes when named.

    Pinning to the nodes admission chose keeps the control plane's record of where a gang
    runs true, which is what health remediation and GPU accounting rely on.
    """
    selector = dict(POOL_LABEL_SELECTOR)
    nodes = sorted({n.strip() for n in env.get(ENV_NODE_IDS, "").split(",") if n.strip()})
    if len(nodes) == 1:
        selector[NODE_ID_LABEL] = nodes[0]
    elif nodes:
        selector[NODE_ID_LABEL] = f"in({','.join(nodes)})"
    return selector


def gang_configs(env: Mapping[str, str]) -> tuple[ScalingConfig, RunConfig]:
    """``(ScalingConfig, RunConfig)`` of the gang the ``RCP_*`` environment describes (1 CPU
    worker outside the control plane)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig  # heavy: only where a gang runs

    from jobs.signals.environment import ENV_JOB_ID

    num_workers = int(env.get(ENV_NUM_WORKERS, "1"))
    gpus = int(env.get(ENV_GPUS_PER_WORKER, "0"))
    cpus = float(env.get(ENV_CPUS_PER_WORKER, "1"))
    resources: dict[str, float] = {"CPU": cpus}
    in_control_plane = ENV_NUM_WORKERS in env
    if gpus > 0:
        resources["GPU"] = gpus
    if in_control_plane:
        resources[POOL_RESOURCE] = 1
    scaling = ScalingConfig(
        num_workers=num_workers,
        use_gpu=gpus > 0,
        resources_per_worker=resources,
        label_selector=gang_label_selector(env) if in_control_plane else None,
    )  # type: ignore[call-arg]  # Train v2's ScalingConfig; type stubs show v1's
    from jobs.launcher import in_place  # imports Ray Train: only where a gang runs

    restarts = in_place.restarts_in_place(env) if in_control_plane else 0
    run_config = RunConfig(
        name=env.get(ENV_JOB_ID) or "rcp-local-run",
        storage_path=env.get(ENV_STORAGE_PATH) or None,
        failure_config=FailureConfig(max_failures=restarts),
        callbacks=[in_place.InPlaceReporter(env)] if restarts else None,  # type: ignore[list-item]  # Train v2's callbacks; the stubs show v1's
    )
    return scaling, run_config


def run_gang(train_fn: Callable[..., Any], config: dict[str, Any] | None = None) -> Result:
    """Run `train_fn` on every worker of the gang described by the ``RCP_*`` environment.

    Outside the control plane (no ``RCP_NUM_WORKERS``) it runs 1 CPU worker, so a script can
    be tried on a laptop. Returns Ray Train's `Result`.
    """
    from ray.train.torch import TorchConfig, TorchTrainer  # heavy: only where a gang runs

    if config is None:
        config = json.loads(os.environ.get(ENV_TRAIN_CONFIG, "{}"))
    backend = os.environ.get(ENV_BACKEND) or ("nccl" if _has_real_gpu() else "gloo")
    scaling, run_config = gang_configs(os.environ)
    trainer = TorchTrainer(
        started_then(train_fn),
        train_loop_config=config,
        scaling_config=scaling,
        torch_config=TorchConfig(backend=backend),
        run_config=run_config,
    )
    return trainer.fit()
