"""Serving's demand is a guarantee (issue 28, item 1), as tables: a training claim takes a
model's cluster replicas only as far as the external pool can host them, a gang that needs
the rest waits with a ``serving-demand`` reason naming the model, and preempts lower-priority
training instead where it may; a model that is ``on_shortfall: yield`` is claimed as before.
Placement's side (a model keeps the cluster replicas the external pool cannot hold, and grows
on the cluster pool while training waits) is in `test_placement_policy`."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from controlplane.config import Config
from controlplane.config.cluster import ProviderConfig
from controlplane.config.validation import validate
from controlplane.loop.decide import external_room_gpus, policies_of, unplaced_gpus
from controlplane.loop.types import ServingPolicyState
from policies.admission import AdmissionConfig, AdmissionState
from policies.admission import decide as admit
from policies.model_classes import ModelClass
from policies.placement import ModelDemand, PoolTargets
from policies.plan import AdmitJob, MoveServeReplicas, PreemptJob, WaitJob
from policies.snapshot import Pool, ReplicaState
from serve.config import ModelConfig
from tests.unit.builders import gang, job, node, replica, snapshot

C1, C2 = node("c1", gpus_total=4), node("c2", gpus_total=4)
HIGH, LOW = 100, 0


def on(model: str, node_id: str, n: int) -> list:  # type: ignore[type-arg]
    return [replica(f"{model}-{node_id}-{i}", node_id, model=model) for i in range(n)]


@dataclass
class Case:
    id: str
    room: int | None
    """GPUs the external pool can still host (None: unbounded, as before)."""
    classes: dict[str, ModelClass] = field(default_factory=dict)
    claimed: dict[str, int] = field(default_factory=dict)
    """Model -> replicas admission claims."""
    waits_naming: tuple[str, ...] = ()
    """Texts the head's `serving-demand` WaitJob names (empty: no WaitJob)."""


