"""Model classes as tables: under a training claim the lowest-priority model yields first, only
as much as the claim needs, a model whose SLO is at risk yields last in its class, no model
goes below its cluster floor, and migration back runs highest priority first. Admission
claims in the same order, never a floor replica, and a gang only floors keep out waits with a
reason naming the models."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from controlplane.config import Config
from controlplane.loop.decide import model_classes_now, policies_of
from policies.admission import AdmissionConfig, AdmissionState
from policies.admission import decide as admit
from policies.model_classes import ModelClass, yield_key
from policies.placement import ModelDemand, PlacementConfig, PlacementState
from policies.placement import decide as place
from policies.plan import AdmitJob, MoveServeReplicas, WaitJob
from policies.snapshot import Pool
from serve.config import ModelConfig
from tests.unit.builders import job, node, replica, snapshot

C1, C2 = node("c1", gpus_total=4), node("c2", gpus_total=4)
EXTERNAL = [node(f"e{i}", gpus_total=4, pool=Pool.EXTERNAL) for i in range(2)]
HIGH, LOW = 100, 0


def on(model: str, node_id: str, n: int, pool: Pool = Pool.CLUSTER) -> list:  # type: ignore[type-arg]
    return [replica(f"{model}-{node_id}-{i}", node_id, model=model, pool=pool) for i in range(n)]


@dataclass
class Model:
    name: str
    priority: int = LOW
    floor: int = 0
    at_risk: bool = False
    cur: tuple[int, int] = (4, 0)
    """(cluster, external) replicas; cluster ones on the node named in `where`."""
    where: str = "c1"

    def demand(self) -> ModelDemand:
        return ModelDemand(
            self.name,
            sum(self.cur),
            1,
            1,
            priority=self.priority,
            min_cluster_replicas=self.floor,
            slo_at_risk=self.at_risk,
        )

    def replicas(self) -> list:  # type: ignore[type-arg]
        return on(self.name, self.where, self.cur[0]) + on(
            self.name, "e0", self.cur[1], Pool.EXTERNAL
        )


@dataclass
class YieldCase:
    id: str
    models: list[Model]
    claim: int
    expect: dict[str, tuple[int, int]]
    """Model -> (cluster, external) targets."""
    moved: dict[str, int] = field(default_factory=dict)
    """Model -> replicas moved to external (absent: none)."""


# c1 and c2 have 4 GPUs each; "hi" runs 4 on c1, "lo" 4 on c2 (1 GPU each) unless a row says.
def hi(**kw: object) -> Model:
    return Model("hi", priority=HIGH, **kw)  # type: ignore[arg-type]


def lo(**kw: object) -> Model:
    return Model("lo", where="c2", **kw)  # type: ignore[arg-type]


YIELD = [
    YieldCase("small-claim-takes-only-the-low-model", [hi(), lo()], 3,
              {"hi": (4, 0), "lo": (1, 3)}, {"lo": 3}),
    YieldCase("claim-of-the-low-model-exactly", [hi(), lo()], 4,
              {"hi": (4, 0), "lo": (0, 4)}, {"lo": 4}),
    YieldCase("partial-yield-across-models", [hi(), lo()], 5,
              {"hi": (3, 1), "lo": (0, 4)}, {"hi": 1, "lo": 4}),
    YieldCase("name-order-does-not-decide", [Model("a", priority=HIGH, where="c2"),
                                             Model("z", priority=LOW)], 4,
              {"a": (4, 0), "z": (0, 4)}, {"z": 4}),
    YieldCase("floor-holds-against-a-claim-of-everything", [hi(floor=2), lo()], 8,
              {"hi": (2, 2), "lo": (0, 4)}, {"hi": 2, "lo": 4}),
    YieldCase("floor-of-the-low-model-shifts-the-yield-up", [hi(), lo(floor=3)], 3,
              {"hi": (2, 2), "lo": (3, 1)}, {"hi": 2, "lo": 1}),
    YieldCase("slo-at-risk-yields-last-within-its-class", [Model("a", at_risk=True),
                                                           Model("b", where="c2")], 4,
              {"a": (4, 0), "b": (0, 4)}, {"b": 4}),
    YieldCase("priority-outranks-slo-at-risk", [hi(), lo(at_risk=True)], 4,
              {"hi": (4, 0), "lo": (0, 4)}, {"lo": 4}),
]  # fmt: skip


@pytest.mark.parametrize("case", YIELD, ids=[c.id for c in YIELD])
def test_claim_yields_lowest_priority_first(case: YieldCase) -> None:
    snap = snapshot([C1, C2, *EXTERNAL], replicas=[r for m in case.models for r in m.replicas()])
    demands = tuple(m.demand() for m in case.models)
    (targets, actions), _ = place(
        snap,
        demands,
        PlacementConfig(external_max_gpus=8),
        PlacementState(),
        training_claim_gpus=case.claim,
    )
    assert {t.model: (t.cluster, t.external) for t in targets} == case.expect
    moved = {
        a.model: a.num_replicas
        for a in actions
        if isinstance(a, MoveServeReplicas) and a.to_pool is Pool.EXTERNAL
    }
    assert moved == case.moved
    order = [a.model for a in actions if isinstance(a, MoveServeReplicas)]
    assert order == sorted(
        order, key=lambda m: yield_key(m, {d.model: d.model_class for d in demands})
    )
    for m in case.models:
        assert dict((t.model, t.cluster) for t in targets)[m.name] >= min(m.floor, m.cur[0])


def test_a_claim_naming_a_model_moves_that_model() -> None:
    """Admission chose hi's replicas (its nodes fit the gang): placement follows the claim."""
    snap = snapshot([C1, C2, *EXTERNAL], replicas=hi().replicas() + lo().replicas())
    claim = MoveServeReplicas("hi", Pool.CLUSTER, Pool.EXTERNAL, 2, ("c1", "c1"), "x", "j")
    (targets, actions), _ = place(
        snap,
        (hi().demand(), lo().demand()),
        PlacementConfig(external_max_gpus=8),
        PlacementState(),
        claims=(claim,),
    )
    assert {t.model: (t.cluster, t.external) for t in targets} == {"hi": (2, 2), "lo": (4, 0)}
    (move,) = [a for a in actions if isinstance(a, MoveServeReplicas)]
    assert (move.model, move.node_ids, move.for_job_id) == ("hi", ("c1", "c1"), "j")


