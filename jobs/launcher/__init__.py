"""The gang launcher: runs a job on every worker of a Ray Train gang on the `cluster` pool.

Owns: building the Ray Train gang for an admitted job from the environment the runner sets
(workers, GPUs and CPUs per worker, the admitted nodes, the run's storage and name, which is
the job id: a restarted run finds its checkpoints there), running the job on every worker,
and telling the control plane when each worker has started, with its Ray worker's pid and
node id (so it can tell a running gang from one stuck waiting for resources, and ask Ray for
a hung worker's stacks; the call carries the attempt's ``RCP_SIGNAL_TOKEN``).

Two ways in (the runner picks one, `controlplane.loop.act.jobs.launching.entrypoint_command`):

* ``entrypoint: mypkg.train:train_loop`` (``module:function``): the runner runs
  ``python -m jobs.launcher mypkg.train:train_loop``, which imports the function and runs it as
  Ray Train's per-worker loop (called with the dict in ``RCP_TRAIN_CONFIG``, default ``{}``)
  under ``TorchTrainer``, whose process group is already set up when it starts. A worker
  counts as started when the loop is about to be called.
* ``entrypoint: python train.py --lr 3e-4`` (any other command): the runner runs
  ``python -m jobs.launcher --command -- python train.py --lr 3e-4``, which starts the command
  on every worker as a child process with the environment torchrun gives (`torchrun_env`:
  ``MASTER_ADDR``/``MASTER_PORT`` on rank 0's node, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``LOCAL_WORLD_SIZE``, ``NODE_RANK``/``GROUP_RANK``), plus the worker's own environment
  (the ``RCP_*`` job variables, for the checkpoint helper, ``RAY_ADDRESS``: the worker's own
  cluster, and ``CUDA_VISIBLE_DEVICES``: the
  GPUs of the gang's workers on that node, so ``LOCAL_RANK`` indexes this rank's own GPU, as
  under torchrun). An unmodified ``torch.distributed`` script (``init_process_group`` with the
  default ``env://``) runs as it would under torchrun. A worker counts as started once its
  command has been spawned. The command's output goes to the worker's stdout/stderr, which Ray
  forwards to the job's driver log (``rcp logs``), every rank's line as written (the driver
  turns Ray's log deduplication off: it folds lines that differ only in numbers).

The gang: ``ScalingConfig(num_workers, use_gpu, resources_per_worker={"GPU": g, "CPU": c,
"pool_cluster": 1}, label_selector={"pool": "cluster", "ray.io/node-id": "in(<admitted nodes>)"})``;
Ray Train reserves all workers in one placement group, so they start together or not at all,
and only on the nodes admission placed them on. Ray Train never retries
(``FailureConfig(max_failures=0)``): restarts are the control plane's, as new attempts. With no
real GPU on the node (logical GPUs in local mode) a function's process group uses gloo
(``TorchConfig(backend="gloo")``), else nccl. A command's workers set up no process group of
their own (`DataParallelTrainer` with `command_backend_config`): the command owns the GPUs
and makes its own.

A command's failure semantics (`CommandProcess`, `stop_running_command`): any rank's command
exiting non-zero or killed by a signal fails its worker with `CommandFailed`, naming the rank,
the node and the exit code or signal; Ray Train then stops the gang, and each other rank's
command gets SIGTERM and, `TERM_GRACE_S` later, SIGKILL (with its whole process group); the
driver exits 1, so the Ray Job is FAILED, its log ending with one line naming the failed
ranks (`gang_failure_summary`). A command never outlives its worker: it is started
in a process group of its own with ``PR_SET_PDEATHSIG=SIGKILL`` (Linux), so when the worker
process dies (the Ray Job stopped, the node lost) the kernel kills it.

Outside the control plane (no ``RCP_NUM_WORKERS``) either way runs 1 CPU worker, so a job can
be tried on a laptop: ``python -m jobs.launcher --command -- python train.py``.

Where each part lives (this module is the public face: every name below is importable from
``jobs.launcher``, and it owns the entry point `main`):

* `jobs.launcher.gang`: the ``RCP_*`` variables, the gang's Ray Train configs, `run_gang`;
* `jobs.launcher.command`: command mode, the driver's and each worker's side, and the
  failed gang's last log line;
* `jobs.launcher.child_process`: one rank's command as a child process, `torchrun_env`;
* `jobs.launcher.worker_started`: telling the control plane a worker started;
* `jobs.launcher.driver_node`: the driver attached to the Ray node it runs on (so the gang's
  Ray Train controller runs there, beside it, and never on the head);
* ``python -m jobs.launcher`` runs `jobs.launcher.__main__`, the Ray Job's driver.

Must not: import `controlplane`; everything comes from ``RCP_*`` environment variables.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from jobs.launcher.child_process import (
    TERM_GRACE_S,
    CommandFailed,
    CommandProcess,
    command_failure,
    free_port,
    stop_running_command,
    torchrun_env,
)
from jobs.launcher.command import (
    GANG_FAILED_PREFIX,
    command_backend_config,
    gang_failure_summary,
    run_command,
)
from jobs.launcher.driver_node import connect_driver
from jobs.launcher.gang import (
    ENV_BACKEND,
    ENV_CPUS_PER_WORKER,
    ENV_GPUS_PER_WORKER,
    ENV_NODE_IDS,
    ENV_NUM_WORKERS,
    ENV_STORAGE_PATH,
    ENV_TRAIN_CONFIG,
    NODE_ID_LABEL,
    POOL_LABEL_SELECTOR,
    POOL_RESOURCE,
    gang_label_selector,
    run_gang,
)
from jobs.launcher.worker_started import WORKER_STARTED_DEADLINE_S, report_started

# Ray (and `jobs.signals`, which imports it) are imported where they are used: the Ray Job's
# driver must set ``RAY_DEDUP_LOGS`` before Ray is first imported (`jobs.launcher.__main__`),
# and the control plane reads this package's names without needing Ray Train.

__all__ = [
    "COMMAND_FLAG",
    "ENV_BACKEND",
    "ENV_CPUS_PER_WORKER",
    "ENV_GPUS_PER_WORKER",
    "ENV_NODE_IDS",
    "ENV_NUM_WORKERS",
    "ENV_STORAGE_PATH",
    "ENV_TRAIN_CONFIG",
    "GANG_FAILED_PREFIX",
    "NODE_ID_LABEL",
    "POOL_LABEL_SELECTOR",
    "POOL_RESOURCE",
    "TERM_GRACE_S",
    "WORKER_STARTED_DEADLINE_S",
    "CommandFailed",
    "CommandProcess",
    "command_backend_config",
    "command_failure",
    "connect_driver",
    "free_port",
    "gang_failure_summary",
    "gang_label_selector",
    "load_function",
    "main",
    "report_started",
    "run_command",
    "run_gang",
    "stop_running_command",
    "torchrun_env",
]

COMMAND_FLAG = "--command"
"""``python -m jobs.launcher --command -- CMD...`` runs CMD on every worker of the gang."""
_USAGE = (
    "usage: python -m jobs.launcher module:function\n"
    "       python -m jobs.launcher --command -- CMD [ARG...]"
)


def load_function(target: str) -> Callable[..., Any]:
    """Import ``module:function``; a clear error if either part is missing."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"entrypoint {target!r}: expected module:function")
    module = importlib.import_module(module_name)
    fn: object = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"entrypoint {target!r}: {module_name} has no function {attr!r}")
    return fn


# -- the entry point -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == [COMMAND_FLAG]:
        command = args[1:]
        if command[:1] == ["--"]:
            command = command[1:]
        if not command:
            print(_USAGE, file=sys.stderr)
            return 2
        connect_driver()
        try:
            run_command(command)
        except Exception as exc:
            # Ray Train's whole report, then one line naming what failed: the last line of
            # the driver's log is what a reader (and the runner's failure reason) sees first.
            print(f"rcp: Ray Train's report: {exc}", file=sys.stderr)
            print(f"{GANG_FAILED_PREFIX}{gang_failure_summary(exc)}", file=sys.stderr)
            return 1
        return 0
    if len(args) != 1:
        print(_USAGE, file=sys.stderr)
        return 2
    sys.path.insert(0, os.getcwd())
    fn = load_function(args[0])
    connect_driver()
    run_gang(fn)
    return 0
