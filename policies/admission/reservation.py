"""Reservation and backfill: the head of the queue's claim on GPUs that will be free at T.

Owns: `try_reserve`, which decides the head's reservation: a placement on the GPUs that
will be free at time T, and which of the GPUs free now it protects (the `Hold`).

- T = ``now_s`` if the head is entitled and releasing GPUs (gangs being preempted, replicas
  stopping) suffice, or if moving Serve replicas and preempting victims makes it fit
  (`policies.admission.preemption.choose_room`; the hold then carries those plan items);
- a head that lost a node (``QueuedJob.lost_s``) and needs Serve replicas moved asks
  `policies.admission.borrow.weigh_borrow` first: borrowing goes on as above (the moves'
  reason says ``serving-lends-a-node``); waiting makes T the replacement node's due time, every GPU free now
  protected (only work that ends by T backfills), and the hold carries a `WaitJob` saying so;
- otherwise T is the earliest time by which enough holders must have ended, holders taken by
  ``started_s + max_runtime_s`` (jobs admitted this tick included, Serve GPUs counted as
  movable), such that the gang fits on the nodes *and* within its queue's share. If that
  needs a holder without a max runtime, T is unknown (None).

A head that cannot fit even once every holder has ended gets no reservation and blocks no
one. The backfill rule that the hold enables is applied by `policies.admission.decision`: a
later job may use protected GPUs only if T is known and it ends by T; any other may use
only the unprotected ones.

Worked example: one node of 8 GPUs, 2 free; ``r`` (6 GPUs, ends at t=500) runs; the head
needs 8, no preemption allowed. T = 500 (once ``r`` ends, 8 fit); the 2 free GPUs are
protected. At now_s=100 a 2-GPU job with max runtime 300 s ends by 400 <= 500: it backfills;
one with max runtime 600 s does not, and waits.

Must not: admit anything, or change the ledger except through `choose_room`/`room_actions`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from policies.admission.borrow import replacement_eta_left_s, weigh_borrow
from policies.admission.fit import FreeGpus
from policies.admission.preemption import Candidate, choose_room, room_actions
from policies.admission.reasons import Why
from policies.admission.shares import EPS, Ledger
from policies.admission.state import Reservation
from policies.plan import Action, WaitJob
from policies.snapshot import QueuedJob

__all__ = ["Hold", "try_reserve"]


@dataclass
class Hold:
    """A decided head: its reservation, the free GPUs other jobs may still take without
    delaying it (`unprotected`), and what must make room now (`actions`, often none)."""

    reservation: Reservation
    unprotected: FreeGpus
    actions: list[Action]


def try_reserve(ledger: Ledger, head: QueuedJob, head_value: int) -> Hold | None:
    """Reserve for `head`, making room now if it is entitled to; None if it cannot fit even
    on an empty pool (no reservation: it blocks no one)."""
    g, w = head.gpus_per_worker, head.num_workers
    future = ledger.free.copy()
    extra: dict[str, int] = {}

    def give(gpus_by_node: Mapping[str, int], sign: int = 1) -> None:
        for n, k in gpus_by_node.items():
            if n in ledger.live_ids and k > 0:
                future.add(n, sign * k)
                extra[n] = extra.get(n, 0) + sign * k

    give(ledger.releasing)
    entitled = ledger.entitled(head.queue, head_value, head.gpus_total)
    if entitled and future.fits(g, w):
        return _hold(ledger, head, future, extra, ledger.now_s, [])
    if entitled:
        chosen = choose_room(ledger, head, head_value, future, give)
        if chosen is not None:
            waits = _waits_for_replacement(ledger, head, chosen)
            if waits is not None:
                return waits
            actions = room_actions(ledger, head, chosen)
            return _hold(ledger, head, future, extra, ledger.now_s, actions)
    future = ledger.free.copy()
    extra = {}
    give(ledger.releasing)

    # Wait for running gangs to end: the earliest T by which the head is guaranteed to fit,
    # both on the nodes and within its queue's share.
    if ledger.cfg.move_serve_replicas:
        for r in ledger.replicas:
            give({r.node_id: r.gpus})
    nominal = ledger.nominal_gpus(head.queue) + EPS
    queue_held = ledger.used_by_queue.get(head.queue, 0)
    holders = [
        (gang.expected_end_s, gang.job_id, gang.queue, gang.gpus_by_node) for gang in ledger.gangs
    ] + ledger.admitted
    holders.sort(key=lambda h: (math.inf if h[0] is None else h[0], h[1]))
    for end_s, _, queue, gpus_by_node in holders:
        give(gpus_by_node)
        if queue == head.queue:
            queue_held -= sum(k for n, k in gpus_by_node.items() if n in ledger.live_ids)
        if queue_held + head.gpus_total <= nominal and future.fits(g, w):
            return _hold(ledger, head, future, extra, end_s, [])
    return None  # cannot fit even on an empty pool: no reservation, blocks no one


def _waits_for_replacement(ledger: Ledger, head: QueuedJob, chosen: list[Candidate]) -> Hold | None:
    """For a head that lost a node and needs Serve replicas moved: a hold until the
    replacement node is due when waiting for it costs less than borrowing (None: borrow, or
    nothing to weigh). Every GPU free now is protected."""
    moved = sum(k for c in chosen if c.replica is not None for k in c.gpus_by_node.values())
    if head.lost_s is None or moved == 0:
        return None
    cfg = ledger.cfg
    seen = ledger.cluster_nodes_seen
    expected = seen if cfg.cluster_nodes is None else cfg.cluster_nodes
    eta_left = replacement_eta_left_s(head.lost_s, ledger.now_s, seen, expected, cfg.borrow)
    weighed = weigh_borrow(head.gpus_total, moved, eta_left, cfg.borrow)
    if weighed.borrow:
        return None
    assert eta_left is not None
    start_by = ledger.now_s + eta_left
    wait = WaitJob(
        head.job_id,
        f"{Why.REPLACEMENT_NODE.value}: {weighed.reason}",
        code=Why.REPLACEMENT_NODE.value,
    )
    return Hold(
        Reservation(head.job_id, start_by, ()), FreeGpus(dict.fromkeys(ledger.free.free, 0)), [wait]
    )


def _hold(
    ledger: Ledger,
    head: QueuedJob,
    future: FreeGpus,
    extra: Mapping[str, int],
    start_by_s: float | None,
    actions: list[Action],
) -> Hold:
    """Place `head` on `future` and protect the GPUs free now that the placement needs beyond
    what comes back (`extra`)."""
    placement = future.place(head.gpus_per_worker, head.num_workers)
    assert placement is not None
    unprotected = ledger.free.copy()
    held: list[tuple[str, int]] = []
    for node_id, workers in placement:
        gpus = workers * head.gpus_per_worker
        held.append((node_id, gpus))
        protected = min(ledger.free.free.get(node_id, 0), max(0, gpus - extra.get(node_id, 0)))
        unprotected.add(node_id, -protected)
    return Hold(Reservation(head.job_id, start_by_s, tuple(held)), unprotected, actions)