# c1 runs "lo" x4 and c2 runs "hi" x4 (1 GPU each); no GPU is free; the gang needs 4 GPUs
# on one node, so it needs all of one model's replicas.
CASES = [
    Case("unbounded-claims-the-low-model", None, {"hi": ModelClass(HIGH)}, {"lo": 4}),
    Case("room-for-all-four-claims-them", 4, {"hi": ModelClass(HIGH)}, {"lo": 4}),
    Case("room-for-three-claims-none-and-waits", 3, {"hi": ModelClass(HIGH)}, {},
         ("serving-demand", "model 'lo' keeps 1 replica(s)", "room for 3 GPU(s)")),
    Case("no-room-names-both-models", 0, {"hi": ModelClass(HIGH)}, {},
         ("model 'lo' keeps 4 replica(s)", "model 'hi' keeps 4 replica(s)")),
    Case("a-yielding-model-is-claimed-without-room", 0,
         {"hi": ModelClass(HIGH), "lo": ModelClass(LOW, yields_on_shortfall=True)}, {"lo": 4}),
    Case("the-room-goes-to-the-first-to-yield", 4,
         {"hi": ModelClass(LOW), "lo": ModelClass(HIGH)}, {"hi": 4}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_claim_takes_only_what_the_external_pool_can_host(case: Case) -> None:
    snap = snapshot(
        [C1, C2], replicas=on("lo", "c1", 4) + on("hi", "c2", 4), queued=[job("g", 1, 4)]
    )
    plan, _ = admit(
        snap, AdmissionConfig(), AdmissionState(), models=case.classes, external_room_gpus=case.room
    )
    claimed = {a.model: a.num_replicas for a in plan if isinstance(a, MoveServeReplicas)}
    assert claimed == case.claimed
    waits = [a for a in plan if isinstance(a, WaitJob)]
    if case.waits_naming:
        (wait,) = waits
        assert wait.job_id == "g" and wait.reason.startswith("serving-demand:")
        assert wait.code == "serving-demand"
        for text in case.waits_naming:
            assert text in wait.reason
    else:
        assert not waits
    assert not [a for a in plan if isinstance(a, AdmitJob)]


def test_the_head_preempts_lower_priority_training_when_serving_cannot_move() -> None:
    """c1: serving x4, no external room; c2: a low-priority gang. The high-priority head
    takes the gang's node (checkpoint first), never serving's."""
    snap = snapshot(
        [C1, C2],
        replicas=on("m", "c1", 4),
        running=[gang("low", {"c2": 4}, priority="low")],
        queued=[job("g", 1, 4, priority="high")],
    )
    plan, _ = admit(snap, AdmissionConfig(), AdmissionState(), external_room_gpus=0)
    assert not [a for a in plan if isinstance(a, MoveServeReplicas)]
    assert [(a.job_id, a.for_job_id) for a in plan if isinstance(a, PreemptJob)] == [("low", "g")]


def test_the_external_room_is_its_most_less_what_its_replicas_hold() -> None:
    cfg = Config()
    cfg.serve.deploy_app = True
    cfg.pools.external.providers = [ProviderConfig(name="a", max_nodes=2, gpus_per_node=4)]
    e1 = node("e1", gpus_total=4, pool=Pool.EXTERNAL)
    reps = [
        replica("a", "e1", model="m", pool=Pool.EXTERNAL),
        replica("b", "e1", model="m", pool=Pool.EXTERNAL, state=ReplicaState.STARTING),
        replica("c", "e1", model="m", pool=Pool.EXTERNAL, state=ReplicaState.STOPPING),
        replica("d", "c1", model="m"),
    ]
    assert external_room_gpus(snapshot([C1, e1], replicas=reps), policies_of(cfg)) == 6


def test_on_shortfall_is_checked_and_reaches_the_models_class() -> None:
    cfg = Config()
    cfg.serve.deploy_app = True
    cfg.serving.models = [
        ModelConfig(name="chat"),
        ModelConfig(name="batch", on_shortfall="yield"),
    ]
    classes = policies_of(cfg).model_classes
    assert not classes["chat"].yields_on_shortfall
    assert classes["batch"].yields_on_shortfall
    cfg.serving.models = [ModelConfig(name="chat", on_shortfall="sometimes")]
    errors = validate(cfg)
    assert any("serving.models[0].on_shortfall" in e and "'sometimes'" in e for e in errors)


@dataclass
class ReclaimCase:
    id: str
    need: int
    """Cluster GPUs serving's demand needs beyond its targets and the external room."""
    gangs: list  # type: ignore[type-arg]
    preempted: list[str]
    queued_admitted: bool = False
    """Whether the queued 1-GPU job still gets a GPU this tick."""
    enabled: bool = True


# c1 and c2 (4 GPUs each) hold the gangs below; "low-1" holds 1 GPU of c1, so c1 has 3 free.
LOW1 = gang("low-1", {"c1": 1}, priority="low", started_s=50.0)
LOW4 = gang("low-4", {"c2": 4}, priority="low", started_s=40.0)
MED4 = gang("med-4", {"c2": 4}, priority="medium")
RECLAIM = [
    ReclaimCase("free-gpus-cover-it-and-no-gang-gets-them", 7, [LOW1], [], False),
    ReclaimCase("free-gpus-left-over-go-to-the-queue", 2, [LOW1], [], True),
    ReclaimCase("the-lowest-gang-whose-gpus-suffice", 5, [LOW1, LOW4], ["low-4"]),
    ReclaimCase("the-smallest-of-those-that-suffice", 4, [LOW1, LOW4], ["low-1"]),
    ReclaimCase("low-priority-first-then-spared-if-not-needed", 5, [LOW1, MED4], ["med-4"]),
    ReclaimCase("preemption-off-reclaims-nothing", 5, [LOW1, LOW4], [], enabled=False),
]  # fmt: skip


@pytest.mark.parametrize("case", RECLAIM, ids=[c.id for c in RECLAIM])
def test_serving_demand_nobody_can_host_is_reclaimed_from_the_lowest_training(
    case: ReclaimCase,
) -> None:
    snap = snapshot(
        [C1, C2], running=case.gangs, queued=[job("q", 1, 1, priority="low")], now_s=100.0
    )
    cfg = AdmissionConfig(preemption_enabled=case.enabled)
    plan, state = admit(
        snap, cfg, AdmissionState(), external_room_gpus=0, serving_need_gpus=case.need
    )
    preempted = [a for a in plan if isinstance(a, PreemptJob)]
    assert sorted(a.job_id for a in preempted) == sorted(case.preempted)
    for a in preempted:
        assert a.reason.startswith("serving-reclaims:") and a.checkpoint_first
    assert sorted(p.job_id for p in state.preemptions) == sorted(case.preempted)
    assert bool([a for a in plan if isinstance(a, AdmitJob)]) == case.queued_admitted


def test_releasing_gpus_cover_serving_before_another_gang_is_asked() -> None:
    """A gang already asked to checkpoint (preempting) frees what serving needs: nobody else
    is preempted, and the queued job does not get those GPUs."""
    snap = snapshot(
        [C1, C2],
        running=[
            gang("going", {"c1": 4}, preempting=True),
            gang("stays", {"c2": 4}, priority="low"),
        ],
        queued=[job("q", 1, 4, priority="low")],
        now_s=100.0,
    )
    plan, _ = admit(
        snap, AdmissionConfig(), AdmissionState(), external_room_gpus=0, serving_need_gpus=4
    )
    assert not [a for a in plan if isinstance(a, PreemptJob | AdmitJob)]


def test_the_loop_holds_for_admission_what_placement_could_not_place() -> None:
    """`unplaced_gpus`: demand's replicas beyond both pools' targets, in GPUs, for the models
    whose demand is a guarantee; a yielding model, or one pinned to the external pool, asks
    for none."""
    demands = (
        ModelDemand("chat", 6, 1, 2),
        ModelDemand("batch", 5, 1, 1, yields_on_shortfall=True),
        ModelDemand("pinned", 4, 1, 1),
        ModelDemand("met", 2, 1, 1),
    )
    targets = (
        PoolTargets("chat", 2, 1),
        PoolTargets("batch", 0, 0),
        PoolTargets("pinned", 0, 1),
        PoolTargets("met", 1, 1),
    )
    assert unplaced_gpus(demands, targets, {"pinned": Pool.EXTERNAL}) == 6
    assert unplaced_gpus(demands, targets, {}) == 9


def test_unplaced_gpus_survive_a_controller_restart() -> None:
    state = ServingPolicyState(unplaced_gpus=7)
    assert ServingPolicyState.from_dict(state.to_dict()).unplaced_gpus == 7
    assert ServingPolicyState.from_dict({"demand": {}}).unplaced_gpus == 0


def test_cluster_replicas_placed_but_on_no_node_yet_are_held_for_serving() -> None:
    """Placement raised the cluster target to 2; one replica runs on c1, the other has no node
    yet (Serve has not placed it) and c2's GPU looks free: the next tick's admission keeps
    that GPU from gangs, so a queued gang does not take it before the replica does; and it
    never preempts for it."""
    from controlplane.loop.decide import unstarted_cluster_gpus

    demand = (ModelDemand("m", 2, 1, 1),)
    pending = replica("m-1", "", model="m", state=ReplicaState.STARTING)
    snap = snapshot([C1, C2], replicas=[replica("m-0", "c1", model="m"), pending])
    assert unstarted_cluster_gpus(snap, demand, (PoolTargets("m", 2, 0),)) == 1
    assert unstarted_cluster_gpus(snap, demand, (PoolTargets("m", 1, 0),)) == 0
    placed = replica("m-1", "c2", model="m", state=ReplicaState.STARTING)
    snap = snapshot([C1, C2], replicas=[replica("m-0", "c1", model="m"), placed])
    assert unstarted_cluster_gpus(snap, demand, (PoolTargets("m", 2, 0),)) == 0
    # Held before any gang: the gang that fits only on that GPU waits.
    free = snapshot([node("c1", 0, gpus_total=1), node("c2", 1, gpus_total=1)],
                    queued=[job("g", 1, 1)], derive_free=False)  # fmt: skip
    plan, _ = admit(free, AdmissionConfig(), AdmissionState(), serving_hold_gpus=1)
    assert plan == ()
    # Never a preemption for them: with no free GPU (the replica may hold it already,
    # before Serve says on which node), the running gang stays.
    full = snapshot([node("c1", 0, gpus_total=1), node("c2", 0, gpus_total=1)],
                    running=[gang("r", {"c2": 1}, priority="low")], derive_free=False)  # fmt: skip
    plan, _ = admit(full, AdmissionConfig(), AdmissionState(), serving_hold_gpus=1)
    assert not [a for a in plan if isinstance(a, PreemptJob)]
    plan, _ = admit(full, AdmissionConfig(), AdmissionState(), serving_need_gpus=1)
    assert [a.job_id for a in plan if isinstance(a, PreemptJob)] == ["r"]


def test_demand_goes_on_from_its_own_decision_not_the_targets_placement_could_place() -> None:
    """Demand asked for 2 replicas; placement could place 1 (its provider out of stock, it
    lowered the external target). The next tick demand still wants 2 at once, not after its
    upscale delay again: the unplaced GPU stays held for serving, no gang takes it."""
    from controlplane.adapters.serve import ServeView
    from controlplane.loop.decide import decide_serving

    cfg = Config()
    cfg.serve.deploy_app = True
    cfg.serving.models = [
        ModelConfig(
            name="m",
            num_gpus=1,
            min_replicas=1,
            max_replicas=4,
            upscale_delay_s=30,
            target_ongoing_requests=1,
        )
    ]
    policies = policies_of(cfg)
    snap = snapshot([node("c1", 0, gpus_total=1)], replicas=[replica("m-0", "c1", model="m")],
                    running=[gang("g", {"c1": 0})], derive_free=False)  # fmt: skip
    state = ServingPolicyState(replicas={"m": 2})
    state = ServingPolicyState.from_dict(state.to_dict())  # through the store's JSON
    _, targets, new = decide_serving(snap, ServeView(), {"m": 2.0}, policies, state)
    assert new.replicas == {"m": 2}
    assert sum(t.cluster + t.external for t in targets) == 2
    # Without its own decision, demand starts from Serve's targets (none here) as before.
    _, _, fresh = decide_serving(snap, ServeView(), {"m": 2.0}, policies, ServingPolicyState())
    assert fresh.replicas == {"m": 1}
