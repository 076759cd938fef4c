"""Spoofed telemetry agents: only the actors the controller created are believed; an actor under
an agent's name with another id is killed, reported and replaced. And the verdict series follow
the live nodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from controlplane.config import Config
from controlplane.loop.health import HealthKeeper
from controlplane.telemetry.manager import AgentRef, ensure_agents, vet_agents
from policies.health import BreakerState, NodeVerdict, Verdict
from tests.unit.builders import node, snapshot


@dataclass
class FakeCluster:
    """`AgentCluster`: alive nodes, named actors by node (actor id, handle), ids handed out."""

    nodes: list[str]
    named: dict[str, tuple[str, Any]] = field(default_factory=dict)
    killed: list[Any] = field(default_factory=list)
    created: list[tuple[str, bool]] = field(default_factory=list)
    next_id: int = 100

    def alive_nodes(self) -> list[dict[str, Any]]:
        return [
            {
                "NodeID": n,
                "NodeManagerAddress": "127.0.0.1",
                "Resources": {"GPU": 8.0, "CPU": 8.0},
                "Labels": {"pool": "cluster"},
            }
            for n in self.nodes
        ]

    def available(self) -> dict[str, dict[str, float]]:
        return {n: {"GPU": 0.0, "CPU": 0.0} for n in self.nodes}

    def agents(self) -> dict[str, tuple[str, Any]]:
        return dict(self.named)

    def create(self, node_id: str, args: tuple[Any, ...], reuse: bool) -> str | None:
        self.created.append((node_id, reuse))
        if node_id in self.named:  # the name is taken
            return self.named[node_id][0] if reuse else None
        self.next_id += 1
        actor_id = f"{self.next_id:x}"
        self.named[node_id] = (actor_id, f"handle-{actor_id}")
        return actor_id

    def kill(self, handle: Any) -> None:
        self.killed.append(handle)
        self.named = {n: v for n, v in self.named.items() if v[1] != handle}

    def controller_running(self) -> bool:
        return self.controller

    controller: bool = False


@pytest.mark.parametrize(
    ("found", "trusted", "ok", "impostors"),
    [
        pytest.param({"a": "1"}, None, {"a"}, {}, id="no-record-believes-all"),
        pytest.param({"a": "1"}, {"a": "1"}, {"a"}, {}, id="recorded-id"),
        pytest.param({"a": "666"}, {"a": "1"}, set(), {"a": "666"}, id="other-id"),
        pytest.param({"a": "666"}, {}, set(), {"a": "666"}, id="never-created-by-us"),
    ],
)
def test_vet_agents(
    found: dict[str, str],
    trusted: dict[str, str] | None,
    ok: set[str],
    impostors: dict[str, str],
) -> None:
    assert vet_agents(found, trusted) == (ok, impostors)


def test_a_squatter_is_killed_and_replaced_never_reused() -> None:
    # A user's job created "rcp-telemetry-a" in namespace "rcp" before the controller did.
    cluster = FakeCluster(["a", "b"], named={"a": ("beef", "squatter")})
    refs = ensure_agents(Config(), trusted={}, cluster=cluster)
    by_node = {r.node_id: r for r in refs}
    assert by_node["a"].impostor == "beef" and not by_node["a"].started
    assert cluster.killed == ["squatter"]
    assert by_node["b"].started and by_node["b"].actor_id == "65"
    assert cluster.created == [("b", False)]  # never get_if_exists with a record to keep
    # Next tick the name is free: the controller's own agent starts and is recorded.
    trusted = {"b": "65"}
    refs = ensure_agents(Config(), trusted=trusted, cluster=cluster)
    assert {r.node_id: r.actor_id for r in refs} == {"a": "66", "b": "65"}
    assert not any(r.impostor for r in refs)


def test_without_a_record_nothing_starts_while_the_controller_runs() -> None:
    cluster = FakeCluster(["a"], controller=True)
    (ref,) = ensure_agents(Config(), cluster=cluster)
    assert not ref.started and cluster.created == []
    cluster.controller = False
    (ref,) = ensure_agents(Config(), cluster=cluster)
    assert ref.started and cluster.created == [("a", True)]


def test_a_restarted_agent_keeps_its_id_and_its_trust() -> None:
    cluster = FakeCluster(["a"], named={"a": ("65", "ours")})
    (ref,) = ensure_agents(Config(), trusted={"a": "65"}, cluster=cluster)
    assert (ref.started, ref.actor_id, ref.impostor) == (False, "65", None)
    assert cluster.killed == [] and cluster.created == []


def test_the_controller_records_ids_and_reports_impostors() -> None:
    events: list[tuple[str, str]] = []
    puts: dict[str, Any] = {}
    fake = SimpleNamespace(
        _agent_ids={"a": "65", "gone": "70"},
        store=SimpleNamespace(put=lambda k, v: puts.__setitem__(k, v)),
        _record=lambda k, m: events.append((k, m)),
    )
    refs = [
        AgentRef("a", "cluster", started=False, actor_id="65"),
        AgentRef("b", "cluster", started=True, actor_id="66"),
        AgentRef("c", "cluster", started=False, impostor="beef"),
    ]
    HealthKeeper._trust_agents(fake, refs)  # type: ignore[arg-type]
    assert fake._agent_ids == {"a": "65", "b": "66"} and puts == {"health.agents": fake._agent_ids}
    assert [k for k, _ in events] == ["health.agent_impostor"]
    assert "node c: actor beef held the telemetry agent's name" in events[0][1]


class FakeSink:
    """The loop's `MetricSink`: every gauge set, in order."""

    def __init__(self) -> None:
        self.sets: list[tuple[str, float, dict[str, str]]] = []

    def set(self, name: str, value: float, tags: dict[str, str] | None = None) -> None:
        self.sets.append((name, value, dict(tags or {})))

    def inc(self, name: str, tags: dict[str, str] | None = None) -> None:
        raise AssertionError("no counter here")


def test_verdict_series_follow_the_live_nodes() -> None:
    fake = SimpleNamespace(
        verdicts={"n0": NodeVerdict("n0", Verdict.UNHEALTHY)},
        remediator=SimpleNamespace(cordoned={}),
        breaker=SimpleNamespace(state=BreakerState(held=("n0",), opened_s=0.0)),
        serving_only={},
    )
    # An autoscaler adds and removes nodes: 50 come and go, 2 at a time.
    for i in range(0, 50, 2):
        sink = FakeSink()
        snap = snapshot([node(f"n{i}"), node(f"n{i + 1}")])
        HealthKeeper.export_metrics(fake, snap, sink)  # type: ignore[arg-type]
        tagged = {t["node"] for name, _, t in sink.sets if name == "rcp_node_verdict"}
        assert tagged == {f"n{i}", f"n{i + 1}"}  # departed nodes are not set again (not zeroed)
        last = {name: value for name, value, _ in sink.sets}
        assert last["rcp_health_breaker_open"] == 1.0 and last["rcp_health_removals_held"] == 1.0
