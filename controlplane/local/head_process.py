"""Running the local cluster's Ray head: `ray start --head`, and the GCS store before it.

Owns: `start_head` (the autoscaler config first, then `ray start --head`, its output in
``<state_dir>/logs``, a failure raised with the log's tail), `head_command` and
`start_gcs_store` (the Redis the head's GCS keeps its tables in).
Must not: stop anything, decide when the head starts again (`LocalCluster.restart_head`
does), or put a secret's value in an environment variable.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import yaml

from controlplane.config import Config
from controlplane.local.autoscaler import autoscaler_config
from controlplane.local.head import ray_head_command
from controlplane.local.processes import CLUSTER_ID_ENV
from controlplane.local.redis import LocalRedis, gcs_redis_env
from controlplane.local.state_file import Endpoint
from controlplane.ray_connection import ClusterError
from controlplane.statefiles import write_private

__all__ = ["head_command", "start_gcs_store", "start_head"]


def head_command(cfg: Config, autoscaler_yaml: Path | None) -> list[str]:
    redis = LocalRedis(cfg).password() if cfg.ray.gcs_fault_tolerance else None
    return ray_head_command(cfg, autoscaler_yaml, redis_password=redis)


def start_gcs_store(cfg: Config, env: dict[str, str], fresh: bool) -> Endpoint:
    redis = LocalRedis(cfg)
    redis.start(env, fresh=fresh)
    return Endpoint("gcs store", f"redis://{redis.host}:{redis.port}")


def start_head(
    cfg: Config,
    env: dict[str, str],
    autoscaler_yaml: Path | None,
    log_dir: Path,
    proxy_ports: Sequence[int] = (),
) -> None:
    """`ray start --head`; with `autoscaler_yaml`, the autoscaler config (its provider
    gives each node one of `proxy_ports` for its Serve proxy) is written there first (a
    restarted head runs without one, see `LocalCluster.restart_head`)."""
    if autoscaler_yaml is not None:
        conf = autoscaler_config(cfg, proxy_ports)
        write_private(autoscaler_yaml, yaml.safe_dump(conf, sort_keys=False))
    r = cfg.ray
    cmd = head_command(cfg, autoscaler_yaml)
    head_env = {**env, **gcs_redis_env(cfg, env[CLUSTER_ID_ENV])}
    with open(log_dir / "ray-start.log", "ab") as log:
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
                f"see {log_dir / 'ray-start.log'}"
            ) from exc
    if proc.returncode != 0:
        tail = (log_dir / "ray-start.log").read_text(errors="replace")[-2000:]
        raise ClusterError(f"`ray start --head` failed (exit {proc.returncode}):\n{tail}")
