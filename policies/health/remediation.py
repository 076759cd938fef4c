"""From verdicts to a plan: take unhealthy GPU nodes out of service without breaking anything.

Owns: `with_verdicts` (the snapshot with unhealthy nodes marked, so capacity shrinks at
once, and serving-only nodes marked, so admission leaves them out), `acting_verdicts` (a node the controller cordoned stays unhealthy; a node Ray drains
for someone else while a gang holds GPUs there turns unhealthy) and `remediate` (cordon,
checkpoint-and-requeue gangs, move replicas make-before-break, drain once empty), with the
`CordonNode` action. Verdicts the breaker holds (`NodeVerdict.held`) are left alone.
Must not: act, or decide how many nodes may go (`policies.health.breaker` does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from policies.health.verdicts import NodeVerdict, Verdict
from policies.plan import DrainNode, PreemptJob
from policies.snapshot import ClusterSnapshot, Pool

__all__ = [
    "DRAINED_BY_OTHERS",
    "CordonNode",
    "RemediationAction",
    "acting_verdicts",
    "remediate",
    "with_verdicts",
]


@dataclass(frozen=True)
class CordonNode:
    """Place nothing new on `node_id` (Ray: exclude it from placement; Kubernetes: cordon).

    Level-triggered like every action: repeated each tick while the node is unhealthy.
    """

    node_id: str
    reason: str


RemediationAction = CordonNode | PreemptJob | DrainNode
"""What `remediate` may ask for."""


def with_verdicts(
    snapshot: ClusterSnapshot, verdicts: Mapping[str, NodeVerdict]
) -> ClusterSnapshot:
    """`snapshot` with every UNHEALTHY node marked ``healthy=False`` and every SERVING_ONLY
    node ``serving_only=True``; degraded nodes stay in, and so do nodes whose verdict the
    breaker holds (`NodeVerdict.held`).

    Every policy that counts live capacity then leaves the node out on this very tick;
    admission leaves a serving-only node out of every gang fit, while placement still
    counts its GPUs as serving's.
    """
    nodes = []
    for n in snapshot.nodes:
        v = verdicts.get(n.node_id, _NO_VERDICT)
        if n.healthy and _acts(v):
            n = replace(n, healthy=False)
        elif n.healthy and _serving_only(v):
            n = replace(n, serving_only=True)
        nodes.append(n)
    return replace(snapshot, nodes=tuple(nodes))


_NO_VERDICT = NodeVerdict("", Verdict.HEALTHY)


def _acts(v: NodeVerdict) -> bool:
    return v.verdict is Verdict.UNHEALTHY and not v.held


def _serving_only(v: NodeVerdict) -> bool:
    return v.verdict is Verdict.SERVING_ONLY and not v.held


DRAINED_BY_OTHERS = "Ray is draining it"
"""The detail of a verdict `acting_verdicts` adds for a node someone else drains."""


def acting_verdicts(
    judged: Mapping[str, NodeVerdict],
    previous: Mapping[str, NodeVerdict],
    cordoned: Iterable[str],
    draining: Iterable[str],
    snapshot: ClusterSnapshot,
) -> tuple[dict[str, NodeVerdict], frozenset[str]]:
    """The verdicts the controller acts on, and the nodes drained by someone else.

    From the telemetry verdicts (`judged`), two rules:

    1. A node the controller has cordoned (`cordoned`: it asked Ray to drain it) stays
       UNHEALTHY even if its samples recover: a Ray drain cannot be undone, so the node goes
       on to be replaced. It keeps its last unhealthy verdict (from `previous`), or gets a
       bare one ("cordoned").
    2. A node Ray drains for someone else (in `draining`, not cordoned: Kubernetes deleting
       the pod, a spot preemption notice, an operator) while a gang holds GPUs there is
       UNHEALTHY (`DRAINED_BY_OTHERS`), so the gang checkpoints and restarts elsewhere before
       the node goes. Such nodes are returned in the second value: the caller does not remove
       them (whoever drains them does) and does not blame their host. Idle draining nodes are
       left to whoever drains them.
    """
    out = dict(judged)
    for node_id in cordoned:
        if out.get(node_id, _NO_VERDICT).verdict is not Verdict.UNHEALTHY:
            before = previous.get(node_id, _NO_VERDICT)
            out[node_id] = (
                before
                if before.verdict is Verdict.UNHEALTHY
                else NodeVerdict(node_id, Verdict.UNHEALTHY, details=("cordoned",))
            )
    ours = set(cordoned)
    by_others = set()
    for node_id in sorted(set(draining) - ours):
        held = any(g.gpus_by_node.get(node_id, 0) > 0 for g in snapshot.running)
        if held and out.get(node_id, _NO_VERDICT).verdict is not Verdict.UNHEALTHY:
            out[node_id] = NodeVerdict(node_id, Verdict.UNHEALTHY, details=(DRAINED_BY_OTHERS,))
            by_others.add(node_id)
    return out, frozenset(by_others)


def remediate(
    snapshot: ClusterSnapshot, verdicts: Mapping[str, NodeVerdict]
) -> tuple[RemediationAction, ...]:
    """The plan that takes unhealthy GPU nodes out of service without breaking anything.

    Per UNHEALTHY node of the cluster or external pool (never the head) that the breaker does
    not hold (`limit_removals`), in node id order:

    1. `CordonNode`: nothing new lands there.
    2. `PreemptJob(checkpoint_first=True)` for each gang holding GPUs there that is not already
       being preempted: it checkpoints, is re-queued and restarts on healthy nodes.
    3. `DrainNode` only once no gang holds GPUs there and no replica of ours is left on it.

    A SERVING_ONLY node (fabric faults only) is not cordoned or drained: its replicas stay
    and more may start there. Only its gangs go: `PreemptJob(checkpoint_first=True)` for each
    one there not already being preempted, so it restarts on nodes whose fabric works.

    Serve replicas on the node are not moved here: the node, unhealthy in the snapshot, leaves
    the cluster pool's serving budget, and the placement policy (`policies.placement`, the one
    owner of where replicas run) moves them make-before-break in a move that names the node.

    Worked example: cluster nodes ``a`` (unhealthy, gang ``j1`` holds 4 GPUs, one 1-GPU replica
    of model ``m``) and ``b`` (healthy, 0 GPUs free). Plan: CordonNode(a), PreemptJob(j1).
    Next ticks, while ``j1`` checkpoints and placement moves the replica: the same cordon, no
    second preemption (``j1`` is now preempting). Once ``a`` holds nothing: CordonNode(a),
    DrainNode(a). Had ``a`` been SERVING_ONLY (ib_errors): PreemptJob(j1) alone, and the
    replica stays.
    """
    actions: list[RemediationAction] = []
    asked: set[str] = set()
    for n in sorted(snapshot.nodes, key=lambda n: n.node_id):
        v = verdicts.get(n.node_id, _NO_VERDICT)
        if n.pool is Pool.HEAD or not _serving_only(v):
            continue
        for g in sorted(snapshot.running, key=lambda g: g.job_id):
            if g.gpus_by_node.get(n.node_id, 0) > 0 and not g.preempting and g.job_id not in asked:
                asked.add(g.job_id)
                why = f"checkpoint and restart elsewhere: node {n.node_id} {v.reason}"
                actions.append(PreemptJob(g.job_id, why))
    unhealthy = {
        n.node_id: verdicts[n.node_id]
        for n in snapshot.nodes
        if n.pool is not Pool.HEAD and n.node_id in verdicts and _acts(verdicts[n.node_id])
    }
    for node_id in sorted(unhealthy):
        why = f"node {node_id} {unhealthy[node_id].reason}"
        actions.append(CordonNode(node_id, why))
        gangs = [g for g in snapshot.running if g.gpus_by_node.get(node_id, 0) > 0]
        for g in sorted(gangs, key=lambda g: g.job_id):
            if not g.preempting and g.job_id not in asked:
                asked.add(g.job_id)
                actions.append(PreemptJob(g.job_id, f"checkpoint and restart elsewhere: {why}"))
        replicas = [r for r in snapshot.serve_replicas if r.node_id == node_id]
        if not gangs and not replicas:
            actions.append(DrainNode(node_id, why))
    return tuple(actions)
