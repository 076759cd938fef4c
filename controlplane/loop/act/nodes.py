"""The health actuators: take an unhealthy node out of service the way Ray and KubeRay expect.

Owns: applying `policies.health`'s `CordonNode` and `DrainNode` actions, idempotently.

* `CordonNode` -> a Ray drain request (``DRAIN_NODE_REASON_PREEMPTION`` with a deadline of
  ``health.drain_deadline_s``): Ray schedules nothing new there, and Ray Serve starts a
  replacement for every replica there before it stops the old one. Work already on the node
  keeps running until the policy has moved it (gangs are preempted with a checkpoint first).
  A drained raylet shuts itself down as soon as nothing runs on it (seen in Ray 2.60's raylet
  log: "The node is drained, continue to shut down raylet"), so an idle node goes at once.
* `DrainNode` (the node holds nothing of ours any more) -> with ``health.replace_drained``, the
  node is replaced: on Kubernetes through the Kubernetes actuator (cordon and taint the
  Kubernetes node, delete the Ray pod, KubeRay creates a new one elsewhere); in local mode the
  node's raylet is stopped through the GCS, and Ray's autoscaler launches a replacement.

And the breaker's bookkeeping (`Breaker`) around the pure `policies.health.limit_removals`.

Must not: decide (the health policy does), or act on the head node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from controlplane.loop.record import EventKind
from policies.health import BreakerState, NodeVerdict, RemovalBudget, limit_removals, reset_breaker
from policies.snapshot import ClusterSnapshot

__all__ = ["Breaker", "NodeActions", "Remediator"]

log = logging.getLogger(__name__)


class NodeActions(Protocol):
    """What remediation needs from Ray (a fake in unit tests)."""

    def draining(self) -> Mapping[str, int]:
        """Node ids Ray drains now -> deadline (ms since the epoch, 0 for none)."""

    def drain(self, node_id: str, reason: str, deadline_s: float) -> bool:
        """Ask Ray to drain `node_id`; True when accepted."""

    def stop(self, node_id: str) -> bool:
        """Stop the node's raylet (local mode's way to have the node replaced)."""

    def hostname(self, node_id: str) -> str | None:
        """The node's hostname (on KubeRay: its pod name), None when Ray does not know it."""

    def holds_gpus(self, node_id: str) -> bool:
        """Whether anything holds a GPU of the node now, as Ray itself accounts it."""


