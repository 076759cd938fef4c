"""Move times from a cluster's events (`controlplane.simulate.calibrate`, issue 17 gap 2).

Owns the checks that the replica start is the median of the moves into the cluster pool, the
external node start the first move into the external pool less that, that the figures land
in the scenario and in `rcp simulate --calibrate-from`, and that a bad events file is a clear
error naming the field or the missing event.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from controlplane.cli import cli
from controlplane.simulate import calibrate as calibrate_module
from controlplane.simulate.calibrate import (
    CalibrationError,
    calibrate,
    calibrated,
    load_events,
    moves,
)
from controlplane.simulate.scenario import Scenario

YIELD = "yield_to_training: 2 replica(s) of sample make room"
BACK = "migrate_back: cluster pool had room"


def ev(at_s: float, kind: str, message: str) -> dict[str, Any]:
    return {"seq": int(at_s), "at_s": at_s, "kind": kind, "message": message}


CLAIM_AND_RETURN = [
    ev(100.0, "serve.move.start", f"sample: 2 cluster -> external: {YIELD}"),
    ev(100.1, "serve.external_capacity", "external_capacity: external replicas need 2 GPU(s)"),
    ev(160.0, "serve.move.done", "sample: moved 2 in 60.0s; c1 freed"),
    ev(200.0, "serve.move.start", f"sample: 1 external -> cluster: {BACK}"),
    ev(212.0, "serve.move.done", "sample: moved 1 in 12.0s"),
    ev(230.0, "serve.move.start", f"sample: 1 external -> cluster: {BACK}"),
    ev(240.0, "serve.move.done", "sample: moved 1 in 10.0s"),
    ev(250.0, "serve.move.start", f"sample: 1 external -> cluster: {BACK}"),
    ev(264.0, "serve.move.unwound", "sample: 1 external -> cluster: the make step did not"),
]


def test_replica_start_and_node_start_from_a_claim_and_a_return() -> None:
    found = moves(CLAIM_AND_RETURN)
    assert [(m.from_pool, m.to_pool, m.seconds) for m in found] == [
        ("cluster", "external", 60.0),
        ("external", "cluster", 12.0),
        ("external", "cluster", 10.0),
    ]  # the unwound move is not a measurement
    c = calibrate(CLAIM_AND_RETURN)
    assert c.replica_start_s == 11.0  # median of 12 and 10
    assert c.node_start_s == 49.0  # 60 - 11
    assert "replica start 11.0 s" in c.describe()
    s = calibrated(Scenario(), c)
    assert (s.serving.replica_start_s, s.external.provision_s) == (11.0, 49.0)
    assert Scenario().serving.replica_start_s == 120.0  # the default is left alone


def test_events_out_of_order_are_sorted_by_time() -> None:
    assert calibrate(list(reversed(CLAIM_AND_RETURN))).replica_start_s == 11.0


@pytest.mark.parametrize(
    ("events", "error"),
    [
        (CLAIM_AND_RETURN[:3], "no finished move into the cluster pool"),
        (CLAIM_AND_RETURN[3:5], "no finished move into the external pool"),
        ([{"kind": "serve.move.start", "message": "m: 1 a -> b: r"}], r"events\[0\]\.at_s"),
        ([ev(1, "serve.move.start", "m: moved")], r"events\[0\]\.message: expected 'MODEL"),
        ([ev(1, "serve.move.done", "m")] + ["x"], r"events\[1\]: expected an object"),
        ([{"at_s": 1.0, "kind": 3, "message": ""}], r"events\[0\]\.kind: expected a str"),
    ],
)
def test_bad_events_name_the_field(events: list[Any], error: str) -> None:
    with pytest.raises(CalibrationError, match=error):
        calibrate(events)


def test_load_events_takes_a_list_or_the_apis_object(tmp_path: Path) -> None:
    f = tmp_path / "events.json"
    f.write_text(json.dumps({"events": CLAIM_AND_RETURN}))
    assert load_events(f) == CLAIM_AND_RETURN
    f.write_text(json.dumps({"items": []}))
    with pytest.raises(CalibrationError, match="events: expected a list"):
        load_events(f)
    f.write_text("{not json")
    with pytest.raises(CalibrationError, match="not a readable JSON file"):
        load_events(f)


@pytest.mark.parametrize(
    ("write", "error"),
    [
        pytest.param(
            lambda f: f.write_text("[" * 100_000 + "]" * 100_000),
            "deeper than 32 levels",
            id="deep",
        ),
        pytest.param(
            lambda f: f.write_bytes(b"[" + b" " * 300_000 + b"]"),
            "more than 250000 bytes",
            id="too-big",
        ),
        pytest.param(lambda f: f.write_bytes(b"[\xff]"), "not UTF-8", id="not-utf8"),
    ],
)
def test_a_hostile_events_file_is_a_calibration_error(
    tmp_path: Path, write: Any, error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calibrate_module, "MAX_EVENTS_FILE_BYTES", 250_000)
    f = tmp_path / "events.json"
    write(f)
    with pytest.raises(CalibrationError, match=error):
        load_events(f)


def test_rcp_simulate_calibrate_from_a_bad_file_exits_2_naming_it(tmp_path: Path) -> None:
    f = tmp_path / "events.json"
    f.write_text(json.dumps(CLAIM_AND_RETURN[:3]))
    result = CliRunner().invoke(
        cli, ["simulate", "--calibrate-from", str(f), "-o", str(tmp_path / "out")]
    )
    assert result.exit_code == 2
    assert "no finished move into the cluster pool" in result.output


def test_the_committed_local_measurement_gives_the_documented_figures() -> None:
    """bench/local-move-events.json (a real claim and return on the local cluster) calibrates
    to what docs/simulator.md says: 12.7 s replica start, 8.3 s external node start."""
    root = Path(__file__).resolve().parents[3]
    c = calibrate(load_events(root / "bench" / "local-move-events.json"))
    assert (round(c.replica_start_s, 1), round(c.node_start_s, 1)) == (12.7, 8.3)
    assert round(c.cold_move_s, 1) == 21.0
    doc = " ".join((root / "docs" / "simulator.md").read_text().split())
    assert "a replica start of 12.7 s and an external node start of 8.3 s" in doc
