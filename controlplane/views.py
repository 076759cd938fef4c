"""What the CLI and the demo print about nodes and their health: the rows and the tables.

Owns: joining Ray's node rows (`controlplane.inventory`) with the telemetry agents' newest
summaries and the verdicts the controller acts on (`controller_verdicts`; judged here from the
agents' samples when no controller runs), and rendering `rcp nodes` and `rcp health` tables.
Must not: change anything (it never starts agents), or be imported by the control plane
below the CLI: the controller's own snapshot reads `controlplane.inventory` directly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controlplane.controller_client import controller_health
from controlplane.inventory import NodeRow, attach_telemetry, list_nodes
from controlplane.telemetry.manager import (
    AgentRef,
    collect_summaries,
    find_agents,
    health_report,
    verdict_json,
)
from policies.health import NodeVerdict

__all__ = [
    "controller_verdicts",
    "format_health_table",
    "format_table",
    "health_rows",
    "node_rows",
    "with_telemetry",
]


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


def node_rows(include_dead: bool = False) -> list[NodeRow]:
    """`rcp nodes`' rows: Ray's nodes, with health columns when telemetry agents run. The
    verdicts are the controller's (what it acts on, with lemon records and cordons) when it
    runs, else judged here from the agents' recent samples."""
    return with_telemetry(list_nodes(include_dead=include_dead))


def with_telemetry(rows: list[NodeRow]) -> list[NodeRow]:
    """`rows` with the health columns filled when telemetry agents run (see `node_rows`)."""
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


def health_rows(
    refs: Sequence[AgentRef],
    judged: Mapping[str, NodeVerdict],
    latest: Mapping[str, dict[str, Any]],
) -> list[dict[str, Any]]:
    """`rcp health`'s rows, one per agent: the verdicts judged here from the agents' samples,
    replaced by the controller's (the ones it acts on, lemon records included; "cordoned"
    marks nodes it took out) when it runs; "unknown" for a node with no samples yet."""
    verdicts: dict[str, dict[str, Any]] = {n: verdict_json(v) for n, v in judged.items()}
    for node_id, held in (controller_verdicts() or {}).items():
        verdicts[node_id] = {
            **held,
            "details": [*held["details"], *(["cordoned"] if held["cordoned"] else [])],
        }
    rows = []
    for ref in refs:
        v = verdicts.get(ref.node_id)
        s = latest.get(ref.node_id, {})
        temps = [g["temp_c"] for g in s.get("gpus", []) if g.get("temp_c") is not None]
        row = (
            dict(v)
            if v
            else {
                "node_id": ref.node_id,
                "verdict": "unknown",
                "reasons": [],
                "details": ["no samples yet"],
                "lemon": False,
            }
        )
        row.update(
            pool=ref.pool,
            gpu_temp_max_c=max(temps) if temps else None,
            faults=s.get("faults", []),
            sampled_s=s.get("sampled_s"),
        )
        rows.append(row)
    return rows


def format_health_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """`rcp health`'s table: node, pool, verdict, hottest GPU, reasons, details."""
    lines = [("NODE", "POOL", "HEALTH", "MAX TEMP C", "REASONS", "DETAILS")]
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
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )
