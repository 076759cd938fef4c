"""The admission decision: one batch over the queue per tick.

Owns: `decide(snapshot, config, state) -> (plan, state)`, the entry point; it walks the queue
in order (`policies.admission.shares.queue_order`), admits every gang that fits on the GPUs
it may use (the whole gang at once, `policies.admission.fit`), and makes the first job that
does not fit but fits within its queue's share the head, with a reservation and, if it is
entitled, room made now (`policies.admission.reservation`, `policies.admission.preemption`).
The rules in full (backfill among them), with a worked example, are in `policies.admission`'s
docstring.

Must not: import Ray, read a clock, do I/O or draw random numbers (see the package doc).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping

from policies.admission.config import AdmissionConfig
from policies.admission.fit import FreeGpus
from policies.admission.forecast import ForecastRoom, Held
from policies.admission.preemption import preemptible, value_of
from policies.admission.reasons import Why
from policies.admission.reservation import try_reserve
from policies.admission.shares import EPS, Ledger, live_gpus, queue_order
from policies.admission.state import AdmissionState, PreemptionRecord, Reservation
from policies.forecast import ServingForecast
from policies.model_classes import ModelClass
from policies.plan import Action, AdmitJob, Plan, PreemptJob, WaitJob, WorkerPlacement
from policies.snapshot import ClusterSnapshot, Pool, QueuedJob, RunningGang

__all__ = ["decide"]


class _Decision(Ledger):
    """One call of `decide`: the ledger plus the plan and the head's reservation. Local,
    mutable scratch for the batch; never escapes."""

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        config: AdmissionConfig,
        state: AdmissionState,
        models: Mapping[str, ModelClass] | None,
        external_room_gpus: int | None = None,
        serving_need_gpus: int = 0,
        forecast: ServingForecast | None = None,
        serving_hold_gpus: int = 0,
    ) -> None:
        super().__init__(snapshot, config, state, models, external_room_gpus)
        self.serving_need_gpus = serving_need_gpus
        self.serving_hold_gpus = serving_hold_gpus
        self.forecast = forecast
        self.ahead: ForecastRoom | None = None
        """Serving's forecast, slot by slot (built once serving's present need is held)."""
        self.snap = snapshot
        self.plan: list[Action] = []
        self.reservation: Reservation | None = None
        self.unprotected = self.free  # becomes a separate copy once a reservation exists
        self.never_fits: dict[int, float] = {}
        """gpus_per_worker -> fewest workers that cannot fit even once everything ends."""
        self.serving_only = [n for n in snapshot.live_nodes(Pool.CLUSTER) if n.serving_only]
        """Live cluster nodes no gang may use (fabric faults); named in a `WaitJob` only."""

    def run(self) -> None:
        rejections, ordered = queue_order(self.snap.queued, self.cfg, self.now_s)
        self.plan.extend(rejections)
        if self.serving_need_gpus > 0:
            self.hold_for_serving(self.serving_need_gpus)
        if self.serving_hold_gpus > 0:
            self.hold_free(self.serving_hold_gpus)
        if self.forecast is not None:
            self.ahead = ForecastRoom(
                self.forecast,
                self.now_s,
                self.capacity,
                ((g, live_gpus(g, self.live_ids)) for g in self.gangs),
            )
        head_decided = False
        free = self.free
        deferred: list[tuple[QueuedJob, bool, Held]] = []
        for neg_value, _, _, job in ordered:
            need = job.num_workers * job.gpus_per_worker
            if head_decided and need > free.total:
                if free.total == 0:
                    break  # nothing left to admit and the head is decided
                continue  # cannot fit anywhere this tick
            within = self.within_share(job.queue, need)
            if not within and not self.may_borrow(job.queue, need):
                continue  # its queue may not borrow this much: waits, blocks no one
            held = None if self.ahead is None else self.ahead.hold(job)
            if held is not None:
                deferred.append((job, within, held))
                continue  # serving's forecast needs its GPUs back during its run: blocks no one
            if self.try_admit(job, within):
                continue
            if not head_decided and (self.pinned or self.floors or self.unhosted):
                self.say_if_held(job)
            if not head_decided and self.serving_only:
                self.say_if_serving_only(job)
            if (
                not head_decided
                and need <= self.nominal_gpus(job.queue) + EPS
                and job.num_workers < self.never_fits.get(job.gpus_per_worker, math.inf)
            ):
                hold = try_reserve(self, job, -neg_value)
                if hold is not None:
                    head_decided = True
                    self.plan.extend(hold.actions)
                    self.reservation = hold.reservation
                    self.unprotected = hold.unprotected
                else:
                    self.never_fits[job.gpus_per_worker] = min(
                        job.num_workers, self.never_fits.get(job.gpus_per_worker, math.inf)
                    )
        for job, within, held in deferred:
            self.admit_or_wait(job, within, held)

    def hold_for_serving(self, need: int) -> None:
        """Serving's demand that no rented GPU can host (`need` GPUs) comes first: the free
        GPUs of serving-only nodes cover it, then free and releasing gang-node GPUs (most free
        node first), which no gang gets this tick; what is still missing is reclaimed from
        training: the lowest-priority gang whose GPUs suffice, the smallest such (else gangs
        in that order until they do, then those the rest cover spared again) is asked to
        checkpoint and is preempted, within the preemption caps."""
        need = self.hold_free(need - sum(n.gpus_free for n in self.serving_only))
        for node_id in sorted(self.releasing, key=lambda n: (-self.releasing[n], n)):
            take = max(0, min(need, self.releasing[node_id]))
            self.releasing[node_id] -= take
            need -= take
        if need <= 0:
            return
        candidates = preemptible(self)
        if not self.cfg.preemption_enabled or not candidates:
            return
        lowest = value_of(self, candidates[0])
        enough = [
            g
            for g in candidates
            if live_gpus(g, self.live_ids) >= need and value_of(self, g) == lowest
        ]
        victims: list[RunningGang] = []
        if enough:
            victims = [min(enough, key=lambda g: live_gpus(g, self.live_ids))]
        else:
            got = 0
            for g in candidates:
                if got >= need:
                    break
                victims.append(g)
                got += live_gpus(g, self.live_ids)
            for g in reversed(victims[:-1]):  # spare those the rest already cover
                if got - live_gpus(g, self.live_ids) >= need:
                    victims.remove(g)
                    got -= live_gpus(g, self.live_ids)
        if len(victims) > self.cfg.max_preemptions_per_hour - len(self.preemptions):
            return  # over the cap: serving stays short, and says so (placement's note)
        why = (
            f"{Why.SERVING_RECLAIMS.value}: serving's demand needs {self.serving_need_gpus} "
            "cluster GPU(s) that no rented GPU can host"
        )
        for g in victims:
            self.plan.append(PreemptJob(g.job_id, why, for_serving=True))
            self.preemptions.append(PreemptionRecord(g.job_id, self.now_s))
            self.gangs.remove(g)
            self.used_by_queue[g.queue] -= live_gpus(g, self.live_ids)

    def hold_free(self, need: int) -> int:
        """Keep up to `need` free GPUs from gangs this tick (most free node first); returns
        what is still missing. Alone (`serving_hold_gpus`: cluster replicas placed that Serve
        has not put on a node yet) it never preempts: those GPUs may be theirs already,
        counted as taken."""
        free = self.free.free
        for node_id in sorted(free, key=lambda n: (-free[n], n)):
            take = max(0, min(need, free[node_id]))
            self.free.add(node_id, -take)
            need -= take
        return need

    def say_if_held(self, job: QueuedJob) -> None:
        """A `WaitJob` naming the pinned models, the models' floors and the replicas no rented
        GPU can host when only their GPUs keep `job` out now: it fits on the free, releasing
        and claimable Serve GPUs plus theirs, not without them."""
        room = self.free.copy()
        for node_id, gpus in self.releasing.items():
            room.add(node_id, gpus)
        if self.cfg.move_serve_replicas:
            for r in self.replicas:
                room.add(r.node_id, r.gpus)
        if room.fits(job.gpus_per_worker, job.num_workers):
            return
        for r in (*self.pinned, *self.floors, *self.unhosted):
            room.add(r.node_id, r.gpus)
        held = Counter[str]()
        for r in self.pinned:
            held[r.model] += r.gpus
        floors = Counter(r.model for r in self.floors)
        unhosted = Counter(r.model for r in self.unhosted)
        if not room.fits(job.gpus_per_worker, job.num_workers):
            return
        kept = "; ".join(
            [
                f"model {m!r} keeps {k} replica(s) on the cluster pool (min_cluster_replicas)"
                for m, k in sorted(floors.items())
            ]
            + [
                f"model {m!r} keeps {k} replica(s) on the cluster pool: its demand needs them "
                f"and the external pool has room for {self.external_room_gpus} GPU(s)"
                for m, k in sorted(unhosted.items())
            ]
        )
        if not held and unhosted:
            why = Why.SERVING_DEMAND
            text = f"waits for GPUs that serving's demand holds and no rented GPU can host: {kept}"
        elif not held:
            why = Why.SERVING_FLOOR
            text = f"waits for GPUs that serving's floors hold: {kept}"
        else:
            why = Why.PINNED_SERVING
            models = ", ".join(f"{m} ({k} GPU(s))" for m, k in sorted(held.items()))
            text = (
                f"waits for GPUs that serving models pinned to the cluster pool hold: {models}; "
                "`rcp serve unpin MODEL` lets training claim them" + (f"; {kept}" if kept else "")
            )
        self.plan.append(WaitJob(job_id=job.job_id, reason=f"{why.value}: {text}", code=why.value))

    def say_if_serving_only(self, job: QueuedJob) -> None:
        """A `WaitJob` naming the serving-only nodes when only they keep `job` out for good: it
        could not fit on the gang nodes even once everything there ends, but would with the
        serving-only nodes' GPUs (it waits until their fabric recovers)."""
        if any(isinstance(a, WaitJob) and a.job_id == job.job_id for a in self.plan):
            return
        room = FreeGpus({n.node_id: n.gpus_total for n in self.snap.gang_nodes(Pool.CLUSTER)})
        if room.fits(job.gpus_per_worker, job.num_workers):
            return
        for n in self.serving_only:
            room.add(n.node_id, n.gpus_total)
        if not room.fits(job.gpus_per_worker, job.num_workers):
            return
        why = (
            f"{Why.SERVING_ONLY_NODES.value}: fits only with serving-only node(s) "
            f"{', '.join(n.node_id for n in self.serving_only)} (fabric faults: replicas only); "
            "waits until they are fit for gangs again"
        )
        self.plan.append(WaitJob(job.job_id, why, code=Why.SERVING_ONLY_NODES.value))

    def admit_or_wait(self, job: QueuedJob, within_share: bool, held: Held) -> None:
        """A gang serving's forecast held back, once every other job had its turn: if serving
        needs the GPUs later than the forecast's ``idle_hold_s`` and it still fits now (no
        shorter work wanted them), it is admitted, and at the peak it is asked to checkpoint and
        yield like any gang (``serving-reclaims``); otherwise it waits with `held`'s reason."""
        assert self.forecast is not None
        if held.needed_in_s > self.forecast.idle_hold_s and self.try_admit(
            job, within_share, forecast_note=held.peak
        ):
            return
        self.plan.append(
            WaitJob(job_id=job.job_id, reason=held.reason, code=Why.SERVING_FORECAST.value)
        )

    def try_admit(self, job: QueuedJob, within_share: bool, forecast_note: str = "") -> bool:
        """Admit `job` if its whole gang fits on the GPUs it may use; False if not."""
        g, w = job.gpus_per_worker, job.num_workers
        start_by_s = None if self.reservation is None else self.reservation.start_by_s
        short = (
            start_by_s is not None
            and job.max_runtime_s is not None
            and self.now_s + job.max_runtime_s <= start_by_s
        )
        pool = self.free if short or self.reservation is None else self.unprotected
        placement = pool.place(g, w)
        if placement is None:
            return False
        separate = self.unprotected is not self.free
        for node_id, workers in placement:
            gpus = workers * g
            if separate:
                protected = self.free.free[node_id] - self.unprotected.free[node_id]
                take_unprotected = gpus if not short else max(0, gpus - protected)
                self.unprotected.add(node_id, -take_unprotected)
            self.free.add(node_id, -gpus)
        self.used_by_queue[job.queue] = self.used_by_queue.get(job.queue, 0) + job.gpus_total
        self.admitted_by_queue[job.queue] = (
            self.admitted_by_queue.get(job.queue, 0) + job.gpus_total
        )
        if self.ahead is not None:
            self.ahead.take(job)
        end_s = None if job.max_runtime_s is None else self.now_s + job.max_runtime_s
        self.admitted.append((end_s, job.job_id, job.queue, {n: k * g for n, k in placement}))
        if self.reservation is None:
            why = f"{Why.FITS.value}: all {w} workers x {g} GPUs fit now"
        elif short:
            why = (
                f"{Why.BACKFILL.value}: ends by {self.now_s + (job.max_runtime_s or 0):g}s, "
                f"before the reservation for {self.reservation.job_id} can be met at "
                f"{start_by_s:g}s"
            )
        else:
            why = (
                f"{Why.BACKFILL.value}: fits on GPUs the reservation for "
                f"{self.reservation.job_id} does not need"
            )
        if not within_share:
            why += f"; borrows idle GPUs beyond queue {job.queue!r}'s share"
        if forecast_note:
            why += (
                f"; no shorter work wants these GPUs, though serving's forecast does "
                f"({forecast_note}): it will be asked to checkpoint and yield at the peak"
            )
        self.plan.append(
            AdmitJob(
                job_id=job.job_id,
                placement=tuple(WorkerPlacement(n, k) for n, k in placement),
                gpus_per_worker=g,
                num_workers=w,
                reason=why,
            )
        )
        return True


