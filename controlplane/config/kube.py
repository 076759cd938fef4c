"""The ``kubernetes`` section: the Kubernetes actuator (`KubernetesConfig`) and its own
service's limits, read by that service alone (`KubeActuatorServiceConfig`).

Must not: talk to Kubernetes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from controlplane.config.checks import (
    MAX_BODY_BYTES,
    MAX_DEADLINE_S,
    MAX_REQUEST_TIMEOUT_S,
    MAX_RETRIES,
    MAX_WINDOW_S,
    ActuatorUrl,
    DnsLabel,
    NonEmpty,
    Port,
    TaintKey,
    waits,
)
from policies.validation import at_least, at_most

__all__ = ["KubeActuatorServiceConfig", "KubernetesConfig"]


@dataclass
class KubeActuatorServiceConfig:
    """The ``rcp-kube-actuator`` service's own settings (``python -m controlplane.kube.service``,
    its own Deployment; docs/kubernetes-actuator.md). Read by that service only: the caller
    cannot change them, they bound what a stolen caller token can do."""

    host: str = "0.0.0.0"
    """Address the service listens on (in its pod: every interface; the NetworkPolicy admits
    only the Ray head)."""
    port: Port = 8080
    max_node_actions: Annotated[int, at_least(0)] = 2
    """Node actions the service takes per `window_s`: a cordon, or a node removal (deleting a
    worker pod, scheduled or not, with the cordon of its node); repeating one already taken
    in the window is free. Past it a request is 429. Defence in depth beside
    ``health.breaker``: keep it >= ``health.breaker.max_nodes`` (one removal per node).
    0 refuses every node action."""
    window_s: Annotated[float, at_least(1), waits(MAX_WINDOW_S)] = 600.0
    max_body_bytes: Annotated[int, at_least(256), at_most(MAX_BODY_BYTES, "read into memory")] = (
        4096
    )
    """Larger request bodies are 413."""


@dataclass
class KubernetesConfig:
    """The Kubernetes actuator (production on KubeRay; see docs/kubernetes-actuator.md).

    Local mode has no Kubernetes: `enabled` stays false and nothing here is used.
    """

    enabled: bool = False
    """Build the Kubernetes actuator (cordon and taint bad nodes, delete their Ray pods)."""
    namespace: DnsLabel = "default"
    """Namespace of the RayCluster and its pods."""
    raycluster: DnsLabel = "rcp"
    """Name of the KubeRay RayCluster the control plane runs on."""
    external_group: NonEmpty = "gpu-external"
    """The prefix of the RayCluster worker groups on rented nodes (the `external` pool): each
    provider's group is ``<external_group>-<provider name>``."""
    autoscaler_owns_external: bool = True
    """The KubeRay autoscaler sizes the external group; the actuator never writes its replicas."""
    taint_key: TaintKey = "rcp.dev/unhealthy"
    """Key of the NoSchedule taint put on a removed node's Kubernetes node; the value is the
    reason as a slug. An operator's uncordon removes exactly this key."""
    in_cluster: bool = True
    """Authenticate with the pod's service account; false: use `kubeconfig`."""
    kubeconfig: str | None = None
    """Kubeconfig file when in_cluster is false; null: $KUBECONFIG or ~/.kube/config."""
    context: str | None = None
    """Kubeconfig context; null: the file's current context."""
    conflict_retries: Annotated[int, at_least(0), at_most(MAX_RETRIES, "retries")] = 5
    """Re-reads after a 409 Conflict (a concurrent writer) before giving up with an error."""
    pod_grace_period_s: Annotated[int | None, at_least(0), waits(MAX_DEADLINE_S)] = None
    """Grace period when deleting a removed node's pod; null: the pod's own."""
    request_timeout_s: Annotated[float, at_least(0.1), waits(MAX_REQUEST_TIMEOUT_S)] = 10.0
    """Timeout of one request to the Kubernetes API."""
    actuator_url: ActuatorUrl = None
    """``http(s)://host:port`` of the ``rcp-kube-actuator`` service. Set: the controller
    holds no Kubernetes credential and asks that service (which holds it and checks every
    request); null: the controller calls the Kubernetes API itself (dev and tests)."""
    actuator_token_file: NonEmpty = "/etc/rcp/kube-actuator/token"
    """The bearer token shared by the controller and the actuator service (a Secret)."""
    service: KubeActuatorServiceConfig = field(default_factory=KubeActuatorServiceConfig)
