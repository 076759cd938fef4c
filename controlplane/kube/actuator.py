"""The Kubernetes actuator: the only code that changes Kubernetes objects (production on KubeRay).

Owns, through the official ``kubernetes`` client (``CoreV1Api``, ``CustomObjectsApi``):

* `KubernetesActuator.remove_node`: take a Ray node's Kubernetes node out of service and
  delete its Ray pod so KubeRay starts a replacement elsewhere: cordon
  (``spec.unschedulable``), a ``NoSchedule`` taint ``<taint_key>=<reason slug>``, annotations
  ``<taint_key>-reason`` / ``<taint_key>-since``, then DELETE the pod.
* `KubernetesActuator.cordon` / `uncordon`: the node half on its own; `uncordon` is for an
  operator's command and removes only our taint.
* `KubernetesActuator.scale_external`: the external worker group's ``replicas`` in the
  RayCluster, clamped to the group's bounds, unless the KubeRay autoscaler owns that group.
* `worker_pods_on_node` / `node_of_worker`: the read-only checks the ``rcp-kube-actuator``
  service (``controlplane.kube.service``) makes before it lets a caller touch a node or pod.

`controlplane.kube.connect.from_config` builds this class (or the service's HTTP client).

How writes are made safe, each a read-modify-write with optimistic concurrency:

* Node: a strategic-merge patch that carries ``metadata.resourceVersion`` and the *whole*
  new taint list. ``Node.spec.taints`` has no patch merge key in Kubernetes, so any patch
  replaces the list; sending the list we computed from the version we read, with that
  version, makes a concurrent writer (the node lifecycle controller, an operator's kubectl)
  cause 409 Conflict instead of a lost taint. On 409 we re-read and retry.
* RayCluster: a JSON patch that tests the group's name at its index, sets
  ``metadata.resourceVersion`` to the version read (so a stale write is 409) and sets only
  that group's ``replicas``. Custom resources do not accept strategic-merge patches.
* Pod: DELETE with a ``preconditions.uid`` of the pod we looked at, so a same-named
  replacement is never deleted; 404 (already gone) counts as success.

Objects are read and patched as raw JSON (not the client's models) so that fields of other
writers' taints this client version does not know are written back unchanged.

Must not: decide anything. Which node to remove, when, and how many external replicas are
policy decisions (``policies/``) handed in by the controller; this module only applies them,
idempotently (a repeated call that finds its effect in place writes nothing), and logs every
change. It never touches the head pod or a pod of another RayCluster, and never writes the
external group's replicas while an autoscaler owns them.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

if TYPE_CHECKING:
    from controlplane.config import KubernetesConfig

__all__ = [
    "CLUSTER_LABEL",
    "NODE_TYPE_LABEL",
    "CordonResult",
    "KubeConflictError",
    "KubeNotFoundError",
    "KubeRateLimitedError",
    "KubeRefusedError",
    "KubernetesActuator",
    "KubernetesActuatorError",
    "RemoveNodeResult",
    "ScaleResult",
    "UncordonResult",
    "reason_slug",
]

log = logging.getLogger(__name__)

RAY_GROUP, RAY_VERSION, RAY_PLURAL = "ray.io", "v1", "rayclusters"
CLUSTER_LABEL = "ray.io/cluster"
"""KubeRay labels every pod of a RayCluster with the cluster's name."""
NODE_TYPE_LABEL = "ray.io/node-type"
"""KubeRay's ``head`` / ``worker`` pod label."""
NO_SCHEDULE = "NoSchedule"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class KubernetesActuatorError(RuntimeError):
    """The actuator could not do what was asked; the message says what and why."""


class KubeNotFoundError(KubernetesActuatorError):
    """A node, RayCluster or worker group the call needs does not exist."""


class KubeConflictError(KubernetesActuatorError):
    """Other writers kept changing the object: every retry ended in 409 Conflict."""


class KubeRefusedError(KubernetesActuatorError):
    """The object is not ours to touch: not a worker pod of our RayCluster, or a node that
    hosts none. Never retried into success: the request itself is wrong."""


class KubeRateLimitedError(KubernetesActuatorError):
    """The actuator service's own cap on node actions per window is reached; try later."""


@dataclass(frozen=True)
class CordonResult:
    node_name: str
    taint: str
    """The taint as ``key=value:effect``."""
    changed: bool
    """False: the node was already cordoned with this taint; nothing was written."""
    attempts: int
    """Writes tried (1 + conflicts retried); 0 when nothing needed writing."""


