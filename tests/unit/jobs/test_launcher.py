"""The gang launcher without a cluster (issue 13, "plain commands are first-class gang jobs"):
what the Ray Job runs for an entrypoint, the environment each rank's command gets, the
failure message, how a rank's command is stopped and that it never outlives its worker.

No Ray is started: the process tests run real short-lived children (``sleep`` in Python).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from controlplane.loop.act.jobs.launching import entrypoint_command
from jobs import launcher
from jobs.launcher import (
    CommandFailed,
    CommandProcess,
    command_failure,
    main,
    report_started,
    stop_running_command,
    torchrun_env,
)
from jobs.launcher.child_process import registered
from jobs.launcher.gang import gang_configs

PY = sys.executable
SLEEP_60 = [PY, "-c", "import time; time.sleep(60)"]

# -- what the Ray Job runs ----------------------------------------------------------------------

LAUNCH = ["/py", "-m", "jobs.launcher"]
COMMAND = [*LAUNCH, "--command", "--"]


@pytest.mark.parametrize(
    "entrypoint, argv",
    [
        ("pkg.mod:fn", [*LAUNCH, "pkg.mod:fn"]),
        ("  pkg.mod:fn ", [*LAUNCH, "pkg.mod:fn"]),
        ("python train.py --lr 1", [*COMMAND, "/py", "train.py", "--lr", "1"]),
        ("python3 train.py", [*COMMAND, "/py", "train.py"]),
        ("python", [*COMMAND, "/py"]),
        ("bash run.sh", [*COMMAND, "bash", "run.sh"]),
        ("/opt/venv/bin/python -u t.py", [*COMMAND, "/opt/venv/bin/python", "-u", "t.py"]),
        ("pythonista t.py", [*COMMAND, "pythonista", "t.py"]),
        ("train.py python", [*COMMAND, "train.py", "python"]),
        (
            "python t.py --name 'a b' --quote \"it's\"",
            [*COMMAND, "/py", "t.py", "--name", "a b", "--quote", "it's"],
        ),
        ("python t.py '$HOME' 'x;rm -rf /'", [*COMMAND, "/py", "t.py", "$HOME", "x;rm -rf /"]),
        ("bash -c 'a && b | c'", [*COMMAND, "bash", "-c", "a && b | c"]),
        ("pkg.mod:fn extra", [*COMMAND, "pkg.mod:fn", "extra"]),
    ],
    ids=[
        "module-function",
        "module-function-padded",
        "python-command",
        "python3-command",
        "python-alone",
        "other-command",
        "python-by-path-kept",
        "python-prefix-is-not-python",
        "python-later-kept",
        "args-with-spaces-and-quotes",
        "shell-syntax-stays-words",
        "shell-by-bash-c",
        "function-with-args-is-a-command",
    ],
)
def test_entrypoint_command(entrypoint: str, argv: list[str]) -> None:
    assert shlex.split(entrypoint_command(entrypoint, python="/py")) == argv


def test_entrypoint_command_quotes_the_interpreter_and_every_word() -> None:
    got = entrypoint_command("python t.py 'a b'", python="/opt/my env/python")
    assert got == (
        "'/opt/my env/python' -m jobs.launcher --command -- '/opt/my env/python' t.py 'a b'"
    )


@pytest.mark.parametrize(
    "entrypoint, message",
    [("", "empty"), ("   ", "empty"), ("python 'unclosed", "cannot be split")],
    ids=["empty", "blank", "unbalanced-quote"],
)
def test_entrypoint_command_refuses(entrypoint: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        entrypoint_command(entrypoint, python="/py")


# -- the environment of a rank's command --------------------------------------------------------


def rank_env(base: dict[str, str] | None = None, **over: Any) -> dict[str, str]:
    args: dict[str, Any] = {
        "rank": 3,
        "world_size": 4,
        "local_rank": 1,
        "local_world_size": 2,
        "node_rank": 1,
        "master_addr": "10.0.0.5",
        "master_port": 29500,
    }
    return torchrun_env(base or {}, **{**args, **over})


def test_torchrun_env_is_what_torchrun_sets() -> None:
    assert rank_env() == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "ROLE_RANK": "3",
        "ROLE_WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29500",
        "PYTHONUNBUFFERED": "1",
    }


def test_torchrun_env_passes_the_job_environment_through_and_adds_no_secret() -> None:
    base = {
        "RCP_JOB_ID": "j-1",
        "RCP_ATTEMPT": "2",
        "RCP_SIGNAL_TOKEN": "tok",
        "RCP_CHECKPOINT_PREFIX": "s3://b/jobs/j-1",
        "CUDA_VISIBLE_DEVICES": "2,3",
        "PATH": "/usr/bin",
        "RANK": "99",  # a stale value from the worker's own environment
        "PYTHONUNBUFFERED": "0",
    }
    env = rank_env(dict(base))
    for key in ("RCP_JOB_ID", "RCP_ATTEMPT", "RCP_SIGNAL_TOKEN", "RCP_CHECKPOINT_PREFIX"):
        assert env[key] == base[key]
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["PATH"] == "/usr/bin"
    assert env["RANK"] == "3"
    assert env["PYTHONUNBUFFERED"] == "0"  # the job's choice stands
    assert not [k for k in env if k.startswith("AWS_")]
    added = set(env) - set(base)
    assert added == {
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    }


def test_torchrun_env_leaves_its_base_alone() -> None:
    base = {"RCP_JOB_ID": "j-1"}
    rank_env(base)
    assert base == {"RCP_JOB_ID": "j-1"}


def test_free_port_can_be_bound() -> None:
    import socket

    port = launcher.free_port()
    with socket.socket() as s:
        s.bind(("", port))


# -- the failure message --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "rank, returncode, message",
    [
        (1, 3, "rank 1 of 4 (node 10.0.0.5): the command exited with code 3"),
        (0, 1, "rank 0 of 4 (node 10.0.0.5): the command exited with code 1"),
        (2, -9, "rank 2 of 4 (node 10.0.0.5): the command was killed by signal 9 (SIGKILL)"),
        (3, -11, "rank 3 of 4 (node 10.0.0.5): the command was killed by signal 11 (SIGSEGV)"),
        (3, -200, "rank 3 of 4 (node 10.0.0.5): the command was killed by signal 200 (unknown)"),
    ],
    ids=["exit-3", "exit-1", "sigkill", "sigsegv", "unknown-signal"],
)
def test_command_failure(rank: int, returncode: int, message: str) -> None:
    assert command_failure(rank, 4, "10.0.0.5", returncode) == message


class _GangError(Exception):
    """Stands in for Ray Train's WorkerGroupError: per-rank errors in `worker_failures`."""

    def __init__(self, worker_failures: dict[int, BaseException]) -> None:
        super().__init__("Training failed due to worker errors:\n...")
        self.worker_failures = worker_failures


