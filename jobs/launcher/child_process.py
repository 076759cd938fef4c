"""One rank's command as a child process of its Ray Train worker, started as torchrun would.

Owns: the environment a rank's command runs with (`torchrun_env`: ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``... on top of the worker's own), the child
process's lifecycle (`CommandProcess`: its own process group, ``PR_SET_PDEATHSIG=SIGKILL``
on Linux so it never outlives its worker, SIGTERM then SIGKILL after `TERM_GRACE_S` for the
whole group), this worker's running command (`registered`, `stop_running_command`) and what
a failure says (`CommandFailed`, `command_failure`: rank, node, exit code or signal; never
the command line or its environment, either may carry a secret).

Must not: import `controlplane` or Ray (Ray Train drives these from `command`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

__all__ = [
    "TERM_GRACE_S",
    "CommandFailed",
    "CommandProcess",
    "command_failure",
    "free_port",
    "registered",
    "stop_running_command",
    "torchrun_env",
]

TERM_GRACE_S = 10.0
"""How long a rank's command has between SIGTERM and SIGKILL when the gang stops it."""


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

    # Its public home: a failed rank's traceback ends "jobs.launcher.CommandFailed: ...", the
    # line `gang_failure_summary` reads and users have seen in their logs.
    __module__ = "jobs.launcher"


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
        except (ProcessLookupError, PermissionError):  # gone, or the id is someone else's now
            return False
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
def registered(child: CommandProcess) -> Iterator[CommandProcess]:
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
