"""Latency-aware scaling through the loop (issue 16 part 2), on the loop's fakes: the latency
reader's p99 -> the snapshot's `ServeLoad` -> the gauges, and demand scaling the model's total
on it with its delays, never past min and max; the observe phase's rows (`serve_loads`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from controlplane.loop.observe import serve_loads
from policies.snapshot import Pool, ServeLoad
from tests.unit.loop_fakes import World, make_world

CONFIG = (
    "serving:\n"
    "  models:\n"
    "    - name: sample\n"
    "      min_replicas: 1\n"
    "      max_replicas: 3\n"
    "      upscale_delay_s: 2\n"
    "      downscale_delay_s: 5\n"
    "      slo_p99_ms: 100\n"
    "    - name: plain\n"
    "      min_replicas: 1\n"
    "      max_replicas: 1\n"
)


def world(tmp_path: Path, p99s: dict[str, float]) -> World:
    w = make_world(tmp_path, "serve.deploy_app=true", config_text=CONFIG)
    w.cluster.add("c1", Pool.CLUSTER, gpus=4)
    w.serve.deploy("sample", cluster=1)
    w.serve.deploy("plain", cluster=1)
    w.loop.adapters.latency = lambda: dict(p99s)
    return w


def gauge(w: World, name: str, model: str) -> float | None:
    return w.metrics.gauges.get((name, (("model", model),)))


def test_the_p99_reaches_the_snapshot_and_the_gauges(tmp_path: Path) -> None:
    p99s = {"sample": 250.0}
    w = world(tmp_path, p99s)
    w.tick()
    assert gauge(w, "rcp_model_p99_ms", "sample") == 250.0
    assert gauge(w, "rcp_model_slo_p99_ms", "sample") == 100.0
    plain = gauge(w, "rcp_model_p99_ms", "plain")
    assert plain is not None and math.isnan(plain)  # no reading: NaN, never a stale value
    assert gauge(w, "rcp_model_slo_p99_ms", "plain") is None  # no goal, no series
    p99s.clear()
    w.tick()
    sample = gauge(w, "rcp_model_p99_ms", "sample")
    assert sample is not None and math.isnan(sample)


@pytest.mark.parametrize(
    ("ongoing", "p99s", "rows"),
    [
        pytest.param(
            {"a": 3.0},
            {"a": 120.0, "b": 5.0},
            (ServeLoad("a", 3.0, 120.0), ServeLoad("b", 0.0, 5.0)),
            id="both-sources",
        ),
        pytest.param({"a": 1.0}, {}, (ServeLoad("a", 1.0, None),), id="no-reading"),
        pytest.param(
            {},
            {"a": math.nan, "b": math.inf, "c": -1.0},
            (ServeLoad("a"), ServeLoad("b"), ServeLoad("c")),
            id="non-finite-or-negative-is-no-reading",
        ),
    ],
)
def test_serve_loads(
    ongoing: dict[str, float], p99s: dict[str, float], rows: tuple[ServeLoad, ...]
) -> None:
    assert serve_loads(ongoing, p99s) == rows


def test_a_serve_load_refuses_a_non_finite_p99() -> None:
    with pytest.raises(ValueError, match="p99_ms must be finite"):
        ServeLoad("a", 0.0, math.nan)
