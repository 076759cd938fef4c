"""Serve on the local cluster: its proxies, the edge in front of them, the production app.

Owns: starting Serve (`start_serve`), the edge on ``serve.http_port`` (HAProxy, configured by
`serve.edge`, outside Ray so it outlives the head: `start_edge`, and `ensure_edge` for a
running cluster) with its files under ``<state_dir>/edge``, and deploying the production Serve
app (`deploy_serving`).
Must not: give the edge anything of the cluster's environment but its id and PATH, or bind
anything but ``ray.node_ip``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controlplane.config import Config
from controlplane.local.ports import port_in_use
from controlplane.local.processes import CLUSTER_ID_ENV
from controlplane.local.readiness import wait_for_port
from controlplane.local.state_file import write_state
from controlplane.statefiles import private_dir
from serve.edge.config import CONFIG_FILE, EdgeSettings, StaticProxies
from serve.edge.process import check as check_edge
from serve.edge.process import command as edge_command
from serve.edge.process import write as write_edge

__all__ = [
    "deploy_serving",
    "edge_dir",
    "edge_settings",
    "ensure_edge",
    "start_edge",
    "start_serve",
]

Echo = Callable[[str], None]


def start_serve(cfg: Config, head_proxy_port: int) -> None:
    """Serve, its head's proxy on `head_proxy_port` (each worker node's proxy binds the
    port its node was given, ``controlplane.local.provider``)."""
    from serve.control.client import (
        start_serve as start,
    )  # deferred: it imports ray and ray.serve (heavy)

    start(cfg.ray.node_ip, head_proxy_port, cfg.serve.proxy_location)


def deploy_serving(cfg: Config, echo: Echo) -> None:
    """Deploy (or update) the production Serve app; keeps deployed targets and weights."""
    from serve.control import operations  # deferred: it imports ray and ray.serve (heavy)

    state = operations.deploy(cfg.serving, wait=True)
    for m in cfg.serving.models:
        where = ", ".join(
            f"{state.target(m.name, pool)} on {pool}" for pool in ("cluster", "external")
        )
        echo(f"model {m.name}: POST /v1/models/{m.name}/predict ({where})")


def edge_dir(cfg: Config) -> Path:
    return cfg.state_path / "edge"


def edge_settings(cfg: Config, state: dict[str, Any]) -> EdgeSettings:
    """The edge's settings: HAProxy over the Serve proxies the state file records."""
    host = cfg.ray.node_ip
    ports = state["serve_proxies"]
    work_dir = edge_dir(cfg)
    return EdgeSettings(
        listen_host=host,
        listen_port=cfg.serve.http_port,
        admin_host=host,
        admin_port=cfg.serve.edge_admin_port,
        work_dir=str(work_dir),
        proxies=StaticProxies(
            nodes=tuple((host, int(p)) for p in ports["nodes"]), head=(host, ports["head"])
        ),
        route_prefix=cfg.serving.route_prefix,
        ingress=cfg.serving.ingress,
        stats_socket=str(work_dir / "admin.sock"),
        threads=1,  # one core carries thousands of requests a second; the machine is shared
    )


def start_edge(cfg: Config, state: dict[str, Any], state_file: Path, log_dir: Path) -> None:
    """The edge on ``serve.http_port``: HAProxy over the nodes' Serve proxies
    (`serve.edge`), outside Ray, so it outlives the head. Its environment is the cluster's
    id (so `down` finds and stops it) and PATH, nothing else: no Ray token path, no
    storage keys. A configuration HAProxy refuses raises before anything starts. Its pid is
    recorded in `state` (written to `state_file`)."""
    host, port = cfg.ray.node_ip, cfg.serve.http_port
    private_dir(edge_dir(cfg))
    config = write_edge(edge_settings(cfg, state))
    check_edge(config)
    env = {CLUSTER_ID_ENV: state["cluster_id"], "PATH": os.environ.get("PATH", os.defpath)}
    with open(log_dir / "serve-edge.log", "ab") as out:
        proc = subprocess.Popen(
            edge_command(config),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    state["edge_pid"] = proc.pid
    write_state(state_file, state)
    wait_for_port(host, port, 30, "the serve edge")


def ensure_edge(
    cfg: Config, state: dict[str, Any], state_file: Path, log_dir: Path, echo: Echo
) -> None:
    """The edge again, for a running cluster that has one: started if it is gone (it runs
    outside Ray and outlives the head, but a process can still die), reloaded when its
    rendered configuration changed (a new ``serving.ingress`` limit, say)."""
    if "serve_proxies" not in state or state.get("status") != "running":
        return
    if not port_in_use(cfg.ray.node_ip, cfg.serve.http_port):
        echo("serve edge: not answering; starting it again")
        start_edge(cfg, state, state_file, log_dir)
        return
    config = edge_dir(cfg) / CONFIG_FILE
    before = config.read_text() if config.exists() else None
    written = write_edge(edge_settings(cfg, state))
    pid = state.get("edge_pid")
    if before != written.read_text() and isinstance(pid, int):
        check_edge(written)
        os.kill(pid, signal.SIGUSR2)  # HAProxy's master reloads without dropping a request
        echo("serve edge: configuration changed; reloaded")
