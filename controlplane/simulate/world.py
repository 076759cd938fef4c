"""The simulated fleet: nodes, training jobs and the external pool, with GPU bookkeeping.

Owns: `World` (every node's GPUs and who holds them; every job's life: queued, running,
checkpointing out, done, where a failure loses the work since the last commit and a
checkpoint-first preemption loses none but costs a stall; a failed gang re-queued, restarted
in place after a worker crash, or restarted on a node its scheme names after a node loss; the
external pool, one node group per provider on its `ProviderSpec`'s terms, and the spot
reclaims of its nodes, each method saying how) and the accounting of GPU-seconds the report turns into figures (`Tally`). A node
itself lives in `controlplane.simulate.nodes`, a job's work and checkpoint arithmetic in
`controlplane.simulate.training`, and the serving plane in `controlplane.simulate.serving`.

GPUs are never double-booked: every grab goes through `World.take`, which raises if a node
has fewer free GPUs than asked (a scheme bug, never a silent overlap).

Must not: decide (schemes do), or draw random numbers (the trace holds them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.simulate.engine import EventKind, EventQueue
from controlplane.simulate.nodes import Node, ProviderSpec
from controlplane.simulate.training import JobPhase, JobRun
from policies.snapshot import Pool

__all__ = ["Replace", "Tally", "World"]

Replace = Callable[[JobRun, str, int], tuple[str, float] | None]
"""A scheme's choice after a node loss under a gang: (the gang, the lost node, its GPUs
there) -> (the node to restart that share on, seconds to the first resumed step), or None
(re-queue)."""


@dataclass
class Tally:
    """GPU-seconds and counts the report turns into figures."""

    owned_gpu_s: float = 0.0
    used_gpu_s: float = 0.0
    training_gpu_s: float = 0.0
    external_gpu_s: float = 0.0
    """Billed external GPU-seconds, all providers."""
    external_gpu_s_by: dict[str, float] = field(default_factory=dict)
    """Billed external GPU-seconds per provider."""
    external_serving_gpu_s: float = 0.0
    idle_with_queue_gpu_s: float = 0.0
    """Owned GPUs idle while a training job waited (what better packing could win)."""
    reclaims: int = 0
    """Spot reclaims that hit a rented node (notices given)."""
    reclaimed_replicas: int = 0
    """Replicas still serving on a reclaimed node when its notice ran out (killed)."""


class World:
    def __init__(
        self,
        num_nodes: int,
        gpus_per_node: int,
        providers: Sequence[ProviderSpec],
        provision_s: float,
        idle_timeout_s: float,
        queue: EventQueue,
    ) -> None:
        self.events = queue
        names = [p.name for p in providers]
        if len(set(names)) != len(names):
            raise ValueError(f"providers: names must be unique, got {names}")
        self.providers = {p.name: p for p in providers}
        """The external pool's providers, in the config's order."""
        self.by_price = tuple(sorted(providers, key=lambda p: p.price_per_gpu_hour))
        """Cheapest first; equal prices keep the config's order."""
        self.nodes: dict[str, Node] = {
            f"n{i:05d}": Node(f"n{i:05d}", Pool.CLUSTER, gpus_per_node) for i in range(num_nodes)
        }
        self.cluster_ids = list(self.nodes)
        self.cluster_gpus = num_nodes * gpus_per_node
        self.provision_s = provision_s
        self.idle_timeout_s = idle_timeout_s
        self.external: dict[str, Node] = {}
        """Every external node, in the order they were asked for."""
        self.external_of: dict[str, dict[str, Node]] = {p.name: {} for p in providers}
        """The external nodes of each provider."""
        self.external_wanted: dict[str, int] = dict.fromkeys(self.providers, 0)
        """Nodes each provider was last asked for."""
        self.draining = 0
        """External nodes drained and not released yet."""
        self.external_used = 0
        """External GPUs held (by serving)."""
        self._ext_gpus_by: dict[str, int] = dict.fromkeys(self.providers, 0)
        """GPUs of each provider's nodes, billed or not yet."""
        self._unbilled: list[Node] = []
        """Nodes whose billing starts later (asked for during a stock-out)."""
        self._ext_seq = 0
        self.jobs: dict[str, JobRun] = {}
        self.queued: dict[str, JobRun] = {}
        self.running: dict[str, JobRun] = {}
        self.cluster_used = 0
        self.training_used = 0
        self.tally = Tally()
        self.now_s = 0.0
        self.node_generation = 0
        """Bumped whenever any node changes (what the observe stand-in caches by)."""

    # -- GPUs ----------------------------------------------------------------------------------

    def touch(self, n: Node) -> None:
        """`n` changed: its snapshot row, and the world's node generation, are new."""
        n.touch()
        self.node_generation += 1

    def node(self, node_id: str) -> Node:
        return self.nodes.get(node_id) or self.external[node_id]

    def take(self, node_id: str, gpus: int, training: bool) -> None:
        n = self.node(node_id)
        if gpus > n.free:
            raise AssertionError(
                f"double-booked: {gpus} GPU(s) asked of {node_id}, {n.free} free "
                f"(up={n.up}, out={n.out}, used={n.used}/{n.gpus})"
            )
        self._book(n, gpus, training)

    def give(self, node_id: str, gpus: int, training: bool) -> None:
        n = self.node(node_id)
        assert 0 <= gpus <= n.used, f"{node_id}: giving back {gpus} of {n.used}"
        self._book(n, -gpus, training)
        if n.pool is Pool.EXTERNAL and n.used == 0:
            self.events.push(self.now_s + self.idle_timeout_s, EventKind.EXTERNAL_IDLE)

    def _book(self, n: Node, gpus: int, training: bool) -> None:
        """`gpus` more (fewer, if negative) held on `n`, in the node's and the world's counts."""
        n.used += gpus
        self.touch(n)
        if n.pool is Pool.EXTERNAL:
            self.external_used += gpus
        else:
            self.cluster_used += gpus
            self.training_used += gpus if training else 0

    # -- time ----------------------------------------------------------------------------------

    def advance(self, now_s: float) -> None:
        dt = now_s - self.now_s
        if dt > 0:
            t = self.tally
            t.owned_gpu_s += self.cluster_gpus * dt
            t.used_gpu_s += self.cluster_used * dt
            t.training_gpu_s += self.training_used * dt
            billed = {name: g * dt for name, g in self._ext_gpus_by.items() if g}
            if self._unbilled:  # nodes a stock-out holds back: not billed before it ends
                waiting = []
                for n in self._unbilled:
                    if self.external.get(n.node_id) is not n:
                        continue  # released before it was billed
                    unbilled_s = min(now_s, n.billed_from_s) - self.now_s
                    if unbilled_s > 0:
                        billed[n.provider] -= n.gpus * unbilled_s
                    if n.billed_from_s > now_s:
                        waiting.append(n)
                self._unbilled = waiting
            for name, gpu_s in billed.items():
                t.external_gpu_s_by[name] = t.external_gpu_s_by.get(name, 0.0) + gpu_s
                t.external_gpu_s += gpu_s
            t.external_serving_gpu_s += self.external_used * dt
            if self.queued:
                t.idle_with_queue_gpu_s += (self.cluster_gpus - self.cluster_used) * dt
        self.now_s = now_s

    # -- jobs ----------------------------------------------------------------------------------

    def submit(self, run: JobRun) -> None:
        run.queued_s = run.spec.submit_s
        self.jobs[run.spec.job_id] = run
        self.queued[run.spec.job_id] = run

    def admit(self, job_id: str, placement: dict[str, int]) -> None:
        run = self.queued.pop(job_id)
        assert sum(placement.values()) == run.gpus, f"{job_id}: placement {placement}"
        for node_id, gpus in placement.items():
            self.take(node_id, gpus, training=True)
        now = self.now_s
        run.phase = JobPhase.RUNNING
        run.placement = dict(placement)
        run.admitted_s = now
        run.base_s = run.committed_s
        restore = run.restore_s if run.committed_s > 0 else 0.0
        run.restore_total_s += restore
        if run.restore_is_failure:
            run.failure_restart_s += restore
            run.restore_is_failure = False
        run.compute_start_s = now + restore
        if run.first_admit_s is None:
            run.first_admit_s = now
        run.version += 1
        self.running[job_id] = run
        self.events.push(run.end_s(), EventKind.JOB_END, job_id, run.version)

    def _settle(self, run: JobRun, keep_all: bool) -> float:
        """Close the current run at now: bank stalls, commit (all of it when `keep_all`);
        returns the work lost (what was done since the last commit, unless `keep_all`)."""
        run.caught_up(self.now_s)
        done, committed, stalls = run.at(self.now_s)
        run.stall_total_s += stalls
        run.committed_s = done if keep_all else committed
        return 0.0 if keep_all else done - committed

    def preempt(self, job_id: str, checkpoint_first: bool) -> None:
        """Stop a running gang: checkpoint first (its GPUs free after one stall, nothing
        lost) or kill it (work since the last commit lost, counted as lost to preemption)."""
        run = self.running.get(job_id)
        if run is None or run.phase is not JobPhase.RUNNING:
            return
        run.preemptions += 1
        run.version += 1
        if checkpoint_first:
            self._settle(run, keep_all=True)
            run.stall_total_s += run.stall_s
            run.phase = JobPhase.CHECKPOINTING_OUT
            self.events.push(self.now_s + run.stall_s, EventKind.JOB_RELEASED, job_id, run.version)
            return
        run.lost_preempt_s += self._settle(run, keep_all=False)
        self._requeue(run, 0.0)

    def released(self, job_id: str, version: int) -> None:
        run = self.running.get(job_id)
        if run is not None and run.version == version and run.phase is JobPhase.CHECKPOINTING_OUT:
            self._requeue(run, 0.0)

    def _free(self, run: JobRun) -> None:
        """The run stops holding GPUs: they are given back and it is no longer running."""
        for node_id, gpus in run.placement.items():
            self.give(node_id, gpus, training=True)
        run.placement = {}
        del self.running[run.spec.job_id]
        run.version += 1

    def _requeue(self, run: JobRun, backoff_s: float) -> None:
        self._free(run)
        run.phase = JobPhase.QUEUED
        run.queued_s = self.now_s
        run.not_before_s = self.now_s + backoff_s if backoff_s > 0 else None
        self.queued[run.spec.job_id] = run

    def finish(self, job_id: str, version: int) -> bool:
        run = self.running.get(job_id)
        if run is None or run.version != version or run.phase is not JobPhase.RUNNING:
            return False
        self._settle(run, keep_all=True)
        if run.behind_since_s is not None:  # it caught up by its end, at the latest
            run.behind_total_s += self.now_s - run.behind_since_s
            run.behind_since_s = None
        run.committed_s = run.spec.work_s
        self._free(run)
        run.phase = JobPhase.DONE
        run.finish_s = self.now_s
        return True

    def reject(self, job_id: str) -> None:
        run = self.queued.pop(job_id, None)
        if run is not None:
            run.phase = JobPhase.REJECTED

    def useful_s(self, run: JobRun) -> float:
        """Work kept so far (done work of a running job counts: it is not lost yet)."""
        if run.phase is JobPhase.RUNNING:
            return run.at(self.now_s)[0]
        return run.committed_s

    # -- failures ------------------------------------------------------------------------------

    def gangs_on(self, node_id: str) -> list[JobRun]:
        return sorted(
            (r for r in self.running.values() if node_id in r.placement),
            key=lambda r: r.spec.job_id,
        )

    def fail_node(self, node_id: str, backoff_s: float, replace: Replace | None = None) -> None:
        """A node loss: every gang there loses its work since the last commit and restarts
        where `replace` says (the lost node's share moved there), else is re-queued (after
        the restart backoff); the node is down until `node_back`."""
        n = self.nodes[node_id]
        n.up = False
        self.touch(n)
        for run in self.gangs_on(node_id):
            running = self._failed(run)
            spot = replace(run, node_id, run.placement[node_id]) if replace and running else None
            if spot is None:
                self._requeue(run, backoff_s)
                run.restore_is_failure = True
                continue
            self.move_share(run, node_id, spot[0])
            run.replacements += 1
            self._restart(run, spot[1])

    def crash(self, node_id: str, backoff_s: float, in_place_s: float | None) -> None:
        """A worker crash on `node_id` (the node survives): every gang there loses its work
        since the last commit and restarts in place after `in_place_s` (None: is re-queued
        after the restart backoff)."""
        for run in self.gangs_on(node_id):
            if self._failed(run) and in_place_s is not None:
                run.restarts_in_place += 1
                self._restart(run, in_place_s)
            else:
                self._requeue(run, backoff_s)
                run.restore_is_failure = True

    def _failed(self, run: JobRun) -> bool:
        """A failure under `run`: its work since the last commit is lost, and it is behind
        until it is back there. True if it was running (not checkpointing out)."""
        run.failures += 1
        run.version += 1
        if run.phase is not JobPhase.RUNNING:
            return False
        done = run.at(self.now_s)[0]
        run.lost_failure_s += self._settle(run, keep_all=False)
        run.fell_behind(self.now_s, done)
        return True

    def move_share(self, run: JobRun, from_id: str, to_id: str) -> None:
        """The gang's GPUs on `from_id` move to `to_id` (the caller restarts the run)."""
        gpus = run.placement.pop(from_id)
        self.give(from_id, gpus, training=True)
        self.take(to_id, gpus, training=True)
        run.placement[to_id] = run.placement.get(to_id, 0) + gpus

    def return_share(self, run: JobRun, from_id: str, to_id: str, restart_s: float) -> bool:
        """A borrowed node goes back: the running gang checkpoints (one stall, nothing lost)
        and restarts with its share on `from_id` moved to `to_id`. False if it does not run
        there any more."""
        gpus = run.placement.get(from_id, 0)
        if run.phase is not JobPhase.RUNNING or not gpus or self.node(to_id).free < gpus:
            return False
        self._settle(run, keep_all=True)
        run.stall_total_s += run.stall_s
        self.move_share(run, from_id, to_id)
        self._restart(run, run.stall_s + restart_s, restart_s)
        return True

    def _restart(self, run: JobRun, delay_s: float, recovery_s: float | None = None) -> None:
        """The (settled) run restarts from its last commit on its placement, training again
        after `delay_s` held on its GPUs (`recovery_s` of them a failure's: all if None)."""
        run.version += 1
        run.base_s = run.committed_s
        run.compute_start_s = self.now_s + delay_s
        run.failure_restart_s += delay_s if recovery_s is None else recovery_s
        self.events.push(run.end_s(), EventKind.JOB_END, run.spec.job_id, run.version)

    def node_back(self, node_id: str) -> None:
        n = self.nodes[node_id]
        n.up = True
        n.out = False
        n.fault = None
        self.touch(n)

    # -- the external pool ---------------------------------------------------------------------

    def want_external(self, by_provider: Mapping[str, int]) -> None:
        """Have ``ceil(gpus / gpus_per_node)`` nodes of each provider (at most its
        ``max_nodes``; one not named: none): new ones are up after ``provision_s`` (later
        if they fall in a stock-out) and billed from when the provider starts on them; idle
        ones beyond that go after the idle timeout."""
        unknown = sorted(set(by_provider) - set(self.providers))
        if unknown:
            raise ValueError(f"unknown provider(s) {unknown}; known: {sorted(self.providers)}")
        surplus = False
        for name, p in self.providers.items():
            gpus = max(0, by_provider.get(name, 0))
            want = min(p.max_nodes, -(-gpus // p.gpus_per_node))
            self.external_wanted[name] = want
            self._top_up(name)
            surplus = surplus or self.live_count(name) > want
        if surplus:
            self.events.push(self.now_s + self.idle_timeout_s, EventKind.EXTERNAL_IDLE)

    def _top_up(self, name: str) -> None:
        """Rent nodes of provider `name` until its nodes not drained are what it is asked for
        (the ask stands, as ``request_resources`` does: a node drained is replaced)."""
        p = self.providers[name]
        mine = self.external_of[name]
        for _ in range(self.external_wanted[name] - self.live_count(name)):
            self._ext_seq += 1
            node_id = f"x{self._ext_seq:05d}"
            n = Node(node_id, Pool.EXTERNAL, p.gpus_per_node, up=False, provider=name)
            n.ready_s = self._delivered_s(p, self.now_s + self.provision_s)
            n.billed_from_s = n.ready_s - self.provision_s
            mine[node_id] = n
            self.external[node_id] = n
            self._ext_gpus_by[name] += n.gpus
            if n.billed_from_s > self.now_s:
                self._unbilled.append(n)
            self.node_generation += 1
            self.events.push(n.ready_s, EventKind.EXTERNAL_NODE_UP, node_id)

    def live_count(self, provider: str) -> int:
        """Nodes of `provider` asked for and not drained (up or on their way)."""
        return sum(1 for n in self.external_of[provider].values() if not n.out)

    def external_gpus(self) -> int:
        """GPUs of every external node asked for (up or on their way)."""
        return sum(self._ext_gpus_by.values())

    def _delivered_s(self, p: ProviderSpec, due_s: float) -> float:
        """When a node of `p` due at `due_s` comes up: after ``provision_s`` past the end of
        a stock-out it falls in (the request waits in the provider's queue)."""
        for start, end in p.stockouts_s:
            if start <= due_s < end:
                return end + self.provision_s
        return due_s

    def external_up(self, node_id: str) -> None:
        n = self.external.get(node_id)
        if n is not None:
            n.up = True
            self.touch(n)

    def drain_external(self, node_id: str) -> bool:
        """Take external node `node_id` out of service: it takes nothing new, Serve moves its
        replicas off (`SimServe`), and once it is idle it goes; if its provider is still asked
        for as many nodes as it had, a new one is rented in its place. False if there is no
        such node, or it is drained already."""
        n = self.external.get(node_id)
        if n is None or n.out:
            return False
        n.out = True
        self.draining += 1
        self.touch(n)
        if n.used == 0:
            self.events.push(self.now_s + self.idle_timeout_s, EventKind.EXTERNAL_IDLE)
        self._top_up(n.provider)
        return True

    def reclaim_target(self, provider: str, slot: int) -> Node | None:
        """The node of `provider` a trace's reclaim of `slot` hits: its nodes that are up and
        not given notice yet, in order of rental (those not drained first, so each of the at
        most ``max_nodes`` the provider is asked for has a slot of its own; a drained one not
        gone yet only where the slots go further), the one of rank `slot`; None if it rents
        fewer."""
        nodes = [n for n in self.external_of[provider].values() if n.up and n.reclaim_at_s is None]
        nodes.sort(key=lambda n: n.out)  # stable: rental order within each
        return nodes[slot] if 0 <= slot < len(nodes) else None

    def reclaim_notice(self, node_id: str, notice_s: float) -> None:
        """Its provider takes external node `node_id` back in `notice_s` (`reclaimed` then).
        The world changes nothing else at notice: whether the node is seen draining is the
        scheme's (`OurScheme.on_reclaim`: Ray drains it, as the real loop observes)."""
        n = self.external[node_id]
        assert n.reclaim_at_s is None, f"{node_id}: already given notice"
        n.reclaim_at_s = self.now_s + notice_s
        self.tally.reclaims += 1
        self.events.push(n.reclaim_at_s, EventKind.NODE_RECLAIMED, node_id)

    def reclaimed(self, node_id: str) -> bool:
        """The notice of `node_id` ran out: the node goes (its GPUs with it; the caller took
        its replicas first, `SimServe.node_lost`), and, if its provider is still asked for as
        many nodes as it had, a new one is rented in its place (the provider is not out of
        stock). False if it went before (released once idle and drained)."""
        n = self.external.get(node_id)
        if n is None or n.reclaim_at_s is None:
            return False
        assert n.used == 0, f"{node_id}: reclaimed with {n.used} GPU(s) held"
        self._release(n)
        self._top_up(n.provider)
        return True

    def release_idle_external(self) -> None:
        """Release every idle drained node, and per provider the idle nodes beyond what it
        was asked for: ones not up yet first, then the newest."""
        for name, mine in self.external_of.items():
            surplus = self.live_count(name) - self.external_wanted[name]
            newest = sorted(mine.values(), key=lambda n: n.node_id, reverse=True)
            for n in sorted(newest, key=lambda n: n.up):
                if n.used:
                    continue
                if n.out:
                    self._release(n)
                elif surplus > 0:
                    self._release(n)
                    surplus -= 1

    def _release(self, n: Node) -> None:
        del self.external[n.node_id]
        del self.external_of[n.provider][n.node_id]
        self._ext_gpus_by[n.provider] -= n.gpus
        if n.out:
            self.draining -= 1
        self.node_generation += 1
