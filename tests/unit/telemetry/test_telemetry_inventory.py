"""`rcp nodes` rows with telemetry, and resolving the NODE argument of `rcp fault inject`."""

from __future__ import annotations

import pytest

from controlplane.inventory import NodeRow, attach_telemetry
from controlplane.telemetry.manager import resolve_node_id
from controlplane.telemetry.readings import TelemetryError
from controlplane.views import format_table


def row(node_id: str) -> NodeRow:
    return NodeRow(node_id, "cluster", "127.0.0.1:1", "ALIVE", 4, 4, 8, 8, {"pool": "cluster"})


def test_rows_get_health_hottest_gpu_mean_tensor_and_summed_ib_errors() -> None:
    summary = {
        "gpus": [
            {"temp_c": 50.0, "tensor_active_ratio": 0.2},
            {"temp_c": 91.5, "tensor_active_ratio": 0.6},
            {"temp_c": None, "tensor_active_ratio": None},
        ],
        "ib_ports": [{"errors_per_s": 3.0}, {"errors_per_s": 1.5}, {"errors_per_s": None}],
    }
    a, b = attach_telemetry(
        [row("aaa"), row("bbb")], {"aaa": summary}, {"aaa": ("unhealthy", ["gpu_overheated"])}
    )
    assert (a.health, a.health_reasons, a.gpu_temp_max_c) == ("unhealthy", ["gpu_overheated"], 91.5)
    assert a.tensor_active_ratio == pytest.approx(0.4) and a.ib_errors_per_s == 4.5
    assert b == row("bbb")  # no agent: fields stay empty
    table = format_table([a, b])
    assert "unhealthy (gpu_overheated)" in table and "91.5" in table and "40%" in table


def test_table_without_telemetry_keeps_its_columns() -> None:
    header = format_table([row("aaa")]).splitlines()[0].split()
    assert "HEALTH" not in header and header[:3] == ["NODE", "POOL", "STATE"]


@pytest.mark.parametrize(
    ("arg", "expected"),
    [
        pytest.param("abc123def456", "abc123def456", id="exact"),
        pytest.param("abc1", "abc123def456", id="prefix"),
        pytest.param("def456", "abc123def456", id="suffix-as-rcp-nodes-shows"),
    ],
)
def test_resolve_node_id(arg: str, expected: str) -> None:
    assert resolve_node_id(arg, ["abc123def456", "fff000fff111"]) == expected


@pytest.mark.parametrize(
    ("arg", "message"),
    [
        pytest.param("zzz", "no telemetry agent on a node matching 'zzz'", id="none"),
        pytest.param("f", "'f' matches several nodes", id="ambiguous"),
    ],
)
def test_resolve_node_id_errors(arg: str, message: str) -> None:
    with pytest.raises(TelemetryError, match=message):
        resolve_node_id(arg, ["abc123def456", "fff000fff111", "f00"])
