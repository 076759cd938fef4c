"""Which Kubernetes actuator a process gets from its config.

Owns: `from_config`. With ``kubernetes.actuator_url`` set (the shipped install) the controller
gets `RemoteKubernetesActuator`, which holds no Kubernetes credential and asks the
``rcp-kube-actuator`` service; otherwise (dev, tests, an operator's `rcp uncordon` with a
kubeconfig) `KubernetesActuator`, which calls the API itself. The service builds the direct
one with ``direct=True``.

Must not: be reached in local mode (`from_config` returns None when Kubernetes is disabled).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubernetes import client as k8s
from kubernetes import config as kube_config

from controlplane.kube.actuator import KubernetesActuator
from controlplane.kube.errors import KubernetesActuatorError
from controlplane.kube.remote import RemoteKubernetesActuator

if TYPE_CHECKING:
    from controlplane.config import Config

__all__ = ["from_config"]


def from_config(
    cfg: Config, *, configuration: k8s.Configuration | None = None, direct: bool = False
) -> KubernetesActuator | RemoteKubernetesActuator | None:
    """The actuator for ``cfg.kubernetes``, or None when it is disabled (local mode).

    ``kubernetes.actuator_url`` set and `direct` false: the service's HTTP client. Otherwise the
    in-process actuator; `configuration` overrides how the API server is reached (tests point
    it at a fake), else it comes from the pod's service account (``kubernetes.in_cluster``) or
    a kubeconfig (``kubernetes.kubeconfig``, ``kubernetes.context``).
    """
    kc = cfg.kubernetes
    if not kc.enabled:
        return None
    if kc.actuator_url and not direct and configuration is None:
        return RemoteKubernetesActuator(kc)
    if configuration is None:
        configuration = k8s.Configuration()
        try:
            if kc.in_cluster:
                kube_config.load_incluster_config(client_configuration=configuration)
            else:
                kube_config.load_kube_config(
                    config_file=kc.kubeconfig,
                    context=kc.context,
                    client_configuration=configuration,
                )
        except (kube_config.ConfigException, OSError) as exc:
            where = (
                "the pod's service account (kubernetes.in_cluster is true; outside a pod set it "
                "false and name a kubeconfig)"
                if kc.in_cluster
                else f"kubeconfig {kc.kubeconfig or '$KUBECONFIG or ~/.kube/config'}"
                + (f", context {kc.context!r}" if kc.context else "")
            )
            raise KubernetesActuatorError(
                f"cannot load Kubernetes credentials from {where}: {exc}"
            ) from exc
    return KubernetesActuator(kc, k8s.ApiClient(configuration))
