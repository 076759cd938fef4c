"""The Ray nodes adapter: the node inventory and Ray's drain, the loop's only way to both.

Owns: `RayNodes`, which lists the cluster's nodes as `controlplane.inventory.NodeRow`s (no
telemetry columns: the loop reads health from its own agents) and implements
`controlplane.loop.act.nodes.NodeActions` through the GCS client of the connected driver or
actor: which nodes Ray drains, a drain request (``DRAIN_NODE_REASON_PREEMPTION`` with a
deadline), stopping a drained node's raylet (local mode's replacement), a node's hostname (on
KubeRay its pod name) and whether anything holds its GPUs.

Must not: decide which node to drain (the health policy does) or act on the head node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from controlplane.inventory import NodeRow, list_nodes
from controlplane.telemetry.manager import stop_agent

__all__ = ["RayNodeControl", "RayNodes"]

log = logging.getLogger(__name__)


class RayNodeControl:
    """`NodeActions` through the GCS client of the connected driver (or actor)."""

    def _gcs(self) -> Any:
        import ray  # deferred: ray is heavy; imported on first call

        worker: Any = ray._private.worker.global_worker
        return worker.gcs_client

    def draining(self) -> Mapping[str, int]:
        import ray  # deferred: ray is heavy; imported on first call

        return dict(ray._private.state.state.get_draining_nodes())

    def drain(self, node_id: str, reason: str, deadline_s: float) -> bool:
        from ray.core.generated import autoscaler_pb2

        reasons: Any = autoscaler_pb2.DrainNodeReason  # type: ignore[attr-defined]
        deadline_ms = int((time.time() + deadline_s) * 1000)
        accepted, message = self._gcs().drain_node(
            node_id,
            reasons.Value("DRAIN_NODE_REASON_PREEMPTION"),
            reason,
            deadline_ms,
        )
        if not accepted:
            log.warning("Ray did not accept draining %s: %s", node_id, message)
        return bool(accepted)

    def stop(self, node_id: str) -> bool:
        # The agent is the last thing of ours there; once it is gone a drained raylet exits on
        # its own. The GCS call makes sure it does.
        stop_agent(node_id)
        stopped = self._gcs().drain_nodes(node_ids=[bytes.fromhex(node_id)])
        return len(stopped) > 0

    def holds_gpus(self, node_id: str) -> bool:
        import ray  # deferred: ray is heavy; imported on first call

        total = next(
            (n.get("Resources", {}) for n in ray.nodes() if n["NodeID"] == node_id and n["Alive"]),
            None,
        )
        if total is None:  # gone already
            return False
        available = ray._private.state.available_resources_per_node().get(node_id, {})
        return float(available.get("GPU", 0.0)) < float(total.get("GPU", 0.0))

    def hostname(self, node_id: str) -> str | None:
        import ray  # deferred: ray is heavy; imported on first call

        for n in ray.nodes():
            if n["NodeID"] == node_id:
                return str(n.get("NodeManagerHostname") or "") or None
        return None


class RayNodes(RayNodeControl):
    """`RayNodeControl` plus the node inventory (`NodeInventory` of the loop)."""

    def list_nodes(self) -> list[NodeRow]:
        return list_nodes()
