"""Preemption: what must make room now for the head of the queue, and the plan that asks it.

Owns: `choose_room`, the minimal set of Serve replicas and victim gangs whose GPUs let the
head fit now, and `room_actions`, the plan items that ask for them. The rules:

- Only for an entitled head (`Ledger.entitled`), and only when free and releasing GPUs are
  not enough (the caller, `policies.admission.reservation`, checks both first).
- In-cluster Serve replicas yield first (training outranks serving): one
  `MoveServeReplicas` per model, to the external pool, with the node ids chosen here. They
  are taken in `policies.model_classes.yield_key` order (lowest model priority first; a
  model whose SLO is at risk last in its class), within a model from the node with most free
  GPUs; a model's ``min_cluster_replicas`` and pinned models are never candidates.
- Then training victims: lower-priority gangs of the head's queue, and (reclaim) gangs of
  other queues while those are over their share. Victims are taken lowest priority value
  first, then least work at risk (most recently checkpointed), then most recently started,
  then job id, until the head fits; then every candidate the fit does not need is spared
  again, most expensive first, so none can be dropped (not a global minimum).
- Caps: a job preempted ``max_preemptions_per_job_per_hour`` times in the window is no
  candidate; if the victims would pass ``max_preemptions_per_hour``, nobody is preempted and
  the head waits. A gang already asked (preempting, or in the state's records since it
  started) counts as releasing and is never chosen again.

Worked example: node ``a`` with 8 GPUs, 4 free; ``old`` (low, 4 GPUs on ``a``) and ``big``
(medium, 8 GPUs on ``b``) run; the head ``h`` (high) needs 2 x 4 GPUs. Candidates in order:
``old``, ``big``. Taking ``old`` makes ``a`` 8 free: ``h`` fits, ``big`` is never taken, and
sparing ``old`` again would not fit: the set is {``old``}: ``PreemptJob(old, for_job_id=h)``.

Must not: reserve, admit, or touch anything but the `Ledger` it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from policies.admission.fit import FreeGpus
from policies.admission.reasons import Why
from policies.admission.shares import Ledger, live_gpus
from policies.admission.state import PreemptionRecord
from policies.model_classes import yield_key
from policies.plan import Action, MoveServeReplicas, PreemptJob
from policies.snapshot import Pool, QueuedJob, ReplicaState, RunningGang, ServeReplica

__all__ = ["Candidate", "choose_room", "preemptible", "room_actions", "value_of"]


@dataclass
class Candidate:
    """Something that can give the head GPUs now: a Serve replica or a gang to preempt."""

    gpus_by_node: Mapping[str, int]
    replica: ServeReplica | None = None
    gang: RunningGang | None = None


def choose_room(
    ledger: Ledger,
    head: QueuedJob,
    head_value: int,
    future: FreeGpus,
    give: Callable[..., None],
) -> list[Candidate] | None:
    """The minimal candidates that make `head` fit on `future`, or None (no fit, or over the
    preemption cap). `give(gpus_by_node, sign)` adds (or with -1 takes back) GPUs to `future`;
    on success `future` holds the chosen candidates' GPUs."""
    g, w = head.gpus_per_worker, head.num_workers
    serve = _serve_candidates(ledger, future) if ledger.cfg.move_serve_replicas else []
    victims = _victim_candidates(ledger, head, head_value)
    chosen: list[Candidate] = []
    queue_used = dict(ledger.used_by_queue)
    fitted = False
    for cand in serve + victims:
        if cand.gang is not None and not _still_eligible(ledger, head, cand.gang):
            continue
        chosen.append(cand)
        give(cand.gpus_by_node)
        if cand.gang is not None:
            ledger.used_by_queue[cand.gang.queue] -= live_gpus(cand.gang, ledger.live_ids)
        if future.fits(g, w):
            fitted = True
            break
    ledger.used_by_queue = queue_used
    if not fitted:
        return None
    for cand in reversed(list(chosen)):
        give(cand.gpus_by_node, -1)
        if future.fits(g, w):
            chosen.remove(cand)
        else:
            give(cand.gpus_by_node)
    num_victims = sum(1 for c in chosen if c.gang is not None)
    if num_victims > ledger.cfg.max_preemptions_per_hour - len(ledger.preemptions):
        return None  # over the cap: nobody is preempted, the head waits
    return chosen


