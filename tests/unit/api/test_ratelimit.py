"""Token buckets of the API's rate limits: the worked example, refill, isolation, eviction."""

from __future__ import annotations

import pytest

from controlplane.api.ratelimit import TokenBuckets


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_the_worked_example_of_the_docstring() -> None:
    clock = Clock()
    buckets = TokenBuckets(50.0, 100, clock=clock)
    answers = [buckets.take("flood") for _ in range(150)]
    assert answers[:100] == [None] * 100 and answers[100:] == [1] * 50
    assert buckets.take("other") is None


@pytest.mark.parametrize(
    "rate, elapsed_s, passes",
    [(1.0, 0.5, False), (1.0, 1.0, True), (0.1, 9.0, False), (0.1, 10.0, True)],
    ids=["half-a-token", "one-token", "slow-rate-early", "slow-rate-on-time"],
)
def test_an_empty_bucket_refills_at_the_rate(rate: float, elapsed_s: float, passes: bool) -> None:
    clock = Clock()
    buckets = TokenBuckets(rate, 1, clock=clock)
    assert buckets.take("k") is None
    retry = buckets.take("k")
    assert retry is not None and retry >= 1
    clock.now_s += elapsed_s
    assert (buckets.take("k") is None) is passes


def test_retry_after_says_when_the_next_token_comes() -> None:
    buckets = TokenBuckets(0.25, 1, clock=Clock())
    buckets.take("k")
    assert buckets.take("k") == 4


def test_a_bucket_never_holds_more_than_the_burst() -> None:
    clock = Clock()
    buckets = TokenBuckets(10.0, 2, clock=clock)
    clock.now_s += 3600
    assert [buckets.take("k") for _ in range(3)] == [None, None, 1]


def test_the_least_recently_used_bucket_is_forgotten_past_max_keys() -> None:
    buckets = TokenBuckets(0.001, 1, clock=Clock(), max_keys=2)
    for key in ("a", "b", "c"):
        assert buckets.take(key) is None
    assert buckets.take("a") is None  # forgotten, so full again
    assert buckets.take("c") is not None


@pytest.mark.parametrize("rate, burst", [(0.0, 1), (1.0, 0)], ids=["rate", "burst"])
def test_impossible_limits_are_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        TokenBuckets(rate, burst)
