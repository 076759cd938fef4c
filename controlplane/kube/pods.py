"""The Kubernetes actuator's pods: which are ours, where they run, and deleting one safely.

Owns: reading our RayCluster's pods (by label, by IP, by node, by worker group) and the
client-side check that a pod is ours to touch (a worker of our RayCluster: never the head,
never another cluster's pod; `KubeRefusedError` otherwise), and the DELETE guarded by
``preconditions.uid`` so a same-named replacement is never deleted (404 counts as success).
Must not: touch nodes (``controlplane.kube.nodes``) or decide which pod goes (policies do).
"""

from __future__ import annotations

from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controlplane.kube.client import KubeClient, log
from controlplane.kube.errors import KubeRefusedError, KubernetesActuatorError, api_message
from controlplane.kube.results import WorkerPod

__all__ = ["CLUSTER_LABEL", "GROUP_LABEL", "NODE_TYPE_LABEL", "PodAccess"]

CLUSTER_LABEL = "ray.io/cluster"
"""KubeRay labels every pod of a RayCluster with the cluster's name."""
NODE_TYPE_LABEL = "ray.io/node-type"
"""KubeRay's ``head`` / ``worker`` pod label."""
GROUP_LABEL = "ray.io/group"
"""KubeRay labels every worker pod with its worker group's name."""


class PodAccess(KubeClient):
    """Reads and deletes our RayCluster's worker pods, refusing any other pod."""

    def _list_pods(self, selector: str) -> list[dict[str, Any]]:
        """Pods in our namespace matching the label `selector` (KubernetesActuatorError)."""
        try:
            pods = self._call(
                self.core.list_namespaced_pod, self.config.namespace, label_selector=selector
            )
        except ApiException as exc:
            raise KubernetesActuatorError(
                f"listing pods {selector} in namespace {self.config.namespace} failed: "
                f"{api_message(exc)}"
            ) from exc
        return list(pods.get("items") or [])

    def pod_for_ip(self, pod_ip: str) -> str | None:
        """Name of the RayCluster's pod with this IP (a Ray node's address), or None."""
        for pod in self._list_pods(f"{CLUSTER_LABEL}={self.config.raycluster}"):
            if (pod.get("status") or {}).get("podIP") == pod_ip:
                return str(pod["metadata"]["name"])
        return None

    def worker_pods_on_node(self, node_name: str) -> list[str]:
        """Names of our RayCluster's worker pods that run on Kubernetes node `node_name` now
        (scheduled there and not finished). Empty: the node is not ours to cordon."""
        selector = f"{CLUSTER_LABEL}={self.config.raycluster},{NODE_TYPE_LABEL}=worker"
        return [
            str(pod["metadata"]["name"])
            for pod in self._list_pods(selector)
            if (pod.get("spec") or {}).get("nodeName") == node_name
            and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]

    def read_worker(self, pod_name: str) -> WorkerPod | None:
        """Our worker pod `pod_name` as read now (its uid and node; the node None when not
        scheduled), or None when it is gone. Raises KubeRefusedError for any pod that is not
        our RayCluster's worker. `remove_worker` acts on this read, not on a later one."""
        pod = self._read_pod(pod_name)
        if pod is None:
            return None
        node = (pod.get("spec") or {}).get("nodeName")
        uid = pod["metadata"].get("uid")
        return WorkerPod(pod_name, str(uid) if uid else None, str(node) if node else None)

    def group_workers(self, group: str) -> dict[str, dict[str, Any]]:
        """Our RayCluster's worker pods of worker group `group`, by name (terminating ones
        too: they are gone once the API no longer lists them)."""
        selector = (
            f"{CLUSTER_LABEL}={self.config.raycluster},{GROUP_LABEL}={group},"
            f"{NODE_TYPE_LABEL}=worker"
        )
        return {str(p["metadata"]["name"]): p for p in self._list_pods(selector)}

    def _read_pod(self, pod_name: str) -> dict[str, Any] | None:
        ns = self.config.namespace
        try:
            pod: dict[str, Any] = self._call(self.core.read_namespaced_pod, pod_name, ns)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise KubernetesActuatorError(
                f"reading pod {ns}/{pod_name} failed: {api_message(exc)}"
            ) from exc
        labels = pod["metadata"].get("labels") or {}
        owner = labels.get(CLUSTER_LABEL)
        if owner != self.config.raycluster:
            raise KubeRefusedError(
                f"pod {ns}/{pod_name} is not a Ray pod of {self._cluster} (its {CLUSTER_LABEL} "
                f"label is {owner!r}); refusing to touch it. Check kubernetes.raycluster and the "
                "pod name (a Ray node's hostname is its pod name)"
            )
        if labels.get(NODE_TYPE_LABEL) == "head":
            raise KubeRefusedError(
                f"pod {ns}/{pod_name} is the Ray head of {self._cluster}; removing it would stop "
                "the whole cluster, so the actuator never does"
            )
        if labels.get(NODE_TYPE_LABEL) != "worker":
            raise KubeRefusedError(
                f"pod {ns}/{pod_name} is not a worker of {self._cluster} (its {NODE_TYPE_LABEL} "
                f"label is {labels.get(NODE_TYPE_LABEL)!r}); the actuator only removes workers"
            )
        return pod

    def _delete_pod(self, pod_name: str, uid: str | None) -> bool:
        ns = self.config.namespace
        options = k8s.V1DeleteOptions(
            grace_period_seconds=self.config.pod_grace_period_s,
            preconditions=k8s.V1Preconditions(uid=uid) if uid else None,
        )
        try:
            self._call(
                self.core.delete_namespaced_pod,
                pod_name,
                ns,
                body=options,
                # this client sets no Content-Type on DELETE (the server would assume JSON)
                _headers={"Content-Type": "application/json"},
            )
        except ApiException as exc:
            if exc.status == 404:
                log.info("pod %s/%s already gone", ns, pod_name)
                return False
            if exc.status == 409 and uid:
                log.info(
                    "pod %s/%s was already replaced by a pod of the same name (uid precondition "
                    "%s failed); the new pod is left alone",
                    ns,
                    pod_name,
                    uid,
                )
                return False
            raise KubernetesActuatorError(
                f"deleting pod {ns}/{pod_name} failed: {api_message(exc)}"
            ) from exc
        grace = self.config.pod_grace_period_s
        log.info(
            "deleted pod %s/%s (grace period %s) so KubeRay replaces it",
            ns,
            pod_name,
            "the pod's own" if grace is None else f"{grace} s",
        )
        return True
