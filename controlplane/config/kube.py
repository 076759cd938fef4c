"""The ``kubernetes`` section: the Kubernetes actuator and its own service.

Owns: `KubernetesConfig` (the RayCluster, the taint, how the actuator authenticates, the
``rcp-kube-actuator`` service's URL and token file) and `KubeActuatorServiceConfig` (that
service's own limits, read by it alone).

Must not: validate (`controlplane.config.validation`) or talk to Kubernetes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["KubeActuatorServiceConfig", "KubernetesConfig"]


@dataclass
class KubeActuatorServiceConfig:
    """The ``rcp-kube-actuator`` service's own settings (``python -m controlplane.kube.service``,
    its own Deployment; docs/kubernetes-actuator.md). Read by that service only: the caller
    cannot change them, they bound what a stolen caller token can do."""

    host: str = "0.0.0.0"
    """Address the service listens on (in its pod: every interface; the NetworkPolicy admits
    only the Ray head)."""
    port: int = 8080
    max_node_actions: int = 2
    """Node actions the service takes per `window_s`: a cordon, or a node removal (deleting a
    worker pod, scheduled or not, with the cordon of its node); repeating one already taken
    in the window is free. Past it a request is 429. Defence in depth beside
    ``health.breaker``: keep it >= ``health.breaker.max_nodes`` (one removal per node).
    0 refuses every node action."""
    window_s: float = 600.0
    max_body_bytes: int = 4096
    """Larger request bodies are 413."""


@dataclass
class KubernetesConfig:
    """The Kubernetes actuator (production on KubeRay; see docs/kubernetes-actuator.md).

    Local mode has no Kubernetes: `enabled` stays false and nothing here is used.
    """

    enabled: bool = False
    """Build the Kubernetes actuator (cordon and taint bad nodes, delete their Ray pods)."""
    namespace: str = "default"
    """Namespace of the RayCluster and its pods."""
    raycluster: str = "rcp"
    """Name of the KubeRay RayCluster the control plane runs on."""
    external_group: str = "gpu-external"
    """The prefix of the RayCluster worker groups on rented nodes (the `external` pool): each
    provider's group is ``<external_group>-<provider name>``."""
    autoscaler_owns_external: bool = True
    """The KubeRay autoscaler sizes the external group; the actuator never writes its replicas."""
    taint_key: str = "rcp.dev/unhealthy"
    """Key of the NoSchedule taint put on a removed node's Kubernetes node; the value is the
    reason as a slug. An operator's uncordon removes exactly this key."""
    in_cluster: bool = True
    """Authenticate with the pod's service account; false: use `kubeconfig`."""
    kubeconfig: str | None = None
    """Kubeconfig file when in_cluster is false; null: $KUBECONFIG or ~/.kube/config."""
    context: str | None = None
    """Kubeconfig context; null: the file's current context."""
    conflict_retries: int = 5
    """Re-reads after a 409 Conflict (a concurrent writer) before giving up with an error."""
    pod_grace_period_s: int | None = None
    """Grace period when deleting a removed node's pod; null: the pod's own."""
    request_timeout_s: float = 10.0
    """Timeout of one request to the Kubernetes API."""
    actuator_url: str | None = None
    """``http(s)://host:port`` of the ``rcp-kube-actuator`` service. Set: the controller
    holds no Kubernetes credential and asks that service (which holds it and checks every
    request); null: the controller calls the Kubernetes API itself (dev and tests)."""
    actuator_token_file: str = "/etc/rcp/kube-actuator/token"
    """The bearer token shared by the controller and the actuator service (a Secret)."""
    service: KubeActuatorServiceConfig = field(default_factory=KubeActuatorServiceConfig)