@pytest.mark.parametrize(
    ("models", "first_back"),
    [
        pytest.param([Model("a", priority=LOW), Model("b", priority=HIGH)], "b", id="high-first"),
        pytest.param([Model("a"), Model("b", at_risk=True)], "b", id="at-risk-first-in-class"),
        pytest.param([Model("a"), Model("b")], "a", id="name-order-within-equals"),
    ],
)
def test_migration_back_runs_highest_priority_first(models: list[Model], first_back: str) -> None:
    for m in models:
        m.cur = (0, 2)
    snap = snapshot(
        [C1, C2, *EXTERNAL], replicas=[r for m in models for r in m.replicas()], now_s=1000.0
    )
    cfg = PlacementConfig(external_max_gpus=8, migrate_back_idle_s=0, migrate_back_step=1)
    (_, actions), _ = place(snap, tuple(m.demand() for m in models), cfg, PlacementState())
    back = [a.model for a in actions if isinstance(a, MoveServeReplicas)]
    assert back == [first_back]


def test_yield_key_orders_priority_then_risk_then_name() -> None:
    classes = {
        "ranker": ModelClass(HIGH, 2),
        "batch": ModelClass(LOW),
        "chat": ModelClass(LOW, slo_at_risk=True),
    }
    assert sorted(classes, key=lambda m: yield_key(m, classes)) == ["batch", "chat", "ranker"]
    assert yield_key("unknown", classes) == (0, False, "unknown")
    with pytest.raises(ValueError, match="min_cluster_replicas"):
        ModelClass(min_cluster_replicas=-1)


@dataclass
class AdmitCase:
    id: str
    need: int
    """GPUs the gang needs (4-GPU workers on 4-GPU nodes: whole nodes)."""
    classes: dict[str, ModelClass]
    claimed: dict[str, int] = field(default_factory=dict)
    """Model -> replicas admission claims (a `MoveServeReplicas` each)."""
    waits_naming: tuple[str, ...] = ()