@dataclass
class Remediator:
    """Applies cordon and drain actions once per node (`cordoned`, `replaced`).

    `kube_remove(pod_name, reason)` is the Kubernetes actuator's node removal, if any.
    `count_removal(now_s)` counts a node health takes out in the fleet's failure record once,
    at its cordon: a drain cannot be undone, so the node leaves service then.
    """

    nodes: NodeActions
    drain_deadline_s: float
    replace_drained: bool
    record: Callable[[EventKind, str], object]
    kube_remove: Callable[[str, str], object] | None = None
    count_removal: Callable[[float], object] | None = None
    cordoned: dict[str, float] = field(default_factory=dict)
    """Node id -> when this controller asked Ray to drain it."""
    replaced: dict[str, float] = field(default_factory=dict)
    """Node id -> when this controller had it stopped or its pod deleted."""

    def cordon(self, node_id: str, reason: str, now_s: float) -> bool:
        """Drain request for `node_id` unless one was made or Ray drains it already (for
        someone else, whose node it then is to remove: not recorded as ours)."""
        if node_id in self.cordoned or node_id in self.nodes.draining():
            return False
        if self.nodes.drain(node_id, reason, self.drain_deadline_s):
            self.cordoned[node_id] = now_s
            self.record(
                EventKind.HEALTH_CORDON, f"node {node_id}: nothing new lands there; {reason}"
            )
            if self.count_removal is not None:
                try:
                    self.count_removal(now_s)
                except Exception:  # the record is for the interval; never stop a removal
                    log.exception("counting node %s in the fleet's failure record", node_id)
            return True
        return False

    def replace(self, node_id: str, reason: str, now_s: float, cause: str = "") -> bool:
        """Have the empty node replaced (once); False when it was already or is not wanted.
        `cause` (e.g. ``gpu_overheated``) is the Kubernetes taint's value."""
        if not self.replace_drained or node_id in self.replaced:
            return False
        # The policy saw the node empty in its snapshot, whose replica list can lag (a
        # restarted controller, a move in progress). Removal waits for a tick after the
        # cordon and for Ray's own accounting to show no GPU held there.
        if self.cordoned.get(node_id, now_s) >= now_s or self.nodes.holds_gpus(node_id):
            return False
        if self.kube_remove is not None:
            pod = self.nodes.hostname(node_id)
            if pod is None:
                log.warning("no hostname (pod name) for node %s; not removing its pod", node_id)
                return False
            self.kube_remove(pod, cause or reason)
            how = f"pod {pod} deleted, its Kubernetes node cordoned and tainted"
        else:
            if not self.nodes.stop(node_id):
                log.warning("the GCS did not stop node %s; will ask again", node_id)
                return False
            how = "raylet stopped; the autoscaler replaces the node"
        self.replaced[node_id] = now_s
        self.record(EventKind.HEALTH_DRAIN, f"node {node_id} drained and removed ({how}); {reason}")
        return True

    def forget(self, alive: set[str]) -> None:
        """Drop records of nodes that are gone (node ids never come back)."""
        for book in (self.cordoned, self.replaced):
            for node_id in [n for n in book if n not in alive]:
                del book[node_id]


def _utc(t_s: float | None) -> str:
    return "-" if t_s is None else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t_s))


@dataclass
class Breaker:
    """Threads the breaker's state through ticks; the caller stores `state`, so removals
    earlier in the window still count after a restart."""

    budget: RemovalBudget
    record: Callable[[EventKind, str], object]
    state: BreakerState = field(default_factory=BreakerState)

    def step(
        self,
        verdicts: Mapping[str, NodeVerdict],
        snapshot: ClusterSnapshot,
        out: set[str],
        now_s: float,
    ) -> dict[str, NodeVerdict]:
        """The verdicts to act on (`limit_removals`); an event when the breaker opens, and when
        it no longer holds anything (it stays open until `reset`)."""
        before = self.state
        acting, self.state = limit_removals(verdicts, snapshot, self.budget, before, out, now_s)
        b = self.budget
        if self.state.open and not before.open:
            held = self.state.held
            shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
            self.record(
                EventKind.HEALTH_BREAKER,
                f"open: {len(held)} unhealthy node(s) not taken out ({shown}): at most "
                f"{b.max_nodes} nodes, and {b.max_pool_fraction:.0%} of a pool (at least 1), "
                f"per {b.window_s:g} s. Verdicts are shown and alerted on, not acted on, and no "
                "node is taken out until an operator resets the breaker (rcp health-breaker "
                "--reset). Check for a fleet-wide cause (telemetry exporter, driver rollout) "
                "first.",
            )
        elif self.state.open and before.held and not self.state.held:
            self.record(
                EventKind.HEALTH_BREAKER,
                "no unhealthy node is held any more; the breaker stays open (a new fault is "
                "held too) until an operator resets it (rcp health-breaker --reset)",
            )
        return acting

    def reset(self, by: str = "operator") -> BreakerState:
        """Close the breaker (`reset_breaker`) and say so in the event log; the state before."""
        before = self.state
        self.state = reset_breaker(before)
        if before.open:
            held = ", ".join(before.held) or "none"
            message = (
                f"reset by {by}: closed (open since {_utc(before.opened_s)}; held: {held}); "
                f"{len(before.removals)} removal(s) in the window still count"
            )
        else:
            message = f"reset by {by}: it was closed; nothing changes"
        self.record(EventKind.HEALTH_BREAKER_RESET, message)
        return before
