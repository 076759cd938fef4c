"""The ingress scaling policy: up at once with the request rate, down after a delay, within
[min, max]."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from policies.demand import DemandState, Direction
from policies.ingress import (
    IngressLoad,
    IngressScaling,
    IngressTraffic,
    decide_ingress,
)


def make_config(
    min_replicas: int = 2, max_replicas: int = 8, util: float = 0.5, down_s: float = 60.0
) -> IngressScaling:
    return IngressScaling(
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        target_utilization=util,
        downscale_delay_s=down_s,
    )


def run(
    steps: Sequence[tuple[float, float, float]], start: int, config: IngressScaling
) -> list[int]:
    """(now_s, requests/s, CPU ms per request) per tick -> the count after each tick."""
    current, state, out = start, DemandState(), []
    for now_s, rate, cpu_ms in steps:
        decision, state = decide_ingress(
            IngressLoad(IngressTraffic(rate, cpu_ms), current, now_s), config, state
        )
        current = decision.num_replicas
        out.append(current)
    return out


@pytest.mark.parametrize(
    ("steps", "start", "config", "expected"),
    [
        pytest.param(
            [(0, 300, 4.0), (10, 100, 4.0), (40, 200, 4.0), (70, 100, 4.0)],
            2,
            make_config(),
            [3, 3, 3, 2],
            id="docstring-example",
        ),
        pytest.param([(0, 1000, 4.0)], 2, make_config(), [8], id="up-at-once-capped-at-max"),
        pytest.param([(0, 0, 0.0)], 5, make_config(down_s=0), [2], id="idle-to-the-floor"),
        pytest.param([(0, 0, 0.0)], 1, make_config(), [2], id="below-floor-raised-at-once"),
        pytest.param([(0, 0, 0.0)], 12, make_config(), [8], id="above-max-lowered-at-once"),
        pytest.param(
            [(0, 100, 4.0), (30, 400, 4.0), (50, 100, 4.0), (80, 100, 4.0), (110, 100, 4.0)],
            4,
            make_config(),
            [4, 4, 4, 4, 2],
            id="a-burst-restarts-the-wait",
        ),
        pytest.param(
            [(0, 500, 4.0), (30, 100, 4.0), (60, 100, 4.0)],
            5,
            make_config(),
            [5, 5, 4],
            id="down-to-the-highest-asked-during-the-wait",
        ),
        pytest.param(
            [(0, float("nan"), 4.0), (1, 100, float("inf")), (2, -5, 4.0)],
            2,
            make_config(down_s=0),
            [2, 2, 2],
            id="non-finite-or-negative-telemetry-counts-as-nothing",
        ),
    ],
)
def test_ingress_count_follows_the_traffic(
    steps: Sequence[tuple[float, float, float]],
    start: int,
    config: IngressScaling,
    expected: list[int],
) -> None:
    assert run(steps, start, config) == expected


def test_a_wait_is_carried_in_the_state_and_dropped_when_the_traffic_fits() -> None:
    config = make_config()
    load = IngressLoad(IngressTraffic(100, 4.0), 4, 10.0)
    decision, state = decide_ingress(load, config, DemandState())
    assert (decision.num_replicas, decision.wanted) == (4, 2)
    assert state == DemandState(Direction.DOWN, 10.0, 2)
    assert "waited 0s of 60s" in decision.message
    fits = IngressLoad(IngressTraffic(400, 4.0), 4, 20.0)
    decision, state = decide_ingress(fits, config, state)
    assert (decision.num_replicas, state) == (4, DemandState())


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        pytest.param({"min_replicas": 0}, "min_replicas", id="no-floor"),
        pytest.param({"min_replicas": 3, "max_replicas": 2}, "max_replicas", id="max<min"),
        pytest.param({"util": 0.0}, "target_utilization", id="zero-util"),
        pytest.param({"util": 1.5}, "target_utilization", id="over-a-core"),
        pytest.param({"down_s": -1.0}, "downscale_delay_s", id="negative-delay"),
    ],
)
def test_impossible_settings_are_refused(kwargs: dict[str, float], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        make_config(**kwargs)  # type: ignore[arg-type]
