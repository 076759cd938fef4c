"""The Kubernetes actuator's nodes: cordon and taint a bad node, let it back, remove a Ray node.

Owns: `cordon` (``spec.unschedulable``, a ``NoSchedule`` taint ``<taint_key>=<reason slug>``,
annotations ``<taint_key>-reason`` / ``<taint_key>-since``), `uncordon` (our taint and
annotations only) and `remove_node` / `remove_worker` (cordon the pod's node, then delete the
pod so KubeRay starts a replacement elsewhere, both as one read of the pod saw them), each
node write safe against other writers as ``controlplane.kube.actuator`` says.
Must not: touch the RayCluster (``controlplane.kube.raycluster``), or remove a taint that is
not ours.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from kubernetes.client.exceptions import ApiException

from controlplane.kube.client import log
from controlplane.kube.errors import (
    KubeConflictError,
    KubeNotFoundError,
    KubernetesActuatorError,
    api_message,
)
from controlplane.kube.pods import PodAccess
from controlplane.kube.results import (
    CordonResult,
    RemoveNodeResult,
    UncordonResult,
    WorkerPod,
    reason_slug,
    taint_text,
)

__all__ = ["NodeRemoval"]

NO_SCHEDULE = "NoSchedule"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"


class NodeRemoval(PodAccess):
    """Cordons, taints and uncordons Kubernetes nodes; removes a Ray node's pod for good."""

    def _read_node(self, node_name: str, doing: str) -> dict[str, Any]:
        try:
            node: dict[str, Any] = self._call(self.core.read_node, node_name)
        except ApiException as exc:
            if exc.status == 404:
                raise KubeNotFoundError(
                    f"Kubernetes node {node_name!r} not found: cannot {doing} it "
                    "(see `kubectl get nodes`)"
                ) from exc
            raise KubernetesActuatorError(
                f"reading Kubernetes node {node_name!r} failed: {api_message(exc)}"
            ) from exc
        return node

    def _patch_node(self, node_name: str, body: dict[str, Any]) -> bool:
        """True when written, False on 409 Conflict (the caller re-reads and retries)."""
        try:
            self._call(self.core.patch_node, node_name, body, _content_type=STRATEGIC_MERGE)
        except ApiException as exc:
            if exc.status == 409:
                log.info("node %s changed under us (409 Conflict); re-reading", node_name)
                return False
            raise KubernetesActuatorError(
                f"patching Kubernetes node {node_name!r} failed: {api_message(exc)}"
            ) from exc
        return True

    def cordon(self, node_name: str, reason: str) -> CordonResult:
        """Cordon `node_name` and taint it ``<taint_key>=<slug of reason>:NoSchedule``.

        Keeps every other taint. Idempotent: when the node is already unschedulable with this
        exact taint nothing is written (and its first ``-since`` annotation is kept). A taint
        of ours with another reason is replaced. Raises KubeNotFoundError when the node does
        not exist, KubeConflictError after ``conflict_retries`` conflicts in a row.
        """
        key = self.config.taint_key
        ours = {"key": key, "value": reason_slug(reason), "effect": NO_SCHEDULE}
        for attempt in range(1, self._tries + 1):
            self._before_retry(attempt)
            node = self._read_node(node_name, "cordon")
            spec = node.get("spec") or {}
            taints: list[dict[str, Any]] = list(spec.get("taints") or [])
            mine = [t for t in taints if t.get("key") == key and t.get("effect") == NO_SCHEDULE]
            same_reason = bool(mine) and all(t.get("value") == ours["value"] for t in mine)
            if same_reason and spec.get("unschedulable"):
                log.debug("node %s already cordoned with %s", node_name, taint_text(ours))
                return CordonResult(node_name, taint_text(ours), False, attempt - 1)
            others = [t for t in taints if t not in mine]
            noted = (node["metadata"].get("annotations") or {}).get(self._annotation("since"))
            now = datetime.fromtimestamp(self._clock(), tz=timezone.utc)
            since = noted if noted and same_reason else now.strftime("%Y-%m-%dT%H:%M:%SZ")
            body = {
                "metadata": {
                    "resourceVersion": node["metadata"]["resourceVersion"],
                    "annotations": {
                        self._annotation("reason"): reason,
                        self._annotation("since"): since,
                    },
                },
                "spec": {"unschedulable": True, "taints": [*others, ours]},
            }
            if self._patch_node(node_name, body):
                log.info(
                    "cordoned Kubernetes node %s with taint %s (kept %d other taints): %s",
                    node_name,
                    taint_text(ours),
                    len(others),
                    reason,
                )
                return CordonResult(node_name, taint_text(ours), True, attempt)
        raise KubeConflictError(
            f"gave up cordoning Kubernetes node {node_name!r} after {self._tries} tries: another "
            "writer changed it every time (409 Conflict); kubernetes.conflict_retries is "
            f"{self.config.conflict_retries}"
        )

    def uncordon(self, node_name: str) -> UncordonResult:
        """An operator's command: remove our taint and our annotations, set unschedulable
        false. Other taints stay. Idempotent. Raises KubeNotFoundError naming the node when
        it does not exist, KubeConflictError after ``conflict_retries`` conflicts in a row."""
        key = self.config.taint_key
        for attempt in range(1, self._tries + 1):
            self._before_retry(attempt)
            node = self._read_node(node_name, "uncordon")
            spec = node.get("spec") or {}
            annotations = node["metadata"].get("annotations") or {}
            taints: list[dict[str, Any]] = list(spec.get("taints") or [])
            mine = [t for t in taints if t.get("key") == key]
            ours_noted = [a for a in ("reason", "since") if self._annotation(a) in annotations]
            if not (mine or spec.get("unschedulable") or ours_noted):
                return UncordonResult(node_name, False, (), f"node {node_name} was not cordoned")
            kept = [t for t in taints if t.get("key") != key]
            meta: dict[str, Any] = {"resourceVersion": node["metadata"]["resourceVersion"]}
            if ours_noted:  # null deletes an annotation
                meta["annotations"] = {self._annotation(a): None for a in ours_noted}
            body = {"metadata": meta, "spec": {"unschedulable": False, "taints": kept or None}}
            if self._patch_node(node_name, body):
                removed = tuple(taint_text(t) for t in mine)
                detail = (
                    f"uncordoned node {node_name}, removed {', '.join(removed) or 'no taint'}, "
                    f"kept {len(kept)} other taints (try {attempt})"
                )
                log.info("%s", detail)
                return UncordonResult(node_name, True, removed, detail)
        raise KubeConflictError(
            f"gave up uncordoning Kubernetes node {node_name!r} after {self._tries} tries: "
            "another writer changed it every time (409 Conflict)"
        )

    def remove_node(self, pod_name: str, reason: str) -> RemoveNodeResult:
        """Take the Ray node running in pod `pod_name` out of service, for good:
        `remove_worker` on `read_worker`'s read of the pod (a Ray node's hostname is its pod
        name in KubeRay; it must be a worker of our RayCluster, never the head:
        KubeRefusedError otherwise). Call it once the Ray node holds nothing (after the Ray
        drain). Calling again changes nothing."""
        return self.remove_worker(pod_name, self.read_worker(pod_name), reason)

    def remove_worker(
        self, pod_name: str, worker: WorkerPod | None, reason: str
    ) -> RemoveNodeResult:
        """Remove the worker pod as `worker` (one `read_worker`) saw it; None: already gone.

        1. `cordon` the pod's Kubernetes node *as read* with `reason` (KubeNotFoundError if
           the node is gone). A pod that was not scheduled when read cordons nothing, even if
           it was bound since: the service counted the actions on this read
           (``controlplane.kube.service``), so nothing is done that the read did not show.
        2. Delete the pod (``kubernetes.pod_grace_period_s``, else the pod's own), guarded by
           the uid read, so KubeRay creates a replacement, which the taint keeps off this node.

        A pod gone at the read or at step 2 is success (``pod_deleted=False``).
        """
        ns = self.config.namespace
        if worker is None:
            detail = f"pod {ns}/{pod_name} already gone; its node is unknown, nothing cordoned"
            log.info("%s", detail)
            return RemoveNodeResult(pod_name, None, None, False, detail)
        node_name = worker.node_name
        cordon = self.cordon(node_name, reason) if node_name else None
        deleted = self._delete_pod(pod_name, worker.uid)
        where = (
            f"node {node_name} {'cordoned' if cordon and cordon.changed else 'already cordoned'}"
        )
        detail = (
            f"{where if node_name else 'pod was not scheduled, no node to cordon'}; pod "
            f"{ns}/{pod_name} {'deleted' if deleted else 'already gone'}: {reason}"
        )
        return RemoveNodeResult(pod_name, node_name, cordon, deleted, detail)