def _serve_candidates(ledger: Ledger, future: FreeGpus) -> list[Candidate]:
    ordered = sorted(
        ledger.replicas,
        key=lambda r: (
            yield_key(r.model, ledger.models)[:2],
            -future.free.get(r.node_id, 0),
            r.state is ReplicaState.RUNNING,
            r.replica_id,
        ),
    )
    return [Candidate({r.node_id: r.gpus}, replica=r) for r in ordered]


def _victim_candidates(ledger: Ledger, head: QueuedJob, head_value: int) -> list[Candidate]:
    cfg = ledger.cfg
    if not cfg.preemption_enabled:
        return []
    if len(ledger.preemptions) >= cfg.max_preemptions_per_hour:
        return []
    return [
        Candidate(gang.gpus_by_node, gang=gang)
        for gang in preemptible(ledger)
        if gang.queue != head.queue or value_of(ledger, gang) < head_value
    ]


def value_of(ledger: Ledger, gang: RunningGang) -> int:
    """The gang's priority value (an unknown class: the lowest)."""
    return ledger.cfg.priority_classes.get(gang.priority_class, ledger.lowest_value)


def preemptible(ledger: Ledger) -> list[RunningGang]:
    """Holding gangs that may be asked to stop (under the per-job cap, with live GPUs), in
    victim order: lowest priority value, then least work at risk, then most recently
    started, then job id. The head's preemption and serving's reclaim both take from it."""
    cap = ledger.cfg.max_preemptions_per_job_per_hour
    return sorted(
        (
            g
            for g in ledger.gangs
            if ledger.preempted_count.get(g.job_id, 0) < cap and live_gpus(g, ledger.live_ids) > 0
        ),
        key=lambda g: (value_of(ledger, g), g.work_at_risk_s(ledger.now_s), -g.started_s, g.job_id),
    )


def _still_eligible(ledger: Ledger, head: QueuedJob, gang: RunningGang) -> bool:
    """Same queue: lower priority (checked already). Other queue: it is over its share."""
    return gang.queue == head.queue or ledger.over_share(gang.queue)


def room_actions(ledger: Ledger, head: QueuedJob, chosen: list[Candidate]) -> list[Action]:
    """The plan items that free `chosen` for `head`: one `MoveServeReplicas` per model, then a
    `PreemptJob` per victim; each preemption is recorded in `ledger` (for the caps) and its
    GPUs leave its queue's use."""
    actions: list[Action] = []
    moves: dict[str, list[str]] = {}
    for cand in chosen:
        if cand.replica is not None:
            moves.setdefault(cand.replica.model, []).append(cand.replica.node_id)
    why = (
        f"{Why.SERVE_YIELDS.value}: training job {head.job_id} needs "
        f"{head.num_workers} x {head.gpus_per_worker} GPUs"
    )
    if head.lost_s is not None:  # policies.admission.borrow weighed it
        why = (
            f"{Why.SERVING_LENDS.value}: training job {head.job_id} lost a node and needs "
            f"{head.num_workers} x {head.gpus_per_worker} GPUs back now"
        )
    for model, node_ids in moves.items():
        actions.append(
            MoveServeReplicas(
                model=model,
                from_pool=Pool.CLUSTER,
                to_pool=Pool.EXTERNAL,
                num_replicas=len(node_ids),
                node_ids=tuple(sorted(node_ids)),
                reason=why,
                for_job_id=head.job_id,
            )
        )
    for cand in chosen:
        gang = cand.gang
        if gang is None:
            continue
        if gang.queue == head.queue:
            why = (
                f"{Why.PREEMPT_PRIORITY.value}: {head.job_id} ({head.priority_class}) "
                f"outranks {gang.job_id} ({gang.priority_class})"
            )
        else:
            why = (
                f"{Why.RECLAIM_SHARE.value}: queue {gang.queue!r} is over its share and "
                f"{head.job_id} is within queue {head.queue!r}'s share"
            )
        actions.append(PreemptJob(gang.job_id, why, for_job_id=head.job_id))
        ledger.preemptions.append(PreemptionRecord(gang.job_id, ledger.now_s))
        ledger.used_by_queue[gang.queue] -= live_gpus(gang, ledger.live_ids)
    return actions
