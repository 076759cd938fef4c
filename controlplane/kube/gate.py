"""What the actuator service lets through, independent of HTTP: `ActuatorService`.

Owns: the checks of every request's body (exactly the route's keys, names as DNS-1123
subdomains, a reason of printable text up to `MAX_REASON_CHARS`, replicas in
0..`MAX_REPLICAS`), the bearer token (read per request from
``kubernetes.actuator_token_file``), the ownership checks before an action (only a worker pod
of the configured RayCluster; only a node that hosts one), the rate cap on node actions
(`NodeActionCap`), and the action itself, one at a time under one lock, so the check, the
count and the action use one read of the pod. A request it will not carry out is a `Refusal`
with the HTTP status `controlplane.kube.service` answers it with.

Must not: speak HTTP or log requests (`controlplane.kube.service` does), decide anything (the
controller's policies do), or trust the caller with a namespace, a label selector or an object
it did not check.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from controlplane.config.checks import DNS_SUBDOMAIN
from controlplane.kube.actuator import KubernetesActuator
from controlplane.kube.remote import read_actuator_token
from controlplane.tokens import bearer_matches

if TYPE_CHECKING:
    from controlplane.config import KubernetesConfig

__all__ = ["MAX_REASON_CHARS", "MAX_REPLICAS", "ActuatorService", "NodeActionCap", "Refusal"]

MAX_REASON_CHARS = 1024
MAX_REPLICAS = 1000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Refusal(Exception):
    """A request the service will not carry out: `status` and a message for the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class NodeActionCap:
    """At most `max_actions` node actions per `window_s`, each checked and recorded in one call.

    An action is the set of Kubernetes objects it changes: a cordon is ``{"node <name>"}``; a
    removal is ``{"pod <uid>"}`` plus ``"node <name>"`` when the pod was scheduled when read
    (a pod not yet scheduled counts too: deleting it is an action). An action whose objects
    were all acted on within the window is a repeat (a retry, or a cordon of a node a removal
    already cordoned) and free; any other action takes one slot, or is refused.

    Example (max_actions 2, window_s 600): cordon a at t=0 and remove pod p (uid 1, on node b)
    at t=10 are admitted; cordon b at t=15 is free (b was cordoned by the removal); remove
    unscheduled pod q (uid 2) at t=20 is refused; remove p again at t=30 is free; cordon c at
    t=601 is admitted (a's slot left the window). The memory is this process's: a restarted
    service starts with an empty window, so the health breaker stays the first limit.
    """

    max_actions: int
    window_s: float
    admitted: list[tuple[float, frozenset[str]]] = field(default_factory=list)
    """(when, the objects it changes) of each action that took a slot within the window."""

    def admit(self, objects: frozenset[str], now_s: float) -> bool:
        """Check and record in one step: True (recorded, or a repeat) or False (refused)."""
        self.admitted = [(t, o) for t, o in self.admitted if now_s - t < self.window_s]
        if objects <= frozenset[str]().union(*(o for _t, o in self.admitted)):
            return True
        if len(self.admitted) >= self.max_actions:
            return False
        self.admitted.append((now_s, objects))
        return True


# --- input checks ---------------------------------------------------------------------------


def _fields(body: object, *names: str) -> dict[str, object]:
    if not isinstance(body, dict):
        raise Refusal(400, "the body must be a JSON object")
    unknown = sorted(set(body) - set(names))
    missing = [n for n in names if n not in body]
    if unknown or missing:
        raise Refusal(
            400,
            f"the body must have exactly the keys {list(names)}; unknown {unknown}, "
            f"missing {missing}",
        )
    return body


