"""What each Kubernetes actuator call reports: frozen results, and the taint text they carry.

Owns: `CordonResult`, `RemoveNodeResult`, `UncordonResult`, `ScaleResult` (the same shapes
whether the actuator runs in-process or behind the ``rcp-kube-actuator`` service),
`WorkerPod` (one read of a worker pod, which a removal then acts on), and how a
free-text reason becomes a taint value (`reason_slug`). Must not: call the Kubernetes API or
import its client: the controller's HTTP client (``controlplane.kube.remote``) builds these
from JSON.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CordonResult",
    "RemoveNodeResult",
    "ScaleResult",
    "UncordonResult",
    "WorkerPod",
    "reason_slug",
    "taint_text",
]


@dataclass(frozen=True)
class WorkerPod:
    """A worker pod of our RayCluster as one read saw it. A removal acts on exactly this:
    it cordons `node_name` as read (never a node the pod was bound to later) and deletes
    the pod only while it still has `uid`."""

    name: str
    uid: str | None
    node_name: str | None
    """None: the pod was not scheduled when read."""


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
    named: tuple[str, ...] = ()
    """Pods this call added to the group's ``scaleStrategy.workersToDelete``: exactly as many
    as it lowered ``replicas`` by (the operator deletes these, not pods of its choice)."""
    cleared: tuple[str, ...] = ()
    """Names this call removed from ``workersToDelete``: their pods are gone."""


def reason_slug(reason: str) -> str:
    """`reason` as a valid label value (the taint's value): at most 63 of [a-z0-9._-],
    starting and ending with a letter or digit, e.g. ``"GPU overheated (81 C)"`` ->
    ``"gpu-overheated-81-c"``. The full reason goes into the node's annotation."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", reason.lower())
    slug = re.sub(r"-{2,}", "-", slug)[:63]
    slug = re.sub(r"^[^a-z0-9]+|[^a-z0-9]+$", "", slug)
    return slug or "unspecified"


def taint_text(t: dict[str, Any]) -> str:
    value = f"={t['value']}" if t.get("value") else ""
    return f"{t.get('key')}{value}:{t.get('effect')}"
