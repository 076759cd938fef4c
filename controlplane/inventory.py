"""What nodes the cluster has now: pool, GPUs total/free, labels, state.

Owns: reading node inventory from Ray (the caller is connected as a driver) and turning it
into plain rows for the CLI, the API and the policy actor's snapshot. When telemetry agents
run, rows also carry health (verdict, reasons), the hottest GPU, mean tensor-core activity and
the IB error rate (`attach_telemetry`); without agents those fields stay None. Verdicts are the
controller's (what it acts on, with lemon records and cordons) when it runs, else judged here
from the agents' recent samples.
Must not: change anything (it never starts agents).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
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
    """healthy, degraded or unhealthy (from telemetry); None when no agent reports."""
    health_reasons: list[str] = field(default_factory=list)
    gpu_temp_max_c: float | None = None
    """The hottest GPU in the newest telemetry sample."""
    tensor_active_ratio: float | None = None
    """Mean tensor-pipe activity over the node's GPUs (0..1)."""
    ib_errors_per_s: float | None = None
    """IB error counter increase per second, all ports."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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


def controller_health(timeout_s: float = 5.0) -> dict[str, Any] | None:
    """The policy actor's `health()` (the verdicts it acts on, cordoned nodes), or None when
    no controller actor runs or it does not answer in time. Local mode only: on Kubernetes
    the controller runs in-process in the head pod's rcp-controller container and there is
    no actor to ask, so this is None there."""
    import ray

    from controlplane.service.controller import get_controller

    handle = get_controller()
    if handle is None:
        return None
    try:
        result: dict[str, Any] = ray.get(handle.health.remote(), timeout=timeout_s)
    except Exception:
        return None
    return result


def controller_verdicts() -> dict[str, dict[str, Any]] | None:
    """The verdicts the controller acts on, as JSON rows by node id (`verdict_json` fields
    plus ``cordoned``: it took the node out), or None when no controller answers."""
    acting = controller_health()
    if acting is None:
        return None
    out = {n: {**v, "cordoned": False} for n, v in acting["verdicts"].items()}
    for node_id in acting["cordoned"]:
        if node_id in out:
            out[node_id]["cordoned"] = True
    return out


def _with_telemetry(rows: list[NodeRow]) -> list[NodeRow]:
    from controlplane.telemetry.manager import collect_summaries, find_agents, health_report

    if not find_agents():
        return rows
    acting = controller_verdicts()
    if acting is not None:  # the verdicts the controller acts on (lemons, cordons included)
        verdicts = {
            n: (
                str(v["verdict"]),
                [*map(str, v["reasons"]), *(["cordoned"] if v["cordoned"] else [])],
            )
            for n, v in acting.items()
        }
        return attach_telemetry(rows, collect_summaries(timeout_s=2.0), verdicts)
    # No controller: judge here. A short window keeps this cheap; it covers a hot streak and a
    # recovery at the defaults.
    judged, _state, latest = health_report(max_samples=8, timeout_s=2.0)
    return attach_telemetry(
        rows,
        latest,
        {n: (v.verdict.value, [r.value for r in v.reasons]) for n, v in judged.items()},
    )


def list_nodes(include_dead: bool = False, telemetry: bool = True) -> list[NodeRow]:
    """Nodes as rows; with `telemetry` (default) and agents running, health columns too."""
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
    return _with_telemetry(rows) if telemetry else rows


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(rows: list[NodeRow]) -> str:
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
    lines = [header]
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
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in lines
    )
