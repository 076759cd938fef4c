"""The demand policy: wanted replicas from load, clamping, and the up/down delay timers; ingress
replicas from the request rate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from policies.demand import (
    DemandConfig,
    DemandLoad,
    DemandReason,
    DemandState,
    Direction,
    decide_replicas,
    ingress_replicas,
    latency_replicas,
    wanted_replicas,
)


def make_config(
    target: float = 2.0,
    min_replicas: int = 1,
    max_replicas: int = 8,
    up_s: float = 5.0,
    down_s: float = 30.0,
) -> DemandConfig:
    return DemandConfig(
        target_ongoing_requests_per_replica=target,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        upscale_delay_s=up_s,
        downscale_delay_s=down_s,
    )


@pytest.mark.parametrize(
    ("ongoing", "config", "expected"),
    [
        pytest.param(9, make_config(), 5, id="9-at-2-per-replica-needs-5"),
        pytest.param(8, make_config(), 4, id="exact-multiple-no-extra"),
        pytest.param(0, make_config(min_replicas=1), 1, id="idle-clamped-to-min"),
        pytest.param(0, make_config(min_replicas=0), 0, id="idle-min-zero"),
        pytest.param(100, make_config(max_replicas=6), 6, id="burst-clamped-to-max"),
        pytest.param(
            1.1, make_config(target=0.1, max_replicas=20), 11, id="float-ratio-not-rounded-up-twice"
        ),
        pytest.param(-3, make_config(min_replicas=2), 2, id="negative-load-treated-as-zero"),
    ],
)
def test_wanted_replicas(ongoing: float, config: DemandConfig, expected: int) -> None:
    assert wanted_replicas(ongoing, config) == expected


def run_ticks(
    ticks: Sequence[tuple[float, float] | tuple[float, float, float | None]],
    current: int,
    config: DemandConfig,
) -> list[tuple[int, DemandReason]]:
    """Feed (now_s, ongoing[, p99_ms]) ticks, applying each decision as the new current count."""
    state = DemandState()
    out = []
    for now_s, ongoing, *p99 in ticks:
        load = DemandLoad(ongoing, current, now_s, p99_ms=p99[0] if p99 else None)
        decision, state = decide_replicas(load, config, state)
        current = decision.num_replicas
        out.append((decision.num_replicas, decision.reason))
    return out


R = DemandReason


@pytest.mark.parametrize(
    ("ticks", "start", "config", "expected"),
    [
        pytest.param(
            [(0, 9), (3, 7), (5, 7), (6, 1), (20, 3), (36, 1)],
            2,
            make_config(),
            [
                (2, R.WAITING_UPSCALE_DELAY),
                (2, R.WAITING_UPSCALE_DELAY),
                (5, R.UPSCALE),
                (5, R.WAITING_DOWNSCALE_DELAY),
                (5, R.WAITING_DOWNSCALE_DELAY),
                (2, R.DOWNSCALE),
            ],
            id="docstring-worked-example",
        ),
        pytest.param(
            [(0, 9)], 2, make_config(up_s=0), [(5, R.UPSCALE)], id="zero-delay-scales-at-once"
        ),
        pytest.param(
            [(0, 9), (2, 4), (4, 9), (8, 9)],
            2,
            make_config(),
            [
                (2, R.WAITING_UPSCALE_DELAY),
                (2, R.STEADY),
                (2, R.WAITING_UPSCALE_DELAY),
                (2, R.WAITING_UPSCALE_DELAY),
            ],
            id="a-break-in-demand-restarts-the-timer",
        ),
        pytest.param(
            [(0, 1), (10, 20), (15, 20)],
            4,
            make_config(),
            [(4, R.WAITING_DOWNSCALE_DELAY), (4, R.WAITING_UPSCALE_DELAY), (8, R.UPSCALE)],
            id="direction-flip-resets-the-timer",
        ),
        pytest.param(
            [(0, 4)],
            0,
            make_config(min_replicas=1),
            [(1, R.BELOW_MIN)],
            id="below-min-fixed-at-once",
        ),
        pytest.param(
            [(0, 100)],
            12,
            make_config(max_replicas=8),
            [(8, R.ABOVE_MAX)],
            id="above-max-fixed-at-once",
        ),
        pytest.param([(0, 4), (100, 4)], 2, make_config(), [(2, R.STEADY)] * 2, id="steady-load"),
    ],
)
def test_decide_replicas_over_ticks(
    ticks: list[tuple[float, float]],
    start: int,
    config: DemandConfig,
    expected: list[tuple[int, DemandReason]],
) -> None:
    assert run_ticks(ticks, start, config) == expected


def test_state_carries_the_timer_and_is_cleared_after_acting() -> None:
    config = make_config()
    d1, s1 = decide_replicas(DemandLoad(9, 2, now_s=100.0), config, DemandState())
    assert (s1.direction, s1.since_s, s1.highest_wanted) == (Direction.UP, 100.0, 5)
    d2, s2 = decide_replicas(DemandLoad(9, 2, now_s=105.0), config, s1)
    assert d2.num_replicas == 5 and s2 == DemandState()
    assert "2 -> 5" in d2.message


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"target": 0}, "target_ongoing_requests_per_replica", id="zero-target"),
        pytest.param({"min_replicas": -1}, "min_replicas", id="negative-min"),
        pytest.param({"min_replicas": 3, "max_replicas": 2}, "max_replicas", id="max-below-min"),
        pytest.param({"up_s": -1}, "delay", id="negative-delay"),
    ],
)
def test_config_rejects_impossible_values(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_config(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rate_rps", "cpu_ms", "kwargs", "expected"),
    [
        pytest.param(300, 2.0, {}, 2, id="docstring-0.6-cores-at-half-a-core-each"),
        pytest.param(300, 1.0, {}, 1, id="docstring-cheaper-requests-one-replica"),
        pytest.param(250, 2.0, {}, 1, id="exactly-half-a-core-fits-one"),
        pytest.param(0, 3.7, {}, 1, id="idle-keeps-the-floor"),
        pytest.param(0, 3.7, {"min_replicas": 2}, 2, id="configured-floor"),
        pytest.param(5000, 3.7, {}, 16, id="capped-at-max"),
        pytest.param(400, 1.0, {"target_utilization": 0.8}, 1, id="hotter-target-fewer"),
        pytest.param(1000, 1.0, {"target_utilization": 0.8}, 2, id="one-core-at-80pct-is-two"),
    ],
)
def test_ingress_replicas_follow_the_request_rate(
    rate_rps: float, cpu_ms: float, kwargs: dict[str, Any], expected: int
) -> None:
    assert ingress_replicas(rate_rps, cpu_ms, **kwargs) == expected


@pytest.mark.parametrize(
    ("args", "kwargs", "says"),
    [
        pytest.param((-1, 1.0), {}, "must be >= 0", id="negative-rate"),
        pytest.param((1, 1.0), {"target_utilization": 0}, "target_utilization", id="zero-util"),
        pytest.param((1, 1.0), {"min_replicas": 0}, "min_replicas", id="no-floor"),
        pytest.param(
            (1, 1.0), {"min_replicas": 3, "max_replicas": 2}, "max_replicas", id="max<min"
        ),
    ],
)
def test_ingress_replicas_refuse_impossible_inputs(
    args: tuple[float, float], kwargs: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        ingress_replicas(*args, **kwargs)


def latency_config(**kwargs: Any) -> DemandConfig:
    return DemandConfig(
        target_ongoing_requests_per_replica=2.0,
        min_replicas=kwargs.pop("min_replicas", 1),
        max_replicas=kwargs.pop("max_replicas", 8),
        upscale_delay_s=kwargs.pop("up_s", 5.0),
        downscale_delay_s=kwargs.pop("down_s", 30.0),
        target_p99_ms=kwargs.pop("target_p99_ms", 100.0),
        **kwargs,
    )


@pytest.mark.parametrize(
    ("p99_ms", "current", "config", "expected"),
    [
        pytest.param(250, 2, latency_config(), 5, id="docstring-2.5x-over-target"),
        pytest.param(101, 2, latency_config(), 3, id="just-over-at-least-one-more"),
        pytest.param(100, 2, latency_config(), 2, id="at-target-holds"),
        pytest.param(80, 2, latency_config(), 2, id="docstring-in-band-holds"),
        pytest.param(50, 2, latency_config(), 2, id="band-edge-holds"),
        pytest.param(30, 2, latency_config(), 0, id="docstring-below-band-asks-nothing"),
        pytest.param(30, 2, latency_config(p99_low_fraction=0.2), 2, id="wider-band"),
        pytest.param(250, 0, latency_config(), 3, id="no-replicas-counts-as-one"),
        pytest.param(None, 2, latency_config(), 0, id="no-measurement"),
        pytest.param(250, 2, make_config(), 0, id="no-latency-target"),
    ],
)
def test_latency_replicas(
    p99_ms: float | None, current: int, config: DemandConfig, expected: int
) -> None:
    assert latency_replicas(p99_ms, current, config) == expected


@pytest.mark.parametrize(
    ("ticks", "start", "config", "expected"),
    [
        pytest.param(
            # A slow backend: few requests, but p99 at 2.5x the target.
            [(0, 1, 250), (3, 1, 250), (5, 1, 250), (6, 1, 90)],
            2,
            latency_config(),
            [
                (2, R.WAITING_UPSCALE_DELAY),
                (2, R.WAITING_UPSCALE_DELAY),
                (5, R.UPSCALE),
                (5, R.STEADY),  # in the band: latency holds 5 though 1 request needs 1
            ],
            id="slow-backend-scales-up-after-the-delay-then-holds-in-band",
        ),
        pytest.param(
            # Latency falls well below the band: the requests decide, after the downscale delay.
            [(0, 1, 20), (10, 1, 20), (30, 1, 20)],
            4,
            latency_config(),
            [
                (4, R.WAITING_DOWNSCALE_DELAY),
                (4, R.WAITING_DOWNSCALE_DELAY),
                (1, R.DOWNSCALE),
            ],
            id="fast-again-scales-down-after-the-delay",
        ),
        pytest.param(
            # p99 flickers around the target: over, in band, over, in band... never 5 s over
            # without a break, so the count never moves.
            [(0, 1, 120), (2, 1, 90), (4, 1, 120), (6, 1, 90), (8, 1, 120), (10, 1, 90)],
            3,
            latency_config(),
            [
                (3, R.WAITING_UPSCALE_DELAY),
                (3, R.STEADY),
                (3, R.WAITING_UPSCALE_DELAY),
                (3, R.STEADY),
                (3, R.WAITING_UPSCALE_DELAY),
                (3, R.STEADY),
            ],
            id="no-flapping-around-the-target",
        ),
        pytest.param(
            [(0, 1, 1000), (5, 1, 1000)],
            3,
            latency_config(max_replicas=4),
            [(3, R.WAITING_UPSCALE_DELAY), (4, R.UPSCALE)],
            id="never-above-max",
        ),
        pytest.param(
            [(0, 0, 5), (30, 0, 5)],
            3,
            latency_config(min_replicas=2),
            [(3, R.WAITING_DOWNSCALE_DELAY), (2, R.DOWNSCALE)],
            id="never-below-the-floor",
        ),
        pytest.param(
            [(0, 9, 20), (5, 9, 20)],
            2,
            latency_config(),
            [(2, R.WAITING_UPSCALE_DELAY), (5, R.UPSCALE)],
            id="requests-still-scale-when-latency-is-fine",
        ),
    ],
)
def test_latency_aware_scaling(
    ticks: list[tuple[float, float, float | None]],
    start: int,
    config: DemandConfig,
    expected: list[tuple[int, DemandReason]],
) -> None:
    assert run_ticks(ticks, start, config) == expected


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        pytest.param({"target_p99_ms": 0}, "target_p99_ms", id="zero-target"),
        pytest.param({"p99_low_fraction": 1.0}, "p99_low_fraction", id="band-up-to-target"),
    ],
)
def test_latency_settings_are_checked(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        latency_config(**kwargs)


def test_a_latency_decision_says_what_it_measured() -> None:
    decision, _ = decide_replicas(
        DemandLoad(1, 2, now_s=10.0, p99_ms=250), latency_config(up_s=0), DemandState()
    )
    assert decision.num_replicas == 5
    assert "p99 250 ms (target 100 ms)" in decision.message
