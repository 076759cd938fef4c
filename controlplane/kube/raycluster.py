"""The Kubernetes actuator's RayCluster: the external worker group's ``replicas``.

Owns: `scale_external`, clamped to the group's [minReplicas, maxReplicas] and refused while an
autoscaler owns the group (``kubernetes.autoscaler_owns_external`` or the RayCluster's
``enableInTreeAutoscaling``), written as a JSON patch that tests the group's name at its
index and carries the ``resourceVersion`` read, retried on conflict. Must not: touch pods or
nodes, or any other field of the RayCluster.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from controlplane.kube.client import KubeClient, log
from controlplane.kube.errors import (
    KubeConflictError,
    KubeNotFoundError,
    KubernetesActuatorError,
    api_message,
)
from controlplane.kube.results import ScaleResult

__all__ = ["RayClusterScaling"]

RAY_GROUP, RAY_VERSION, RAY_PLURAL = "ray.io", "v1", "rayclusters"
JSON_PATCH = "application/json-patch+json"


class RayClusterScaling(KubeClient):
    """Sizes the RayCluster's external worker group."""

    def scale_external(self, replicas: int, provider: str | None = None) -> ScaleResult:
        """Set the external worker group's ``replicas`` to `replicas`, clamped to the group's
        [minReplicas, maxReplicas]. The group is provider `provider`'s
        (``<kubernetes.external_group>-<provider>``), or with None the one named
        ``kubernetes.external_group``.

        Refused (nothing written, ``refused`` says why) when
        ``kubernetes.autoscaler_owns_external`` is true (then nothing is even read) or the
        RayCluster has ``enableInTreeAutoscaling: true``: the autoscaler owns that number.
        Raises ValueError for a negative count, KubeNotFoundError when the RayCluster or the
        group (``kubernetes.external_group``) is missing, KubeConflictError after
        ``conflict_retries`` conflicts in a row.
        """
        group = self.config.external_group + (f"-{provider}" if provider else "")
        if replicas < 0:
            raise ValueError(f"replicas for worker group {group!r} must be >= 0, got {replicas}")
        if self.config.autoscaler_owns_external:
            why = (
                f"kubernetes.autoscaler_owns_external is true: the KubeRay autoscaler sizes "
                f"worker group {group!r}; not writing replicas={replicas}"
            )
            log.info("%s", why)
            return ScaleResult(group, replicas, None, None, False, False, why, 0, why)
        for attempt in range(1, self._tries + 1):
            self._before_retry(attempt)
            rc = self._read_raycluster()
            spec = rc.get("spec") or {}
            if spec.get("enableInTreeAutoscaling"):
                why = (
                    f"{self._cluster} has enableInTreeAutoscaling: true, so its autoscaler sizes "
                    f"worker group {group!r}; not writing replicas={replicas} (set "
                    "kubernetes.autoscaler_owns_external: true to say so in config)"
                )
                log.warning("%s", why)
                return ScaleResult(group, replicas, None, None, False, False, why, 0, why)
            groups = spec.get("workerGroupSpecs") or []
            index = next((i for i, g in enumerate(groups) if g.get("groupName") == group), None)
            if index is None:
                names = ", ".join(repr(g.get("groupName")) for g in groups) or "none"
                raise KubeNotFoundError(
                    f"{self._cluster} has no worker group named {group!r} "
                    f"(kubernetes.external_group); its worker groups: {names}"
                )
            g = groups[index]
            low = int(g.get("minReplicas") or 0)
            high = g.get("maxReplicas")
            target = max(low, replicas if high is None else min(replicas, int(high)))
            previous = g.get("replicas")
            clamped = target != replicas
            if previous == target:
                detail = f"worker group {group!r} already has replicas={target}"
                log.debug("%s", detail)
                return ScaleResult(
                    group, replicas, target, previous, False, clamped, None, attempt - 1, detail
                )
            rv = rc["metadata"]["resourceVersion"]
            ops = [
                {"op": "test", "path": f"/spec/workerGroupSpecs/{index}/groupName", "value": group},
                {"op": "replace", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "add", "path": f"/spec/workerGroupSpecs/{index}/replicas", "value": target},
            ]
            if self._patch_raycluster(ops, rv):
                bounds = f"[{low}, {'unbounded' if high is None else high}]"
                detail = (
                    f"worker group {group!r} of {self._cluster}: replicas {previous} -> {target}"
                    + (f" (asked {replicas}, clamped to {bounds})" if clamped else "")
                )
                log.info("%s", detail)
                return ScaleResult(
                    group, replicas, target, previous, True, clamped, None, attempt, detail
                )
        raise KubeConflictError(
            f"gave up scaling worker group {group!r} of {self._cluster} to {replicas} after "
            f"{self._tries} tries: another writer changed the RayCluster every time (409 "
            "Conflict). If the KubeRay autoscaler is on, set kubernetes.autoscaler_owns_external"
        )

    def _read_raycluster(self) -> dict[str, Any]:
        c = self.config
        try:
            rc: dict[str, Any] = self._call(
                self.custom.get_namespaced_custom_object,
                RAY_GROUP,
                RAY_VERSION,
                c.namespace,
                RAY_PLURAL,
                c.raycluster,
            )
        except ApiException as exc:
            if exc.status == 404:
                raise KubeNotFoundError(
                    f"{self._cluster} not found (kubernetes.namespace, kubernetes.raycluster): "
                    f"{api_message(exc)}"
                ) from exc
            raise KubernetesActuatorError(
                f"reading {self._cluster} failed: {api_message(exc)}"
            ) from exc
        return rc

    def _patch_raycluster(self, ops: list[dict[str, Any]], rv: str) -> bool:
        """True when written; False when the RayCluster changed since version `rv` (409, or
        a 422 failed test because the groups moved), so the caller re-reads and retries."""
        c = self.config
        try:
            self._call(
                self.custom.patch_namespaced_custom_object,
                RAY_GROUP,
                RAY_VERSION,
                c.namespace,
                RAY_PLURAL,
                c.raycluster,
                ops,
                _content_type=JSON_PATCH,
            )
        except ApiException as exc:
            if exc.status == 409:
                log.info("%s changed under us (409 Conflict); re-reading", self._cluster)
                return False
            if exc.status == 422 and self._read_raycluster()["metadata"]["resourceVersion"] != rv:
                log.info("%s changed under us (422 on a stale patch); re-reading", self._cluster)
                return False
            raise KubernetesActuatorError(
                f"patching {self._cluster} failed: {api_message(exc)}"
            ) from exc
        return True
