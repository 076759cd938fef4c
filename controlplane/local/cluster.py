"""The embedded local cluster: what `rcp up` starts and `rcp down` stops.

Owns: the lifecycle of the Ray head (no GPUs), the fixed `cluster` pool and the autoscaled
`external` pool (both launched by Ray's own autoscaler with its fake multi-node provider, from
the cluster config ``controlplane.local.autoscaler`` builds; the processes' environment and the
head's command line are ``controlplane.local.head``'s; ports are ``controlplane.local.ports``'),
the S3-protocol object store on loopback, Serve (a proxy on the head and on every node that
holds a replica, each on a loopback port of its own) and the edge in front of them on
``serve.http_port`` (HAProxy, configured by `serve.edge`, outside Ray), and the state file
that lets a second `up` report what runs and `down` stop exactly that (the Serve proxies' ports
are recorded there, ``serve_proxies``; the edge's configuration lists them).

Must not: touch Ray processes it did not start (no ``ray stop``), bind anything but
``ray.node_ip`` (127.0.0.1 by default), or log storage credentials or the Ray token.

Security model (docs/operations.md): every Ray process runs with token auth
(``RAY_AUTH_MODE=token``); `up` writes a fresh random token to ``<state_dir>/ray-token``
(0600, state dir 0700) and every Ray process and client finds it through
``RAY_AUTH_TOKEN_PATH``, never through the token's value in an environment variable (a job's
runtime env shows in the dashboard). Everything `up` and the cluster's processes write is
owner-only (umask 077). Only the `cluster` pool's workers offer `JOB_DRIVER_RESOURCE`, so job
drivers (user code) never run on the head beside the control plane's credentials.

Production maps each part to KubeRay (see docs/architecture.md): the autoscaler config's node
types are the RayCluster's worker groups; `cluster` has min = max replicas, `external` min 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from controlplane.config import Config, from_dict, to_dict
from controlplane.controller.actor import deploy
from controlplane.local.autoscaler import (
    FAKE_HEAD_NODE_ID,
    HEAD_NODE_TYPE,
    JOB_DRIVER_SLOTS_PER_NODE,
    autoscaler_config,
)
from controlplane.local.head import node_env, ray_head_command
from controlplane.local.ports import (
    check_ports_free,
    free_loopback_ports,
    isolated_overrides,
    port_in_use,
    serve_proxy_ports,
)
from controlplane.local.processes import (
    CLUSTER_ID_ENV,
    NODE_ID_ENV,
    find_cluster_processes,
    node_processes,
    stop_cluster_processes,
    terminate,
)
from controlplane.local.prometheus import LocalPrometheus, PrometheusError
from controlplane.local.redis import LocalRedis, gcs_redis_env
from controlplane.pools import POOL_LABEL, Pool
from controlplane.ray_connection import (
    ClusterError,
    connect,
    gcs_address,
    ray_temp_dir,
    ray_token_path,
)
from controlplane.statefiles import narrow_private, private_dir, private_umask, write_private
from controlplane.storage import ensure_bucket
from serve.edge.config import CONFIG_FILE, EdgeSettings, StaticProxies
from serve.edge.process import check as check_edge
from serve.edge.process import command as edge_command
from serve.edge.process import write as write_edge

# Re-exported: callers (tests, benchmarks) import these from here.
__all__ = [
    "HEAD_NODE_TYPE",
    "JOB_DRIVER_SLOTS_PER_NODE",
    "Endpoint",
    "LocalCluster",
    "autoscaler_config",
    "free_loopback_ports",
    "isolated_overrides",
]

Echo = Callable[[str], None]

STATE_FILE = "local-cluster.json"


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str


def _wait_until(
    check: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.5
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(poll_s)
    raise ClusterError(f"timed out after {timeout_s:.0f}s waiting for {what}")


class LocalCluster:
    """One embedded cluster per state dir. Methods are safe to call repeatedly."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.state_dir = cfg.state_path
        self.temp_dir = ray_temp_dir(cfg)
        self.log_dir = self.state_dir / "logs"

    # -- state file -------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE

    def read_state(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.state_file.read_text())
            return data
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as exc:
            raise ClusterError(
                f"{self.state_file} is not valid JSON ({exc}); remove it after checking no "
                "cluster runs"
            ) from exc

    def _write_state(self, state: dict[str, Any]) -> None:
        write_private(self.state_file, json.dumps(state, indent=2, sort_keys=True))

    def running_config(self) -> Config | None:
        """The config the running cluster was started with, if one runs."""
        state = self.read_state()
        if state and self.is_running(state):
            return from_dict(state["config"])
        return None

    def is_running(self, state: dict[str, Any] | None = None) -> bool:
        state = state if state is not None else self.read_state()
        if not state or state.get("status") != "running":
            return False
        cfg = from_dict(state["config"])
        return port_in_use(cfg.ray.node_ip, cfg.ray.gcs_port)

    # -- up ---------------------------------------------------------------------------------
    def up(self, echo: Echo = print) -> list[Endpoint]:
        """Start everything and return the endpoints; if already running, report them.

        Runs with umask 077, which every process it starts inherits: the files they write
        (logs, configs, the job store, checkpoints under the state dir) are owner-only.
        """
        with private_umask():
            return self._up(echo)

    def _up(self, echo: Echo) -> list[Endpoint]:
        self._make_state_dir_private(echo)
        state = self.read_state()
        if state and self.is_running(state):
            echo(f"already running (cluster {state['cluster_id']}, started {state['started_at']})")
            self._ensure_balancer(state, echo)
            known = [Endpoint(**e) for e in state["endpoints"]]
            for ep in known:
                echo(f"{ep.name}: {ep.url}")
            echo(f"ray token: {self.ray_token_file}")
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
        write_private(self.ray_token_file, secrets.token_hex(32) + "\n")
        env = self._env(cluster_id)
        if self.cfg.observability.prometheus:
            # The dashboard reads it when the head starts: its Metrics tab queries this server.
            env["RAY_PROMETHEUS_HOST"] = self.prometheus_url
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
        self._write_state(state)
        endpoints: list[Endpoint] = []

        def announce(ep: Endpoint) -> None:
            endpoints.append(ep)
            state["endpoints"] = [ep.__dict__ for ep in endpoints]
            self._write_state(state)
            echo(f"{ep.name}: {ep.url}")

        try:
            if self.cfg.storage.embedded:
                announce(self._start_object_store(env))
            if self.cfg.ray.gcs_fault_tolerance:
                announce(self._start_redis(env, fresh=True))
            self._start_head(
                env, self.state_dir / "autoscaler.yaml", state["serve_proxies"]["nodes"]
            )
            announce(
                Endpoint(
                    "dashboard", f"http://{self.cfg.ray.node_ip}:{self.cfg.ray.dashboard_port}"
                )
            )
            announce(Endpoint("ray", gcs_address(self.cfg)))
            echo(f"ray token: {self.ray_token_file} (clients and the dashboard's login read it)")
            connect(self.cfg)
            self._wait_for_cluster_pool()
            announce(
                Endpoint(
                    "metrics",
                    f"http://{self.cfg.ray.node_ip}:{self.cfg.ray.metrics_export_port}/metrics",
                )
            )
            self._start_serve(state["serve_proxies"]["head"])
            self._start_balancer(state)
            announce(Endpoint("serve", f"http://{self.cfg.ray.node_ip}:{self.cfg.serve.http_port}"))
            if self.cfg.serve.deploy_app:
                self._deploy_serving(echo)
            announce(Endpoint("api", deploy(self.cfg)))
            if self.cfg.observability.prometheus:
                prometheus = self._start_prometheus(env, echo)
                if prometheus is not None:
                    announce(prometheus)
        except BaseException:
            echo("start failed; stopping what was started")
            self._stop(state, echo=lambda _m: None)
            raise
        state["status"] = "running"
        self._write_state(state)
        return endpoints

    # -- the head coming back -------------------------------------------------------------
    @staticmethod
    def head_node_id(state: dict[str, Any]) -> str:
        """The Ray node id of the cluster's head now: the fake provider's fixed one until a
        restart gives the head a new one (recorded in the state file)."""
        return str(state.get("head_node_id", FAKE_HEAD_NODE_ID))

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
                    self.head_node_id(state),
                ):
                    return True
        return False

    def restart_head(self, echo: Echo = print) -> str:
        """Start the head again after its processes died while the worker nodes live on
        (``ray.gcs_fault_tolerance``); returns the API URL once it answers.

        What is left of the old head is stopped, and the new head gets a new node id (as a
        new head pod does). The new GCS reads the cluster back from Redis: the worker nodes'
        raylets reconnect (within ``ray.gcs_reconnect_timeout_s`` of the loss), their actors
        (Serve replicas and proxies, gang workers) were never stopped, and detached actors
        that lived on the head (Serve's controller, the control plane's controller, which
        resumes from its store) are restarted on the new head by Ray. Two local-mode steps that KubeRay does not need:
        ``<temp_dir>/ray_current_cluster`` is removed first (`ray start --head` refuses to
        start while a raylet on this host names the old GCS address and that file says it is
        this cluster's), and the head starts without the autoscaler: Ray's fake multi-node
        provider keeps its node table in the dead monitor's memory, so a new one would launch
        the fixed pool a second time under the node ids of the live nodes. Until the next
        `rcp down`/`rcp up` the external pool does not scale (docs/operations.md).
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
            state["cluster_id"], self.process_roots(state), self.head_node_id(state)
        )
        if leftovers:
            echo(f"stopping what is left of the old head ({len(leftovers)} processes)")
            terminate(leftovers)
        with private_umask():
            env = self._env(state["cluster_id"])
            if self.cfg.observability.prometheus:
                env["RAY_PROMETHEUS_HOST"] = self.prometheus_url
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
            self._write_state(state)
            self._start_head(env, autoscaler_yaml=None)
            echo(f"ray: {gcs_address(self.cfg)} (head restarted)")
            self._ensure_balancer(state, echo)
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

    @property
    def ray_token_file(self) -> Path:
        return ray_token_path(self.cfg)

    def _env(self, cluster_id: str) -> dict[str, str]:
        return node_env(self.cfg, cluster_id)

    @property
    def prometheus_url(self) -> str:
        return f"http://{self.cfg.ray.node_ip}:{self.cfg.observability.prometheus_port}"

    def _start_prometheus(self, env: dict[str, str], echo: Echo) -> Endpoint | None:
        """The local Prometheus (observability.prometheus); None, with a note, if it cannot run.

        It scrapes Ray's per-node metrics agents (Ray keeps their target list in its temp
        dir), the telemetry agents (the controller rewrites their target list as agents come
        and go) and loads the alert rules.
        """
        host, port = self.cfg.ray.node_ip, self.cfg.observability.prometheus_port
        if port_in_use(host, port):
            echo(
                f"prometheus: not started, {host}:{port} is in use (choose another with "
                "observability.prometheus_port=..., or observability.prometheus=false)"
            )
            return None
        prom = LocalPrometheus.for_cluster(
            self.cfg,
            port=port,
            env=env,
            scrape_interval_s=self.cfg.observability.scrape_interval_s,
        )
        try:
            prom.start()
        except PrometheusError as exc:
            echo(f"prometheus: not started ({str(exc).splitlines()[0]})")
            return None
        return Endpoint("prometheus", prom.url)

    def _start_object_store(self, env: dict[str, str]) -> Endpoint:
        host, port = self.cfg.ray.node_ip, self.cfg.storage.embedded_port
        log = open(self.log_dir / "object-store.log", "ab")  # noqa: SIM115 - owned by the child
        subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        log.close()
        _wait_until(lambda: port_in_use(host, port), 30, f"the object store on {host}:{port}")
        endpoint_url = f"http://{host}:{port}"
        ensure_bucket(self.cfg, endpoint_url=endpoint_url)
        return Endpoint("storage", endpoint_url)

    def head_command(self, autoscaler_yaml: Path | None) -> list[str]:
        redis = LocalRedis(self.cfg).password() if self.cfg.ray.gcs_fault_tolerance else None
        return ray_head_command(self.cfg, autoscaler_yaml, redis_password=redis)

    def _start_redis(self, env: dict[str, str], fresh: bool) -> Endpoint:
        redis = LocalRedis(self.cfg)
        redis.start(env, fresh=fresh)
        return Endpoint("gcs store", f"redis://{redis.host}:{redis.port}")

    def _start_head(
        self, env: dict[str, str], autoscaler_yaml: Path | None, proxy_ports: Sequence[int] = ()
    ) -> None:
        """`ray start --head`; with `autoscaler_yaml`, the autoscaler config (its provider
        gives each node one of `proxy_ports` for its Serve proxy) is written there first (a
        restarted head runs without one, see `restart_head`)."""
        if autoscaler_yaml is not None:
            conf = autoscaler_config(self.cfg, proxy_ports)
            write_private(autoscaler_yaml, yaml.safe_dump(conf, sort_keys=False))
        r = self.cfg.ray
        cmd = self.head_command(autoscaler_yaml)
        head_env = {**env, **gcs_redis_env(self.cfg, env[CLUSTER_ID_ENV])}
        with open(self.log_dir / "ray-start.log", "ab") as log:
            try:
                proc = subprocess.run(
                    cmd,
                    env=head_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=r.ready_timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise ClusterError(
                    f"`ray start --head` did not return within {r.ready_timeout_s:.0f}s; "
                    f"see {self.log_dir / 'ray-start.log'}"
                ) from exc
        if proc.returncode != 0:
            tail = (self.log_dir / "ray-start.log").read_text(errors="replace")[-2000:]
            raise ClusterError(f"`ray start --head` failed (exit {proc.returncode}):\n{tail}")

    def _wait_for_cluster_pool(self) -> None:
        import ray  # deferred: ray is heavy and optional here

        want = self.cfg.pools.cluster.num_nodes

        def ready() -> bool:
            alive = [
                n
                for n in ray.nodes()
                if n["Alive"] and n.get("Labels", {}).get(POOL_LABEL) == Pool.CLUSTER.value
            ]
            return len(alive) >= want

        _wait_until(ready, self.cfg.ray.ready_timeout_s, f"{want} `cluster` pool node(s) to join")

    def _start_serve(self, head_proxy_port: int) -> None:
        """Serve, its head's proxy on `head_proxy_port` (each worker node's proxy binds the
        port its node was given, ``controlplane.local.provider``)."""
        from serve.control.client import (
            start_serve,
        )  # deferred: it imports ray and ray.serve (heavy)

        start_serve(self.cfg.ray.node_ip, head_proxy_port, self.cfg.serve.proxy_location)

    def _ensure_balancer(self, state: dict[str, Any], echo: Echo) -> None:
        """The edge again, for a running cluster that has one: started if it is gone (it runs
        outside Ray and outlives the head, but a process can still die), reloaded when its
        rendered configuration changed (a new ``serving.ingress`` limit, say)."""
        if "serve_proxies" not in state or state.get("status") != "running":
            return
        if not port_in_use(self.cfg.ray.node_ip, self.cfg.serve.http_port):
            echo("serve edge: not answering; starting it again")
            self._start_balancer(state)
            return
        config = self._edge_dir / CONFIG_FILE
        before = config.read_text() if config.exists() else None
        written = write_edge(self._edge_settings(state))
        pid = state.get("edge_pid")
        if before != written.read_text() and isinstance(pid, int):
            check_edge(written)
            os.kill(pid, signal.SIGUSR2)  # HAProxy's master reloads without dropping a request
            echo("serve edge: configuration changed; reloaded")

    @property
    def _edge_dir(self) -> Path:
        return self.state_dir / "edge"

    def _edge_settings(self, state: dict[str, Any]) -> EdgeSettings:
        host = self.cfg.ray.node_ip
        ports = state["serve_proxies"]
        return EdgeSettings(
            listen_host=host,
            listen_port=self.cfg.serve.http_port,
            admin_host=host,
            admin_port=self.cfg.serve.edge_admin_port,
            work_dir=str(self._edge_dir),
            proxies=StaticProxies(
                nodes=tuple((host, int(p)) for p in ports["nodes"]), head=(host, ports["head"])
            ),
            route_prefix=self.cfg.serving.route_prefix,
            ingress=self.cfg.serving.ingress,
            stats_socket=str(self._edge_dir / "admin.sock"),
            threads=1,  # one core carries thousands of requests a second; the machine is shared
        )

    def _start_balancer(self, state: dict[str, Any]) -> None:
        """The edge on ``serve.http_port``: HAProxy over the nodes' Serve proxies
        (`serve.edge`), outside Ray, so it outlives the head. Its environment is the cluster's
        id (so `down` finds and stops it) and PATH, nothing else: no Ray token path, no
        storage keys. A configuration HAProxy refuses raises before anything starts."""
        host, port = self.cfg.ray.node_ip, self.cfg.serve.http_port
        private_dir(self._edge_dir)
        config = write_edge(self._edge_settings(state))
        check_edge(config)
        env = {CLUSTER_ID_ENV: state["cluster_id"], "PATH": os.environ.get("PATH", os.defpath)}
        with open(self.log_dir / "serve-edge.log", "ab") as out:
            proc = subprocess.Popen(
                edge_command(config),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        state["edge_pid"] = proc.pid
        self._write_state(state)
        _wait_until(lambda: port_in_use(host, port), 30, f"the serve edge on {host}:{port}")

    def _deploy_serving(self, echo: Echo) -> None:
        """Deploy (or update) the production Serve app; keeps deployed targets and weights."""
        from serve.control import operations  # deferred: it imports ray and ray.serve (heavy)

        state = operations.deploy(self.cfg.serving, wait=True)
        for m in self.cfg.serving.models:
            where = ", ".join(
                f"{state.target(m.name, pool)} on {pool}" for pool in ("cluster", "external")
            )
            echo(f"model {m.name}: POST /v1/models/{m.name}/predict ({where})")

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
