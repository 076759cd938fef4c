"""The embedded local cluster: what `rcp up` starts and `rcp down` stops.

Owns: the lifecycle of one cluster per state dir (`LocalCluster`): the order `up` starts its
parts in and what it records in the state file as it goes, so that a second `up` reports what
runs and `down` stops exactly that; cleaning up after a failed start; starting again a head
that died while its workers live on (`restart_head`); and `down`. The parts are the sibling
modules': the Ray head and its autoscaler (`head_process`, `head`, `autoscaler`), ports
(`ports`), the GCS store (`redis`), the object store (`object_store`), Serve and its edge
(`serving`), Prometheus (`prometheus`), the state file (`state_file`) and the cluster's
processes (`processes`).

Must not: touch Ray processes it did not start (no ``ray stop``), bind anything but
``ray.node_ip`` (127.0.0.1 by default), or log storage credentials or the Ray token.

Security model (docs/operations.md): every Ray process runs with token auth; `up` writes a
fresh random token to ``<state_dir>/ray-token`` (0600, state dir 0700) and every Ray process
and client finds it through ``RAY_AUTH_TOKEN_PATH``, never through the token's value in an
environment variable (a job's runtime env shows in the dashboard). Everything `up` and the
cluster's processes write is owner-only (umask 077). Only the `cluster` pool's workers offer
`JOB_DRIVER_RESOURCE`, so job drivers (user code) never run on the head beside the control
plane's credentials.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from controlplane.config import Config, from_dict, to_dict
from controlplane.controller.actor import deploy
from controlplane.local.head import node_env
from controlplane.local.head_process import start_gcs_store, start_head
from controlplane.local.object_store import start_object_store
from controlplane.local.ports import check_ports_free, port_in_use, serve_proxy_ports
from controlplane.local.processes import (
    NODE_ID_ENV,
    find_cluster_processes,
    node_processes,
    stop_cluster_processes,
    terminate,
)
from controlplane.local.prometheus import prometheus_url, start_for_cluster
from controlplane.local.readiness import wait_for_cluster_pool
from controlplane.local.redis import LocalRedis
from controlplane.local.serving import deploy_serving, ensure_edge, start_edge, start_serve
from controlplane.local.state_file import (
    Endpoint,
    head_node_id,
    is_running,
    read_state,
    state_file_path,
    write_state,
)
from controlplane.ray_connection import (
    ClusterError,
    connect,
    gcs_address,
    ray_temp_dir,
    ray_token_path,
)
from controlplane.statefiles import narrow_private, private_dir, private_umask, write_private

__all__ = ["LocalCluster"]

Echo = Callable[[str], None]


class LocalCluster:
    """One embedded cluster per state dir. Methods are safe to call repeatedly."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.state_dir = cfg.state_path
        self.temp_dir = ray_temp_dir(cfg)
        self.log_dir = self.state_dir / "logs"
        self.state_file = state_file_path(cfg)

    # -- state file -------------------------------------------------------------------------
    def read_state(self) -> dict[str, Any] | None:
        return read_state(self.state_file)

    def running_config(self) -> Config | None:
        """The config the running cluster was started with, if one runs."""
        state = self.read_state()
        if state and is_running(state):
            return from_dict(state["config"])
        return None

    # -- up ---------------------------------------------------------------------------------
    def up(self, echo: Echo = print) -> list[Endpoint]:
        """Start everything and return the endpoints; if already running, report them. Runs with
        umask 077, which every process it starts inherits."""
        with private_umask():
            return self._up(echo)

    def _up(self, echo: Echo) -> list[Endpoint]:
        self._make_state_dir_private(echo)
        state = self.read_state()
        if state and is_running(state):
            echo(f"already running (cluster {state['cluster_id']}, started {state['started_at']})")
            ensure_edge(self.cfg, state, self.state_file, self.log_dir, echo)
            known = [Endpoint(**e) for e in state["endpoints"]]
            for ep in known:
                echo(f"{ep.name}: {ep.url}")
            echo(f"ray token: {ray_token_path(self.cfg)}")
            return known
        if state and self._head_lost(state):
            echo(f"the head of cluster {state['cluster_id']} is down and its workers live on")
            LocalCluster(from_dict(state["config"])).restart_head(echo)
            return [Endpoint(**e) for e in state["endpoints"]]
        if state:
            echo(f"cleaning up a cluster that is no longer running ({state['cluster_id']})")
            self._stop(state, echo=lambda _m: None)

        check_ports_free(self.cfg)
        cluster_id = uuid.uuid4().hex[:12]
        # A new token for every new cluster; clients read it from the file (never printed).
        write_private(ray_token_path(self.cfg), secrets.token_hex(32) + "\n")
        env = node_env(self.cfg, cluster_id)
        if self.cfg.observability.prometheus:
            # The dashboard reads it when the head starts: its Metrics tab queries this server.
            env["RAY_PROMETHEUS_HOST"] = prometheus_url(self.cfg)
        private_dir(self.log_dir)
        private_dir(self.temp_dir)
        state = {
            "cluster_id": cluster_id,
            "status": "starting",
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "temp_dir": str(self.temp_dir),
            "config": to_dict(self.cfg),
            "endpoints": [],
            "serve_proxies": serve_proxy_ports(self.cfg),
        }
        write_state(self.state_file, state)
        endpoints: list[Endpoint] = []

        def announce(ep: Endpoint) -> None:
            endpoints.append(ep)
            state["endpoints"] = [ep.__dict__ for ep in endpoints]
            write_state(self.state_file, state)
            echo(f"{ep.name}: {ep.url}")

        try:
            if self.cfg.storage.embedded:
                announce(start_object_store(self.cfg, env, self.log_dir))
            if self.cfg.ray.gcs_fault_tolerance:
                announce(start_gcs_store(self.cfg, env, fresh=True))
            start_head(
                self.cfg,
                env,
                self.state_dir / "autoscaler.yaml",
                self.log_dir,
                state["serve_proxies"]["nodes"],
            )
            ip = self.cfg.ray.node_ip
            announce(Endpoint("dashboard", f"http://{ip}:{self.cfg.ray.dashboard_port}"))
            announce(Endpoint("ray", gcs_address(self.cfg)))
            echo(
                f"ray token: {ray_token_path(self.cfg)} (clients and the dashboard's login read it)"
            )
            connect(self.cfg)
            wait_for_cluster_pool(self.cfg)
            metrics_port = self.cfg.ray.metrics_export_port
            announce(Endpoint("metrics", f"http://{ip}:{metrics_port}/metrics"))
            start_serve(self.cfg, state["serve_proxies"]["head"])
            start_edge(self.cfg, state, self.state_file, self.log_dir)
            announce(Endpoint("serve", f"http://{ip}:{self.cfg.serve.http_port}"))
            if self.cfg.serve.deploy_app:
                deploy_serving(self.cfg, echo)
            announce(Endpoint("api", deploy(self.cfg)))
            if self.cfg.observability.prometheus:
                prometheus = start_for_cluster(self.cfg, env, echo)
                if prometheus is not None:
                    announce(Endpoint("prometheus", prometheus))
        except BaseException:
            echo("start failed; stopping what was started")
            self._stop(state, echo=lambda _m: None)
            raise
        state["status"] = "running"
        write_state(self.state_file, state)
        return endpoints

    # -- the head coming back -------------------------------------------------------------
    def _head_lost(self, state: dict[str, Any]) -> bool:
        """The recorded cluster runs with GCS fault tolerance, its GCS does not answer, and a
        worker node's raylet of it is still alive: the head can come back to it."""
        if state.get("status") != "running" or not self.cfg.ray.gcs_fault_tolerance:
            return False
        if not from_dict(state["config"]).ray.gcs_fault_tolerance:
            return False
        procs = find_cluster_processes(state["cluster_id"], self.process_roots(state))
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                if proc.name() == "raylet" and proc.environ().get(NODE_ID_ENV) not in (
                    None,
                    head_node_id(state),
                ):
                    return True
        return False

    def restart_head(self, echo: Echo = print) -> str:
        """Start the head again after its processes died while the worker nodes live on
        (``ray.gcs_fault_tolerance``); returns the API URL once it answers.

        What is left of the old head is stopped, and the new head gets a new node id (as a
        new head pod does). The new GCS reads the cluster back from Redis: the worker nodes'
        raylets reconnect (within ``ray.gcs_reconnect_timeout_s``), their actors were never
        stopped, and detached actors that lived on the head (Serve's controller, the control
        plane's) are restarted on the new head by Ray. Two local-mode steps KubeRay does not
        need: ``<temp_dir>/ray_current_cluster`` is removed first (`ray start --head` refuses
        to start while it names this cluster), and the head starts without the autoscaler:
        Ray's fake provider keeps its node table in the dead monitor's memory, so a new one
        would launch the fixed pool a second time. Until the next `rcp down`/`rcp up` the
        external pool does not scale (docs/operations.md).
        """
        state = self.read_state()
        if state is None or state.get("status") != "running":
            raise ClusterError(f"no running local cluster recorded in {self.state_dir}")
        if not self.cfg.ray.gcs_fault_tolerance:
            raise ClusterError(
                "restart_head needs ray.gcs_fault_tolerance: without it a new head is a new "
                "cluster (rcp down, then rcp up)"
            )
        if port_in_use(self.cfg.ray.node_ip, self.cfg.ray.gcs_port):
            raise ClusterError(f"the head's GCS still answers on {gcs_address(self.cfg)}")
        # A head whose GCS died is gone as a whole (KubeRay restarts its container): what is
        # left of it (its raylet waiting for the GCS, the dashboard) goes first.
        leftovers = node_processes(
            state["cluster_id"], self.process_roots(state), head_node_id(state)
        )
        if leftovers:
            echo(f"stopping what is left of the old head ({len(leftovers)} processes)")
            terminate(leftovers)
        with private_umask():
            env = node_env(self.cfg, state["cluster_id"])
            if self.cfg.observability.prometheus:
                env["RAY_PROMETHEUS_HOST"] = prometheus_url(self.cfg)
            redis = LocalRedis(self.cfg)
            if not redis.ping():
                echo("gcs store: not answering; starting it on its data")
                redis.start(env, fresh=False)
            (self.temp_dir / "ray_current_cluster").unlink(missing_ok=True)
            # A new node id, as a new head pod has: the GCS marks the old head dead and
            # restarts the detached actors that lived there on this one.
            # `ray start --head` forces the fake provider's fixed head id while
            # RAY_FAKE_CLUSTER is set; only the fake provider (in the autoscaler, which this
            # head runs without) needs that switch.
            node_id = secrets.token_hex(28)
            env.pop("RAY_FAKE_CLUSTER", None)
            env.update({NODE_ID_ENV: node_id, "RAY_CLOUD_INSTANCE_ID": node_id})
            state["head_node_id"] = node_id
            write_state(self.state_file, state)
            start_head(self.cfg, env, None, self.log_dir)
            echo(f"ray: {gcs_address(self.cfg)} (head restarted)")
            ensure_edge(self.cfg, state, self.state_file, self.log_dir, echo)
            connect(self.cfg)
            url = deploy(self.cfg)
        echo(f"api: {url}")
        return url

    def _make_state_dir_private(self, echo: Echo) -> None:
        """Create the state dir 0700; one that an older version left readable by others (and
        that this user owns) is narrowed to 0700, with a note. A state dir that is a symlink
        is narrowed at its target (`narrow_private` itself never follows one)."""
        private_dir(self.state_dir)
        if narrow_private(self.state_dir.resolve()):
            echo(f"note: {self.state_dir} was readable by other users; it is now 0700")

    # -- down -------------------------------------------------------------------------------
    def down(self, echo: Echo = print) -> int:
        """Stop every process `up` started (and nothing else). Returns how many stopped."""
        state = self.read_state()
        if state is None:
            echo(f"nothing to stop: no local cluster recorded in {self.state_dir}")
            return 0
        return self._stop(state, echo)

    def process_roots(self, state: dict[str, Any]) -> list[str]:
        """The directories whose processes are the cluster's (`processes.find_cluster_processes`):
        Ray's temp dir, and Redis's own dir (redis-server rewrites its process title over its
        environment, so only its open files there name the cluster)."""
        return [state["temp_dir"], str(LocalRedis(self.cfg).work_dir)]

    def _stop(self, state: dict[str, Any], echo: Echo) -> int:
        try:
            import ray  # deferred: ray is heavy and optional here

            if ray.is_initialized():
                ray.shutdown()
        except ImportError:
            pass
        n = stop_cluster_processes(
            state["cluster_id"],
            roots=self.process_roots(state),
            first=("autoscaler/_private/monitor.py",),
        )
        self.state_file.unlink(missing_ok=True)
        temp = Path(state["temp_dir"])
        if temp.exists():
            # Old sessions only; logs of the last one stay for post-mortems.
            for session in temp.glob("session_2*"):
                latest = temp / "session_latest"
                if latest.exists() and session.resolve() == latest.resolve():
                    continue
                shutil.rmtree(session, ignore_errors=True)
        echo(f"stopped cluster {state['cluster_id']} ({n} processes)")
        return n
