"""Command mode: any command run on every worker of the gang, the way torchrun runs it.

Owns: the driver's side (`run_command`: Ray Train v2's `DataParallelTrainer` with
`command_backend_config`, which sets up no process group, shares the node's gang GPUs through
``CUDA_VISIBLE_DEVICES`` and stops every rank's command when the gang stops; and
`gang_failure_summary`, the one line ``GANG_FAILED_PREFIX ...`` naming the failed ranks that
ends a failed driver's log) and the worker's side (`command_worker`: rank 0 picks the master
address and port, every rank starts its command with `torchrun_env`, reports that it started
and waits; a non-zero exit or a signal fails the worker with `CommandFailed`).

Must not: import `controlplane`, or import Ray at module level (see `jobs.launcher`).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jobs.launcher.child_process import (
    TERM_GRACE_S,
    CommandFailed,
    CommandProcess,
    command_failure,
    free_port,
    registered,
    stop_running_command,
    torchrun_env,
)
from jobs.launcher.gang import gang_configs
from jobs.launcher.worker_started import rank_output, report_this_worker

if TYPE_CHECKING:
    from ray.train import Result
    from ray.train.backend import BackendConfig

__all__ = [
    "GANG_FAILED_PREFIX",
    "command_backend_config",
    "command_worker",
    "gang_failure_summary",
    "run_command",
]


def run_command(argv: Sequence[str]) -> Result:
    """Run the command `argv` on every worker of the gang described by the ``RCP_*``
    environment (see the module doc); raises Ray Train's error when any rank's command
    fails. Returns Ray Train's `Result`."""
    # Ray Train v2's base trainer: no framework process group in the worker (the command
    # makes its own, and a NCCL group here would hold GPU memory the command needs).
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    if not argv or not str(argv[0]).strip():
        raise ValueError("jobs.launcher --command: no command given")
    scaling, run_config = gang_configs(os.environ)
    trainer = DataParallelTrainer(
        command_worker,
        train_loop_config={"argv": [str(a) for a in argv]},
        backend_config=command_backend_config(),
        scaling_config=scaling,
        run_config=run_config,
    )
    return trainer.fit()


def command_worker(config: dict[str, Any]) -> None:
    """One worker of a command gang: agree on the master, start the command, report, wait."""
    import ray
    import ray.train  # heavy (pandas, pyarrow): only where a gang runs
    from ray.train.collective import broadcast_from_rank_zero

    argv = [str(a) for a in config["argv"]]
    ctx = ray.train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    node_ip = str(ray.util.get_node_ip_address())
    mine = {"addr": node_ip, "port": free_port()} if rank == 0 else None
    master = broadcast_from_rank_zero(mine)
    env = torchrun_env(
        os.environ,
        rank=rank,
        world_size=world_size,
        local_rank=ctx.get_local_rank(),
        local_world_size=ctx.get_local_world_size(),
        node_rank=ctx.get_node_rank(),
        master_addr=str(master["addr"]),
        master_port=int(master["port"]),
    )
    # The command joins this worker's own cluster (the checkpoint helper's ray.init), never
    # whichever cluster last started on the machine, which "auto" would pick.
    env.setdefault("RAY_ADDRESS", str(ray.get_runtime_context().gcs_address))
    with rank_output(rank):  # the command's output, marked as this rank's (rcp logs)
        try:
            child = CommandProcess(argv, env)
        except OSError as exc:
            raise CommandFailed(
                f"rank {rank} of {world_size} (node {node_ip}): cannot start "
                f"{os.path.basename(argv[0])!r}: {exc.strerror or exc}"
            ) from None
        with registered(child):
            try:
                report_this_worker(rank)
                returncode = child.wait()
            finally:
                returncode = child.stop()
    if child.stop_requested:
        print(f"rcp: rank {rank}: command stopped (the gang is ending)", file=sys.stderr)
        return
    if returncode != 0:
        raise CommandFailed(command_failure(rank, world_size, node_ip, returncode))


GANG_FAILED_PREFIX = "rcp: the gang failed: "
"""Starts the driver's last log line when a gang failed; the control plane takes the rest of
that line as the attempt's reason (`controlplane.loop.act.jobs`)."""


def gang_failure_summary(exc: BaseException) -> str:
    """One line naming what failed a gang: each failed rank's error (Ray Train's
    ``WorkerGroupError.worker_failures``), by its last line, else `exc`'s last line::

        WorkerGroupError(worker_failures={1: <rank 1's traceback, ending "jobs.launcher.
        CommandFailed: rank 1 of 4 (node n): the command exited with code 3">})
        -> "rank 1 of 4 (node n): the command exited with code 3"
    """
    failures = getattr(exc, "worker_failures", None)
    if isinstance(failures, Mapping) and failures:
        return "; ".join(_failure_line(failures[rank]) for rank in sorted(failures))
    return _failure_line(exc)


_COMMAND_FAILED_PREFIX = "jobs.launcher.CommandFailed: "


def _failure_line(error: BaseException) -> str:
    if isinstance(error, CommandFailed):
        return str(error)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    last = lines[-1] if lines else type(error).__name__
    return last.removeprefix(_COMMAND_FAILED_PREFIX)


@functools.cache
def command_backend_config() -> BackendConfig:
    """Ray Train's `BackendConfig` for a command gang: no process group in the workers; each
    worker sees the GPUs of every gang worker on its node (``CUDA_VISIBLE_DEVICES``, as torchrun
    gives); when the gang stops, every worker's command is stopped (`stop_running_command`)
    before Ray Train kills the workers. Built on first use: Ray Train is a heavy import the
    control plane, which reads this module's names, does without."""
    import ray
    from ray.train.backend import Backend, BackendConfig

    class CommandBackend(Backend):
        share_cuda_visible_devices = True

        # Any: Train v2 passes its own worker group, not the v1 class Backend's signature names.
        def on_shutdown(self, worker_group: Any, backend_config: BackendConfig) -> None:
            refs = worker_group.execute_async(stop_running_command, TERM_GRACE_S)
            ray.wait(refs, num_returns=len(refs), timeout=TERM_GRACE_S + 5)

    class CommandBackendConfig(BackendConfig):
        @property
        def backend_cls(self) -> type:
            return CommandBackend

    return CommandBackendConfig()
