"""The health actuators and the glue around them: `Remediator` against a fake Ray, the health
state's round trip through the store's JSON, and gang pinning to the admitted nodes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from controlplane.loop.act.nodes import Remediator
from jobs.launcher import ENV_NODE_IDS, NODE_ID_LABEL, gang_label_selector
from policies.health import (
    HealthReason,
    HealthState,
    NodeHealthState,
)


@dataclass
class FakeNodes:
    draining_now: dict[str, int] = field(default_factory=dict)
    accept: bool = True
    stop_ok: bool = True
    hostnames: dict[str, str] = field(default_factory=dict)
    busy: set[str] = field(default_factory=set)
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def draining(self) -> Mapping[str, int]:
        return dict(self.draining_now)

    def drain(self, node_id: str, reason: str, deadline_s: float) -> bool:
        self.calls.append(("drain", node_id, f"{deadline_s:g}"))
        if self.accept:
            self.draining_now[node_id] = 1
        return self.accept

    def stop(self, node_id: str) -> bool:
        self.calls.append(("stop", node_id))
        return self.stop_ok

    def hostname(self, node_id: str) -> str | None:
        return self.hostnames.get(node_id)

    def holds_gpus(self, node_id: str) -> bool:
        return node_id in self.busy


def remediator(nodes: FakeNodes, **kw: object) -> tuple[Remediator, list[tuple[str, str]]]:
    events: list[tuple[str, str]] = []
    args: dict[str, object] = {
        "drain_deadline_s": 600.0,
        "replace_drained": True,
        "record": lambda k, m: events.append((k, m)),
    }
    args.update(kw)
    return Remediator(nodes, **args), events  # type: ignore[arg-type]


def test_cordon_drains_once_with_the_configured_deadline() -> None:
    nodes = FakeNodes()
    r, events = remediator(nodes)
    assert r.cordon("a", "unhealthy: gpu_overheated", now_s=10.0)
    assert not r.cordon("a", "unhealthy: gpu_overheated", now_s=11.0)
    assert nodes.calls == [("drain", "a", "600")]
    assert [k for k, _ in events] == ["health.cordon"]
    assert r.cordoned == {"a": 10.0}


def test_cordon_leaves_a_node_ray_already_drains_alone() -> None:
    nodes = FakeNodes(draining_now={"a": 0})
    r, events = remediator(nodes)
    assert not r.cordon("a", "x", now_s=1.0)
    assert nodes.calls == [] and events == []
    assert "a" not in r.cordoned  # someone else's drain: not ours to remove
    assert not r.cordon("a", "x", now_s=2.0) and nodes.calls == []


def test_a_rejected_drain_is_asked_again_next_tick() -> None:
    nodes = FakeNodes(accept=False)
    r, _ = remediator(nodes)
    assert not r.cordon("a", "x", now_s=1.0)
    assert not r.cordon("a", "x", now_s=2.0)
    assert [c[0] for c in nodes.calls] == ["drain", "drain"]
    assert r.cordoned == {}


@pytest.mark.parametrize(
    ("replace_drained", "stop_ok", "stopped", "calls"),
    [
        (True, True, True, [("stop", "a")]),
        (True, False, False, [("stop", "a"), ("stop", "a")]),  # retried next time
        (False, True, False, []),
    ],
)
def test_replace_in_local_mode_stops_the_raylet_once(
    replace_drained: bool, stop_ok: bool, stopped: bool, calls: list[tuple[str, ...]]
) -> None:
    nodes = FakeNodes(stop_ok=stop_ok)
    r, events = remediator(nodes, replace_drained=replace_drained)
    r.cordon("a", "why", now_s=1.0)
    nodes.calls.clear()
    assert r.replace("a", "why", now_s=5.0) is stopped
    r.replace("a", "why", now_s=6.0)
    assert nodes.calls == calls
    assert [k for k, _ in events if k != "health.cordon"] == (["health.drain"] if stopped else [])


def test_replace_on_kubernetes_deletes_the_pod_named_by_the_hostname() -> None:
    removed: list[tuple[str, str]] = []
    nodes = FakeNodes(hostnames={"a": "raycluster-gpu-cluster-worker-x7"})
    r, events = remediator(nodes, kube_remove=lambda pod, why: removed.append((pod, why)))
    r.cordon("a", "unhealthy", now_s=0.5)
    r.cordon("b", "unhealthy", now_s=0.5)
    nodes.calls.clear()
    assert r.replace("a", "unhealthy", now_s=1.0)
    assert removed == [("raycluster-gpu-cluster-worker-x7", "unhealthy")]
    assert nodes.calls == []  # the raylet is not stopped: KubeRay replaces the pod
    assert "pod raycluster-gpu-cluster-worker-x7 deleted" in dict(events)["health.drain"]
    assert not r.replace("b", "unhealthy", now_s=1.0)  # no hostname known: nothing deleted


@pytest.mark.parametrize(
    ("cordoned_at", "busy", "replaced"),
    [
        (None, False, False),  # never cordoned by us: not ours to remove
        (5.0, False, False),  # cordoned this very tick: wait a tick
        (4.0, True, False),  # Ray still accounts a GPU held there (a replica the cache missed)
        (4.0, False, True),
    ],
)
def test_replace_waits_for_an_earlier_cordon_and_for_ray_to_show_the_node_empty(
    cordoned_at: float | None, busy: bool, replaced: bool
) -> None:
    nodes = FakeNodes(busy={"a"} if busy else set())
    r, _ = remediator(nodes)
    if cordoned_at is not None:
        r.cordon("a", "x", now_s=cordoned_at)
    assert r.replace("a", "x", now_s=5.0) is replaced
    assert (("stop", "a") in nodes.calls) is replaced


def test_forget_drops_nodes_that_are_gone() -> None:
    r, _ = remediator(FakeNodes())
    r.cordon("a", "x", 1.0)
    r.cordon("b", "x", 1.0)
    assert r.replace("a", "x", 2.0)
    r.forget({"b"})
    assert r.cordoned == {"b": 1.0} and r.replaced == {}


def test_health_state_survives_the_stores_json() -> None:
    state = HealthState(
        {
            "n1": NodeHealthState(
                last_sampled_s=12.5,
                last_new_sample_now_s=13.0,
                hot_streaks=((0, 2), (3, 1)),
                unhealthy=True,
                held_reasons=(HealthReason.GPU_OVERHEATED,),
                clean_samples=1,
                degraded_reasons=(HealthReason.IB_LINK_DEGRADED,),
                details=("gpu 0 at 91 C",),
                unhealthy_turns_s=(11.0,),
                lemon=True,
            ),
            "n2": NodeHealthState(),
        }
    )
    again = HealthState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert dict(again.nodes) == dict(state.nodes)


@pytest.mark.parametrize(
    ("env", "selector"),
    [
        ({}, {"pool": "cluster"}),
        ({ENV_NODE_IDS: ""}, {"pool": "cluster"}),
        ({ENV_NODE_IDS: "abc"}, {"pool": "cluster", NODE_ID_LABEL: "abc"}),
        ({ENV_NODE_IDS: "b,a, b"}, {"pool": "cluster", NODE_ID_LABEL: "in(a,b)"}),
    ],
)
def test_gang_is_pinned_to_the_admitted_nodes(
    env: dict[str, str], selector: dict[str, str]
) -> None:
    assert gang_label_selector(env) == selector


def test_pinned_selector_is_one_ray_accepts() -> None:
    from ray._private.label_utils import validate_label_selector

    ids = ",".join(["a" * 56, "b" * 56])
    assert validate_label_selector(gang_label_selector({ENV_NODE_IDS: ids})) is None


def test_health_actions_are_logged_once_while_their_live_figures_change() -> None:
    from controlplane.loop.record import event_key as _event_key
    from policies.health import CordonNode
    from policies.plan import MoveServeReplicas, PreemptJob
    from policies.snapshot import Pool

    def move(reason: str) -> MoveServeReplicas:
        return MoveServeReplicas("m", Pool.CLUSTER, Pool.EXTERNAL, 1, ("a",), reason)

    assert _event_key(CordonNode("a", "for 3 samples")) == _event_key(
        CordonNode("a", "for 4 samples")
    )
    assert _event_key(CordonNode("a", "x")) != _event_key(CordonNode("b", "x"))
    assert _event_key(move("for 3 samples")) == _event_key(move("for 9 samples"))
    # Job actions stay keyed by their reason: a new reason is a new decision.
    assert _event_key(PreemptJob("j", "r1")) != _event_key(PreemptJob("j", "r2"))


@pytest.mark.parametrize(
    "first, second, same",
    [
        # A wait keeps its code while its figures change: logged once.
        (
            ("serving-forecast: in about 2h15m", "serving-forecast"),
            ("serving-forecast: in about 2h00m", "serving-forecast"),
            True,
        ),
        # A new code (even with the same words after it) is a new wait.
        (("serving-floor: x", "serving-floor"), ("serving-demand: x", "serving-demand"), False),
        # A colon in the text is not a code: without one the whole reason keys it.
        (("waits: at 10:15", ""), ("waits: at 10:30", ""), False),
    ],
)
def test_a_job_wait_is_keyed_by_its_code(first, second, same) -> None:  # type: ignore[no-untyped-def]
    from controlplane.loop.record import event_key as _event_key
    from policies.plan import WaitJob

    a = WaitJob("j", first[0], code=first[1])
    b = WaitJob("j", second[0], code=second[1])
    assert (_event_key(a) == _event_key(b)) is same
    assert _event_key(a) != _event_key(WaitJob("other", first[0], code=first[1]))


def test_a_wait_whose_reason_does_not_start_with_its_code_is_refused() -> None:
    from policies.plan import WaitJob

    with pytest.raises(ValueError, match="must start with its code 'serving-floor'"):
        WaitJob("j", "serving-demand: x", code="serving-floor")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RAY_AUTH_MODE": "token"}, {"RAY_AUTH_MODE": "token"}),  # KubeRay with token auth
        (
            {
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": "/home/u/.rcp/ray-token",
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            },
            {
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": "/home/u/.rcp/ray-token",
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            },
        ),  # local mode: the token's file, never its value
        (
            {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "secret"},
            {"RAY_AUTH_MODE": "token"},
        ),  # a token value in the environment is not copied into jobs' runtime env
        ({}, {}),  # nothing set: Ray's own defaults apply
    ],
)
def test_the_controller_and_its_jobs_reach_ray_the_way_the_deployer_does(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: dict[str, str]
) -> None:
    from controlplane.ray_connection import RAY_CONNECTION_ENV, ray_connection_env

    for key in RAY_CONNECTION_ENV:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert ray_connection_env() == expected