@dataclass(frozen=True)
class RemoveNodeResult:
    pod_name: str
    node_name: str | None
    """The pod's Kubernetes node; None when the pod was gone (or never scheduled) before we
    could read it, so no node was cordoned."""
    cordon: CordonResult | None
    """What happened to the node; None when there was no node to cordon."""
    pod_deleted: bool
    """True: this call deleted the pod. False: it was already gone (404, or replaced by a pod
    of the same name with another uid, which is left alone)."""
    detail: str
    """One line for the event log."""


@dataclass(frozen=True)
class UncordonResult:
    node_name: str
    changed: bool
    """False: the node was schedulable and carried none of our taint; nothing was written."""
    removed_taints: tuple[str, ...]
    """Our taints removed, each ``key=value:effect``; other taints are left as they were."""
    detail: str


@dataclass(frozen=True)
class ScaleResult:
    group: str
    requested: int
    replicas: int | None
    """The group's ``replicas`` after the call (None when refused before reading it)."""
    previous: int | None
    changed: bool
    clamped: bool
    """`requested` was outside [minReplicas, maxReplicas] and was clamped."""
    refused: str | None
    """Why nothing was written, when the autoscaler owns the group; None otherwise."""
    attempts: int
    detail: str


def reason_slug(reason: str) -> str:
    """`reason` as a valid label value (the taint's value): at most 63 of [a-z0-9._-],
    starting and ending with a letter or digit, e.g. ``"GPU overheated (81 C)"`` ->
    ``"gpu-overheated-81-c"``. The full reason goes into the node's annotation."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", reason.lower())
    slug = re.sub(r"-{2,}", "-", slug)[:63]
    slug = re.sub(r"^[^a-z0-9]+|[^a-z0-9]+$", "", slug)
    return slug or "unspecified"


def _taint_text(t: dict[str, Any]) -> str:
    value = f"={t['value']}" if t.get("value") else ""
    return f"{t.get('key')}{value}:{t.get('effect')}"


def _api_message(exc: ApiException) -> str:
    """The Kubernetes `Status` message of an error response, else its HTTP reason."""
    try:
        body = json.loads(exc.body or "")
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    except ValueError:
        pass
    return f"HTTP {exc.status} {exc.reason or ''}".strip()


class KubernetesActuator:
    """Applies node removals and external-group sizes to one KubeRay RayCluster."""

    def __init__(
        self,
        config: KubernetesConfig,
        api_client: k8s.ApiClient,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self.api_client = api_client
        self.core = k8s.CoreV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)
        self._clock = clock
        self._sleep = sleep

    def close(self) -> None:
        self.api_client.close()

    def __enter__(self) -> KubernetesActuator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------------

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call a client method and return the response body as plain JSON.

        ApiException (an HTTP error answer) passes through for the caller to interpret; not
        reaching the server at all is a KubernetesActuatorError naming the address."""
        try:
            resp = method(
                *args,
                _preload_content=False,
                _request_timeout=self.config.request_timeout_s,
                **kwargs,
            )
            data = resp.data
        except urllib3.exceptions.HTTPError as exc:
            host = self.api_client.configuration.host
            raise KubernetesActuatorError(
                f"cannot reach the Kubernetes API at {host} "
                f"(timeout {self.config.request_timeout_s:g} s): {exc}"
            ) from exc
        return json.loads(data) if data else None

    def _before_retry(self, attempt: int) -> None:
        """A short pause before try `attempt` (2, 3, ...) after a conflict, like client-go's
        RetryOnConflict (10 ms steps), so two writers do not collide in lockstep."""
        if attempt > 1:
            self._sleep(0.01 * (attempt - 1))

    @property
    def _cluster(self) -> str:
        return f"RayCluster {self.config.namespace}/{self.config.raycluster}"

    @property
    def _tries(self) -> int:
        return self.config.conflict_retries + 1

    def _annotation(self, what: str) -> str:
        return f"{self.config.taint_key}-{what}"

    # -- pods ----------------------------------------------------------------------------------

    def _list_pods(self, selector: str) -> list[dict[str, Any]]:
        """Pods in our namespace matching the label `selector` (KubernetesActuatorError)."""
        try:
            pods = self._call(
                self.core.list_namespaced_pod, self.config.namespace, label_selector=selector
            )
        except ApiException as exc:
            raise KubernetesActuatorError(
                f"listing pods {selector} in namespace {self.config.namespace} failed: "
                f"{_api_message(exc)}"
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

    def node_of_worker(self, pod_name: str) -> str | None:
        """The Kubernetes node of our worker pod `pod_name`; None when the pod is gone or not
        scheduled. Raises KubeRefusedError for any pod that is not our RayCluster's worker."""
        pod = self._read_pod(pod_name)
        if pod is None:
            return None
        node = (pod.get("spec") or {}).get("nodeName")
        return str(node) if node else None

    def _read_pod(self, pod_name: str) -> dict[str, Any] | None:
        ns = self.config.namespace
        try:
            pod: dict[str, Any] = self._call(self.core.read_namespaced_pod, pod_name, ns)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise KubernetesActuatorError(
                f"reading pod {ns}/{pod_name} failed: {_api_message(exc)}"
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
                f"deleting pod {ns}/{pod_name} failed: {_api_message(exc)}"
            ) from exc
        grace = self.config.pod_grace_period_s
        log.info(
            "deleted pod %s/%s (grace period %s) so KubeRay replaces it",
            ns,
            pod_name,
            "the pod's own" if grace is None else f"{grace} s",
        )
        return True

    # -- nodes ---------------------------------------------------------------------------------

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
                f"reading Kubernetes node {node_name!r} failed: {_api_message(exc)}"
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
                f"patching Kubernetes node {node_name!r} failed: {_api_message(exc)}"
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
                log.debug("node %s already cordoned with %s", node_name, _taint_text(ours))
                return CordonResult(node_name, _taint_text(ours), False, attempt - 1)
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
                    _taint_text(ours),
                    len(others),
                    reason,
                )
                return CordonResult(node_name, _taint_text(ours), True, attempt)
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
                removed = tuple(_taint_text(t) for t in mine)
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
        """Take the Ray node running in pod `pod_name` out of service, for good.

        1. Read the pod (a Ray node's hostname is its pod name in KubeRay); it must be a worker
           of our RayCluster, never the head (KubernetesActuatorError otherwise).
        2. `cordon` its Kubernetes node with `reason` (KubeNotFoundError if the node is gone).
        3. Delete the pod (``kubernetes.pod_grace_period_s``, else the pod's own), guarded by
           its uid, so KubeRay creates a replacement, which the taint keeps off this node.

        Call it once the Ray node holds nothing (after the Ray drain). A pod already gone at
        step 1 or 3 is success (``pod_deleted=False``); calling again changes nothing.
        """
        ns = self.config.namespace
        pod = self._read_pod(pod_name)
        if pod is None:
            detail = f"pod {ns}/{pod_name} already gone; its node is unknown, nothing cordoned"
            log.info("%s", detail)
            return RemoveNodeResult(pod_name, None, None, False, detail)
        node_name = (pod.get("spec") or {}).get("nodeName")
        cordon = self.cordon(node_name, reason) if node_name else None
        deleted = self._delete_pod(pod_name, pod["metadata"].get("uid"))
        where = (
            f"node {node_name} {'cordoned' if cordon and cordon.changed else 'already cordoned'}"
        )
        detail = (
            f"{where if node_name else 'pod was not scheduled, no node to cordon'}; pod "
            f"{ns}/{pod_name} {'deleted' if deleted else 'already gone'}: {reason}"
        )
        return RemoveNodeResult(pod_name, node_name, cordon, deleted, detail)

    # -- the RayCluster's external worker group ------------------------------------------------

    def scale_external(self, replicas: int) -> ScaleResult:
        """Set the external worker group's ``replicas`` to `replicas`, clamped to the group's
        [minReplicas, maxReplicas].

        Refused (nothing written, ``refused`` says why) when
        ``kubernetes.autoscaler_owns_external`` is true (then nothing is even read) or the
        RayCluster has ``enableInTreeAutoscaling: true``: the autoscaler owns that number.
        Raises ValueError for a negative count, KubeNotFoundError when the RayCluster or the
        group (``kubernetes.external_group``) is missing, KubeConflictError after
        ``conflict_retries`` conflicts in a row.
        """
        group = self.config.external_group
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
                    f"{_api_message(exc)}"
                ) from exc
            raise KubernetesActuatorError(
                f"reading {self._cluster} failed: {_api_message(exc)}"
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
                f"patching {self._cluster} failed: {_api_message(exc)}"
            ) from exc
        return True
