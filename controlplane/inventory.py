"""What nodes the cluster has now: pool, GPUs total/free, labels, state.

Owns: reading node inventory from Ray (the caller is connected as a driver) and turning it
into plain rows for the CLI, the API and the policy actor's snapshot.
Must not: change anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from controlplane.pools import POOL_LABEL, Pool, pool_resource


@dataclass(frozen=True)
class NodeRow:
    node_id: str
    pool: str
    address: str
    state: str
    gpus_total: float
    gpus_free: float
    cpus_total: float
    cpus_free: float
    labels: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def pool_of(labels: dict[str, str], resources: dict[str, float]) -> str:
    """A node's pool: its `pool` label, else the pool resource it advertises, else unknown."""
    if labels.get(POOL_LABEL) in {p.value for p in Pool}:
        return labels[POOL_LABEL]
    for p in Pool:
        if pool_resource(p) in resources:
            return p.value
    return "unknown"


def list_nodes(include_dead: bool = False) -> list[NodeRow]:
    import ray

    available = ray._private.state.available_resources_per_node()
    rows = []
    for n in ray.nodes():
        if not n["Alive"] and not include_dead:
            continue
        total = n.get("Resources", {})
        free = available.get(n["NodeID"], {}) if n["Alive"] else {}
        labels = {k: v for k, v in (n.get("Labels") or {}).items() if not k.startswith("ray.io/")}
        rows.append(
            NodeRow(
                node_id=n["NodeID"],
                pool=pool_of(labels, total),
                address=f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}",
                state="ALIVE" if n["Alive"] else "DEAD",
                gpus_total=float(total.get("GPU", 0)),
                gpus_free=float(free.get("GPU", 0)),
                cpus_total=float(total.get("CPU", 0)),
                cpus_free=float(free.get("CPU", 0)),
                labels=labels,
            )
        )
    order = {Pool.HEAD.value: 0, Pool.CLUSTER.value: 1, Pool.EXTERNAL.value: 2}
    rows.sort(key=lambda r: (order.get(r.pool, 3), r.state != "ALIVE", r.node_id))
    return rows


def format_table(rows: list[NodeRow]) -> str:
    header = ("NODE", "POOL", "STATE", "GPU FREE/TOTAL", "CPU FREE/TOTAL", "ADDRESS", "LABELS")
    lines = [header]
    for r in rows:
        labels = ",".join(f"{k}={v}" for k, v in sorted(r.labels.items()))
        lines.append(
            (
                r.node_id[-12:],
                r.pool,
                r.state,
                f"{r.gpus_free:g}/{r.gpus_total:g}",
                f"{r.cpus_free:g}/{r.cpus_total:g}",
                r.address,
                labels,
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in lines
    )
