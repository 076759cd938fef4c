"""The Kubernetes actuator's plumbing: one API client, bounded calls, retry pacing.

Owns: `KubeClient`, the base the actuator's parts share: the ``CoreV1Api`` and
``CustomObjectsApi`` of one API client, `_call` (every request with
``kubernetes.request_timeout_s``, answered as raw JSON so that fields this client version does
not know are written back unchanged; an unreachable server named), the pause between conflict
retries, and the logger every change is logged under (``controlplane.kube.actuator``, as
docs/kubernetes-actuator.md says). Must not: read or write any object itself: pods
(``controlplane.kube.pods``), nodes (``controlplane.kube.nodes``) and the RayCluster
(``controlplane.kube.raycluster``) do.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import urllib3
from kubernetes import client as k8s

from controlplane.kube.errors import KubernetesActuatorError

if TYPE_CHECKING:
    from controlplane.config import KubernetesConfig

__all__ = ["KubeClient", "log"]

# One logger for every change the actuator makes, whichever module makes it.
log = logging.getLogger("controlplane.kube.actuator")


class KubeClient:
    """The API client and the plumbing the actuator's pod, node and RayCluster parts share."""

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
