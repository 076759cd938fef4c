"""The Kubernetes actuator: the only code that changes Kubernetes objects (production on KubeRay).

Owns `KubernetesActuator`, put together from its parts, each calling the official
``kubernetes`` client: ``kube.client`` (the API client, bounded calls, retry pacing),
``kube.pods`` (which pods are ours, `read_worker`, `worker_pods_on_node`; deleting one),
``kube.nodes`` (`cordon`, `uncordon`, `remove_node`, `remove_worker`) and ``kube.raycluster``
(`scale_external`); what the calls report is in ``kube.results``, what they raise in
``kube.errors``. `controlplane.kube.connect.from_config` builds it (or the service's client).

How writes are made safe, each a read-modify-write with optimistic concurrency:

* Node: a strategic-merge patch that carries ``metadata.resourceVersion`` and the *whole*
  new taint list. ``Node.spec.taints`` has no patch merge key in Kubernetes, so any patch
  replaces the list; sending the list we computed from the version we read, with that
  version, makes a concurrent writer (the node lifecycle controller, an operator's kubectl)
  cause 409 Conflict instead of a lost taint. On 409 we re-read and retry.
* RayCluster: a JSON patch that tests the group's name at its index, sets
  ``metadata.resourceVersion`` to the version read (so a stale write is 409) and sets only
  that group's ``replicas`` and ``scaleStrategy``. Custom resources do not accept
  strategic-merge patches.
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

from controlplane.kube.nodes import NodeRemoval
from controlplane.kube.raycluster import RayClusterScaling

__all__ = ["KubernetesActuator"]


class KubernetesActuator(NodeRemoval, RayClusterScaling):
    """Applies node removals and external-group sizes to one KubeRay RayCluster."""

    def close(self) -> None:
        self.api_client.close()

    def __enter__(self) -> KubernetesActuator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
