"""`serve_status` data built from Serve's details, and the `rcp serve status` table."""

from __future__ import annotations

import json
from typing import Any

import pytest

from serve.config import ModelConfig, ServingConfig
from serve.control.status import format_status_table, summarize
from serve.spec import BACKEND_DEPLOYMENT, build_app_configs, initial_state

NODE_POOLS = {"n-cluster-1": "cluster", "n-ext-1": "external"}


def replica(rid: str, state: str, node: str) -> dict[str, Any]:
    return {
        "replica_id": rid,
        "state": state,
        "node_id": node,
        "node_ip": "127.0.0.1",
        "actor_name": f"SERVE_REPLICA::x#{rid}",
    }


def make_details(
    targets: dict[tuple[str, str], int],
    weights: dict[str, float],
    replicas: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """Serve instance details as `get_serve_details` returns them, for one model 'sample'."""
    serving = ServingConfig(models=[ModelConfig(name="sample", min_replicas=2)])
    state = initial_state(serving)
    for (m, p), n in targets.items():
        state = state.with_target(m, p, n)
    state = state.with_weights("sample", weights)
    apps: dict[str, Any] = {}
    for cfg in build_app_configs(state):
        name = cfg["name"]
        deps: dict[str, Any] = {}
        for d in cfg["deployments"]:
            deps[d["name"]] = {
                "status": "HEALTHY",
                "target_num_replicas": d["num_replicas"],
                "deployment_config": {"user_config": d.get("user_config")},
                "replicas": replicas.get(name, []),
            }
        apps[name] = {"status": "RUNNING", "deployed_app_config": cfg, "deployments": deps}
    # a pool being deleted still shows its stopping replicas, without a config
    for name, reps in replicas.items():
        if name not in apps:
            apps[name] = {
                "status": "DELETING",
                "deployed_app_config": None,
                "deployments": {BACKEND_DEPLOYMENT: {"replicas": reps}},
            }
    return {"applications": apps}


def test_mid_move_counts_targets_weights_and_nodes() -> None:
    details = make_details(
        targets={("sample", "cluster"): 2, ("sample", "external"): 2},
        weights={"cluster": 2, "external": 1},
        replicas={
            "rcp-sample-cluster": [
                replica("c1", "RUNNING", "n-cluster-1"),
                replica("c2", "STOPPING", "n-cluster-1"),
            ],
            "rcp-sample-external": [
                replica("e1", "RUNNING", "n-ext-1"),
                replica("e2", "STARTING", "n-ext-1"),
            ],
        },
    )
    data = summarize(details, NODE_POOLS)
    pools = data["models"]["sample"]["pools"]
    assert {
        k: pools["cluster"][k] for k in ("target", "running", "starting", "stopping", "weight")
    } == {"target": 2, "running": 1, "starting": 0, "stopping": 1, "weight": 2.0}
    assert {
        k: pools["external"][k] for k in ("target", "running", "starting", "stopping", "weight")
    } == {"target": 2, "running": 1, "starting": 1, "stopping": 0, "weight": 1.0}
    assert [r["node_pool"] for r in pools["external"]["replicas"]] == ["external", "external"]
    json.dumps(data)  # plain JSON-able data for `rcp serve status --json`


def test_pool_being_deleted_reports_target_zero_and_stopping() -> None:
    details = make_details(
        targets={("sample", "cluster"): 0, ("sample", "external"): 2},
        weights={"external": 2},
        replicas={"rcp-sample-cluster": [replica("c1", "STOPPING", "n-cluster-1")]},
    )
    pools = summarize(details, NODE_POOLS)["models"]["sample"]["pools"]
    assert pools["cluster"]["target"] == 0
    assert pools["cluster"]["weight"] == 0.0
    assert pools["external"]["target"] == 2


def test_not_deployed() -> None:
    data = summarize({"applications": {}}, {})
    assert data["deployed"] is False
    assert format_status_table(data) == "serving plane: not deployed"


@pytest.mark.parametrize(
    ("needle"),
    [
        pytest.param("MODEL", id="header"),
        pytest.param("n-cluste(cluster) x1", id="node-and-pool"),
        pytest.param("route table generation 1", id="generation"),
    ],
)
def test_table_lists_rows(needle: str) -> None:
    details = make_details(
        targets={("sample", "cluster"): 1},
        weights={"cluster": 1},
        replicas={"rcp-sample-cluster": [replica("c1", "RUNNING", "n-cluster-1")]},
    )
    table = format_status_table(summarize(details, NODE_POOLS))
    assert needle in table
    rows = [line.split() for line in table.splitlines()[1:3]]
    assert rows[0][:7] == ["sample", "cluster", "1", "1", "0", "0", "1"]
    assert rows[1][:7] == ["sample", "external", "0", "0", "0", "0", "0"]


@pytest.mark.parametrize(
    ("latency", "line"),
    [
        pytest.param(
            {"p99_ms": 251.4, "slo_p99_ms": 100.0},
            "latency: sample p99 251 ms, SLO 100 ms (over)",
            id="over",
        ),
        pytest.param(
            {"p99_ms": 12.0, "slo_p99_ms": 100.0}, "latency: sample p99 12 ms, SLO 100 ms", id="ok"
        ),
        pytest.param(
            {"p99_ms": None, "slo_p99_ms": 100.0}, "latency: sample p99 -, SLO 100 ms", id="none"
        ),
        pytest.param(
            {"p99_ms": 8.0, "slo_p99_ms": None}, "latency: sample p99 8 ms, no SLO", id="x"
        ),
    ],
)
def test_table_shows_each_models_p99_and_slo(latency: dict[str, float | None], line: str) -> None:
    details = make_details(
        targets={("sample", "cluster"): 1},
        weights={"cluster": 1},
        replicas={"rcp-sample-cluster": [replica("c1", "RUNNING", "n-cluster-1")]},
    )
    data = {**summarize(details, NODE_POOLS), "latency": {"sample": latency}}
    assert format_status_table(data).splitlines()[-1] == line
