"""How a process finds and reaches the local cluster's Ray: its GCS address, its temp dir, its
token, and the environment a process (the controller actor, a job) needs to reach it the same
way.

Must not: start or stop anything (`controlplane.local.cluster` starts the cluster), or put the
token's value in an environment variable: it travels as its file's path, because a job's
runtime env shows in the dashboard's Jobs tab. It imports nothing of the control plane but
`controlplane.config`.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from controlplane.config import Config
from controlplane.config.checks import is_loopback

__all__ = [
    "RAY_AUTH_MODE_ENV",
    "RAY_AUTH_TOKEN_ENV",
    "RAY_AUTH_TOKEN_PATH_ENV",
    "RAY_CONNECTION_ENV",
    "RAY_TOKEN_FILE",
    "ClusterError",
    "connect",
    "gcs_address",
    "ray_auth_env",
    "ray_connection_env",
    "ray_temp_dir",
    "ray_token_path",
    "use_ray_token",
]

# The Ray token `up` generates (hex, 256 bits); Ray reads it from the file RAY_AUTH_TOKEN_PATH
# names. RAY_AUTH_TOKEN (the value itself) would take precedence, so it is never passed on.
RAY_TOKEN_FILE = "ray-token"
RAY_AUTH_MODE_ENV = "RAY_AUTH_MODE"
RAY_AUTH_TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
RAY_AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"

RAY_CONNECTION_ENV = (
    RAY_AUTH_MODE_ENV,
    RAY_AUTH_TOKEN_PATH_ENV,
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",
)
"""How this process reaches Ray; the actor and the jobs it starts must reach it the same way.
The token travels as its file's path, never as `RAY_AUTH_TOKEN`: a job's runtime env (and so
every value here) is shown in the dashboard's Jobs tab."""


class ClusterError(RuntimeError):
    """The local cluster cannot be started or reached; the message says what to do."""


def ray_temp_dir(cfg: Config) -> Path:
    """Ray's temp dir for this state dir. Short, because Ray puts unix sockets under it."""
    digest = hashlib.sha1(str(cfg.state_path.resolve()).encode()).hexdigest()[:10]
    return Path("/tmp") / f"rcp-{digest}"


def gcs_address(cfg: Config) -> str:
    return f"{cfg.ray.node_ip}:{cfg.ray.gcs_port}"


def ray_token_path(cfg: Config) -> Path:
    """The file holding the running local cluster's Ray token (0600)."""
    return cfg.state_path / RAY_TOKEN_FILE


def ray_auth_env(token_path: Path) -> dict[str, str]:
    """What a process needs in its environment to reach a token-auth cluster: the mode and the
    token's file (absolute, so children with another working dir find it), not the token."""
    return {
        RAY_AUTH_MODE_ENV: "token",
        RAY_AUTH_TOKEN_PATH_ENV: str(token_path.resolve()),
    }


def ray_connection_env() -> dict[str, str]:
    """The caller's `RAY_CONNECTION_ENV` values that are set: local mode sets token auth, the
    token's file and loopback; on KubeRay the pod's own settings pass through unchanged."""
    return {k: os.environ[k] for k in RAY_CONNECTION_ENV if k in os.environ}


def use_ray_token(token_path: Path) -> None:
    """Make this process (and the processes it starts) authenticate to Ray with the token in
    `token_path`. Raises ClusterError when there is no token to use."""
    if not token_path.is_file():
        raise ClusterError(
            f"no Ray token at {token_path}: the local cluster was not started by this version "
            "of `rcp up`; run `rcp down` and `rcp up` again"
        )
    os.environ.pop(RAY_AUTH_TOKEN_ENV, None)
    os.environ.update(ray_auth_env(token_path))
    # Ray caches its config (auth mode included) and the token per process; a process that
    # imported Ray before, or talked to another cluster, must re-read both. This is what Ray's
    # own `ray start` does when it turns token auth on.
    # Deferred import: ray is heavy and only a connecting process needs it.
    # (ray._raylet is compiled; its stub file does not list these.)
    from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]
    from ray._raylet import Config as RayConfig  # type: ignore[attr-defined]

    RayConfig.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def keep_ray_on_loopback(node_ip: str) -> None:
    """Make this process's Ray leave a loopback cluster address as it is (local mode).

    Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, when it is first imported; left on
    (Linux's default) it rewrites a loopback address into this host's own IP, where the local
    cluster does not listen, and `ray.init` waits there for good. A process that imported Ray
    before (a bench, a test, a user's driver) keeps what it read, so the value Ray read is
    set too. A non-loopback `node_ip` (a real cluster) changes nothing."""
    if not is_loopback(node_ip):
        return
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # Deferred import: ray is heavy; the setting above must come first for a fresh process.
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def connect(cfg: Config, address: str | None = None) -> None:
    """Connect this process to the local cluster as a Ray driver (no-op if connected), with
    the cluster's Ray token."""
    keep_ray_on_loopback(cfg.ray.node_ip)
    import ray  # deferred: heavy, and only a connecting process needs it

    if ray.is_initialized():
        return
    use_ray_token(ray_token_path(cfg))
    ray.init(
        address=address or gcs_address(cfg),
        _node_ip_address=cfg.ray.node_ip,
        namespace="rcp",
        logging_level=logging.ERROR,
        log_to_driver=False,
    )
