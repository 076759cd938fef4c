"""The operator commands of `rcp` against a running API, given only `--url` and a token.

HOME and RCP_STATE_DIR point at an empty directory (no state dir, no `rcp up`), the token
comes from RCP_API_TOKEN: every command reaches the control plane through the SDK alone. The
server is the real aiohttp app over a loop on fake adapters (`test_api_operations.Ops`). The
real-cluster version of this sweep is in tests/integration/test_local_cluster.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from controlplane.cli import cli
from tests.unit.api.test_api_operations import TOKEN, Ops
from tests.unit.loop.test_loop_claim import MODEL


@pytest.fixture
def ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Ops]:
    (tmp_path / "server").mkdir()
    o = Ops(tmp_path / "server")
    empty = tmp_path / "nowhere"
    empty.mkdir()
    monkeypatch.setenv("HOME", str(empty))
    monkeypatch.setenv("RCP_STATE_DIR", str(empty / "no-state"))
    monkeypatch.setenv("RCP_API_TOKEN", TOKEN)
    monkeypatch.delenv("RCP_API_URL", raising=False)
    monkeypatch.delenv("RCP_CONFIG", raising=False)
    yield o
    o.server.stop()
    o.world.store.close()


def rcp(ops: Ops, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, [*args, "--url", ops.url])
    assert result.exit_code == code, (args, result.output)
    return result


def test_every_operator_command_works_with_only_a_url_and_a_token(ops: Ops) -> None:
    table = rcp(ops, "nodes").output
    assert table.splitlines()[0].startswith("NODE") and "node-03" in table
    assert len(json.loads(rcp(ops, "nodes", "--json").output)) == len(ops.world.cluster.nodes)

    assert (
        "cordoned by admin: flaky NIC"
        in rcp(ops, "cordon", "node-03", "--reason", "flaky NIC").output
    )
    assert "node-03" in rcp(ops, "nodes").output and "cordoned" in rcp(ops, "nodes").output
    assert "uncordoned" in rcp(ops, "uncordon", "node-03", "--reason", "fixed").output

    assert (
        "paused by admin: incident 7"
        in rcp(ops, "policy", "pause", "--reason", "incident 7").output
    )
    status = rcp(ops, "policy", "status").output
    assert "PAUSED by admin" in status and "incident 7" in status
    assert "PAUSED by admin" in rcp(ops, "serve", "status").output
    assert json.loads(rcp(ops, "serve", "status", "--json").output)["policy"]["paused"] is True
    assert "resumed (paused by admin: incident 7)" in rcp(ops, "policy", "resume").output
    assert "policy actor: running" in rcp(ops, "policy", "status").output

    assert (
        f"{MODEL}: pinned to external"
        in rcp(ops, "serve", "pin", MODEL, "--pool", "external").output
    )
    assert f"pinned:       {MODEL} -> external" in rcp(ops, "serve", "status").output
    assert "was pinned to external" in rcp(ops, "serve", "unpin", MODEL).output

    assert "breaker:  closed" in rcp(ops, "health", "breaker").output
    assert json.loads(rcp(ops, "health", "breaker", "--json").output)["open"] is False
    assert "it was closed already" in rcp(ops, "health", "breaker", "--reset").output
    assert "it was closed already" in rcp(ops, "health", "breaker", "reset", "--reason", "x").output
    assert "it was closed already" in rcp(ops, "health-breaker", "--reset").output  # old name
    assert "no verdicts yet" in rcp(ops, "health").output
    assert json.loads(rcp(ops, "health", "--json").output) == []

    assert "injected xid" in rcp(ops, "fault", "inject", "node-05", "xid").output
    assert ops.faults == [("node-05", "xid")]
    events = json.loads(rcp(ops, "events", "--json").output)
    kinds = {e["kind"] for e in events}
    assert {"node.cordon", "policy.pause", "serve.pin", "health.breaker_reset"} <= kinds


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("health", "clear", "node-01"), "no node with a health record"),
        (("serve", "pin", "nope", "--pool", "cluster"), "no served model 'nope'"),
        (("cordon", "node-99", "--reason", "x"), "no node matches 'node-99'"),
        (("uncordon", "node-01"), "is not cordoned by hand"),
    ],
    ids=["clear-unknown", "pin-unknown-model", "cordon-unknown", "uncordon-not-cordoned"],
)
def test_a_refusal_prints_the_servers_message_and_exits_2(
    ops: Ops, args: tuple[str, ...], message: str
) -> None:
    result = rcp(ops, *args, code=2)
    assert message in result.output


def test_without_a_token_the_command_says_where_to_put_one(
    ops: Ops, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RCP_API_TOKEN")
    result = rcp(ops, "nodes", code=1)
    assert "RCP_API_TOKEN" in result.output


def test_a_gang_a_pinned_model_keeps_out_says_why_in_status_and_queue(ops: Ops) -> None:
    rcp(ops, "serve", "pin", MODEL, "--pool", "cluster")
    # 1 worker x 2 GPUs fits only on c1, whose 2 GPUs the pinned replicas hold.
    job_id = ops.world.jobs.submit("needs-c1", workers=1, gpus=2)
    ops.world.tick(4)
    status = rcp(ops, "status", job_id).output
    (line,) = [ln for ln in status.splitlines() if ln.startswith("waiting:")]
    assert "pinned-serving:" in line and f"{MODEL} (2 GPU(s))" in line
    queue = rcp(ops, "queue").output
    assert f"  {job_id}  pinned-serving:" in queue
    rcp(ops, "serve", "unpin", MODEL)
    for _ in range(40):
        ops.world.tick()
        if ops.world.store.get(job_id).state.value != "QUEUED":
            break
    assert "waiting:" not in rcp(ops, "queue").output


def test_nodes_shows_a_node_health_keeps_for_serving_only(ops: Ops) -> None:
    ops.world.loop.health.serving_only = {
        "node-03": {"since_s": 1.0, "reason": "serving_only: ib_errors (mlx5_0/1 5 errors/s)"}
    }
    (line,) = [row for row in rcp(ops, "nodes").output.splitlines() if "node-03" in row]
    assert "ALIVE,serving-only" in line, line
    rows = json.loads(rcp(ops, "nodes", "--json").output)
    (row,) = [r for r in rows if r["node_id"] == "node-03"]
    assert "ib_errors" in row["serving_only"]["reason"]
    assert all(r["serving_only"] is None for r in rows if r["node_id"] != "node-03")
