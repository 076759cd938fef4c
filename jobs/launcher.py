"""The gang launcher: runs a job on every worker of a Ray Train gang on the `cluster` pool.

Owns: building the Ray Train gang for an admitted job from the environment the runner sets
(workers, GPUs and CPUs per worker, the admitted nodes, the run's storage and name, which is
the job id: a restarted run finds its checkpoints there), running the job on every worker,
and telling the control plane when each worker has started, with its Ray worker's pid and
node id (so it can tell a running gang from one stuck waiting for resources, and ask Ray for
a hung worker's stacks; the call carries the attempt's ``RCP_SIGNAL_TOKEN``).

Two ways in (the runner picks one, `controlplane.service.runner.entrypoint_command`):

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
  (the ``RCP_*`` job variables, for the checkpoint helper, and ``CUDA_VISIBLE_DEVICES``: the
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

Must not: import `controlplane`; everything comes from ``RCP_*`` environment variables.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.train import Result, RunConfig, ScalingConfig
    from ray.train.backend import BackendConfig

    from jobs.signals import SignalsHandle

# Ray (and `jobs.signals`, which imports it) are imported where they are used: the Ray Job's
# driver must set ``RAY_DEDUP_LOGS`` before Ray is first imported (see the end of this file),
# and the control plane reads this module's names without needing Ray Train.

__all__ = [
    "COMMAND_FLAG",
    "TERM_GRACE_S",
    "CommandFailed",
    "CommandProcess",
    "command_failure",
    "command_backend_config",
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
COMMAND_FLAG = "--command"
"""``python -m jobs.launcher --command -- CMD...`` runs CMD on every worker of the gang."""
TERM_GRACE_S = 10.0
"""How long a rank's command has between SIGTERM and SIGKILL when the gang stops it."""
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


# -- telling the control plane a worker started -------------------------------------------------

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
    handle: SignalsHandle | None = None,
    *,
    pid: int | None = None,
    node_id: str | None = None,
) -> bool | None:
    """Tell the signals actor this worker started: its answer, or None when there is no
    actor under the name. `pid` and `node_id` (hex), when given, name the worker's process
    (the controller asks Ray for its stacks, and its children's, when the job hangs). An
    actor found dead (the controller replaces it) is looked up by name again
    (`jobs.signals.SignalsHandle`) until `deadline_s` has passed."""
    import ray

    from jobs.signals import SignalsHandle

    signals = handle if handle is not None else SignalsHandle()
    args: tuple[object, ...] = (job_id, attempt, rank, token)
    if pid is not None or node_id is not None:
        args = (*args, pid, node_id)
    give_up_s = time.monotonic() + deadline_s
    lost = False
    while True:
        try:
            return bool(signals.call("worker_started", *args, timeout_s=30))
        except LookupError:
            if not lost:
                return None  # no actor under the name at all: not under the control plane
        except ray.exceptions.RayActorError:
            lost = True  # dropped: the next call looks the name up again
        if time.monotonic() >= give_up_s:
            print("rcp: the job signals actor is unreachable; not reported", file=sys.stderr)
            return None
        time.sleep(min(1.0, signals.resolve_interval_s))


def _report_this_worker(rank: int) -> None:
    """`report_started` for this Ray Train worker (its pid and node), under the control plane."""
    import ray

    from jobs.signals import ENV_ATTEMPT, ENV_JOB_ID, ENV_SIGNAL_TOKEN

    job_id = os.environ.get(ENV_JOB_ID)
    if not job_id:
        return
    attempt = int(os.environ.get(ENV_ATTEMPT, "0"))
    token = os.environ.get(ENV_SIGNAL_TOKEN, "")
    accepted = report_started(
        job_id,
        attempt,
        rank,
        token,
        pid=os.getpid(),
        node_id=ray.get_runtime_context().get_node_id(),
    )
    if accepted is False:
        print(
            f"rcp: the control plane refused worker {rank} of job {job_id} attempt "
            f"{attempt} (wrong signal token or a stale attempt); it will not count "
            "as started",
            file=sys.stderr,
        )


