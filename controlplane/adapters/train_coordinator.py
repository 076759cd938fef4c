"""Ray Train's autoscaling coordinator, kept on the head node.

Ray Train (2.60) makes a detached actor, ``AutoscalingCoordinator`` (in a namespace of the same
name, `_AutoscalingCoordinatorActor` from Ray Data), the first time a run starts, pinned with a
hard node affinity to the node the run's controller is on. In this product that is a
cluster-pool worker (a gang's driver never runs on the head). A detached actor is work to
Ray, so that node could never finish a drain: Kubernetes deleting its pod, a spot notice, an
operator's ``ray drain-node`` all waited forever (found by test_node_health's drain
scenario), and once the node went, the actor could not restart anywhere else.

Owns: `keep_on_head`, which the controller calls when it starts: it makes the coordinator on
the head itself (Train then finds it by name), or moves one a run left on another node, or
replaces one that cannot come back (pinned to a node that is gone, e.g. the head before a
restart). Its state is the runs' resource requests, which Train sends again every few seconds,
so a move loses nothing.

Must not: run in a gang's driver, or fail the controller's start (it logs and returns).
"""

from __future__ import annotations

import logging
import time

__all__ = ["NAME", "NAMESPACE", "keep_on_head"]

log = logging.getLogger(__name__)

NAME = "AutoscalingCoordinator"
NAMESPACE = "AutoscalingCoordinator"
HEAD_RESOURCE = "node:__internal_head__"


def _head_node_id() -> str | None:
    import ray  # deferred: ray is heavy; imported on first call

    for n in ray.nodes():
        if n["Alive"] and HEAD_RESOURCE in (n.get("Resources") or {}):
            return str(n["NodeID"])
    return None


def _where(actor_id: str) -> tuple[str, str] | None:
    """(state, node id) of the actor, from Ray's state API; None if Ray does not know it."""
    from ray.util.state import get_actor

    row = get_actor(actor_id)
    if row is None:
        return None
    return str(row.state), str(row.node_id or "")


def keep_on_head(timeout_s: float = 30.0) -> str:
    """Make sure Train's coordinator is alive on the head; say what was done."""
    import ray  # deferred: ray is heavy; imported on first call
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        _AutoscalingCoordinatorActor,
    )
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    head = _head_node_id()
    if head is None:
        return "no live head node: the Train coordinator is left as it is"
    moved = ""
    try:
        found = ray.get_actor(NAME, namespace=NAMESPACE)
    except ValueError:
        found = None
    if found is not None:
        where = _where(found._actor_id.hex())
        if where is not None and where == ("ALIVE", head):
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
    # The options Ray's own get_or_create uses, but pinned to the head, not the caller's node.
    ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(
        _AutoscalingCoordinatorActor
    ).options(
        name=NAME,
        namespace=NAMESPACE,
        get_if_exists=True,
        lifetime="detached",
        scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False),
    ).remote()
    return f"the Train coordinator made on the head {head}{moved}"
