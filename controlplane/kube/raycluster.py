"""The Kubernetes actuator's RayCluster: the external worker group's ``replicas``.

Owns: `scale_external`, clamped to the group's bounds and refused while an autoscaler owns
the group, written as a JSON patch that tests the group's name at its index and carries the
``resourceVersion`` read, retried on conflict; a shrink takes only the pods it names in
``scaleStrategy.workersToDelete`` (see its doc).
Must not: delete pods or touch nodes (the operator deletes the named pods), write any other
field of the RayCluster, or choose which pods go (the policy did).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from controlplane.kube.client import log
from controlplane.kube.errors import (
    KubeConflictError,
    KubeNotFoundError,
    KubeRefusedError,
    KubernetesActuatorError,
    api_message,
)
from controlplane.kube.pods import GROUP_LABEL, PodAccess
from controlplane.kube.results import ScaleResult

__all__ = ["RayClusterScaling"]

RAY_GROUP, RAY_VERSION, RAY_PLURAL = "ray.io", "v1", "rayclusters"
JSON_PATCH = "application/json-patch+json"


class RayClusterScaling(PodAccess):
    """Sizes the RayCluster's external worker groups, naming the pods a shrink takes."""

    def scale_external(
        self, replicas: int, provider: str | None = None, workers_to_delete: Sequence[str] = ()
    ) -> ScaleResult:
        """Set the external worker group's ``replicas`` to `replicas`, clamped to the group's
        [minReplicas, maxReplicas]. The group is provider `provider`'s
        (``<kubernetes.external_group>-<provider>``), or with None the one named
        ``kubernetes.external_group``.

        A shrink takes only the pods `workers_to_delete` names (the emptied nodes the policy
        picked, `policies.external_shrink`): ``replicas`` goes down by the named pods that are
        live workers of the group and not already named, and never by more, so the
        operator's own pick (the first pods of its list) never comes into play. Those names
        go into the group's ``scaleStrategy.workersToDelete`` in the same JSON patch, and
        names whose pods are gone are cleared from it (the operator forgets them only in
        memory). A name that is gone already is skipped; a name of a pod that is not a
        worker of this group (the head, another group's or another RayCluster's pod, a pod
        without our labels) refuses the whole call (KubeRefusedError, nothing written).

        Refused (nothing written, ``refused`` says why) when
        ``kubernetes.autoscaler_owns_external`` is true (then nothing is even read) or the
        RayCluster has ``enableInTreeAutoscaling: true``: the autoscaler owns that number.
        Raises ValueError for a negative count or a repeated name, KubeNotFoundError when the
        RayCluster or the group (``kubernetes.external_group``) is missing, KubeConflictError
        after ``conflict_retries`` conflicts in a row.
        """
        group = self.config.external_group + (f"-{provider}" if provider else "")
        if replicas < 0:
            raise ValueError(f"replicas for worker group {group!r} must be >= 0, got {replicas}")
        names = tuple(workers_to_delete)
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"workers_to_delete for {group!r} names pods twice: {repeated}")
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
                names_seen = ", ".join(repr(g.get("groupName")) for g in groups) or "none"
                raise KubeNotFoundError(
                    f"{self._cluster} has no worker group named {group!r} "
                    f"(kubernetes.external_group); its worker groups: {names_seen}"
                )
            g = groups[index]
            low = int(g.get("minReplicas") or 0)
            high = g.get("maxReplicas")
            asked = max(low, replicas if high is None else min(replicas, int(high)))
            clamped = asked != replicas
            previous = g.get("replicas")
            current = int(previous) if previous is not None else low
            strategy: dict[str, Any] = dict(g.get("scaleStrategy") or {})
            pending = [str(n) for n in strategy.get("workersToDelete") or []]
            pods = self.group_workers(group) if names or pending else {}
            nameable = self._nameable(group, names, pods, pending)
            target, take = asked, tuple[str, ...]()
            if asked < current:  # a shrink: only by the pods it names
                target = max(asked, current - len(nameable))
                take = nameable[: current - target]
            kept = [n for n in pending if n in pods]
            cleared = tuple(n for n in pending if n not in pods)
            listed = kept + list(take)
            if previous == target and listed == pending:
                detail = f"worker group {group!r} already has replicas={target}"
                log.debug("%s", detail)
                return ScaleResult(
                    group, replicas, target, previous, False, clamped, None, attempt - 1, detail
                )
            rv = rc["metadata"]["resourceVersion"]
            at = f"/spec/workerGroupSpecs/{index}"
            ops = [
                {"op": "test", "path": f"{at}/groupName", "value": group},
                {"op": "replace", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "add", "path": f"{at}/replicas", "value": target},
            ]
            if listed != pending:
                value = {**strategy, "workersToDelete": listed}
                ops.append({"op": "add", "path": f"{at}/scaleStrategy", "value": value})
            if self._patch_raycluster(ops, rv):
                bounds = f"[{low}, {'unbounded' if high is None else high}]"
                detail = (
                    f"worker group {group!r} of {self._cluster}: replicas {previous} -> {target}"
                    + (f" (asked {replicas}, clamped to {bounds})" if clamped else "")
                    + (f", deleting {', '.join(take)}" if take else "")
                    + (
                        f" (held at {target}: only {len(nameable)} emptied pod(s) named)"
                        if target > asked
                        else ""
                    )
                    + (
                        f"; cleared gone {', '.join(cleared)} from workersToDelete"
                        if cleared
                        else ""
                    )
                )
                log.info("%s", detail)
                return ScaleResult(
                    group,
                    replicas,
                    target,
                    previous,
                    True,
                    clamped,
                    None,
                    attempt,
                    detail,
                    tuple(take),
                    cleared,
                )
        raise KubeConflictError(
            f"gave up scaling worker group {group!r} of {self._cluster} to {replicas} after "
            f"{self._tries} tries: another writer changed the RayCluster every time (409 "
            "Conflict). If the KubeRay autoscaler is on, set kubernetes.autoscaler_owns_external"
        )

    def _nameable(
        self,
        group: str,
        names: Sequence[str],
        pods: Mapping[str, Mapping[str, Any]],
        pending: Sequence[str],
    ) -> tuple[str, ...]:
        """The names a shrink may take, in the caller's order: live (not terminating) worker
        pods of `group` not already in ``workersToDelete``. A name not among `pods` is read:
        gone is skipped, any pod that is not a worker of `group` is KubeRefusedError."""
        ns = self.config.namespace
        for name in names:
            if name in pods:
                continue
            pod = self._read_pod(name)  # KubeRefusedError: not a worker of our RayCluster
            if pod is None:
                continue
            other = (pod["metadata"].get("labels") or {}).get(GROUP_LABEL)
            if other != group:
                raise KubeRefusedError(
                    f"pod {ns}/{name} is a worker of group {other!r}, not of {group!r} of "
                    f"{self._cluster}; a shrink of {group!r} names only its own pods"
                )
        return tuple(
            n
            for n in names
            if n in pods
            and n not in pending
            and not (pods[n].get("metadata") or {}).get("deletionTimestamp")
        )

    @property
    def _raycluster_path(self) -> tuple[str, str, str, str, str]:
        """(group, version, namespace, plural, name) of our RayCluster, as the client takes it."""
        return RAY_GROUP, RAY_VERSION, self.config.namespace, RAY_PLURAL, self.config.raycluster

    def _read_raycluster(self) -> dict[str, Any]:
        try:
            rc: dict[str, Any] = self._call(
                self.custom.get_namespaced_custom_object, *self._raycluster_path
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
        try:
            self._call(
                self.custom.patch_namespaced_custom_object,
                *self._raycluster_path,
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
