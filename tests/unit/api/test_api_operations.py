"""The operator routes against the real aiohttp app on loopback, over a loop on fake adapters.

Each route is exercised through the SDK (what the CLI calls) and raw HTTP for bad input: a bad
body or name is a 400 naming the field and changes nothing; lists page; refusals keep the
JSON error shape; every route is registered with the action the role table expects. The
loop is `tests.unit.loop_fakes` (no Ray): what the routes change is what the next tick obeys.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from controlplane.api.access import ROUTE_ACTIONS, Action
from controlplane.api.jobs import JobService
from controlplane.api.operations import Operations
from controlplane.api.routes import ApiServer, make_app
from controlplane.sdk import ApiError, Client, ConflictError, JobNotFound, SpecRejected
from policies.snapshot import Pool
from tests.unit.loop.test_loop_claim import MODEL, world
from tests.unit.loop_fakes import World

TOKEN = "ops-token-123"


class Ops:
    """A server with the operator routes over a fake world, and a way to send raw requests."""

    def __init__(self, tmp: Path, *overrides: str) -> None:
        self.world: World = world(tmp, "api.rate_burst=100000", *overrides)
        for i in range(7):
            self.world.cluster.add(f"node-{i:02d}", Pool.CLUSTER, gpus=1)
        self.faults: list[tuple[str, str]] = []
        self.operations = Operations(
            self.world.cfg,
            self.world.loop,
            serve_status=lambda: {"deployed": True, "models": {}},
            inject_fault=self._inject,
        )
        service = JobService(self.world.store, self.world.cfg)
        self.server = ApiServer(service, TOKEN, "127.0.0.1", 0, operations=self.operations).start()
        self.url = self.server.url
        self.client = Client(self.url, TOKEN)

    def _inject(self, node_id: str, kind: str) -> Mapping[str, Any]:
        self.faults.append((node_id, kind))
        return {"node_id": node_id, "faults": [kind]}

    def raw(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body))
        req = urllib.request.Request(
            self.url + path,
            data=data.encode() if isinstance(data, str) else data,
            method=method,
        )
        req.add_header("Authorization", f"Bearer {TOKEN}")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture
def ops(tmp_path: Path) -> Iterator[Ops]:
    o = Ops(tmp_path)
    yield o
    o.server.stop()
    o.world.store.close()


EXPECTED_ACTIONS = {
    "nodes.list": Action.READ,
    "nodes.cordon": Action.OPERATE,
    "nodes.uncordon": Action.OPERATE,
    "health.get": Action.READ,
    "health.clear": Action.OPERATE,
    "health.breaker": Action.READ,
    "health.breaker_reset": Action.OPERATE,
    "serve.control.status": Action.READ,
    "serve.pin": Action.OPERATE,
    "serve.unpin": Action.OPERATE,
    "faults.inject": Action.OPERATE,
    "policy.get": Action.READ,
    "policy.pause": Action.OPERATE,
    "policy.resume": Action.OPERATE,
}


def test_every_operator_route_needs_the_action_the_role_table_expects(ops: Ops) -> None:
    app = make_app(JobService(ops.world.store, ops.world.cfg), TOKEN, operations=ops.operations)
    registered = {k: v for k, v in app[ROUTE_ACTIONS].items() if k in EXPECTED_ACTIONS}
    assert registered == EXPECTED_ACTIONS
    without = make_app(JobService(ops.world.store, ops.world.cfg), TOKEN)
    assert not set(without[ROUTE_ACTIONS]) & set(EXPECTED_ACTIONS)


def test_nodes_page_with_a_cursor_and_the_sdk_follows_the_pages(ops: Ops) -> None:
    every = sorted(ops.world.cluster.nodes)
    status, first = ops.raw("GET", "/v1/nodes?limit=3")
    assert status == 200 and [n["node_id"] for n in first["nodes"]] == every[:3]
    assert first["next"] == every[2]
    status, second = ops.raw("GET", f"/v1/nodes?limit=3&after={first['next']}")
    assert [n["node_id"] for n in second["nodes"]] == every[3:6]
    _, last = ops.raw("GET", f"/v1/nodes?limit=100&after={every[-2]}")
    assert [n["node_id"] for n in last["nodes"]] == every[-1:] and last["next"] is None
    assert [n["node_id"] for n in ops.client.nodes()] == every
    assert len(ops.client.nodes(limit=4)) == 4


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/nodes?limit=0", "limit"),
        ("/v1/nodes?limit=abc", "limit"),
        ("/v1/nodes?limit=999999", "limit"),
        ("/v1/nodes?after=" + "x" * 300, "after"),
        ("/v1/health?limit=-1", "limit"),
    ],
    ids=["zero", "not-a-number", "too-big", "long-cursor", "health-negative"],
)
def test_bad_paging_is_a_400_naming_the_field(ops: Ops, path: str, field: str) -> None:
    status, body = ops.raw("GET", path)
    assert status == 400 and body["field"] == field and body["request_id"]


def test_pause_and_resume_carry_who_and_why_and_the_next_tick_obeys(ops: Ops) -> None:
    paused = ops.client.pause("incident 42: bad rollout")
    assert paused["changed"] and paused["pause"]["by"] == "admin"
    again = ops.client.pause("another reason")
    assert not again["changed"] and again["pause"]["reason"] == "incident 42: bad rollout"
    status = ops.client.policy()
    assert status["paused"] and status["pause"]["reason"] == "incident 42: bad rollout"
    assert ops.client.serve_status()["policy"]["paused"] is True
    # Each served model's p99 and goal as the loop last saw them (none measured here).
    assert ops.client.serve_status()["latency"] == {
        m.name: {"p99_ms": None, "slo_p99_ms": None} for m in ops.world.cfg.serving.models
    }
    ops.world.tick()
    assert ops.world.loop.guards.paused
    assert ops.world.metrics.gauges[("rcp_policy_paused", ())] == 1.0
    resumed = ops.client.resume("rollback done")
    assert resumed["was"]["by"] == "admin" and resumed["reason"] == "rollback done"
    assert ops.client.resume()["was"] is None  # resuming twice is harmless
    kinds = [e.kind for e in ops.world.store.events(kind_prefix="policy.")]
    assert kinds.count("policy.pause") == 1 and kinds.count("policy.resume") == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "reason"),
        ({"reason": ""}, "reason"),
        ({"reason": "   "}, "reason"),
        ({"reason": 5}, "reason"),
        ({"reason": "x" * 501}, "reason"),
        ({"reason": "two\nlines"}, "reason"),
        ({"reason": "ok", "extra": 1}, "extra"),
        ([1, 2], "<body>"),
        (b"{not json", "<body>"),
        (b'{"reason": NaN}', "<body>"),
    ],
    ids=[
        "missing", "empty", "blank", "number", "too-long", "newline", "unknown-field",
        "not-an-object", "malformed", "nan",
    ],
)  # fmt: skip
def test_a_bad_pause_body_is_a_400_naming_the_field_and_pauses_nothing(
    ops: Ops, body: Any, field: str
) -> None:
    status, answer = ops.raw("POST", "/v1/policy/pause", body)
    assert status == 400 and answer["field"] == field and answer["error"]
    assert ops.client.policy()["paused"] is False


def test_pin_and_unpin_a_served_model(ops: Ops) -> None:
    pinned = ops.client.pin(MODEL, "cluster")
    assert pinned["pin"]["pool"] == "cluster" and pinned["was"] is None
    assert ops.client.policy()["pins"][MODEL]["by"] == "admin"
    ops.world.tick()
    assert ops.world.loop.guards.pinned() == {MODEL: Pool.CLUSTER}
    moved = ops.client.pin(MODEL, "external")
    assert moved["was"]["pool"] == "cluster"
    assert ops.client.unpin(MODEL)["was"]["pool"] == "external"
    with pytest.raises(JobNotFound, match="not pinned") as info:
        ops.client.unpin(MODEL)
    assert info.value.field == "model"


@pytest.mark.parametrize(
    ("model", "body", "status", "field"),
    [
        ("nope", {"pool": "cluster"}, 404, "model"),
        (MODEL, {"pool": "moon"}, 400, "pool"),
        (MODEL, {}, 400, "pool"),
        (MODEL, {"pool": "cluster", "why": "x"}, 400, "why"),
        ("bad%20name", {"pool": "cluster"}, 400, "model"),
        ("x" * 200, {"pool": "cluster"}, 400, "model"),
    ],
    ids=["unknown-model", "unknown-pool", "no-pool", "unknown-field", "bad-chars", "too-long"],
)
def test_a_bad_pin_changes_nothing(
    ops: Ops, model: str, body: Any, status: int, field: str
) -> None:
    got, answer = ops.raw("POST", f"/v1/serve/models/{model}/pin", body)
    assert (got, answer["field"]) == (status, field)
    assert ops.client.policy()["pins"] == {}


def test_cordon_by_hand_then_uncordon(ops: Ops) -> None:
    result = ops.client.cordon("node-03", "flaky NIC")
    assert result["node_id"] == "node-03" and result["changed"]
    assert result["cordon"] == {**result["cordon"], "by": "admin", "reason": "flaky NIC"}
    rows = {n["node_id"]: n for n in ops.client.nodes()}
    assert rows["node-03"]["cordon"]["reason"] == "flaky NIC"
    assert rows["node-04"]["cordon"] is None
    ops.world.tick()
    assert set(ops.world.loop.guards.cordons) == {"node-03"}
    assert ops.client.uncordon("03", "fixed")["was"]["reason"] == "flaky NIC"  # a suffix
    with pytest.raises(ConflictError, match="not cordoned"):
        ops.client.uncordon("node-03")
    kinds = [e.kind for e in ops.world.store.events(kind_prefix="node.")]
    assert kinds == ["node.cordon", "node.uncordon"]


@pytest.mark.parametrize(
    ("node", "body", "status", "field"),
    [
        ("node-99", {"reason": "x"}, 404, "node"),
        ("node-0", {"reason": "x"}, 400, "node"),  # a prefix of seven nodes
        ("node-01", {}, 400, "reason"),
        ("..", {"reason": "x"}, 400, "node"),
    ],
    ids=["unknown", "ambiguous", "no-reason", "bad-name"],
)
def test_a_bad_cordon_changes_nothing(
    ops: Ops, node: str, body: Any, status: int, field: str
) -> None:
    got, answer = ops.raw("POST", f"/v1/nodes/{node}/cordon", body)
    assert (got, answer["field"]) == (status, field)
    assert ops.client.policy()["cordons"] == {}


def test_breaker_show_and_reset_carry_what_was_reset(ops: Ops) -> None:
    shown = ops.client.breaker()
    assert shown["open"] is False and shown["window_s"] > 0 and shown["removals"] == []
    reset = ops.client.reset_breaker("false alarm")
    assert reset["reset"] is True and reset["by"] == "admin" and reset["reason"] == "false alarm"
    assert reset["was"]["open"] is False
    (event,) = ops.world.store.events(kind_prefix="health.breaker_reset")
    assert "admin (false alarm)" in event.message


def test_clear_an_unknown_node_is_a_404_naming_the_node(ops: Ops) -> None:
    with pytest.raises(JobNotFound) as info:
        ops.client.clear_node("node-05")
    assert info.value.field == "node" and "no node with a health record" in info.value.message


def test_fault_injection_goes_to_the_resolved_node(ops: Ops) -> None:
    assert ops.client.inject_fault("06", "hot-gpu")["faults"] == ["hot-gpu"]
    assert ops.faults == [("node-06", "hot-gpu")]
    with pytest.raises(SpecRejected) as info:
        ops.client.inject_fault("node-06", "meltdown")
    assert info.value.field == "kind"
    assert ops.faults == [("node-06", "hot-gpu")]


def test_fault_injection_is_refused_where_the_config_does_not_allow_it(tmp_path: Path) -> None:
    o = Ops(tmp_path, "telemetry.source=nvml")
    try:
        with pytest.raises(ConflictError) as info:
            o.client.inject_fault("node-01", "xid")
        assert info.value.status == 409 and info.value.field == "telemetry.source"
        assert o.faults == []
    finally:
        o.server.stop()
        o.world.store.close()


def test_health_lists_verdict_rows(ops: Ops) -> None:
    data = ops.client.health()
    assert data["nodes"] == [] and data["replaced"] == {} and data["next"] is None


def test_an_unknown_route_keeps_the_error_shape(ops: Ops) -> None:
    status, body = ops.raw("GET", "/v1/policy/nothing-here")
    assert status == 404 and set(body) >= {"error", "field", "request_id"}
    with pytest.raises(ApiError):
        Client(ops.url, "wrong-token").policy()
