"""The primitives' order of writes (make-before-break) and their waits (`serve.control.waiting`),
against a fake of Serve's controller. A move is the control loop's own
(`controlplane.loop.act.operations`: `start`, then `advance` once a tick) through the Serve
adapter (`controlplane.adapters.serve.RayServe`), as the policy actor runs it.

`FakeServe` stands in for `serve.control.client`: it keeps the applied application configs and
reports every replica RUNNING at once (or STARTING for apps listed in `stuck`), and every
ingress replica as having applied the latest route table. `FakeClock` stands in for the
waits' clock: a wait's sleep moves it on, so the edge routers' table age (the settle wait
before a source pool is lowered) passes without sleeping. No Ray is started.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from controlplane.adapters.serve import RayServe
from controlplane.loop.act.operations import MoveOutcome, advance, start
from policies.plan import MoveServeReplicas
from policies.snapshot import Pool
from serve.config import IngressConfig, ModelConfig, ServingConfig
from serve.control import operations as ops
from serve.control import waiting
from serve.spec import INGRESS_APP, app_name, parse_app_name


@dataclass
class FakeClock:
    now_s: float = 1000.0

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


@dataclass
class FakeServe:
    clock: FakeClock = field(default_factory=FakeClock)
    stuck: set[str] = field(default_factory=set)
    """App names whose replicas never leave STARTING."""
    apps: dict[str, dict[str, Any]] = field(default_factory=dict)
    applied: list[dict[str, dict[str, Any]]] = field(default_factory=list)
    applied_at_s: list[float] = field(default_factory=list)
    """The clock at each apply (`applied`'s times)."""

    def apply_app_configs(self, apps: list[dict[str, Any]]) -> None:
        self.apps = {a["name"]: a for a in apps}
        self.applied.append(dict(self.apps))
        self.applied_at_s.append(self.clock.now_s)

    def read_details(self) -> dict[str, Any]:
        applications = {}
        for name, cfg in self.apps.items():
            deps = {}
            for d in cfg["deployments"]:
                n = d["num_replicas"]
                state = "STARTING" if name in self.stuck else "RUNNING"
                deps[d["name"]] = {
                    "status": "HEALTHY",
                    "target_num_replicas": n,
                    "deployment_config": {"user_config": d.get("user_config")},
                    "replicas": [
                        {"replica_id": f"{name}-{i}", "state": state, "node_id": "n"}
                        for i in range(n)
                    ],
                }
            applications[name] = {
                "status": "RUNNING",
                "deployed_app_config": cfg,
                "deployments": deps,
            }
        return {"applications": applications}


def targets(apps: dict[str, dict[str, Any]]) -> dict[str, int]:
    out = {}
    for name, cfg in apps.items():
        parsed = parse_app_name(name)
        if parsed:
            out[parsed[1]] = cfg["deployments"][0]["num_replicas"]
    return out


def weights(apps: dict[str, dict[str, Any]]) -> dict[str, float]:
    return dict(apps[INGRESS_APP]["deployments"][0]["user_config"]["weights"]["sample"])


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeServe:
    f = FakeServe()
    monkeypatch.setattr(ops.control, "apply_app_configs", f.apply_app_configs)
    monkeypatch.setattr(ops.control, "read_details", f.read_details)
    monkeypatch.setattr(ops.control, "node_pools", lambda: {})  # the status reads no Ray nodes
    monkeypatch.setattr(waiting, "_POLL_S", 0.01)
    monkeypatch.setattr(waiting, "now_s", lambda: f.clock.now_s)
    monkeypatch.setattr(waiting, "_sleep", f.clock.sleep)
    monkeypatch.setattr(waiting, "_first_applied_s", {})
    cfg = ServingConfig(
        ready_timeout_s=5,
        ingress=IngressConfig(num_replicas=2),
        models=[ModelConfig(name="sample", min_replicas=2)],
    )
    ops.deploy(cfg)
    f.applied.clear()
    f.applied_at_s.clear()
    return f


def move(
    fake: FakeServe,
    n: int,
    from_pool: str = "cluster",
    to_pool: str = "external",
    *,
    timeout_s: float = 30.0,
) -> tuple[int, MoveOutcome]:
    """Run the control loop's move of `n` replicas of ``sample`` to its end, a tick every
    0.5 s of the fake clock: (replicas moved, how it ended)."""
    plane = RayServe({"sample": 1.0})
    action = MoveServeReplicas("sample", Pool(from_pool), Pool(to_pool), n, (), reason="test")
    op = start(action, plane.view(), fake.clock.now_s)
    if op is None:
        return 0, MoveOutcome.DONE
    for _ in range(200):
        op, outcome = advance(op, plane, fake.clock.now_s, timeout_s)
        if outcome in (MoveOutcome.DONE, MoveOutcome.UNWOUND):
            return op.num_replicas, outcome
        fake.clock.sleep(0.5)
    raise AssertionError(f"the move did not end: {op}")


def test_deploy_routes_to_the_ready_initial_pool(fake: FakeServe) -> None:
    assert targets(fake.apps) == {"cluster": 2}
    assert weights(fake.apps) == {"cluster": 2.0, "external": 0.0}


def test_move_is_make_before_break(fake: FakeServe) -> None:
    assert move(fake, 2) == (2, MoveOutcome.DONE)
    steps = [(targets(a), weights(a)) for a in fake.applied]
    assert steps == [
        ({"cluster": 2, "external": 2}, {"cluster": 2.0, "external": 0.0}),  # make
        ({"cluster": 2, "external": 2}, {"cluster": 0.0, "external": 2.0}),  # shift
        ({"external": 2}, {"cluster": 0.0, "external": 2.0}),  # break: pool at zero, no app
    ]


def test_move_lowers_the_source_only_after_the_edges_table_age(fake: FakeServe) -> None:
    """An edge router may route by a table up to ``edge_table_max_age_s`` old: the break
    comes at least that long after the shift was applied (the fake applies it at once)."""
    move(fake, 2)
    _make_s, shift_s, break_s = fake.applied_at_s
    assert break_s - shift_s >= IngressConfig().edge_table_max_age_s == 5.0


def test_route_applied_waits_for_the_edges_table_age(fake: FakeServe) -> None:
    generation = ops.route_for_targets("sample", {"cluster": 1})  # written, not yet awaited
    assert not waiting.route_applied(generation)  # applied: first seen now
    fake.clock.now_s += 4.99
    assert not waiting.route_applied(generation)
    fake.clock.now_s += 0.01
    assert waiting.route_applied(generation)
    assert not waiting.route_applied(generation + 1)  # not written yet
    later = ops.route_for_targets("sample", {"cluster": 2})
    fake.stuck.add(INGRESS_APP)  # an ingress replica has not applied it: the clock waits
    fake.clock.now_s += 60
    assert not waiting.route_applied(later)
    fake.stuck.clear()
    assert not waiting.route_applied(later)
    fake.clock.now_s += 5.0
    assert waiting.route_applied(later) and waiting.route_applied(generation)


def test_the_settle_wait_follows_the_configured_table_age(fake: FakeServe) -> None:
    ops.deploy(
        ServingConfig(
            ready_timeout_s=5,
            ingress=IngressConfig(num_replicas=2, edge_table_max_age_s=2.0),
            models=[ModelConfig(name="sample", min_replicas=2)],
        )
    )
    generation = ops.route_for_targets("sample", {"cluster": 1})
    assert not waiting.route_applied(generation)
    fake.clock.now_s += 1.9
    assert not waiting.route_applied(generation)
    fake.clock.now_s += 0.1
    assert waiting.route_applied(generation)


def test_the_first_seen_times_are_bounded(fake: FakeServe) -> None:
    state = ops.read_state()
    assert state is not None
    waiting._first_applied_s.clear()
    for generation in range(state.generation + 1, state.generation + 200):
        waiting.route_applied(generation)  # generations never written: not applied, not kept
    assert waiting._first_applied_s == {}
    for generation in range(state.generation - 99, state.generation + 1):
        waiting.route_applied(generation)  # all applied (a later one is): each noted
    assert len(waiting._first_applied_s) == waiting._SEEN_KEPT
    assert min(waiting._first_applied_s) == state.generation - waiting._SEEN_KEPT + 1


def test_partial_move_splits_weights_by_ready_replicas(fake: FakeServe) -> None:
    move(fake, 1)
    assert targets(fake.apps) == {"cluster": 1, "external": 1}
    assert weights(fake.apps) == {"cluster": 1.0, "external": 1.0}


def test_move_that_cannot_start_puts_target_back_and_leaves_source(fake: FakeServe) -> None:
    fake.stuck.add(app_name("sample", "external"))
    assert move(fake, 2, timeout_s=2.0)[1] is MoveOutcome.UNWOUND
    assert targets(fake.apps) == {"cluster": 2}
    assert weights(fake.apps) == {"cluster": 2.0, "external": 0.0}


def test_move_more_than_source_has_moves_what_is_there(fake: FakeServe) -> None:
    assert move(fake, 5) == (2, MoveOutcome.DONE)
    assert move(fake, 1) == (0, MoveOutcome.DONE)


def test_scale_down_takes_replicas_out_of_routing_first(fake: FakeServe) -> None:
    ops.scale_pool("sample", "external", 2)
    fake.applied.clear()
    ops.scale_pool("sample", "cluster", 0)
    steps = [(targets(a), weights(a)) for a in fake.applied]
    assert steps == [
        ({"cluster": 2, "external": 2}, {"cluster": 0.0, "external": 2.0}),
        ({"external": 2}, {"cluster": 0.0, "external": 2.0}),
    ]


def test_scale_up_routes_after_running(fake: FakeServe) -> None:
    ops.scale_pool("sample", "external", 1)
    steps = [(targets(a), weights(a)) for a in fake.applied]
    assert steps == [
        ({"cluster": 2, "external": 1}, {"cluster": 2.0, "external": 0.0}),
        ({"cluster": 2, "external": 1}, {"cluster": 2.0, "external": 1.0}),
    ]


def test_redeploy_keeps_targets_and_weights(fake: FakeServe) -> None:
    move(fake, 1)
    before = ops.read_state()
    ops.deploy(
        ServingConfig(ready_timeout_s=5, models=[ModelConfig(name="sample", min_replicas=2)])
    )
    after = ops.read_state()
    assert before is not None and after is not None
    assert (after.targets, after.weights) == (before.targets, before.weights)


def ingress_count(apps: dict[str, dict[str, Any]]) -> int:
    return int(apps[INGRESS_APP]["deployments"][0]["num_replicas"])


def test_scale_ingress_changes_only_its_count_and_a_redeploy_keeps_it(fake: FakeServe) -> None:
    before = ops.read_state()
    ops.scale_ingress(5)
    (apps,) = fake.applied
    assert ingress_count(apps) == 5
    assert (targets(apps), weights(apps)) == (targets(fake.apps), weights(fake.apps))
    state = ops.read_state()
    assert before is not None and state is not None
    assert (state.ingress_replicas, state.generation) == (5, before.generation)
    ops.scale_ingress(5)  # unchanged: no write
    ops.scale_ingress(1)  # below the configured floor of 2: runs the floor
    assert [ingress_count(a) for a in fake.applied] == [5, 2]
    ops.scale_ingress(4)
    ops.deploy(ServingConfig(ready_timeout_s=5, models=[ModelConfig(name="sample")]))
    assert ingress_count(fake.apps) == 4
    with pytest.raises(ValueError, match="at least 1"):
        ops.scale_ingress(0)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        pytest.param(
            lambda: ops.set_pool_target("sample", "gpu", 1), "unknown pool", id="target-bad-pool"
        ),
        pytest.param(
            lambda: ops.set_pool_target("nope", "cluster", 1),
            "unknown model",
            id="target-bad-model",
        ),
        pytest.param(lambda: ops.scale_pool("sample", "cluster", -1), ">= 0", id="scale-negative"),
        pytest.param(
            lambda: ops.set_route_weights("sample", {"gpu": 1}),
            "unknown pool",
            id="weights-bad-pool",
        ),
    ],
)
def test_bad_arguments_raise_before_any_write(fake: FakeServe, call: Any, error: str) -> None:
    with pytest.raises((ValueError, KeyError), match=error):
        call()
    assert fake.applied == []


def test_not_deployed_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops.control, "read_details", lambda: {"applications": {}})
    with pytest.raises(ops.ServingNotDeployedError, match="not deployed"):
        ops.scale_pool("sample", "cluster", 1)
