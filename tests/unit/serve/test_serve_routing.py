"""Pure routing decisions of the ingress: pool choice, retry budget, weights from readiness."""

from __future__ import annotations

import pytest

from serve.routing import choose_pool, retry_decision, weights_from_readiness


@pytest.mark.parametrize(
    ("weights", "u", "exclude", "expected"),
    [
        pytest.param({"cluster": 3, "external": 1}, 0.5, (), "cluster", id="draw-in-cluster-share"),
        pytest.param(
            {"cluster": 3, "external": 1}, 0.9, (), "external", id="draw-in-external-share"
        ),
        pytest.param({"cluster": 3, "external": 1}, 0.75, (), "external", id="boundary-goes-right"),
        pytest.param(
            {"cluster": 0, "external": 2}, 0.0, (), "external", id="zero-weight-never-chosen"
        ),
        pytest.param({"cluster": 0, "external": 0}, 0.3, (), None, id="no-capacity"),
        pytest.param({}, 0.3, (), None, id="unknown-model-weights"),
        pytest.param(
            {"cluster": 1, "external": 1},
            0.1,
            ("cluster",),
            "external",
            id="retry-prefers-untried-pool",
        ),
        pytest.param(
            {"cluster": 1, "external": 0},
            0.9,
            ("cluster",),
            "cluster",
            id="retry-same-pool-when-only-one",
        ),
        pytest.param({"cluster": 2, "external": 2}, 1.0, (), "external", id="u-of-one-clamped"),
        pytest.param({"cluster": 2, "gpu-x": 5}, 0.99, (), "cluster", id="unknown-pool-ignored"),
    ],
)
def test_choose_pool(
    weights: dict[str, float], u: float, exclude: tuple[str, ...], expected: str | None
) -> None:
    assert choose_pool(weights, u, exclude) == expected


def test_choose_pool_shares_follow_weights() -> None:
    weights = {"cluster": 1.0, "external": 3.0}
    draws = [i / 1000 for i in range(1000)]
    picks = [choose_pool(weights, u) for u in draws]
    assert picks.count("external") == 750
    assert picks.count("cluster") == 250


@pytest.mark.parametrize(
    ("attempts", "max_attempts", "elapsed_s", "timeout_s", "retry"),
    [
        pytest.param(1, 3, 0.1, 30.0, True, id="first-failure-retried"),
        pytest.param(2, 3, 0.1, 30.0, True, id="second-failure-retried"),
        pytest.param(3, 3, 0.1, 30.0, False, id="attempts-used-up"),
        pytest.param(1, 3, 30.0, 30.0, False, id="deadline-passed"),
        pytest.param(1, 1, 0.0, 30.0, False, id="no-retries-configured"),
    ],
)
def test_retry_decision(
    attempts: int, max_attempts: int, elapsed_s: float, timeout_s: float, retry: bool
) -> None:
    decision = retry_decision(attempts, max_attempts, elapsed_s, timeout_s)
    assert decision.retry is retry
    assert decision.reason


@pytest.mark.parametrize(
    ("running", "targets", "expected"),
    [
        pytest.param(
            {"cluster": 2, "external": 0},
            {"cluster": 2, "external": 0},
            {"cluster": 2.0, "external": 0.0},
            id="steady-cluster-only",
        ),
        pytest.param(
            {"cluster": 2, "external": 2},
            {"cluster": 0, "external": 2},
            {"cluster": 0.0, "external": 2.0},
            id="draining-pool-gets-zero",
        ),
        pytest.param(
            {"cluster": 2, "external": 1},
            {"cluster": 2, "external": 2},
            {"cluster": 2.0, "external": 1.0},
            id="only-running-replicas-count",
        ),
        pytest.param(
            {"cluster": 3},
            {"cluster": 2},
            {"cluster": 2.0, "external": 0.0},
            id="capped-at-target",
        ),
        pytest.param({}, {}, {"cluster": 0.0, "external": 0.0}, id="nothing-ready"),
    ],
)
def test_weights_from_readiness(
    running: dict[str, int], targets: dict[str, int], expected: dict[str, float]
) -> None:
    assert weights_from_readiness(running, targets) == expected