def _started_then(train_fn: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
    def worker_loop(config: dict[str, Any]) -> Any:
        import ray.train  # heavy (pandas, pyarrow): only where a gang runs

        _report_this_worker(ray.train.get_context().get_world_rank())
        return train_fn(config)

    return worker_loop


# -- the gang --------------------------------------------------------------------------------


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


def _gang_configs(env: Mapping[str, str]) -> tuple[ScalingConfig, RunConfig]:
    """``(ScalingConfig, RunConfig)`` of the gang the ``RCP_*`` environment describes (1 CPU
    worker outside the control plane)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig  # heavy: see _started_then

    from jobs.signals import ENV_JOB_ID

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
    run_config = RunConfig(
        name=env.get(ENV_JOB_ID) or "rcp-local-run",
        storage_path=env.get(ENV_STORAGE_PATH) or None,
        failure_config=FailureConfig(max_failures=0),
    )
    return scaling, run_config


def run_gang(train_fn: Callable[..., Any], config: dict[str, Any] | None = None) -> Result:
    """Run `train_fn` on every worker of the gang described by the ``RCP_*`` environment.

    Outside the control plane (no ``RCP_NUM_WORKERS``) it runs 1 CPU worker, so a script can
    be tried on a laptop. Returns Ray Train's `Result`.
    """
    from ray.train.torch import TorchConfig, TorchTrainer  # heavy: see _started_then

    if config is None:
        config = json.loads(os.environ.get(ENV_TRAIN_CONFIG, "{}"))
    backend = os.environ.get(ENV_BACKEND) or ("nccl" if _has_real_gpu() else "gloo")
    scaling, run_config = _gang_configs(os.environ)
    trainer = TorchTrainer(
        _started_then(train_fn),
        train_loop_config=config,
        scaling_config=scaling,
        torch_config=TorchConfig(backend=backend),
        run_config=run_config,
    )
    return trainer.fit()


def run_command(argv: Sequence[str]) -> Result:
    """Run the command `argv` on every worker of the gang described by the ``RCP_*``
    environment (see the module doc); raises Ray Train's error when any rank's command
    fails. Returns Ray Train's `Result`."""
    # Ray Train v2's base trainer: no framework process group in the worker (the command
    # makes its own, and a NCCL group here would hold GPU memory the command needs).
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    if not argv or not str(argv[0]).strip():
        raise ValueError("jobs.launcher --command: no command given")
    scaling, run_config = _gang_configs(os.environ)
    trainer = DataParallelTrainer(
        _command_worker,
        train_loop_config={"argv": [str(a) for a in argv]},
        backend_config=command_backend_config(),
        scaling_config=scaling,
        run_config=run_config,
    )
    return trainer.fit()


# -- a command on every worker -----------------------------------------------------------------


def torchrun_env(
    base: Mapping[str, str],
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    node_rank: int,
    master_addr: str,
    master_port: int,
) -> dict[str, str]:
    """The environment a rank's command runs with: `base` (the worker's own: ``RCP_*``,
    ``CUDA_VISIBLE_DEVICES``, ``PATH``...) plus what torchrun sets for a worker. Nothing
    else is added. ``PYTHONUNBUFFERED=1`` unless `base` says otherwise, so a Python
    command's prints reach the job's log as they happen::

        torchrun_env({"RCP_JOB_ID": "j-1"}, rank=3, world_size=4, local_rank=1,
                     local_world_size=2, node_rank=1, master_addr="10.0.0.5", master_port=29500)
        -> {"RCP_JOB_ID": "j-1", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1", "GROUP_RANK": "1", "ROLE_RANK": "3",
            "ROLE_WORLD_SIZE": "4", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500",
            "PYTHONUNBUFFERED": "1"}
    """
    env = dict(base)
    env.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world_size),
            "NODE_RANK": str(node_rank),
            "GROUP_RANK": str(node_rank),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
        }
    )
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def free_port() -> int:
    """A TCP port free on this node right now (rank 0 picks ``MASTER_PORT`` with it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class CommandFailed(RuntimeError):
    """A rank's command ended badly; the message says which rank, where and how."""


def command_failure(rank: int, world_size: int, node: str, returncode: int) -> str:
    """What failed, for the job's log. Never the command line or its environment (either may
    carry a secret)::

        command_failure(1, 4, "10.0.0.5", 3)   -> "rank 1 of 4 (node 10.0.0.5): the command
                                                  exited with code 3"
        command_failure(0, 4, "10.0.0.5", -9)  -> "rank 0 of 4 (node 10.0.0.5): the command
                                                  was killed by signal 9 (SIGKILL)"
    """
    where = f"rank {rank} of {world_size} (node {node})"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown"
        return f"{where}: the command was killed by signal {-returncode} ({name})"
    return f"{where}: the command exited with code {returncode}"


PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _child_setup(parent_pid: int) -> Callable[[], None]:
    """What the child runs between fork and exec: a process group of its own, and (Linux)
    SIGKILL when the thread that started it dies. If the parent died before that took
    effect, the child kills itself."""

    def setup() -> None:
        os.setpgid(0, 0)
        if _LIBC is not None:
            _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)

    return setup


class CommandProcess:
    """One rank's command: a child process that leads its own process group and never
    outlives its parent (``PR_SET_PDEATHSIG``: the kernel kills it when the *thread* that
    started it ends, so that thread must be the one that waits for it). Its stdout and stderr
    are the parent's."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.stop_requested = False
        """Set when the launcher stopped it (the gang is ending), not the command itself."""
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(  # the job's own command, run as the job
            list(argv), env=dict(env), preexec_fn=_child_setup(os.getpid())
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self) -> int:
        return self.proc.wait()

    def _signal_group(self, sig: int) -> bool:
        """Send `sig` to the command's process group; False when the group is gone."""
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False  # the id was reused by someone else's group: not ours
        return True

    def stop(self, grace_s: float = TERM_GRACE_S) -> int:
        """End the command and whatever is left of its process group: SIGTERM, then
        SIGKILL after `grace_s`. Returns the command's exit status (negative: a signal)."""
        with self._lock:
            if self.proc.poll() is None:
                self._signal_group(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    self.proc.wait()
            # The command is gone; what it started may not be (its group keeps the id).
            if self._signal_group(signal.SIGTERM):
                deadline = time.monotonic() + grace_s
                while time.monotonic() < deadline and self._signal_group(0):
                    time.sleep(0.05)
                self._signal_group(signal.SIGKILL)
            return self.proc.returncode


_running_lock = threading.Lock()
_running: CommandProcess | None = None
"""This worker's running command, for `stop_running_command` (at most one per worker)."""


@contextlib.contextmanager
def _registered(child: CommandProcess) -> Iterator[CommandProcess]:
    global _running
    with _running_lock:
        _running = child
    try:
        yield child
    finally:
        with _running_lock:
            _running = None


def stop_running_command(grace_s: float = TERM_GRACE_S) -> bool:
    """Stop this worker's command, if one runs (`CommandProcess.stop`); True if one did.
    Ray Train calls it on every worker when the gang stops (`command_backend_config`)."""
    with _running_lock:
        child = _running
    if child is None:
        return False
    child.stop_requested = True
    child.stop(grace_s)
    return True


def _command_worker(config: dict[str, Any]) -> None:
    """One worker of a command gang: agree on the master, start the command, report, wait."""
    import ray
    import ray.train  # heavy: see _started_then
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
    try:
        child = CommandProcess(argv, env)
    except OSError as exc:
        raise CommandFailed(
            f"rank {rank} of {world_size} (node {node_ip}): cannot start "
            f"{os.path.basename(argv[0])!r}: {exc.strerror or exc}"
        ) from None
    with _registered(child):
        try:
            _report_this_worker(rank)
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
that line as the attempt's reason (`controlplane.service.runner`)."""


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


_COMMAND_BACKEND_CONFIG: BackendConfig | None = None


def command_backend_config() -> BackendConfig:
    """Ray Train's `BackendConfig` for a command gang: no process group in the workers; each
    worker sees the GPUs of every gang worker on its node (``CUDA_VISIBLE_DEVICES``, as torchrun
    gives); when the gang stops, every worker's command is stopped (`stop_running_command`)
    before Ray Train kills the workers. Built on first use: Ray Train is a heavy import the
    control plane, which reads this module's names, does without."""
    global _COMMAND_BACKEND_CONFIG
    if _COMMAND_BACKEND_CONFIG is not None:
        return _COMMAND_BACKEND_CONFIG
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

    _COMMAND_BACKEND_CONFIG = CommandBackendConfig()
    return _COMMAND_BACKEND_CONFIG


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
    run_gang(load_function(args[0]))
    return 0


if __name__ == "__main__":
    # The Ray Job's driver. Every rank's output is forwarded to it; Ray would fold lines that
    # differ only in numbers ("rank 3 ...") into one, so each rank's line is kept, as under
    # torchrun (read when Ray is imported: nothing above imports it).
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    # Call `main` of the package module, so what Ray pickles for the workers (the worker
    # loops, `stop_running_command`) is found by name in `jobs.launcher`, not copied out of
    # ``__main__``.
    from jobs.launcher import main as _main

    sys.exit(_main())
