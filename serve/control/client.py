"""The one module that talks to Ray Serve's controller and Ray's node table.

Owns: reading Serve's instance details (applications, deployments, replicas and the
declarative config each app was deployed with), applying a set of application configs, and
mapping node ids to pools. Everything else in `serve/` goes through here, so a change in
Serve's API is fixed in one place.

Must not: decide anything; callers pass complete application configs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import ray
from ray import serve
from ray.serve.schema import ServeDeploySchema

from policies.snapshot import pool_of
from serve.spec import APP_PREFIX, AppConfig, declarative_configs

if TYPE_CHECKING:
    from ray.serve._private.client import ServeControllerClient

__all__ = [
    "ServeNotRunningError",
    "apply_app_configs",
    "node_pools",
    "read_details",
    "start_serve",
]


class ServeNotRunningError(RuntimeError):
    """Serve is not running on the connected Ray cluster."""


def _client() -> ServeControllerClient:
    from ray.serve.context import _get_global_client

    try:
        client = _get_global_client()
    except Exception as exc:
        raise ServeNotRunningError(
            "Ray Serve is not running on this cluster: start it first (rcp up, or "
            "serve.start(http_options={'host': '127.0.0.1', 'port': PORT}))"
        ) from exc
    if client is None:
        raise ServeNotRunningError(
            "Ray Serve is not running on this cluster: start it first (rcp up, or "
            "serve.start(http_options={'host': '127.0.0.1', 'port': PORT}))"
        )
    return client


def start_serve(host: str, port: int, proxy_location: str = "EveryNode") -> None:
    """Start Serve's controller and its HTTP proxies, bound to `host` (the head's on `port`).
    No-op when Serve is up.

    ``EveryNode``: Serve runs a proxy on the head and on every node that holds a replica (of
    either pool), and stops a node's proxy once the node is draining and its requests are done
    (Serve's own ``DRAINING`` -> ``DRAINED``), so an external node leaves no Serve actor behind
    for the autoscaler to wait on. Every proxy routes the same way: each one sends a request to
    an ingress replica, which picks the pool by route weight and retries. `port` is the head's
    proxy's: a worker node's proxy binds the same port unless its node's environment names
    another (``RAY_SERVE_WORKER_PROXY_HTTP_PORT``). Local mode gives every simulated node its
    own (they share one host) and puts the edge in front (HAProxy, ``serve.edge``);
    docs/serving.md, "Proxies on every node". ``HeadOnly`` (one proxy, on the head) is the
    behaviour before issue 18, kept as the head-loss benchmark's baseline."""
    serve.start(http_options={"host": host, "port": port}, proxy_location=proxy_location)


def read_details() -> dict[str, Any]:
    """Serve's instance details as plain data (``ServeInstanceDetails`` as a dict)."""
    details: dict[str, Any] = _client().get_serve_details()
    return details


def apply_app_configs(apps: Sequence[AppConfig]) -> None:
    """Apply our application configs as Serve's declarative config, keeping every other
    declaratively deployed application as it is. Returns once the controller accepted it;
    replicas change asynchronously."""
    client = _client()
    ours = {a["name"] for a in apps}
    foreign = [
        cfg
        for name, cfg in declarative_configs(client.get_serve_details()).items()
        if name not in ours and not name.startswith(f"{APP_PREFIX}-")
    ]
    client.deploy_apps(ServeDeploySchema.model_validate({"applications": [*foreign, *apps]}))


def node_pools() -> dict[str, str]:
    """Pool of every alive node, by node id: its ``pool`` label, else its ``pool_*`` resource."""
    return {
        str(node["NodeID"]): pool_of(node.get("Labels") or {}, node.get("Resources") or {})
        for node in ray.nodes()
        if node.get("Alive", False)
    }
