"""Starts the control plane in the RayCluster's head pod, and keeps it there.

Owns: what `rcp up` does after the cluster exists, for a cluster that KubeRay made: load the
config file (``RCP_CONFIG``) with ``ray.node_ip`` set to the head pod's IP (``RCP_NODE_IP``),
wait for the head's GCS, connect as a Ray driver, start Serve's HTTP proxy on the head and
deploy the production Serve app (`serve.control.operations.deploy`, which keeps deployed replica
targets and route weights), then run the controller.

Two modes:

* in-process (the default, shipped): the bootstrap is the head pod's ``rcp-controller``
  container, next to ``ray-head`` (raycluster.yaml). After Serve it runs the controller in
  this very process (`controlplane.controller.in_process.run_in_process`): no ``rcp-controller`` actor
  exists, and Ray never starts a worker process in this container, so the API token, the job
  store (PVC ``rcp-state``) and the actuator's bearer token, mounted here only, are out of
  reach of any job, even one placed on the head (``pool_head``, node affinity), which runs in
  ``ray-head``. It reaches the head's raylet through the shared ``/tmp/ray`` (Ray's session
  dir and sockets). It exits non-zero on a fatal error (a corrupt job store: the StoreError
  message is printed; Ray lost), so Kubernetes restarts the container, and 0 on SIGTERM.
* ``--actor``: the former way, for a head with a single container: create the
  ``rcp-controller`` actor (`controlplane.controller.actor.deploy`, which finds a running one
  instead), then check every ``RCP_BOOTSTRAP_CHECK_S`` seconds (default 30) that it still
  exists and deploy it again if not. The actor then runs in the Ray head container, beside
  user code that asks for the head: no separation. ``--actor --once`` deploys and exits.

Must not: start or stop Ray (KubeRay's ``ray start`` in the ``ray-head`` container does),
change replica targets or route weights (the controller owns them), or print credentials.

Shipped as the ConfigMap ``rcp-bootstrap`` (kustomization.yaml).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controlplane.config import Config

log = logging.getLogger("rcp.bootstrap")

CONFIG_ENV = "RCP_CONFIG"
NODE_IP_ENV = "RCP_NODE_IP"
CHECK_ENV = "RCP_BOOTSTRAP_CHECK_S"


class BootstrapError(RuntimeError):
    """The bootstrap cannot start the control plane; the message says what to fix."""


def config_inputs(env: Mapping[str, str]) -> tuple[str, list[str]]:
    """The config file and the overrides the head pod's environment asks for.

    >>> config_inputs({"RCP_CONFIG": "/etc/rcp/config/rcp.yaml", "RCP_NODE_IP": "10.0.0.7"})
    ('/etc/rcp/config/rcp.yaml', ['ray.node_ip=10.0.0.7'])
    """
    path = env.get(CONFIG_ENV, "").strip()
    if not path:
        raise BootstrapError(
            f"{CONFIG_ENV} is not set: point it at the mounted config file "
            "(raycluster.yaml sets /etc/rcp/config/rcp.yaml)"
        )
    node_ip = env.get(NODE_IP_ENV, "").strip()
    if not node_ip:
        raise BootstrapError(
            f"{NODE_IP_ENV} is not set: give the head container the pod IP "
            "(env valueFrom fieldRef status.podIP)"
        )
    return path, [f"ray.node_ip={node_ip}"]


def check_interval_s(env: Mapping[str, str]) -> float:
    """Seconds between two checks that the controller actor exists (default 30, >= 1)."""
    raw = env.get(CHECK_ENV, "30")
    try:
        value = float(raw)
    except ValueError as exc:
        raise BootstrapError(f"{CHECK_ENV}: must be a number of seconds, got {raw!r}") from exc
    if value < 1:
        raise BootstrapError(f"{CHECK_ENV}: must be >= 1, got {raw!r}")
    return value


def wait_for_port(host: str, port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            if s.connect_ex((host, port)) == 0:
                return
        time.sleep(1.0)
    raise BootstrapError(f"the head's GCS did not answer on {host}:{port} within {timeout_s:.0f}s")


def deploy_serve(cfg: Config) -> None:
    """Serve's proxy on the head and the production app, if configured."""
    from serve.control import operations

    if cfg.serve.deploy_app:
        operations.deploy(
            cfg.serving, http_host=cfg.ray.node_ip, http_port=cfg.serve.http_port, wait=True
        )


def deploy_all(cfg: Config) -> str:
    """Serve (proxy + app, if configured) and the controller actor; returns the API URL."""
    from controlplane.controller.actor import deploy

    deploy_serve(cfg)
    return deploy(cfg)


def serve_and_run_controller(cfg: Config, interval_s: float) -> int:
    """Serve, then the controller in this process until SIGTERM or a fatal error."""
    from controlplane.controller.in_process import run_in_process as run_controller

    while True:
        try:
            deploy_serve(cfg)
            break
        except Exception as exc:  # keep trying: the head may still be coming up
            log.error("deploying Serve failed, retrying in %.0fs: %s", interval_s, exc)
            time.sleep(interval_s)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    code = run_controller(cfg, stop=stop)
    log.info("the in-process controller ended: %s", code.name)
    return int(code)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--actor",
        action="store_true",
        help="run the controller as the rcp-controller actor (no separation from user code)",
    )
    parser.add_argument("--once", action="store_true", help="with --actor: deploy, then exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rcp-bootstrap %(message)s")

    from controlplane.config import ConfigError, load_config

    try:
        path, overrides = config_inputs(os.environ)
        interval_s = check_interval_s(os.environ)
        cfg = load_config(path, overrides)
    except (BootstrapError, ConfigError) as exc:
        log.error("cannot start the control plane: %s", exc)
        return 2
    if args.once and not args.actor:
        log.error("--once needs --actor: the in-process controller runs until stopped")
        return 2

    import ray

    from controlplane.controller.actor import get_controller

    wait_for_port(cfg.ray.node_ip, cfg.ray.gcs_port, cfg.ray.ready_timeout_s)
    ray.init(
        address=f"{cfg.ray.node_ip}:{cfg.ray.gcs_port}",
        # The head's raylet is on this IP (the pod's, or loopback locally); without it Ray
        # guesses the node's address and may not find the raylet in a second container.
        _node_ip_address=cfg.ray.node_ip,
        namespace="rcp",
        logging_level="ERROR",
        log_to_driver=False,
    )
    if not args.actor:
        return serve_and_run_controller(cfg, interval_s)
    while True:
        try:
            if get_controller() is None or args.once:
                log.info("control plane API at %s", deploy_all(cfg))
            if args.once:
                return 0
        except Exception as exc:  # keep trying: the head may still be coming up
            log.error("deploy failed, retrying in %.0fs: %s", interval_s, exc)
            if args.once:
                return 1
        time.sleep(interval_s)


if __name__ == "__main__":
    sys.exit(main())
