"""The health breaker: at most a budget of nodes taken out per window; past it, verdicts are
shown (held) and alerted on, not acted on. Ends with a fleet-wide bad scrape fed through the
real parser, sampler, judge, breaker, plan and actuator."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from controlplane.config import HealthConfig
from controlplane.service.remediation import Breaker, Remediator
from controlplane.telemetry import dcgm
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
    with_verdicts,
)
from policies.plan import DrainNode
from policies.snapshot import ClusterSnapshot, Pool
from tests.unit.builders import node, snapshot

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


def test_breaker_says_so_once_when_it_opens_and_once_when_it_closes() -> None:
    events: list[tuple[str, str]] = []
    b = Breaker(BUDGET, record=lambda k, m: events.append((k, m)))
    snap = snapshot(fleet(30))
    verdicts = {f"n{i:02d}": bad(f"n{i:02d}") for i in range(5)}
    for t in (0.0, 1.0, 2.0):
        b.step(verdicts, snap, {"n00", "n01"} if t else set(), t)
    assert [k for k, _ in events] == ["health.breaker"]
    assert events[0][1].startswith("open: 3 unhealthy node(s) not taken out (n02, n03, n04)")
    b.step({}, snap, {"n00", "n01"}, 3.0)
    assert events[-1] == ("health.breaker", "closed: no unhealthy node is held any more")
    again = BreakerState.from_dict(json.loads(json.dumps(b.state.to_dict())))
    assert again == b.state and len(again.removals) == 2


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

    class Answer:
        def __enter__(self) -> Answer:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def read(self) -> bytes:
            return answer.encode()

    monkeypatch.setattr(dcgm.urllib.request, "urlopen", lambda url, timeout: Answer())
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