def _name(what: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > 253 or not DNS_SUBDOMAIN.fullmatch(value):
        raise Refusal(
            400,
            f"{what} must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', "
            f"at most 253 characters), got {str(value)[:80]!r}",
        )
    return value


def _reason(value: object) -> str:
    if (
        not isinstance(value, str)
        or not value.strip()
        or len(value) > MAX_REASON_CHARS
        or _CONTROL.search(value)
    ):
        raise Refusal(
            400,
            f"reason must be printable text of 1..{MAX_REASON_CHARS} characters without "
            "control characters",
        )
    return value


def _pod_names(value: object) -> list[str]:
    """``workers_to_delete``: a list of distinct pod names, at most `MAX_REPLICAS`."""
    if not isinstance(value, list) or len(value) > MAX_REPLICAS:
        raise Refusal(400, f"workers_to_delete must be a list of at most {MAX_REPLICAS} pod names")
    names = [_name(f"workers_to_delete[{i}]", n) for i, n in enumerate(value)]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise Refusal(400, f"workers_to_delete names pods twice: {repeated}")
    return names


# --- the service ----------------------------------------------------------------------------


class ActuatorService:
    """The checks and the actions, independent of HTTP (`controlplane.kube.service`'s
    handlers call these)."""

    def __init__(
        self,
        actuator: KubernetesActuator,
        config: KubernetesConfig,
        *,
        providers: Collection[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.actuator = actuator
        self.config = config
        self._providers = frozenset(providers)
        """The external providers whose worker groups callers may size."""
        self.cap = NodeActionCap(config.service.max_node_actions, config.service.window_s)
        self._clock = clock
        self._lock = threading.Lock()

    @property
    def _cluster(self) -> str:
        return f"RayCluster {self.config.namespace}/{self.config.raycluster}"

    def token(self) -> str:
        """The expected bearer token, read now (`read_actuator_token`)."""
        return read_actuator_token(self.config.actuator_token_file)

    def authorized(self, header: str) -> bool:
        """Whether `header` is ``Bearer <the token>`` (`bearer_matches`)."""
        return bearer_matches(header, self.token())

    def _admit(self, what: str, objects: frozenset[str]) -> None:
        if not self.cap.admit(objects, self._clock()):
            s = self.config.service
            raise Refusal(
                429,
                f"{what}: the actuator service took {len(self.cap.admitted)} node actions "
                f"in the last {s.window_s:g} s, its cap (kubernetes.service.max_node_actions); "
                "try again later",
            )

    def remove_node(self, body: object) -> dict[str, Any]:
        b = _fields(body, "pod_name", "reason")
        pod, reason = _name("pod_name", b["pod_name"]), _reason(b["reason"])
        with self._lock:
            # One read of the pod: the check, the cap and the action all use it, so a pod
            # bound to a node after this read cannot get that node cordoned uncounted.
            worker = self.actuator.read_worker(pod)  # KubeRefusedError: not our worker
            if worker is not None:
                objects = {f"pod {worker.uid or worker.name}"}
                if worker.node_name is not None:
                    objects.add(f"node {worker.node_name}")
                self._admit(f"pod {pod}", frozenset(objects))
            return dataclasses.asdict(self.actuator.remove_worker(pod, worker, reason))

    def cordon(self, body: object) -> dict[str, Any]:
        b = _fields(body, "node_name", "reason")
        node, reason = _name("node_name", b["node_name"]), _reason(b["reason"])
        with self._lock:
            if not self.actuator.worker_pods_on_node(node):
                raise Refusal(
                    403,
                    f"node {node} hosts no running worker pod of {self._cluster}; "
                    "the actuator only cordons nodes of its own Ray workers",
                )
            self._admit(f"node {node}", frozenset({f"node {node}"}))
            return dataclasses.asdict(self.actuator.cordon(node, reason))

    def scale_external(self, body: object) -> dict[str, Any]:
        """``{"replicas": N}`` sizes ``kubernetes.external_group``, or with ``"provider": P``
        (one this service was configured with) P's group; ``"workers_to_delete"`` names the
        pods a shrink takes, each checked by the actuator (`RayClusterScaling.scale_external`:
        403 for any pod not a worker of that group). Not counted by the node-action cap: the
        names choose which of the group's pods a lower ``replicas`` takes, not how many."""
        optional = ("provider", "workers_to_delete")
        given = [k for k in optional if isinstance(body, dict) and k in body]
        b = _fields(body, "replicas", *given)
        replicas = b["replicas"]
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise Refusal(400, f"replicas must be an integer, got {type(replicas).__name__}")
        if not 0 <= replicas <= MAX_REPLICAS:
            raise Refusal(400, f"replicas must be in 0..{MAX_REPLICAS}, got {replicas}")
        provider = b.get("provider")
        if provider is not None and provider not in self._providers:
            raise Refusal(
                400,
                f"provider must be one of {sorted(self._providers)}, got {str(provider)[:40]!r}",
            )
        names = _pod_names(b.get("workers_to_delete", []))
        with self._lock:
            result = self.actuator.scale_external(
                replicas, None if provider is None else str(provider), names
            )
            return dataclasses.asdict(result)

    def pod_for_ip(self, body: object) -> str | None:
        ip = _fields(body, "pod_ip")["pod_ip"]
        try:
            if not isinstance(ip, str) or len(ip) > 45:
                raise ValueError(ip)
            address = str(ipaddress.ip_address(ip))
        except ValueError:
            raise Refusal(400, "pod_ip must be an IPv4 or IPv6 address") from None
        with self._lock:
            return self.actuator.pod_for_ip(address)
