"""How the local cluster's Ray processes start: their environment (`node_env`) and the head's
command line (`ray_head_command`: no GPUs, every listener on ``ray.node_ip``).
Must not: run anything (``controlplane.local.head_process`` does), or put a secret's value in an
environment variable.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from controlplane.config import Config
from controlplane.local.autoscaler import FAKE_HEAD_NODE_ID, POOL_RESOURCE_UNITS
from controlplane.local.processes import CLUSTER_ID_ENV, NODE_ID_ENV
from controlplane.pools import POOL_LABEL, Pool, pool_resource
from controlplane.ray_connection import (
    RAY_AUTH_TOKEN_ENV,
    ray_auth_env,
    ray_temp_dir,
    ray_token_path,
)
from controlplane.storage import EMBEDDED_ACCESS_KEY, EMBEDDED_SECRET_KEY
from jobs.storage_credentials import JobCredentialsMode

__all__ = ["node_env", "ray_head_command"]


def node_env(cfg: Config, cluster_id: str) -> dict[str, str]:
    """The environment of every process of cluster `cluster_id`: this process's own, with the
    Ray token's path (its value never), the switches the fake provider needs, and, with the
    embedded object store and ``storage.job_credentials=shared``, its fixed local keys
    (``scoped``: jobs get theirs from the signals actor, and the nodes carry none)."""
    env = dict(os.environ)
    env.pop(RAY_AUTH_TOKEN_ENV, None)
    env.update(ray_auth_env(ray_token_path(cfg)))
    env.update(
        {
            CLUSTER_ID_ENV: cluster_id,
            # The fake multi-node provider only runs when this is set.
            "RAY_FAKE_CLUSTER": "1",
            "AUTOSCALER_UPDATE_INTERVAL_S": f"{cfg.ray.autoscaler_update_interval_s:g}",
            # Makes Ray resolve this machine's address to loopback, so the nodes the
            # autoscaler launches bind 127.0.0.1 like the head.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_TMPDIR": str(ray_temp_dir(cfg)),
            "RAY_USAGE_STATS_ENABLED": "0",
            # Autoscaler v2: the fake provider needs it (v1 tries to ssh-update nodes),
            # and it is what KubeRay runs in production. The head's instance id is the
            # one the fake provider reserves for it.
            "RAY_enable_autoscaler_v2": "1",
            "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
            NODE_ID_ENV: FAKE_HEAD_NODE_ID,
            # The hang watchdog asks the dashboard for a hung worker's stacks
            # (``/worker/traceback``): Ray answers 403 unless profiling is on. It runs
            # py-spy, found on PATH: this interpreter's bin directory goes first.
            "RAY_DASHBOARD_ENABLE_PROFILING": "1",
            # How long a worker's raylet waits for a lost GCS (the head coming back).
            "RAY_gcs_rpc_server_reconnect_timeout_s": f"{cfg.ray.gcs_reconnect_timeout_s:g}",
            "PATH": os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", os.defpath)]),
        }
    )
    if cfg.storage.embedded and cfg.storage.job_credentials == JobCredentialsMode.SHARED.value:
        # Shared: jobs reach the embedded store with boto3's usual credential chain, like on
        # a real cluster: the nodes' own environment carries its fixed local keys (it
        # accepts any), never the job's runtime env, which the dashboard shows.
        env["AWS_ACCESS_KEY_ID"] = EMBEDDED_ACCESS_KEY
        env["AWS_SECRET_ACCESS_KEY"] = EMBEDDED_SECRET_KEY
    return env


def ray_head_command(
    cfg: Config, autoscaler_yaml: Path | None, redis_password: str | None = None
) -> list[str]:
    """`ray start --head`: no GPUs, the head pool's resource only (never the job-driver
    resource), every listener on ray.node_ip. With `redis_password`, the GCS keeps its tables
    in the local Redis (its address comes from ``controlplane.local.redis.gcs_redis_env``).
    Without `autoscaler_yaml` no autoscaler config is given (a restarted head: see
    ``LocalCluster.restart_head``)."""
    r = cfg.ray
    ray_bin = str(Path(sys.executable).with_name("ray"))
    extra = [f"--autoscaling-config={autoscaler_yaml}"] if autoscaler_yaml is not None else []
    if redis_password is not None:
        extra.append(f"--redis-password={redis_password}")
    return [
        ray_bin if os.path.exists(ray_bin) else "ray",
        "start",
        "--head",
        f"--node-ip-address={r.node_ip}",
        f"--port={r.gcs_port}",
        f"--num-cpus={cfg.head.num_cpus}",
        "--num-gpus=0",
        f"--resources={json.dumps({pool_resource(Pool.HEAD): POOL_RESOURCE_UNITS})}",
        f"--labels={POOL_LABEL}={Pool.HEAD.value}",
        "--include-dashboard=true",
        f"--dashboard-host={r.node_ip}",
        f"--dashboard-port={r.dashboard_port}",
        "--dashboard-agent-listen-port=0",
        f"--ray-client-server-port={r.client_port}",
        f"--metrics-export-port={r.metrics_export_port}",
        f"--temp-dir={ray_temp_dir(cfg)}",
        "--disable-usage-stats",
        *extra,
    ]
