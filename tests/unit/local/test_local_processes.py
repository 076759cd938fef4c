"""Which processes of this machine `rcp down` counts as the local cluster's
(controlplane.local.processes), with real processes: a readable environment decides, and
only a process whose environment reads empty (what setproctitle leaves of a Ray agent's) is
attributed by the files it holds under the cluster's directories."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from controlplane.local.processes import CLUSTER_ID_ENV, find_cluster_processes

CLUSTER = "c0ffee"
HOLD = "import sys, time\nf = open(sys.argv[1], 'a')\nprint('ready', flush=True)\ntime.sleep(120)\n"


@contextmanager
def holding(log: Path, env: dict[str, str], cwd: Path | None = None) -> Iterator[int]:
    """A Python process that keeps `log` open, started with exactly `env`; its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(log)],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def pids(root: Path) -> set[int]:
    return {p.pid for p in find_cluster_processes(CLUSTER, [str(root)])}


def test_a_users_process_holding_the_clusters_logs_is_not_the_clusters(tmp_path: Path) -> None:
    """A user's Python connected to the cluster keeps its driver log open under Ray's temp
    dir, and may run in the state dir: `down` must leave it alone."""
    user_env = {"PATH": os.environ.get("PATH", "/usr/bin"), "HOME": str(tmp_path)}
    with holding(tmp_path / "python-core-driver.log", user_env, cwd=tmp_path) as pid:
        assert psutil.Process(pid).environ()  # readable: the rule that decides
        assert pid not in pids(tmp_path)


def test_a_process_with_the_clusters_id_is_the_clusters_wherever_it_runs(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ours = {"PATH": os.environ.get("PATH", "/usr/bin"), CLUSTER_ID_ENV: CLUSTER}
    other = {**ours, CLUSTER_ID_ENV: "another-cluster"}
    root = tmp_path / "root"
    root.mkdir()
    with holding(elsewhere / "a.log", ours) as mine, holding(root / "b.log", other) as theirs:
        found = pids(root)
        assert mine in found
        assert theirs not in found  # another cluster's process, even with a file under root


def test_a_process_without_a_readable_environment_is_known_by_its_open_files(
    tmp_path: Path,
) -> None:
    """Ray's agents rename themselves (setproctitle), and their environment then reads
    empty: the log they hold open under the cluster's temp dir names them."""
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    with holding(root / "agent.log", {}) as agent, holding(outside / "x.log", {}) as stranger:
        for _ in range(50):  # the child has opened its file once it said ready; be sure
            if psutil.Process(agent).open_files():
                break
            time.sleep(0.05)
        assert psutil.Process(agent).environ() == {}
        found = pids(root)
        assert agent in found
        assert stranger not in found
