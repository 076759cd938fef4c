"""The controller in this process: the Kubernetes way to run the control plane.

Owns: running `actor.Controller` in the calling process, a connected Ray driver, until it is
stopped or breaks. On KubeRay the head pod's ``rcp-controller`` container runs this (through
infra/k8s/bootstrap/rcp_bootstrap.py): it holds the control plane's credentials, and Ray
never starts a worker process in it, so a job that lands on the head cannot read them.

`run_in_process(cfg)` stops an ``rcp-controller`` actor left by an older install (one
controller per store: two would admit the same queue twice), reads the first admin's token
(`tokens.admin_token`), runs ``Controller(cfg, token)``, writes the API URL, then checks every
`check_interval_s` that the tick thread lives and ``/healthz`` answers. It returns the
container's exit status (`ExitCode`): non-zero for a store it cannot open or a dead loop, so
Kubernetes restarts the container; 0 for a stop request (SIGTERM).

Must not: create an actor for the controller, start or stop Ray, deploy Serve (the bootstrap
does, first), or print credentials.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from controlplane.config import Config, to_dict
from controlplane.controller.actor import Controller, _healthy, get_controller
from controlplane.tokens import TokenFileError, admin_token, write_url

__all__ = ["ExitCode", "run_in_process", "stop_leftover_actor"]

log = logging.getLogger(__name__)

LEFTOVER_ACTOR_WAIT_S = 30.0
API_FAILED_CHECKS = 3
"""Checks in a row that /healthz must miss before the process exits to be restarted."""


class ExitCode(enum.IntEnum):
    """The container's exit status for each way `run_in_process` ends."""

    STOPPED = 0
    """Asked to stop (SIGTERM): a clean shutdown."""
    STORE = 3
    """The job store cannot be opened: fix the file named in the message, then restart."""
    LOOP_DIED = 4
    """The tick thread or the API thread is gone: restart to rebuild everything."""
    LEFTOVER_ACTOR = 5
    """An ``rcp-controller`` actor would not go away: two controllers must never share a store."""
    TOKEN = 6
    """``api.admin_token_file`` is configured but missing, unreadable or too short."""


def stop_leftover_actor(
    get: Callable[[], Any], kill: Callable[[Any], None], *, wait_s: float = LEFTOVER_ACTOR_WAIT_S
) -> bool:
    """Kill the ``rcp-controller`` actor if one runs (an install from before the in-process
    controller, or a local ``rcp up``), and wait until its name is free. True when none is
    left. `get` is `actor.get_controller`, `kill` kills without restart."""
    handle = get()
    if handle is None:
        return True
    log.warning(
        "an rcp-controller actor runs on this cluster (an older install); stopping it: one "
        "controller per job store"
    )
    kill(handle)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if get() is None:
            return True
        time.sleep(0.5)
    return get() is None


def _ray_kill(handle: Any) -> None:
    import ray

    ray.kill(handle, no_restart=True)


def run_in_process(
    cfg: Config,
    *,
    stop: threading.Event | None = None,
    check_interval_s: float = 5.0,
    find_actor: Callable[[], Any] | None = None,
    kill_actor: Callable[[Any], None] = _ray_kill,
) -> ExitCode:
    """Run the controller in this process until `stop` is set or it breaks (module docstring).

    The caller is a connected Ray driver in namespace ``rcp``. `find_actor` (default
    `actor.get_controller`) and `kill_actor` are Ray's, swapped only by unit tests."""
    stop = stop or threading.Event()
    if not stop_leftover_actor(
        find_actor or get_controller, kill_actor, wait_s=LEFTOVER_ACTOR_WAIT_S
    ):
        log.error(
            "the rcp-controller actor is still there after %.0fs; stop it (ray.kill) and "
            "restart this container",
            LEFTOVER_ACTOR_WAIT_S,
        )
        return ExitCode.LEFTOVER_ACTOR
    try:
        token = admin_token(cfg)
    except TokenFileError as exc:
        print(f"rcp-controller: cannot start: {exc}", flush=True)
        return ExitCode.TOKEN
    controller = Controller(to_dict(cfg), token, start=True)
    if controller.store_problem is not None:
        # The message names the file and what to do (StoreError); it holds no credential.
        print(f"rcp-controller: cannot start: {controller.store_problem}", flush=True)
        return ExitCode.STORE
    try:
        url = controller.url()
        write_url(cfg.state_path, url)
        log.info("control plane API at %s (in-process controller)", url)
        failed_checks = 0
        while not stop.wait(check_interval_s):
            if not controller.loop.alive():
                problem = "the tick thread ended"
            elif not _healthy(url):
                failed_checks += 1
                problem = f"/healthz did not answer {failed_checks} times in a row"
                if failed_checks < API_FAILED_CHECKS:
                    continue
            else:
                failed_checks = 0
                continue
            log.error("the in-process controller broke: %s; exiting to be restarted", problem)
            return ExitCode.LOOP_DIED
        return ExitCode.STOPPED
    finally:
        controller.shutdown()
