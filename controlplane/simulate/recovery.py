"""Our scheme's recovery of a gang from a failure (issue 30): restart in place, and serving as
the spare pool.

Owns: `Recovery`, what our scheme does when a failure hits a running gang, given to the world
as its hooks (`World.crash`, `World.fail_node`), from the scenario's `RecoverySpec`:

1. a worker crash (the node survives): the gang's worker group restarts inside its run on
   the same nodes after ``in_place_restart_s`` (Ray Train's FailureConfig,
   `jobs.launcher.in_place`; `policies.attempts` row 7 records it and spends a restart): no
   re-queue, no admission wait;
2. a node loss: the gang restarts at full size at once (`replace`), its share of the lost
   node moved to a healthy cluster node with room for it (the one with the least room
   that fits), else to a cluster node freed from serving (`borrow`), after
   ``replacement_restart_s``; else it is re-queued as before. Whether to borrow is the control
   plane's own choice (`policies.admission.borrow.weigh_borrow`: the gang's GPUs idle until
   the lost node is repaired against the rented GPUs the moved replicas hold until then, a
   move taking ``replica_start_s + replica_stop_s``). Borrowing stops the node's
   replicas at once (they count as stopped by a move; Serve starts each again elsewhere:
   the targets are unchanged) and is allowed only where every model keeps its
   ``min_replicas`` and the replicas its demand needs RUNNING without them (the never-short
   rule), the node with the fewest serving GPUs first; the gang waits ``replica_stop_s``
   (their drain) more. A borrowed node goes back to serving when the lost node is back
   (`node_back`): the gang checkpoints (one stall) and moves that share there, restarting
   again after ``replacement_restart_s``.

Worked example: a 16-GPU gang on n1 and n2; n2 dies; no node has 8 GPUs free; n7 runs one
`chat` replica (8 GPUs) of 12 RUNNING, demand needs 10 and ``min_replicas`` is 4: 11 >= 10,
so n7 is borrowed, the replica stops, the gang holds n1 and n7 and trains again after
20 + 120 s from its last commit. Four hours later n2 is back: the gang checkpoints and moves
to n1 and n2, and n7 can serve again.

Must not: draw random numbers. Which node is the simulator's rule (admission's claim picks
replicas in yield order instead, `policies.admission.preemption.choose_room`); whether is the
policy's.
"""

from __future__ import annotations

from controlplane.simulate.serving import SimServe
from controlplane.simulate.training import JobRun
from controlplane.simulate.world import World
from policies.admission.borrow import BorrowConfig, weigh_borrow
from policies.snapshot import Pool, ReplicaState

__all__ = ["Recovery"]


class Recovery:
    def __init__(
        self,
        world: World,
        serve: SimServe,
        in_place_s: float | None,
        replacement_s: float | None,
        repair_s: float | None = None,
    ) -> None:
        self.world = world
        self.serve = serve
        self.in_place_s = in_place_s
        """A crash to training again in place; None: crashes re-queue."""
        self.replacement_s = replacement_s
        """A node loss to training again on another node; None: node losses re-queue."""
        self.costs = BorrowConfig(
            replacement_eta_s=repair_s or 0.0, replica_move_s=serve.start_s + serve.stop_s
        )
        self.repair_s = repair_s
        """How long a lost node takes to come back (the replacement's ETA); None: never."""
        self.lent: dict[str, list[tuple[str, str]]] = {}
        """Per lost node, the (job id, borrowed node) of each gang that borrowed for it."""
        self.borrowed = 0
        """Serving nodes borrowed."""
        self.returned = 0
        """Borrowed nodes given back to serving while their gang ran (the gang moved)."""

    def replace(self, run: JobRun, lost_id: str, gpus: int) -> tuple[str, float] | None:
        """Where the gang's `gpus` on lost node `lost_id` restart, and after how long."""
        if self.replacement_s is None:
            return None
        w = self.world
        fits = [
            w.nodes[i]
            for i in w.cluster_ids
            if i != lost_id and w.nodes[i].free >= gpus and w.nodes[i].up
        ]
        if fits:
            best = min(fits, key=lambda n: (n.free, n.node_id))
            return best.node_id, self.replacement_s
        node_id = self.borrow(lost_id, gpus, run.gpus)
        if node_id is None:
            return None
        self.lent.setdefault(lost_id, []).append((run.spec.job_id, node_id))
        return node_id, self.serve.stop_s + self.replacement_s

    def borrow(self, lost_id: str, gpus: int, gang_gpus: int | None = None) -> str | None:
        """A cluster node freed from serving for `gpus` of a gang of `gang_gpus` (its replicas
        stopped), or None where none can be without a model going below its floor, or where
        waiting for the repair costs less (see the module doc)."""
        w, sv = self.world, self.serve
        on: dict[str, list[tuple[str, int, bool]]] = {}
        for r in sv.replicas.values():
            if r.pool is Pool.CLUSTER:
                running = r.state is ReplicaState.RUNNING
                on.setdefault(r.node_id, []).append((r.model, r.gpus, running))
        floor = {m: max(sv.needed(m), sv.bounds.get(m, (0, 0))[0]) for m in sv.by_model}
        have = {m: sv.running(m) for m in sv.by_model}
        best: tuple[int, str] | None = None
        for node_id, rows in on.items():
            n = w.nodes[node_id]
            serving = sum(g for _, g, _ in rows)
            if node_id == lost_id or not n.up or n.out or n.free + serving < gpus:
                continue
            lose: dict[str, int] = {}
            for model, _, running in rows:
                lose[model] = lose.get(model, 0) + running
            if any(have[m] - k < floor[m] for m, k in lose.items()):
                continue
            if best is None or (serving, node_id) < best:
                best = (serving, node_id)
        if best is None:
            return None
        weighed = weigh_borrow(gang_gpus or gpus, best[0], self.repair_s, self.costs)
        if not weighed.borrow:
            return None
        sv.node_lost(best[1], cause="moves")
        self.borrowed += 1
        return best[1]

    def node_back(self, node_id: str) -> None:
        """Lost node `node_id` is back: each gang that still runs on the node it borrowed
        for it moves there, and that node goes back to serving."""
        assert self.replacement_s is not None or node_id not in self.lent
        for job_id, borrowed in self.lent.pop(node_id, []):
            run = self.world.running.get(job_id)
            if run is not None and self.replacement_s is not None:
                moved = self.world.return_share(run, borrowed, node_id, self.replacement_s)
                self.returned += moved
