"""The gang launcher: turns a training function into a Ray Train gang on the `cluster` pool.

Owns: building the `TorchTrainer` for an admitted job from the environment the runner sets
(workers, GPUs and CPUs per worker, the run's storage and name, which is the job id: a
restarted run finds its checkpoints there, see `jobs.signals.Preemption.restore`), and
telling the control plane when each worker has started (so it can tell a running gang from
one stuck waiting for resources; the call carries the attempt's ``RCP_SIGNAL_TOKEN``).

Two ways in, both documented for researchers:

* ``entrypoint: mypkg.train:train_loop`` (``module:function``): the runner runs
  ``python -m jobs.launcher mypkg.train:train_loop``, which imports the function and runs it as
  Ray Train's per-worker loop (called with the dict in ``RCP_TRAIN_CONFIG``, default ``{}``).
* ``entrypoint: python train.py ...`` (any command): the script builds its own loop and calls
  ``jobs.launcher.run_gang(train_loop)``, which reads the same environment.

The gang: ``ScalingConfig(num_workers, use_gpu, resources_per_worker={"GPU": g, "CPU": c,
"pool_cluster": 1}, label_selector={"pool": "cluster", "ray.io/node-id": "in(<admitted nodes>)"})``;
Ray Train reserves all workers in one placement group, so they start together or not at all,
and only on the nodes admission placed them on. With no real GPU on the node (logical
GPUs in local mode) the process group uses gloo (``TorchConfig(backend="gloo")``), else nccl.

Must not: import `controlplane`; everything comes from ``RCP_*`` environment variables.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["load_function", "run_gang", "main"]

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


def load_function(target: str) -> Callable[..., Any]:
    """Import ``module:function``; a clear error if either part is missing."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"entrypoint {target!r}: expected module:function")
    module = importlib.import_module(module_name)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"entrypoint {target!r}: {module_name} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


def _started_then(train_fn: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
    def worker_loop(config: dict[str, Any]) -> Any:
        import ray
        import ray.train

        from jobs.signals import ENV_ATTEMPT, ENV_JOB_ID, ENV_SIGNAL_TOKEN

        job_id = os.environ.get(ENV_JOB_ID)
        if job_id:
            rank = ray.train.get_context().get_world_rank()
            attempt = int(os.environ.get(ENV_ATTEMPT, "0"))
            token = os.environ.get(ENV_SIGNAL_TOKEN, "")
            accepted = report_started(job_id, attempt, rank, token)
            if accepted is False:
                print(
                    f"rcp: the control plane refused worker {rank} of job {job_id} attempt "
                    f"{attempt} (wrong signal token or a stale attempt); it will not count "
                    "as started",
                    file=sys.stderr,
                )
        return train_fn(config)

    return worker_loop


WORKER_STARTED_DEADLINE_S = 60.0
"""How long a worker keeps trying to report that it started while the signals actor is dead
(the controller replaces it on its next tick). Past that it trains anyway; the gang then
counts as not started (``jobs.gang_start_timeout_s``)."""


def report_started(
    job_id: str,
    attempt: int,
    rank: int,
    token: str,
    deadline_s: float = WORKER_STARTED_DEADLINE_S,
    handle: Any = None,
) -> bool | None:
    """Tell the signals actor this worker started: its answer, or None when there is no
    actor under the name. An actor found dead (the controller replaces it) is looked up by
    name again (`jobs.signals.SignalsHandle`) until `deadline_s` has passed."""
    import ray

    from jobs.signals import SignalsHandle

    signals = handle if handle is not None else SignalsHandle()
    give_up_s = time.monotonic() + deadline_s
    lost = False
    while True:
        try:
            return bool(signals.call("worker_started", job_id, attempt, rank, token, timeout_s=30))
        except LookupError:
            if not lost:
                return None  # no actor under the name at all: not under the control plane
        except ray.exceptions.RayActorError:
            lost = True  # dropped: the next call looks the name up again
        if time.monotonic() >= give_up_s:
            print("rcp: the job signals actor is unreachable; not reported", file=sys.stderr)
            return None
        time.sleep(min(1.0, signals.resolve_interval_s))


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


def run_gang(train_fn: Callable[..., Any], config: dict[str, Any] | None = None) -> Any:
    """Run `train_fn` on every worker of the gang described by the ``RCP_*`` environment.

    Outside the control plane (no ``RCP_NUM_WORKERS``) it runs 1 CPU worker, so a script can
    be tried on a laptop. Returns Ray Train's `Result`.
    """
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from jobs.signals import ENV_JOB_ID

    num_workers = int(os.environ.get(ENV_NUM_WORKERS, "1"))
    gpus = int(os.environ.get(ENV_GPUS_PER_WORKER, "0"))
    cpus = float(os.environ.get(ENV_CPUS_PER_WORKER, "1"))
    if config is None:
        config = json.loads(os.environ.get(ENV_TRAIN_CONFIG, "{}"))
    resources: dict[str, float] = {"CPU": cpus}
    in_control_plane = ENV_NUM_WORKERS in os.environ
    if gpus > 0:
        resources["GPU"] = gpus
    if in_control_plane:
        resources[POOL_RESOURCE] = 1
    backend = os.environ.get(ENV_BACKEND) or ("nccl" if _has_real_gpu() else "gloo")
    scaling = ScalingConfig(
        num_workers=num_workers,
        use_gpu=gpus > 0,
        resources_per_worker=resources,
        label_selector=gang_label_selector(os.environ) if in_control_plane else None,
    )  # type: ignore[call-arg]  # Train v2's ScalingConfig; type stubs show v1's
    run_config = RunConfig(
        name=os.environ.get(ENV_JOB_ID) or "rcp-local-run",
        storage_path=os.environ.get(ENV_STORAGE_PATH) or None,
    )
    trainer = TorchTrainer(
        _started_then(train_fn),
        train_loop_config=config,
        scaling_config=scaling,
        torch_config=TorchConfig(backend=backend),
        run_config=run_config,
    )
    return trainer.fit()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m jobs.launcher module:function", file=sys.stderr)
        return 2
    sys.path.insert(0, os.getcwd())
    run_gang(load_function(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