def _traceback_of(line: str) -> Exception:
    """What Ray Train keeps of a worker's error: its traceback text (str of the wrapper)."""
    return Exception(f'Traceback (most recent call last):\n  File "x.py", line 1\n{line}\n')


@pytest.mark.parametrize(
    "error, summary",
    [
        (
            _GangError({1: _traceback_of("jobs.launcher.CommandFailed: rank 1 of 4 (node n): x")}),
            "rank 1 of 4 (node n): x",
        ),
        (
            _GangError({3: CommandFailed("rank 3: b"), 0: CommandFailed("rank 0: a")}),
            "rank 0: a; rank 3: b",
        ),
        (_GangError({2: _traceback_of("ValueError: bad lr")}), "ValueError: bad lr"),
        (RuntimeError("controller died\n\n"), "controller died"),
        (RuntimeError(""), "RuntimeError"),
    ],
    ids=["rank-traceback", "ranks-in-order", "other-error", "no-worker-failures", "empty"],
)
def test_gang_failure_summary(error: BaseException, summary: str) -> None:
    assert launcher.gang_failure_summary(error) == summary


# -- a rank's command: stopped, and never outliving its worker ---------------------------------


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie awaiting its reaper is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def eventually(what: str, check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_file(path: Path, timeout_s: float = 10.0) -> str:
    eventually(f"{path}", lambda: path.exists() and path.read_text().strip(), timeout_s)
    return path.read_text().strip()


def test_a_command_exit_status_comes_back() -> None:
    child = CommandProcess([PY, "-c", "raise SystemExit(3)"], os.environ)
    assert child.wait() == 3
    assert child.stop(grace_s=1) == 3


def test_stop_terminates_a_running_command() -> None:
    child = CommandProcess(SLEEP_60, os.environ)
    t0 = time.monotonic()
    assert child.stop(grace_s=5) == -signal.SIGTERM
    assert time.monotonic() - t0 < 5
    assert not alive(child.pid)


def test_stop_kills_a_command_that_ignores_sigterm_after_the_grace(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = (
        "import signal, time, pathlib; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"pathlib.Path({str(ready)!r}).write_text('1'); time.sleep(60)"
    )
    child = CommandProcess([PY, "-c", code], os.environ)
    wait_file(ready)
    t0 = time.monotonic()
    assert child.stop(grace_s=0.5) == -signal.SIGKILL
    assert 0.4 < time.monotonic() - t0 < 5


def test_stop_ends_what_the_command_left_behind(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild"
    code = (
        "import subprocess, sys, pathlib; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"pathlib.Path({str(pid_file)!r}).write_text(str(p.pid))"
    )
    child = CommandProcess([PY, "-c", code], os.environ)
    assert child.wait() == 0
    grandchild = int(wait_file(pid_file))
    assert alive(grandchild)
    child.stop(grace_s=2)
    eventually("the grandchild to end", lambda: not alive(grandchild))


def test_a_command_dies_with_the_worker_that_started_it(tmp_path: Path) -> None:
    """The worker is killed outright (SIGKILL: no finally runs); its command goes too."""
    worker_code = textwrap.dedent(
        f"""
        import os, sys, time
        from jobs.launcher import CommandProcess
        child = CommandProcess({SLEEP_60!r}, os.environ)
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    worker = subprocess.Popen(
        [PY, "-c", worker_code],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert worker.stdout is not None
        child_pid = int(worker.stdout.readline())
        assert alive(child_pid)
        worker.kill()
        worker.wait()
        eventually("the command to die with its worker", lambda: not alive(child_pid))
    finally:
        worker.kill()
        worker.wait()


def test_stop_running_command_stops_the_registered_command_and_marks_it() -> None:
    assert stop_running_command(grace_s=1) is False  # nothing runs
    child = CommandProcess(SLEEP_60, os.environ)
    with registered(child):
        assert stop_running_command(grace_s=5) is True
    assert child.stop_requested and child.wait() == -signal.SIGTERM
    assert stop_running_command(grace_s=1) is False


def test_a_missing_program_fails_at_spawn() -> None:
    with pytest.raises(FileNotFoundError):
        CommandProcess(["/nonexistent/rcp-no-such-program"], os.environ)


# -- reporting that a worker started ---------------------------------------------------------------


class _Handle:
    resolve_interval_s = 0.01

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def call(self, method: str, *args: Any, timeout_s: float) -> Any:
        self.calls.append((method, args))
        return True


def test_report_started_carries_the_workers_pid_and_node() -> None:
    handle = _Handle()
    assert report_started("j-1", 2, 3, "tok", handle=handle, pid=4321, node_id="ab12") is True
    assert handle.calls == [("worker_started", ("j-1", 2, 3, "tok", 4321, "ab12"))]


class _Answers(_Handle):
    """Answers each call with the next of `answers` (the last one from then on)."""

    def __init__(self, *answers: bool) -> None:
        super().__init__()
        self.answers = list(answers)

    def call(self, method: str, *args: Any, timeout_s: float) -> Any:
        super().call(method, *args, timeout_s=timeout_s)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@pytest.mark.parametrize(
    "answers, deadline_s, reported, calls",
    [
        ((True,), 5.0, True, 1),
        ((False, False, True), 5.0, True, 3),
        ((False,), 0.0, False, 1),
    ],
    ids=[
        "accepted at once",
        "refused until the controller registers the attempt again (head restarted)",
        "refused past the deadline (a wrong token): False",
    ],
)
def test_report_started_asks_again_while_the_actor_refuses(
    answers: tuple[bool, ...], deadline_s: float, reported: bool, calls: int
) -> None:
    handle = _Answers(*answers)
    got = report_started("j-1", 2, 3, "tok", deadline_s=deadline_s, handle=handle)
    assert (got, len(handle.calls)) == (reported, calls)


def test_report_started_without_a_pid_calls_as_before() -> None:
    handle = _Handle()
    report_started("j-1", 2, 3, "tok", handle=handle)
    assert handle.calls == [("worker_started", ("j-1", 2, 3, "tok"))]


# -- the gang and the entry point ------------------------------------------------------------------


def test_the_gang_under_the_control_plane_is_pinned_and_not_retried_without_restarts() -> None:
    env = {
        launcher.ENV_NUM_WORKERS: "4",
        launcher.ENV_GPUS_PER_WORKER: "2",
        launcher.ENV_CPUS_PER_WORKER: "1.5",
        launcher.ENV_NODE_IDS: "n2,n1",
        launcher.ENV_STORAGE_PATH: "/tmp/train",
        "RCP_JOB_ID": "j-7",
    }
    scaling, run = gang_configs(env)
    assert scaling.num_workers == 4 and scaling.use_gpu
    assert scaling.resources_per_worker == {"CPU": 1.5, "GPU": 2, launcher.POOL_RESOURCE: 1}
    assert scaling.label_selector == {"pool": "cluster", launcher.NODE_ID_LABEL: "in(n1,n2)"}
    assert run.name == "j-7" and run.storage_path == "/tmp/train"
    assert run.failure_config.max_failures == 0 and not run.callbacks


def test_the_gang_restarts_in_place_as_often_as_the_runner_says_and_reports_it() -> None:
    from jobs.launcher.in_place import ENV_RESTARTS_IN_PLACE, InPlaceReporter

    env = {launcher.ENV_NUM_WORKERS: "2", "RCP_JOB_ID": "j-7", ENV_RESTARTS_IN_PLACE: "2"}
    _, run = gang_configs(env)
    assert run.failure_config.max_failures == 2
    [reporter] = run.callbacks
    assert isinstance(reporter, InPlaceReporter) and reporter.max_restarts == 2
    # Outside the control plane a stray variable restarts nothing.
    _, local = gang_configs({ENV_RESTARTS_IN_PLACE: "2"})
    assert local.failure_config.max_failures == 0


def test_the_gang_outside_the_control_plane_is_one_cpu_worker() -> None:
    scaling, run = gang_configs({})
    assert scaling.num_workers == 1 and not scaling.use_gpu
    assert scaling.resources_per_worker == {"CPU": 1.0}
    assert scaling.label_selector is None
    assert run.name == "rcp-local-run"


def test_a_command_gang_shares_its_nodes_gpus_like_torchrun() -> None:
    backend = launcher.command_backend_config().backend_cls()
    assert backend.share_cuda_visible_devices is True


@pytest.mark.parametrize("argv", [[], ["--command"], ["--command", "--"], ["a:b", "c"]], ids=str)
def test_main_refuses_a_missing_command(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_main_runs_the_command_and_ends_a_failed_gangs_log_with_what_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[list[str]] = []
    monkeypatch.setattr(launcher, "run_command", lambda argv: ran.append(list(argv)))
    assert main(["--command", "--", "python", "t.py", "--lr", "1"]) == 0
    assert ran == [["python", "t.py", "--lr", "1"]]

    def fail(argv: list[str]) -> None:
        raise _GangError({1: CommandFailed("rank 1 of 2 (node n): the command exited with code 3")})

    monkeypatch.setattr(launcher, "run_command", fail)
    assert main(["--command", "--", "python", "t.py"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "rcp: the gang failed: rank 1 of 2 (node n): the command exited with code 3"


def test_the_runner_takes_the_launchers_failure_line_as_the_attempts_reason() -> None:
    from controlplane.adapters.job_logs import tail_of

    log = (
        "step 1\nrank 1 of 4 (node 127.0.0.1): the command exited with code 3\n"
        f"{launcher.GANG_FAILED_PREFIX}rank 1 of 4 (node 127.0.0.1): the command exited with "
        "code 3\n(RayTrainWorker pid=9) rank 0: command stopped (the gang is ending)\n"
    )
    assert tail_of(log, 400) == "rank 1 of 4 (node 127.0.0.1): the command exited with code 3"
    # Else the exception's own line (its type and message), never a cut of the traceback.
    assert tail_of("Traceback ...\nNameError: name 'lr' is not defined\n", 20) == (
        "NameError: name 'lr'"
    )
    crash = (
        'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n'
        "    x = lr\n        ^^\nNameError: name 'lr' is not defined\n"
        "(raylet) the worker exited; its resources are released\n"
    )
    assert tail_of(crash, 400) == "NameError: name 'lr' is not defined"
    assert tail_of("step 1\nstep 2\nall done, oddly\n", 11) == "done, oddly"
    assert tail_of("  ", 10) == "no logs"
