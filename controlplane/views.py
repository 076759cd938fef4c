"""What the demo prints about nodes: Ray's node rows (`controlplane.inventory`) joined with the
telemetry agents' newest summaries and the verdicts the controller acts on (judged here from
the agents' samples when no controller runs). The CLI reads nodes and health over the API.
Must not: change anything, or be imported by the control plane below the CLI.
"""

from __future__ import annotations

from typing import Any

from controlplane.controller_client import controller_health
from controlplane.inventory import NodeRow, attach_telemetry, format_table, list_nodes
from controlplane.telemetry.manager import collect_summaries, find_agents, health_report

__all__ = ["controller_verdicts", "format_table", "node_rows", "with_telemetry"]


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
