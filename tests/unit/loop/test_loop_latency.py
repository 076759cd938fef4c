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
    assert w.loop.serve_load == (ServeLoad("sample", 0.0, 250.0),)  # what `rcp serve status` shows
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


def total(w: World, model: str = "sample") -> int:
    return sum(n for (m, _), n in w.serve.targets.items() if m == model)


def test_demand_scales_on_the_p99_with_its_delays_and_does_not_flap(tmp_path: Path) -> None:
    """sample: 1 replica, SLO 100 ms, upscale delay 2 s, downscale delay 5 s, max 3; few
    requests (the load alone asks for min_replicas), one tick per second."""
    p99s = {"sample": 250.0}
    w = world(tmp_path, p99s)
    totals: list[int] = []

    def run(ticks: int) -> None:
        for _ in range(ticks):
            w.tick()
            totals.append(total(w))

    run(2)  # over the SLO for 1 s of the 2 s delay: nothing yet
    assert totals == [1, 1]
    run(1)  # 2 s over: ceil(1 x 2.5) = 3 (max 3)
    assert totals[-1] == 3
    run(3)  # still slow: held at max
    p99s["sample"] = 80.0  # in the band (50..100 ms): latency holds the 3 replicas
    run(8)
    assert set(totals[3:]) == {3}
    p99s["sample"] = 120.0  # over again, already at max: nothing to do
    run(2)
    p99s["sample"] = 20.0  # under half the SLO: ongoing requests decide, after 5 s
    run(5)
    assert totals[-1] == 3
    run(2)
    assert totals[-1] == 1
    p99s.clear()  # no reading: nothing acts on latency, the count stays
    run(4)
    assert totals[-1] == 1
    changes = [n for i, n in enumerate(totals) if i == 0 or totals[i - 1] != n]
    assert changes == [1, 3, 1]  # up once, down once
    assert total(w, "plain") == 1  # a model without a goal never moved


def test_a_missing_or_flickering_reading_never_scales(tmp_path: Path) -> None:
    """The p99 comes and goes (Prometheus slow to answer): a reading over the SLO never lasts
    the 2 s upscale delay, so the count stays."""
    p99s: dict[str, float] = {}
    w = world(tmp_path, p99s)
    for i in range(12):
        if i % 2:
            p99s["sample"] = 400.0
        else:
            p99s.clear()
        w.tick()
        assert total(w) == 1


def test_a_scale_up_stays_while_its_replicas_are_not_up_yet(tmp_path: Path) -> None:
    """The cluster pool is full, so the p99's 2 new replicas go to the external pool, where no
    node is up yet (the autoscaler's lag; Serve shows no replica for them). Demand counts the
    model's target, not the replicas it sees: the scale-up stays and nothing flaps."""
    w = make_world(tmp_path, "serve.deploy_app=true", config_text=CONFIG)
    w.cluster.add("c1", Pool.CLUSTER, gpus=2)
    w.serve.deploy("sample", cluster=1)
    w.serve.deploy("plain", cluster=1)
    w.loop.adapters.latency = lambda: {"sample": 250.0}
    w.tick(3)
    assert w.serve.targets[("sample", Pool.EXTERNAL)] == 2
    assert not [r for r in w.serve.replicas if r.pool is Pool.EXTERNAL and r.node_id]
    w.tick(6)
    assert w.serve.targets[("sample", Pool.EXTERNAL)] == 2
    external = [(m, n) for _, m, pool, n in w.serve.writes if pool is Pool.EXTERNAL]
    assert external == [("sample", 2)]  # once, never undone
