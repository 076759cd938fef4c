"""What nodes the cluster has now: pool, GPUs total/free, labels, state.

Owns: reading node inventory from Ray (the caller is connected as a driver) as plain rows for
the CLI, the API and the policy actor's snapshot, with the health columns when telemetry
agents run (`attach_telemetry`), and the tables `rcp nodes` and `rcp health` print (the CLI
reads the rows over the API and must not load Ray to print them).
Must not: change anything (it never starts agents).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from controlplane.pools import Pool, pool_of


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
    health: str | None = None
    """healthy, degraded, serving_only or unhealthy (from telemetry); None when no agent
    reports."""
    health_reasons: list[str] = field(default_factory=list)
    gpu_temp_max_c: float | None = None
    """The hottest GPU in the newest telemetry sample."""
    tensor_active_ratio: float | None = None
    """Mean tensor-pipe activity over the node's GPUs (0..1)."""
    ib_errors_per_s: float | None = None
    """IB error counter increase per second, all ports."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeRow:
        """A row as the API sends it (`to_json`; fields it does not know are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def attach_telemetry(
    rows: list[NodeRow],
    summaries: dict[str, dict[str, Any]],
    verdicts: dict[str, tuple[str, list[str]]],
) -> list[NodeRow]:
    """Rows with the telemetry fields filled from the newest summaries and verdicts."""
    out = []
    for r in rows:
        s = summaries.get(r.node_id)
        verdict, reasons = verdicts.get(r.node_id, (None, []))
        if s is None and verdict is None:
            out.append(r)
            continue
        gpus = (s or {}).get("gpus", [])
        temps = [g["temp_c"] for g in gpus if g.get("temp_c") is not None]
        tensor = [
            g["tensor_active_ratio"] for g in gpus if g.get("tensor_active_ratio") is not None
        ]
        ib = [
            p["errors_per_s"]
            for p in (s or {}).get("ib_ports", [])
            if p.get("errors_per_s") is not None
        ]
        out.append(
            replace(
                r,
                health=verdict,
                health_reasons=list(reasons),
                gpu_temp_max_c=max(temps) if temps else None,
                tensor_active_ratio=_mean(tensor),
                ib_errors_per_s=sum(ib) if ib else None,
            )
        )
    return out


def list_nodes(include_dead: bool = False) -> list[NodeRow]:
    """Nodes as Ray sees them now, as rows (the health columns empty: `attach_telemetry`
    fills them; `controlplane.views.node_rows` does it for the CLI)."""
    import ray  # deferred: heavy; the caller is a connected driver

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


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(rows: list[NodeRow]) -> str:
    """`rcp nodes`' table: one line per node, health columns when any row has health."""
    header: tuple[str, ...] = (
        "NODE",
        "POOL",
        "STATE",
        "GPU FREE/TOTAL",
        "CPU FREE/TOTAL",
        "ADDRESS",
        "LABELS",
    )
    with_health = any(r.health is not None for r in rows)
    if with_health:
        header = header[:3] + ("HEALTH", "MAX TEMP C", "TENSOR", "IB ERR/S") + header[3:]
    lines: list[tuple[str, ...]] = []
    for r in rows:
        labels = ",".join(f"{k}={v}" for k, v in sorted(r.labels.items()))
        row: tuple[str, ...] = (
            r.node_id[-12:],
            r.pool,
            r.state,
            f"{r.gpus_free:g}/{r.gpus_total:g}",
            f"{r.cpus_free:g}/{r.cpus_total:g}",
            r.address,
            labels,
        )
        if with_health:
            health = r.health or "-"
            if r.health_reasons:
                health += f" ({','.join(r.health_reasons)})"
            row = (
                row[:3]
                + (
                    health,
                    _fmt(r.gpu_temp_max_c, ".1f"),
                    _fmt(r.tensor_active_ratio, ".0%"),
                    _fmt(r.ib_errors_per_s, ".3g"),
                )
                + row[3:]
            )
        lines.append(row)
    return text_table(lines, header)


def format_health_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """`rcp health`'s table: node, pool, verdict, hottest GPU, reasons, details."""
    lines: list[tuple[str, ...]] = []
    for r in rows:
        temp = "-" if r["gpu_temp_max_c"] is None else f"{r['gpu_temp_max_c']:.1f}"
        lines.append(
            (
                r["node_id"][-12:],
                r["pool"],
                r["verdict"],
                temp,
                ",".join(r["reasons"]) or "-",
                "; ".join(r["details"]),
            )
        )
    return text_table(lines, ("NODE", "POOL", "HEALTH", "MAX TEMP C", "REASONS", "DETAILS"))


def text_table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    """`rows` under `header`, each column as wide as its widest cell, two spaces apart."""
    lines = [header, *rows]
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines
    )
