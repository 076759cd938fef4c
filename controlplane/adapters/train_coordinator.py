"""Ray Train's autoscaling coordinator, kept on the head node.

Ray Train (2.60) makes a detached actor, ``AutoscalingCoordinator`` (in a namespace of the same
name; Ray Data's ``get_or_create_autoscaling_coordinator``), the first time a run starts,
pinned with a hard node affinity to the node the calling process is on. In this product that
is a cluster-pool worker (a gang's driver and its Train controller never run on the head). A
detached actor is work to Ray, so that node could never finish a drain: Kubernetes deleting
its pod, a spot notice, an operator's ``ray drain-node`` all waited forever (found by
test_node_health's drain scenario), and once the node went, the actor could not restart
anywhere else.

Owns: `keep_on_head`, which the controller runs in a thread of its own when it starts: it has
Ray make the coordinator on the head (a task pinned to the head calls Ray's own
get-or-create, so the actor is exactly the one Train would make, and Train then finds it by
name), moves one a run left on another node, and replaces one that cannot come back (pinned
to a node that is gone, e.g. the head before a restart). Its state is the runs' resource
requests, which Train sends again every few seconds, so a move loses nothing.

Must not: import Ray Data in the controller's process (pandas and pyarrow: about 100 MB; the
task imports it on the head's worker), or fail the controller's start (the caller logs).
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["NAME", "NAMESPACE", "head_node_id", "keep_on_head"]

NAME = "AutoscalingCoordinator"
NAMESPACE = "AutoscalingCoordinator"
HEAD_RESOURCE = "node:__internal_head__"
_SETTLING = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "RESTARTING")
"""Actor states that may still end ALIVE: waited out before the actor is judged."""


def head_node_id() -> str | None:
    """The live head node's id (None while there is none)."""
    import ray  # deferred: ray is heavy; imported on first call

    for n in ray.nodes():
        if n["Alive"] and HEAD_RESOURCE in (n.get("Resources") or {}):
            return str(n["NodeID"])
    return None


def _where(actor_id: str, timeout_s: float) -> tuple[str, str] | None:
    """(state, node id) of the actor from Ray's state API once it is no longer settling (or
    `timeout_s` has passed); None if Ray does not know it."""
    from ray.util.state import get_actor

    deadline = time.monotonic() + timeout_s
    while True:
        row = get_actor(actor_id)
        if row is None:
            return None
        state = str(row.state)
        if state not in _SETTLING or time.monotonic() >= deadline:
            return state, str(row.node_id or "")
        time.sleep(0.5)


def _get_or_create_here() -> str:
    """Run on the head: Ray's own get-or-create (it pins the actor to this node); the id of
    the node the coordinator it returned lives on."""
    import ray  # deferred: runs in a Ray worker
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator,
    )

    actor = get_or_create_autoscaling_coordinator()
    ray.get(actor.__ray_ready__.remote(), timeout=60)
    return ray.get_runtime_context().get_node_id()


def keep_on_head(timeout_s: float = 60.0) -> str:
    """Make sure Train's coordinator is alive on the head; say what was done."""
    import ray  # deferred: ray is heavy; imported on first call
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    head = head_node_id()
    if head is None:
        return "no live head node: the Train coordinator is left as it is"
    moved = ""
    found: Any
    try:
        found = ray.get_actor(NAME, namespace=NAMESPACE)
    except ValueError:
        found = None
    if found is not None:
        where = _where(found._actor_id.hex(), timeout_s)
        if where == ("ALIVE", head):
            return "the Train coordinator is on the head"
        moved = f" (it was {where[0].lower()} on {where[1] or 'no node'})" if where else ""
        ray.kill(found, no_restart=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # the name is free once the kill has landed
            try:
                ray.get_actor(NAME, namespace=NAMESPACE)
            except ValueError:
                break
            time.sleep(0.2)
    task = ray.remote(num_cpus=0, max_retries=3)(_get_or_create_here)
    pinned = NodeAffinitySchedulingStrategy(head, soft=False)
    node = ray.get(task.options(scheduling_strategy=pinned).remote(), timeout=timeout_s)
    if node != head:  # a run made one elsewhere between the kill and the task
        return f"the Train coordinator is on {node}, not the head {head}; left for the next start"
    return f"the Train coordinator made on the head {head}{moved}"
