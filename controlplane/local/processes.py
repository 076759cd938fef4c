"""Finding and stopping the processes of one embedded local cluster, and only those.

Owns: the rule that decides whether a process on this machine belongs to a given local
cluster, the TERM-then-KILL sequence that stops them, and, for fault injection, which of them
are one simulated node's Ray processes (`node_processes`).

Must not: stop anything it cannot attribute to the cluster (it never runs ``ray stop``).

A process belongs to the cluster when any of these holds:
- its environment carries ``RCP_CLUSTER_ID=<id>`` (every process `up` starts inherits it);
- its environment cannot be read and its command line, working directory or an open file
  lies under the cluster's own directories (Ray's agents overwrite their environment block
  with setproctitle but keep their logs open there). A process whose environment reads and
  lacks the id is never the cluster's: a user's Python connected to it keeps its driver logs
  there too;
- it descends from a process that belongs.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable

import psutil

CLUSTER_ID_ENV = "RCP_CLUSTER_ID"


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r + os.sep) for r in roots)


def _belongs(proc: psutil.Process, cluster_id: str, roots: tuple[str, ...]) -> bool:
    try:
        env = proc.environ()
    except (psutil.Error, OSError):
        env = {}
    if env:
        # A readable environment decides: a user's own Python connected to the cluster
        # (its driver logs lie under Ray's temp dir) or a shell whose working directory is
        # the state dir is not the cluster's, whatever files it has open.
        return bool(env.get(CLUSTER_ID_ENV) == cluster_id)
    try:
        cmdline = " ".join(proc.cmdline())
        if any(r in cmdline for r in roots):
            return True
        if _under(proc.cwd(), roots):
            return True
        return any(_under(f.path, roots) for f in proc.open_files())
    except (psutil.Error, OSError):
        return False


def find_cluster_processes(cluster_id: str, roots: Iterable[str]) -> list[psutil.Process]:
    """Every live process of this machine that belongs to the cluster (see module doc)."""
    root_tuple = tuple(os.path.realpath(r) for r in roots)
    me = os.getpid()
    members: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        if _belongs(proc, cluster_id, root_tuple):
            members[proc.pid] = proc
    for proc in list(members.values()):
        try:
            for child in proc.children(recursive=True):
                if child.pid != me:
                    members.setdefault(child.pid, child)
        except psutil.Error:
            pass
    return list(members.values())


# Every Ray process of one simulated node carries its node id here (the head's from
# `controlplane.local.head.node_env`, each worker's from the fake provider).
NODE_ID_ENV = "RAY_OVERRIDE_NODE_ID_FOR_TESTING"
# Processes `up` starts beside Ray that are not part of any node (they stand for services
# production runs elsewhere: the GCS store, object storage, Prometheus, the load balancer).
_NOT_A_NODE = ("redis-server", "moto.server", "prometheus", "haproxy")


def node_processes(cluster_id: str, roots: Iterable[str], node_id: str) -> list[psutil.Process]:
    """The Ray processes of one simulated node of the cluster (for fault injection: tests and
    benchmarks kill a node, or the head, as a machine failure would): those whose environment
    names `node_id`, and, for Ray's agents whose environment setproctitle overwrote, those
    whose parent is one of them. A worker node's raylet descends from the head's autoscaler
    but carries its own id, so it is not the head's."""
    members = find_cluster_processes(cluster_id, roots)
    node: dict[int, psutil.Process] = {}
    unknown: list[psutil.Process] = []
    for proc in members:
        try:
            cmdline = " ".join(proc.cmdline())
            if any(name in cmdline for name in _NOT_A_NODE):
                continue
            env_id = proc.environ().get(NODE_ID_ENV)
        except (psutil.Error, OSError):
            continue
        if env_id == node_id:
            node[proc.pid] = proc
        elif env_id is None:
            unknown.append(proc)
    grew = True
    while grew:
        grew = False
        for proc in unknown:
            with contextlib.suppress(psutil.Error):
                if proc.pid not in node and proc.ppid() in node:
                    node[proc.pid] = proc
                    grew = True
    return list(node.values())


def kill_now(procs: list[psutil.Process]) -> int:
    """SIGKILL every process at once (a machine failure, not a shutdown); returns how many."""
    killed = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
            killed += 1
    return killed


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def terminate(procs: list[psutil.Process], grace_s: float = 5.0) -> None:
    """SIGTERM each process, wait up to `grace_s`, then SIGKILL what is left."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def stop_cluster_processes(
    cluster_id: str, roots: Iterable[str], first: Iterable[str] = (), rounds: int = 4
) -> int:
    """Stop every process of the cluster; returns how many. Those whose command line contains
    a string of `first` go first (the autoscaler, so it relaunches no node meanwhile); several
    rounds catch processes spawned while the others went down."""
    roots = list(roots)
    stopped = 0
    first = tuple(first)
    for _ in range(rounds):
        procs = find_cluster_processes(cluster_id, roots)
        if not procs:
            break
        leaders = [p for p in procs if first and any(tok in _cmdline(p) for tok in first)]
        if leaders:
            terminate(leaders)
        terminate(procs)
        stopped += len(procs)
        time.sleep(0.2)
    return stopped