# c1 holds "hi" x2 and "lo" x2; c2 holds "lo" x2 and "hi" x2; no GPU is free.
ADMIT = [
    AdmitCase("no-classes-claims-by-node", 4, {}, {"hi": 2, "lo": 2}),
    AdmitCase("lowest-first-when-nodes-tie", 4,
              {"hi": ModelClass(HIGH), "lo": ModelClass(LOW)}, {"hi": 2, "lo": 2}),
    AdmitCase("floor-of-two-still-leaves-a-node", 4,
              {"hi": ModelClass(HIGH, 2)}, {"hi": 2, "lo": 2}),
    AdmitCase("floors-block-the-whole-pool", 8,
              {"hi": ModelClass(HIGH, 2)}, {}, ("model 'hi' keeps 2 replica(s)",)),
    AdmitCase("floors-of-both-models-named", 8,
              {"hi": ModelClass(HIGH, 1), "lo": ModelClass(LOW, 1)}, {},
              ("model 'hi' keeps 1 replica(s)", "model 'lo' keeps 1 replica(s)")),
]  # fmt: skip


@pytest.mark.parametrize("case", ADMIT, ids=[c.id for c in ADMIT])
def test_admission_claims_by_class_and_never_a_floor(case: AdmitCase) -> None:
    reps = on("hi", "c1", 2) + on("lo", "c1", 2)
    reps += [replica(f"lo-c2-{i}", "c2", model="lo") for i in range(2)]
    reps += [replica(f"hi-c2-{i}", "c2", model="hi") for i in range(2)]
    snap = snapshot([C1, C2], replicas=reps, queued=[job("g", case.need // 4, 4)])
    plan, _ = admit(snap, AdmissionConfig(), AdmissionState(), models=case.classes)
    claimed = {a.model: a.num_replicas for a in plan if isinstance(a, MoveServeReplicas)}
    assert claimed == case.claimed
    waits = [a for a in plan if isinstance(a, WaitJob)]
    assert all(a.reason.startswith(f"{a.code}: ") for a in waits)
    if case.waits_naming:
        (wait,) = waits
        assert wait.job_id == "g" and "(min_cluster_replicas)" in wait.reason
        for text in case.waits_naming:
            assert text in wait.reason
    else:
        assert not waits
    assert not [a for a in plan if isinstance(a, AdmitJob)]  # nothing was free this tick


def test_admission_takes_the_low_model_when_it_alone_frees_a_node() -> None:
    """c1: lo x4; c2: hi x4; a 4-GPU gang: lo yields, hi keeps all of its replicas."""
    reps = on("lo", "c1", 4) + on("hi", "c2", 4)
    snap = snapshot([C1, C2], replicas=reps, queued=[job("g", 1, 4)])
    classes = {"hi": ModelClass(HIGH), "lo": ModelClass(LOW)}
    plan, _ = admit(snap, AdmissionConfig(), AdmissionState(), models=classes)
    assert [(a.model, a.num_replicas) for a in plan if isinstance(a, MoveServeReplicas)] == [
        ("lo", 4)
    ]


def test_the_loop_builds_each_models_class_from_its_config() -> None:
    """`policies_of` maps a model's priority class name to its value (none: the lowest) and
    its floor; `model_classes_now` marks a model at risk when its p99 is over its SLO."""
    cfg = Config()
    cfg.serve.deploy_app = True
    cfg.serving.models = [
        ModelConfig(name="ranker", priority="high", min_cluster_replicas=2, slo_p99_ms=100.0),
        ModelConfig(name="batch"),
    ]
    policies = policies_of(cfg)
    assert policies.model_classes == {"ranker": ModelClass(HIGH, 2), "batch": ModelClass(LOW)}
    now = model_classes_now(policies, {"ranker": 150.0, "batch": 900.0})
    assert now == {"ranker": ModelClass(HIGH, 2, slo_at_risk=True), "batch": ModelClass(LOW)}
    assert not model_classes_now(policies, {"ranker": 80.0})["ranker"].slo_at_risk
