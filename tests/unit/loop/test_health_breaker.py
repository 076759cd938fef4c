"""The health breaker: at most a budget of nodes taken out per window; past it, verdicts are
shown (held) and alerted on, not acted on, and the breaker stays open until an operator resets
it (kept across controller restarts; `rcp health-breaker`). Ends with a fleet-wide bad scrape fed through the
real parser, sampler, judge, breaker, plan and actuator."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controlplane.config import HealthConfig, load_config, to_dict
from controlplane.controller.actor import Controller
from controlplane.loop.act.nodes import Breaker, Remediator
from controlplane.loop.health import BREAKER_KEY
from controlplane.telemetry.dcgm import DcgmSource
from controlplane.telemetry.sampling import NodeSampler
from controlplane.telemetry.verdicts import judge
from policies.health import (
    BreakerState,
    CordonNode,
    HealthReason,
    HealthState,
    NodeVerdict,
    RemovalBudget,
    Verdict,
    limit_removals,
    remediate,
    reset_breaker,
    with_verdicts,
)
from policies.plan import DrainNode
from policies.snapshot import ClusterSnapshot, Pool
from tests.unit.builders import node, snapshot
from tests.unit.telemetry.test_telemetry_dcgm import answer_every_scrape

BUDGET = RemovalBudget(max_nodes=2, max_pool_fraction=0.1, window_s=600.0)


def bad(node_id: str) -> NodeVerdict:
    return NodeVerdict(node_id, Verdict.UNHEALTHY, (HealthReason.GPU_MISSING,), ("0 of 8 GPUs",))


def fleet(n: int, pool: Pool = Pool.CLUSTER, prefix: str = "n") -> list:  # type: ignore[type-arg]
    return [node(f"{prefix}{i:02d}", pool=pool) for i in range(n)]


@pytest.mark.parametrize(
    ("nodes", "unhealthy", "state", "out", "now_s", "admitted", "held"),
    [
        pytest.param(fleet(30), ["n00"], BreakerState(), (), 0.0, ["n00"], [], id="one-is-fine"),
        pytest.param(
            fleet(30),
            [f"n{i:02d}" for i in range(30)],
            BreakerState(),
            (),
            0.0,
            ["n00", "n01"],
            [f"n{i:02d}" for i in range(2, 30)],
            id="fleet-cap-2-of-30",
        ),
        pytest.param(
            fleet(5),
            ["n00", "n01", "n02"],
            BreakerState(),
            (),
            0.0,
            ["n00"],
            ["n01", "n02"],
            id="pool-fraction-floor-1-of-5",
        ),
        pytest.param(
            fleet(1), ["n00"], BreakerState(), (), 0.0, ["n00"], [], id="pool-of-one-may-go"
        ),
        pytest.param(
            fleet(5) + fleet(5, Pool.EXTERNAL, "e"),
            ["n00", "n01", "e00", "e01"],
            BreakerState(),
            (),
            0.0,
            ["e00", "n00"],
            ["e01", "n01"],
            id="per-pool-and-fleet",
        ),
        pytest.param(
            fleet(30),
            ["n05", "n06"],
            BreakerState((("gone1", "cluster", 100.0), ("gone2", "cluster", 200.0))),
            (),
            300.0,
            [],
            ["n05", "n06"],
            id="replaced-nodes-still-count-in-the-window",
        ),
        pytest.param(
            fleet(30),
            ["n05", "n06"],
            BreakerState((("gone1", "cluster", 100.0), ("gone2", "cluster", 200.0))),
            (),
            750.0,
            ["n05"],
            ["n06"],
            id="window-passes-for-the-first",
        ),
        pytest.param(
            fleet(30),
            ["n00", "n01", "n02"],
            BreakerState((("n00", "cluster", 10.0), ("n01", "cluster", 10.0))),
            (),
            20.0,
            [],
            ["n02"],
            id="admitted-earlier-not-counted-twice",
        ),
        pytest.param(
            fleet(30),
            ["n00", "n01", "n02", "n03"],
            BreakerState(),
            ("n00", "n01"),
            0.0,
            ["n02", "n03"],
            [],
            id="already-out-is-exempt",
        ),
        pytest.param(
            [node("head", pool=Pool.HEAD)] + fleet(3),
            ["head"],
            BreakerState(),
            (),
            0.0,
            [],
            [],
            id="head-never-counts",
        ),
    ],
)
def test_limit_removals(
    nodes: list,  # type: ignore[type-arg]
    unhealthy: list[str],
    state: BreakerState,
    out: tuple[str, ...],
    now_s: float,
    admitted: list[str],
    held: list[str],
) -> None:
    verdicts = {n: bad(n) for n in unhealthy}
    acting, new = limit_removals(verdicts, snapshot(nodes), BUDGET, state, out, now_s)
    assert sorted(n for n, v in acting.items() if v.held) == held
    assert list(new.held) == held and new.open is bool(held)
    newly = [r[0] for r in new.removals if r[2] == now_s]
    assert sorted(newly) == admitted
    for n in held:
        assert acting[n].verdict is Verdict.UNHEALTHY  # still shown as it was judged
        assert "health breaker open" in acting[n].details[-1]


def test_zero_budget_holds_every_removal() -> None:
    acting, state = limit_removals(
        {"n00": bad("n00")}, snapshot(fleet(3)), RemovalBudget(max_nodes=0), BreakerState(), (), 0.0
    )
    assert acting["n00"].held and state.held == ("n00",)


def test_held_nodes_stay_in_capacity_and_get_no_plan() -> None:
    snap = snapshot(fleet(30))
    verdicts = {f"n{i:02d}": bad(f"n{i:02d}") for i in range(30)}
    acting, _ = limit_removals(verdicts, snap, BUDGET, BreakerState(), (), 0.0)
    plan = remediate(snap, acting)
    assert [a.node_id for a in plan if isinstance(a, CordonNode)] == ["n00", "n01"]
    out_of_capacity = [n.node_id for n in with_verdicts(snap, acting).nodes if not n.healthy]
    assert out_of_capacity == ["n00", "n01"]


def test_breaker_says_so_once_when_it_opens_and_when_it_holds_nothing_more() -> None:
    events: list[tuple[str, str]] = []
    b = Breaker(BUDGET, record=lambda k, m: events.append((k, m)))
    snap = snapshot(fleet(30))
    verdicts = {f"n{i:02d}": bad(f"n{i:02d}") for i in range(5)}
    for t in (0.0, 1.0, 2.0):
        b.step(verdicts, snap, {"n00", "n01"} if t else set(), t)
    assert [k for k, _ in events] == ["health.breaker"]
    assert events[0][1].startswith("open: 3 unhealthy node(s) not taken out (n02, n03, n04)")
    assert "until an operator resets the breaker (rcp health-breaker --reset)" in events[0][1]
    b.step({}, snap, {"n00", "n01"}, 3.0)
    assert events[-1][1].startswith("no unhealthy node is held any more; the breaker stays open")
    assert b.state.open and b.state.held == ()
    again = BreakerState.from_dict(json.loads(json.dumps(b.state.to_dict())))
    assert again == b.state and len(again.removals) == 2 and again.opened_s == 0.0
    b.step({}, snap, {"n00", "n01"}, 4.0)
    assert len(events) == 2  # said once
    before = b.reset()
    assert before.open and not b.state.open and b.state.removals == before.removals
    assert events[-1][0] == "health.breaker_reset"
    assert events[-1][1].startswith("reset by operator: closed (open since 1970-01-01 00:00:00Z")


# -- the breaker latches: a fleet-wide fault is stopped, not slowed -----------------------------

OPEN = BreakerState(removals=(("n00", "cluster", 0.0), ("n01", "cluster", 0.0)), opened_s=0.0)


@pytest.mark.parametrize(
    ("state", "unhealthy", "out", "now_s", "admitted", "held"),
    [
        pytest.param(OPEN, ["n05"], (), 10_000.0, [], ["n05"], id="open-holds-past-the-window"),
        pytest.param(
            BreakerState(opened_s=0.0), ["n05"], (), 0.0, [], ["n05"], id="open-with-budget-left"
        ),
        pytest.param(
            OPEN, ["n00", "n01", "n05"], (), 30.0, [], ["n05"], id="admitted-before-go-on"
        ),
        pytest.param(OPEN, ["n07"], ("n07",), 30.0, [], [], id="already-out-never-held"),
        pytest.param(OPEN, [], (), 30.0, [], [], id="open-holding-nothing-stays-open"),
        pytest.param(reset_breaker(OPEN), ["n05"], (), 10_000.0, ["n05"], [], id="after-reset"),
        pytest.param(
            reset_breaker(OPEN), ["n05"], (), 30.0, [], ["n05"], id="reset-keeps-the-rate-limit"
        ),
    ],
)
def test_an_open_breaker_holds_every_new_removal_until_reset(
    state: BreakerState,
    unhealthy: list[str],
    out: tuple[str, ...],
    now_s: float,
    admitted: list[str],
    held: list[str],
) -> None:
    verdicts = {n: bad(n) for n in unhealthy}
    acting, new = limit_removals(verdicts, snapshot(fleet(30)), BUDGET, state, out, now_s)
    assert sorted(n for n, v in acting.items() if v.held) == held
    assert sorted(r[0] for r in new.removals if r[2] == now_s) == admitted
    assert new.open is (state.open or bool(held))
    if state.open:
        assert new.opened_s == state.opened_s
        for n in held:
            assert "holds every removal until an operator resets it" in acting[n].details[-1]


@pytest.mark.parametrize(
    ("num_nodes", "hours"),
    [
        pytest.param(30, 3, id="30-nodes-3h"),
        pytest.param(200, 24, id="200-nodes-a-day"),
    ],
)
def test_a_fleet_wide_fault_that_lasts_takes_out_only_the_first_budget(
    num_nodes: int, hours: int
) -> None:
    nodes = fleet(num_nodes)
    snap = snapshot(nodes)
    verdicts = {n.node_id: bad(n.node_id) for n in nodes}
    state, out = BreakerState(), set[str]()
    for t in range(0, hours * 3600, 10):
        acting, state = limit_removals(verdicts, snap, BUDGET, state, out, float(t))
        out |= {k for k, v in acting.items() if v.verdict is Verdict.UNHEALTHY and not v.held}
    assert sorted(out) == ["n00", "n01"] and state.open


def test_the_breaker_survives_a_controller_restart_and_the_reset_is_stored(
    tmp_path: Path,
) -> None:
    cfg = load_config(None, [f"state_dir={tmp_path}"])
    first = Controller(to_dict(cfg), "token", start=False)
    first.store.put(BREAKER_KEY, OPEN.to_dict())
    first.shutdown()
    second = Controller(to_dict(cfg), "token", start=False)
    shown = second.breaker_status()
    assert shown["open"] and shown["opened_s"] == 0.0 and shown["window_s"] == 600.0
    assert [r["node_id"] for r in shown["removals"]] == ["n00", "n01"]
    reset = second.operations.reset_breaker("oncall", "exporter rollout")
    assert reset["was"]["open"] is True  # the state before the reset
    assert [e.kind for e in second.store.events(kind_prefix="health.breaker_reset")] == [
        "health.breaker_reset"
    ]
    second.shutdown()
    third = Controller(to_dict(cfg), "token", start=False)
    assert third.breaker_status()["open"] is False
    assert len(third.breaker_status()["removals"]) == 2  # the window still counts
    third.shutdown()


# -- a fleet-wide bad scrape, end to end -------------------------------------------------------


@dataclass
class FakeNodes:
    draining_now: dict[str, int] = field(default_factory=dict)
    drained: list[str] = field(default_factory=list)

    def draining(self) -> Mapping[str, int]:
        return dict(self.draining_now)

    def drain(self, node_id: str, reason: str, deadline_s: float) -> bool:
        self.drained.append(node_id)
        self.draining_now[node_id] = 1
        return True

    def stop(self, node_id: str) -> bool:
        return True

    def hostname(self, node_id: str) -> str | None:
        return None

    def holds_gpus(self, node_id: str) -> bool:
        return False


def _dcgm_scrape(gpus: range) -> str:
    return "".join(f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",UUID="GPU-{i}"}} 40\n' for i in gpus)


def _run_fleet(answer: str, ticks: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """20 cluster nodes of 8 GPUs, each agent's dcgm-exporter answering `answer` (HTTP 200),
    one sample per tick through the whole health path; the nodes Ray was asked to drain."""

    answer_every_scrape(monkeypatch, answer)
    ids = [f"n{i:02d}" for i in range(20)]
    clock = [0.0]
    samplers = {
        n: NodeSampler(
            n, "cluster", DcgmSource("http://x"), gpus_expected=8, clock=lambda: clock[0]
        )
        for n in ids
    }
    cfg = HealthConfig()
    nodes = FakeNodes()
    remediator = Remediator(nodes, 600.0, True, record=lambda k, m: None)
    breaker = Breaker(cfg.breaker, record=lambda k, m: None)
    state = HealthState()
    for tick in range(ticks):
        clock[0] = float(tick + 1)
        summaries = {n: [s.sample()] for n, s in samplers.items()}
        verdicts, state = judge(summaries, cfg, state, clock[0])
        snap: ClusterSnapshot = snapshot([node(n) for n in ids], now_s=clock[0])
        acting = breaker.step(verdicts, snap, set(remediator.cordoned), clock[0])
        for action in remediate(with_verdicts(snap, acting), acting):
            if isinstance(action, CordonNode):
                remediator.cordon(action.node_id, action.reason, clock[0])
            elif isinstance(action, DrainNode):
                remediator.replace(action.node_id, action.reason, clock[0])
    return nodes.drained


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param("", id="empty-200"),
        pytest.param("<html><body>upgrading</body></html>", id="html-200"),
    ],
)
def test_a_fleet_wide_empty_scrape_cordons_nothing(
    answer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _run_fleet(answer, ticks=10, monkeypatch=monkeypatch) == []


def test_a_fleet_that_looks_gpu_missing_loses_at_most_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every node's exporter answers with only 4 of its 8 GPUs: after the missing streak, all
    # 20 are UNHEALTHY; the breaker lets 2 go (fleet cap; pool cap max(1, 2.0) = 2).
    drained = _run_fleet(_dcgm_scrape(range(4)), ticks=10, monkeypatch=monkeypatch)
    assert drained == ["n00", "n01"]
