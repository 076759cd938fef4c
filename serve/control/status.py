"""What the serving plane looks like now, as plain JSON-able data and as a table.

Owns: `summarize` (pure: Serve's instance details + node pools -> per model, per pool:
target, running, starting and stopping replicas, route weight, and the node and pool of
each replica), `serve_status()` (reads them from the cluster) and `format_status_table`
(what ``rcp serve status`` prints without ``--json``).

Must not: change anything.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, TypedDict

from serve.config import POOLS
from serve.spec import (
    BACKEND_DEPLOYMENT,
    INGRESS_APP,
    INGRESS_DEPLOYMENT,
    app_name,
    declarative_configs,
    desired_from_app_configs,
)

__all__ = [
    "STARTING_STATES",
    "IngressStatus",
    "ModelStatus",
    "PoolStatus",
    "ReplicaStatus",
    "ServeStatus",
    "deployment",
    "format_status_table",
    "replica_states",
    "serve_status",
    "state_of",
    "summarize",
]

STARTING_STATES = frozenset({"STARTING", "UPDATING", "RECOVERING", "PENDING_MIGRATION"})


class ReplicaStatus(TypedDict):
    replica_id: str | None
    state: str
    """Serve's replica state, upper case without the enum's prefix (``RUNNING``)."""
    node_id: str
    node_ip: str | None
    node_pool: str
    """The node's pool, ``unknown`` for a node not in the node table."""
    actor_name: str | None


class PoolStatus(TypedDict):
    target: int
    running: int
    starting: int
    stopping: int
    weight: float
    replicas: list[ReplicaStatus]


class ModelStatus(TypedDict):
    min_replicas: int
    max_replicas: int
    pools: dict[str, PoolStatus]


class IngressStatus(TypedDict):
    status: str | None
    target: int | None
    running: int
    applied_generation: int | None
    """The route table generation the ingress deployment's config carries."""


class _ServeStatusRequired(TypedDict):
    deployed: bool
    generation: int | None
    ingress: IngressStatus | None
    models: dict[str, ModelStatus]


class ServeStatus(_ServeStatusRequired, total=False):
    """`serve_status` output (JSON-able); `message` says why Serve could not be read."""

    message: str


def deployment(details: Mapping[str, Any], app: str, name: str) -> Mapping[str, Any]:
    """Serve's details of deployment `name` of application `app` ({} when there is none)."""
    a = (details.get("applications") or {}).get(app) or {}
    found: Mapping[str, Any] = (a.get("deployments") or {}).get(name) or {}
    return found


def state_of(value: object) -> str:
    """A Serve state upper case without the enum's prefix (``ReplicaState.RUNNING``: ``RUNNING``)."""
    return str(value).rsplit(".", 1)[-1].upper()


def replica_states(dep: Mapping[str, Any]) -> list[str]:
    return [state_of(r.get("state", "")) for r in dep.get("replicas") or []]


def summarize(details: Mapping[str, Any], node_pools: Mapping[str, str]) -> ServeStatus:
    """Per model, per pool status from Serve's details (a dict) and node id -> pool."""
    state = desired_from_app_configs(declarative_configs(details))
    if state is None:
        return {"deployed": False, "generation": None, "ingress": None, "models": {}}
    models: dict[str, ModelStatus] = {}
    for model in state.serving.models:
        pools: dict[str, PoolStatus] = {}
        for pool in POOLS:
            dep = deployment(details, app_name(model.name, pool), BACKEND_DEPLOYMENT)
            replicas: list[ReplicaStatus] = []
            for r in dep.get("replicas") or []:
                node_id = str(r.get("node_id") or "")
                replicas.append(
                    {
                        "replica_id": r.get("replica_id"),
                        "state": state_of(r.get("state", "")),
                        "node_id": node_id,
                        "node_ip": r.get("node_ip"),
                        "node_pool": node_pools.get(node_id, "unknown"),
                        "actor_name": r.get("actor_name"),
                    }
                )
            states = [r["state"] for r in replicas]
            pools[pool] = {
                "target": state.target(model.name, pool),
                "running": states.count("RUNNING"),
                "starting": sum(1 for st in states if st in STARTING_STATES),
                "stopping": states.count("STOPPING"),
                "weight": state.weight(model.name, pool),
                "replicas": replicas,
            }
        models[model.name] = {
            "min_replicas": model.min_replicas,
            "max_replicas": model.max_replicas,
            "pools": pools,
        }
    ing = deployment(details, INGRESS_APP, INGRESS_DEPLOYMENT)
    ingress: IngressStatus = {
        "status": state_of(ing.get("status") or "") or None,
        "target": ing.get("target_num_replicas"),
        "running": replica_states(ing).count("RUNNING"),
        "applied_generation": ((ing.get("deployment_config") or {}).get("user_config") or {}).get(
            "generation"
        ),
    }
    return {"deployed": True, "generation": state.generation, "ingress": ingress, "models": models}


def serve_status() -> ServeStatus:
    """The serving plane's status now (JSON-able). Needs a connected Ray cluster with Serve."""
    # Deferred: serve.control.client imports ray.serve (heavy); the table formatting here needs none.
    from serve.control.client import ServeNotRunningError, node_pools, read_details

    try:
        details = read_details()
    except ServeNotRunningError as exc:
        return {**summarize({}, {}), "message": str(exc)}
    return summarize(details, node_pools())


def format_status_table(data: Mapping[str, Any]) -> str:
    """A fixed-width table of `serve_status()` output, one row per model and pool."""
    if not data.get("deployed"):
        return "serving plane: not deployed" + (
            f" ({data['message']})" if data.get("message") else ""
        )
    header = ("MODEL", "POOL", "TARGET", "RUNNING", "STARTING", "STOPPING", "WEIGHT", "NODES")
    rows: list[tuple[str, ...]] = [header]
    for model, m in sorted(data["models"].items()):
        for pool, p in m["pools"].items():
            nodes = Counter(f"{r['node_id'][:8]}({r['node_pool']})" for r in p["replicas"])
            node_text = ", ".join(f"{k} x{n}" for k, n in sorted(nodes.items())) or "-"
            counts = (str(p[k]) for k in ("target", "running", "starting", "stopping"))
            rows.append((model, pool, *counts, f"{p['weight']:g}", node_text))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    ing = data.get("ingress") or {}
    lines.append(
        f"ingress: {ing.get('running', 0)}/{ing.get('target')} running, status "
        f"{ing.get('status')}, route table generation {data.get('generation')}"
    )
    for model, lat in sorted((data.get("latency") or {}).items()):
        lines.append(f"latency: {model} {_latency_text(lat)}")
    return "\n".join(lines)


def _latency_text(lat: Mapping[str, Any]) -> str:
    """``p99 250 ms, SLO 100 ms (over)``: the control loop's last reading of a model."""
    p99, slo = lat.get("p99_ms"), lat.get("slo_p99_ms")
    text = "p99 -" if p99 is None else f"p99 {p99:.0f} ms"
    if slo is None:
        return text + ", no SLO"
    over = p99 is not None and p99 > slo
    return text + f", SLO {slo:g} ms" + (" (over)" if over else "")
