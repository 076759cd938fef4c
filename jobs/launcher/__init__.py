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
  on every worker as a child process with the environment torchrun gives (`torchrun_env`) on
  top of the worker's own (the ``RCP_*`` job variables; ``RAY_ADDRESS``, the worker's own
  cluster; ``CUDA_VISIBLE_DEVICES``, the GPUs of the gang's workers on that node, so
  ``LOCAL_RANK`` indexes this rank's GPU). An unmodified ``torch.distributed`` script runs as
  under torchrun. A worker counts as started once its command has been spawned. Every rank's
  output reaches the job's driver log (``rcp logs``) as written (the driver turns Ray's log
  deduplication off).

The gang (`jobs.launcher.gang`): one placement group on the `cluster` pool, so the workers
start together or not at all, only on the nodes admission placed them on. A failed worker
restarts the gang inside the run up to ``RCP_RESTARTS_IN_PLACE`` times (`jobs.launcher.in_place`:
Ray Train starts a new worker group on the same nodes and the control plane is told); past
that the run fails and the control plane restarts the job as a new attempt. A command's workers set up no
process group of their own (`command_backend_config`): the command owns the GPUs.

A command's failure semantics (`jobs.launcher.child_process`): any rank's command exiting
non-zero or killed by a signal fails its worker with `CommandFailed`; Ray Train stops the gang,
each other rank's command gets SIGTERM and, `TERM_GRACE_S` later, SIGKILL; the driver exits 1,
its log ending with one line naming the failed ranks (`gang_failure_summary`). A command never
outlives its worker (its own process group, ``PR_SET_PDEATHSIG=SIGKILL``).

Outside the control plane (no ``RCP_NUM_WORKERS``) either way runs 1 CPU worker, so a job can
be tried on a laptop: ``python -m jobs.launcher --command -- python train.py``.

Its parts: `gang` (the ``RCP_*`` variables, Ray Train's configs, `run_gang`), `command`
(command mode, the driver's and each worker's side), `child_process` (one rank's command,
`torchrun_env`), `worker_started` and `driver_node` (the driver attached to the Ray node it
runs on, never the head); this module re-exports their public names and owns `main`, which
``python -m jobs.launcher`` (`jobs.launcher.__main__`, the Ray Job's driver) runs.

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
