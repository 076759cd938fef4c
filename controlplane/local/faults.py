"""Faults a rented-GPU provider causes, played on the local cluster (`rcp fault reclaim`).

Owns: `reclaim_node`, the local stand-in for a spot reclaim: the provider gives notice that it
takes an external node back (for Ray, a drain with that deadline, as clouds and KubeRay turn
it into), and kills the node's processes when the notice runs out. Meanwhile the control plane
counts the node out of its provider's live GPUs and Serve starts its replicas elsewhere.

Must not: act on a node that is not an external (rented) node of this cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from controlplane.adapters.nodes import RayNodeControl
from controlplane.config import Config
from controlplane.local.processes import node_processes
from controlplane.pools import POOL_LABEL, Pool
from controlplane.ray_connection import connect

__all__ = ["MAX_NOTICE_S", "ReclaimError", "reclaim_node"]

MAX_NOTICE_S = 3600.0


class ReclaimError(RuntimeError):
    """The reclaim cannot be played: no such external node, or a bad notice."""


def _external_node(node: str) -> dict[str, Any]:
    import ray  # deferred: the caller connected

    alive = [n for n in ray.nodes() if n.get("Alive")]
    matches = [n for n in alive if n["NodeID"] == node or n["NodeID"].startswith(node)]
    matches = matches or [n for n in alive if node and n["NodeID"].endswith(node)]
    if len(matches) != 1:
        raise ReclaimError(f"node {node!r}: {len(matches)} live nodes match; give more of its id")
    found = matches[0]
    if (found.get("Labels") or {}).get(POOL_LABEL) != Pool.EXTERNAL.value:
        raise ReclaimError(f"node {found['NodeID']} is not an external (rented) node")
    return dict(found)


def reclaim_node(
    cfg: Config,
    state: dict[str, Any],
    node: str,
    notice_s: float,
    echo: Callable[[str], object] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Give external `node` (an id, or a unique prefix or suffix) `notice_s` of notice, then
    kill it; returns its id. `state` is the running cluster's state file."""
    if not 0 < notice_s <= MAX_NOTICE_S:  # NaN fails too
        raise ReclaimError(f"notice: between 0 and {MAX_NOTICE_S:g} s, got {notice_s!r}")
    connect(cfg)
    found = _external_node(node)
    node_id = str(found["NodeID"])
    provider = (found.get("Labels") or {}).get("provider", "?")
    why = f"provider {provider} reclaims the node in {notice_s:g} s"
    if not RayNodeControl().drain(node_id, why, notice_s):
        raise ReclaimError(f"Ray refused to drain {node_id} (see the GCS log)")
    echo(f"node {node_id} ({provider}): notice given, {notice_s:g} s")
    sleep(notice_s)
    procs = node_processes(state["cluster_id"], [state["temp_dir"]], node_id)
    for proc in procs:
        proc.kill()
    if procs:
        echo(f"node {node_id} ({provider}): taken back ({len(procs)} processes killed)")
    else:
        echo(f"node {node_id} ({provider}): taken back (already gone: Ray let it go once drained)")
    return node_id