def decide(
    snapshot: ClusterSnapshot,
    config: AdmissionConfig,
    state: AdmissionState,
    models: Mapping[str, ModelClass] | None = None,
    external_room_gpus: int | None = None,
    serving_need_gpus: int = 0,
    forecast: ServingForecast | None = None,
    serving_hold_gpus: int = 0,
) -> tuple[Plan, AdmissionState]:
    """Decide admissions, replica moves and preemptions for one tick (see the package doc).

    `models` are the served models' classes (`policies.model_classes`): the order in which
    their cluster replicas are claimed, and the floors a claim never takes; a model without
    one is the lowest class with no floor. `external_room_gpus` is what the external pool
    can still host: a claim takes replicas of a model whose demand is a guarantee only as far
    as that room holds them, in yield order (None: no bound, as before issue 28).
    `serving_need_gpus` is serving's demand that placement could place nowhere (the loop
    passes the tick before's, `controlplane.loop.decide.unplaced_gpus`): those cluster GPUs
    are serving's first (`_Decision.hold_for_serving`), reclaimed from the lowest-priority
    training if they must be. `forecast` is serving's need per slot ahead
    (`policies.forecast`): a gang whose run would hold GPUs it needs back waits
    (`policies.admission.forecast.ForecastRoom`), and shorter work is admitted meanwhile.
    `serving_hold_gpus` free GPUs are kept from gangs and never preempted for (cluster
    replicas placed that hold no node yet, `controlplane.loop.decide.unstarted_cluster_gpus`).

    Returns the plan (rejections, then in queue order: admissions, and for the head any
    `MoveServeReplicas` and `PreemptJob` actions) and the new state.
    """
    d = _Decision(
        snapshot,
        config,
        state,
        models,
        external_room_gpus,
        serving_need_gpus,
        forecast,
        serving_hold_gpus,
    )
    d.run()
    new_state = AdmissionState(preemptions=tuple(d.preemptions), reservation=d.reservation)
    return tuple(d.plan), new_state
