"""The node health policy as tables: each row a node's samples and the verdict they earn."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.health import (
    GpuSample,
    HealthReason,
    HealthState,
    HealthThresholds,
    NodeSample,
    PortSample,
    Verdict,
    clear_lemon,
    evaluate,
)

R = HealthReason
T = HealthThresholds(
    gpu_temp_c=78.0,
    hot_samples=2,
    recover_after_samples=3,
    lemon_count=2,
    lemon_window_s=3600.0,
    stale_after_s=10.0,
)


def gpu(i: int = 0, **kw: object) -> GpuSample:
    base: dict[str, object] = {
        "temp_c": 50.0,
        "nvlink_links_total": 4,
        "nvlink_links_up": 4,
        "nvlink_errors_per_s": 0.0,
        "ecc_uncorrectable_total": 0,
    }
    base.update(kw)
    return GpuSample(gpu=i, **base)  # type: ignore[arg-type]


def port(name: str = "mlx5_0/1", **kw: object) -> PortSample:
    base: dict[str, object] = {"up": True, "width": 4, "rate_gbps": 400.0, "errors_per_s": 0.0}
    base.update(kw)
    return PortSample(port=name, **base)  # type: ignore[arg-type]


def sample(
    t: float,
    *gpus: GpuSample,
    ports: tuple[PortSample, ...] = (port(),),
    expected: int | None = None,
    node_id: str = "n1",
) -> NodeSample:
    gs = gpus or (gpu(0), gpu(1))
    return NodeSample(node_id, t, gs, ports, len(gs) if expected is None else expected)


def run(*samples: NodeSample, thresholds: HealthThresholds = T, now_s: float | None = None):
    """Feed samples one per tick (now_s = sample time); return the last verdict and state."""
    state = HealthState()
    verdict = None
    for s in samples:
        verdicts, state = evaluate({"n1": [s]}, thresholds, state, s.sampled_s)
        verdict = verdicts["n1"]
    if now_s is not None:
        verdicts, state = evaluate({"n1": []}, thresholds, state, now_s)
        verdict = verdicts["n1"]
    assert verdict is not None
    return verdict, state


CASES = [
    ("all-clean", [sample(1)], Verdict.HEALTHY, ()),
    (
        "hot-once-is-degraded",
        [sample(1, gpu(0, temp_c=80.0))],
        Verdict.DEGRADED,
        (R.GPU_TEMP_HIGH,),
    ),
    (
        "hot-twice-is-unhealthy",
        [sample(1, gpu(0, temp_c=80.0)), sample(2, gpu(0, temp_c=81.0))],
        Verdict.UNHEALTHY,
        (R.GPU_OVERHEATED,),
    ),
    (
        "at-threshold-is-not-hot",
        [sample(1, gpu(0, temp_c=78.0)), sample(2, gpu(0, temp_c=78.0))],
        Verdict.HEALTHY,
        (),
    ),
    (
        "hot-streak-broken",
        [sample(1, gpu(0, temp_c=80.0)), sample(2), sample(3, gpu(0, temp_c=80.0))],
        Verdict.DEGRADED,
        (R.GPU_TEMP_HIGH,),
    ),
    (
        "hot-on-different-gpus-no-streak",
        [sample(1, gpu(0, temp_c=80.0), gpu(1)), sample(2, gpu(0), gpu(1, temp_c=80.0))],
        Verdict.DEGRADED,
        (R.GPU_TEMP_HIGH,),
    ),
    (
        "temp-unknown-is-not-bad",
        [sample(1, gpu(0, temp_c=None)), sample(2, gpu(0, temp_c=None))],
        Verdict.HEALTHY,
        (),
    ),
    (
        "thermal-throttle-degraded",
        [sample(1, gpu(0, thermal_throttle=True))],
        Verdict.DEGRADED,
        (R.GPU_THERMAL_THROTTLE,),
    ),
    ("fatal-xid-79", [sample(1, gpu(0, new_xids=(79,)))], Verdict.UNHEALTHY, (R.XID_FATAL,)),
    (
        "app-xid-13-degraded",
        [sample(1, gpu(0, new_xids=(13,)))],
        Verdict.DEGRADED,
        (R.XID_NONFATAL,),
    ),
    (
        "ecc-uncorrectable",
        [sample(1, gpu(0, ecc_uncorrectable_total=1))],
        Verdict.UNHEALTHY,
        (R.ECC_UNCORRECTABLE,),
    ),
    (
        "row-remap-failure",
        [sample(1, gpu(0, row_remap_failure=True))],
        Verdict.UNHEALTHY,
        (R.ROW_REMAP_FAILURE,),
    ),
    (
        "row-remap-pending-degraded",
        [sample(1, gpu(0, row_remap_pending=True))],
        Verdict.DEGRADED,
        (R.ROW_REMAP_PENDING,),
    ),
    (
        "gpu-missing-once-degraded",
        [sample(1, gpu(0), expected=2)],
        Verdict.DEGRADED,
        (R.GPU_MISSING,),
    ),
    (
        "gpu-missing-streak-unhealthy",
        [sample(t, gpu(0), expected=2) for t in (1, 2, 3)],
        Verdict.UNHEALTHY,
        (R.GPU_MISSING,),
    ),
    (
        "gpu-missing-streak-broken-by-a-full-sample",
        [
            sample(1, gpu(0), expected=2),
            sample(2, gpu(0), expected=2),
            sample(3, gpu(0), gpu(1), expected=2),
            sample(4, gpu(0), expected=2),
        ],
        Verdict.DEGRADED,
        (R.GPU_MISSING,),
    ),
    # Fabric faults alone: the GPUs still serve, no gang may use the node.
    ("nvlink-down", [sample(1, gpu(0, nvlink_links_up=3))], Verdict.SERVING_ONLY, (R.NVLINK_DOWN,)),
    (
        "nvlink-errors-above",
        [sample(1, gpu(0, nvlink_errors_per_s=5.0))],
        Verdict.SERVING_ONLY,
        (R.NVLINK_ERRORS,),
    ),
    (
        "nvlink-errors-at-threshold",
        [sample(1, gpu(0, nvlink_errors_per_s=1.0))],
        Verdict.HEALTHY,
        (),
    ),
    ("ib-down", [sample(1, ports=(port(up=False),))], Verdict.SERVING_ONLY, (R.IB_LINK_DOWN,)),
    (
        "ib-flapped",
        [sample(1, ports=(port(link_downed_delta=1),))],
        Verdict.SERVING_ONLY,
        (R.IB_LINK_DOWN,),
    ),
    (
        "ib-errors-above",
        [sample(1, ports=(port(errors_per_s=200.0),))],
        Verdict.SERVING_ONLY,
        (R.IB_ERRORS,),
    ),
    # A GPU fault beside a fabric one: out of everything.
    (
        "ib-errors-and-fatal-xid",
        [sample(1, gpu(0, new_xids=(79,)), ports=(port(errors_per_s=200.0),))],
        Verdict.UNHEALTHY,
        (R.XID_FATAL, R.IB_ERRORS),
    ),
    (
        "nvlink-errors-and-ecc",
        [sample(1, gpu(0, nvlink_errors_per_s=5.0, ecc_uncorrectable_total=1))],
        Verdict.UNHEALTHY,
        (R.ECC_UNCORRECTABLE, R.NVLINK_ERRORS),
    ),
    (
        "ib-width-1x-degraded",
        [sample(1, ports=(port(width=1, rate_gbps=100.0),))],
        Verdict.DEGRADED,
        (R.IB_LINK_DEGRADED,),
    ),
    (
        "ib-rate-unknown-is-not-bad",
        [sample(1, ports=(port(width=None, rate_gbps=None, errors_per_s=None),))],
        Verdict.HEALTHY,
        (),
    ),
    ("stale-telemetry", [sample(1)], Verdict.DEGRADED, (R.NO_TELEMETRY,)),
]


@pytest.mark.parametrize(
    ("samples", "verdict", "reasons"), [pytest.param(s, v, r, id=i) for i, s, v, r in CASES]
)
def test_verdict_from_samples(
    samples: list[NodeSample],
    verdict: Verdict,
    reasons: tuple[HealthReason, ...],
    request: pytest.FixtureRequest,
) -> None:
    now_s = 100.0 if request.node.callspec.id == "stale-telemetry" else None
    got, _ = run(*samples, now_s=now_s)
    assert got.verdict is verdict, got.reason
    assert got.reasons == reasons, got.reason


@pytest.mark.parametrize(
    ("clean_after", "verdict"),
    [
        pytest.param(2, Verdict.UNHEALTHY, id="2-clean-still-held"),
        pytest.param(3, Verdict.HEALTHY, id="3-clean-recovered"),
    ],
)
def test_unhealthy_is_held_until_enough_clean_samples(clean_after: int, verdict: Verdict) -> None:
    samples = [sample(1, gpu(0, new_xids=(79,)))] + [sample(2 + i) for i in range(clean_after)]
    got, _ = run(*samples)
    assert got.verdict is verdict
    if verdict is Verdict.UNHEALTHY:
        assert got.reasons == (R.XID_FATAL,)
        assert any("recovering" in d for d in got.details)


def test_worked_example_from_docstring_ends_in_a_lemon_until_cleared() -> None:
    hot = [sample(10, gpu(0, temp_c=80.0)), sample(11, gpu(0, temp_c=81.0))]
    cool = [sample(t, gpu(0, temp_c=60.0)) for t in (12, 13, 14)]
    verdict, state = run(*hot)
    assert verdict.verdict is Verdict.UNHEALTHY
    verdict, state_after = run(*hot, *cool)
    assert verdict.verdict is Verdict.HEALTHY
    assert state_after.nodes["n1"].unhealthy_turns_s == (11.0,)
    verdicts, state = evaluate({"n1": [sample(100, gpu(0, new_xids=(79,)))]}, T, state_after, 100.0)
    assert verdicts["n1"].lemon and verdicts["n1"].reasons == (R.LEMON, R.XID_FATAL)
    later = [sample(200 + i) for i in range(5)]
    verdicts, state = evaluate({"n1": later}, T, state, 205.0)
    assert verdicts["n1"].verdict is Verdict.UNHEALTHY and verdicts["n1"].reasons[0] is R.LEMON
    verdicts, state = evaluate({"n1": [sample(206)]}, T, clear_lemon(state, ["n1"]), 206.0)
    assert verdicts["n1"].verdict is Verdict.HEALTHY


@pytest.mark.parametrize(
    ("later", "verdict", "reasons"),
    [
        pytest.param(
            [sample(11, gpu(0, temp_c=85.0), ports=(port(errors_per_s=5.0),))],
            Verdict.SERVING_ONLY,
            (R.IB_ERRORS,),
            id="one-hot-sample-still-serving-only",
        ),
        pytest.param(
            [
                sample(11, gpu(0, temp_c=85.0), ports=(port(errors_per_s=5.0),)),
                sample(12, gpu(0, temp_c=86.0), ports=(port(errors_per_s=5.0),)),
            ],
            Verdict.UNHEALTHY,
            (R.IB_ERRORS, R.GPU_OVERHEATED),
            id="hot-streak-takes-it-out",
        ),
        pytest.param(
            [sample(11 + i) for i in range(3)], Verdict.HEALTHY, (), id="3-clean-fit-for-gangs"
        ),
    ],
)
def test_fabric_worked_example_serving_only_until_a_gpu_fault(
    later: list[NodeSample], verdict: Verdict, reasons: tuple[HealthReason, ...]
) -> None:
    first = sample(10, gpu(0), ports=(port(errors_per_s=5.0),))
    assert run(first)[0].verdict is Verdict.SERVING_ONLY
    got, _ = run(first, *later)
    assert got.verdict is verdict, got.reason
    assert got.reasons == reasons, got.reason


def test_a_node_whose_fabric_keeps_failing_is_a_lemon_out_of_everything() -> None:
    state = HealthState()
    ib_bad = (port(errors_per_s=5.0),)
    verdicts, state = evaluate({"n1": [sample(0, ports=ib_bad)]}, T, state, 0.0)
    assert verdicts["n1"].verdict is Verdict.SERVING_ONLY
    _, state = evaluate({"n1": [sample(i) for i in (1, 2, 3)]}, T, state, 3.0)
    # The second turn within the window (lemon_count 2): a lemon, out of everything.
    verdicts, _ = evaluate({"n1": [sample(10, ports=ib_bad)]}, T, state, 10.0)
    assert verdicts["n1"].lemon and verdicts["n1"].verdict is Verdict.UNHEALTHY


def test_turns_outside_the_lemon_window_do_not_count() -> None:
    state = HealthState()
    for t in (0.0, 5000.0):  # 5000 s apart > 3600 s window
        _, state = evaluate({"n1": [sample(t, gpu(0, new_xids=(79,)))]}, T, state, t)
        _, state = evaluate({"n1": [sample(t + i) for i in range(1, 4)]}, T, state, t + 3)
    assert not state.nodes["n1"].lemon
    assert state.nodes["n1"].unhealthy_turns_s == (5000.0,)


def test_samples_already_seen_are_skipped() -> None:
    hot = sample(1, gpu(0, temp_c=80.0))
    state = HealthState()
    for _ in range(3):  # the same window handed in every tick must not build a streak
        verdicts, state = evaluate({"n1": [hot]}, T, state, 1.0)
    assert verdicts["n1"].verdict is Verdict.DEGRADED
    assert state.nodes["n1"].hot_streaks == ((0, 1),)


def test_samples_are_ordered_by_time_not_by_position() -> None:
    out_of_order = [sample(2, gpu(0, temp_c=81.0)), sample(1, gpu(0, temp_c=80.0))]
    verdicts, _ = evaluate({"n1": out_of_order}, T, HealthState(), 2.0)
    assert verdicts["n1"].verdict is Verdict.UNHEALTHY


def test_custom_thresholds_apply() -> None:
    strict = replace(T, gpu_temp_c=60.0, hot_samples=1, fatal_xids=frozenset({13}))
    got, _ = run(sample(1, gpu(0, temp_c=61.0, new_xids=(13,))), thresholds=strict)
    assert got.verdict is Verdict.UNHEALTHY
    assert set(got.reasons) == {R.GPU_OVERHEATED, R.XID_FATAL}


def test_sample_of_another_node_is_rejected() -> None:
    with pytest.raises(ValueError, match="sample of node 'n2' was passed under node 'n1'"):
        evaluate({"n1": [sample(1, node_id="n2")]}, T, HealthState(), 1.0)


def test_reason_line_names_verdict_reasons_and_details() -> None:
    got, _ = run(sample(1, gpu(0, temp_c=90.0)), sample(2, gpu(0, temp_c=91.5)))
    assert got.reason == "unhealthy: gpu_overheated (gpu 0 at 91.5 C > 78 C for 2 samples)"


@pytest.mark.parametrize("field", ["hot_samples", "recover_after_samples", "lemon_count"])
def test_thresholds_reject_zero_counts(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        HealthThresholds(**{field: 0})  # type: ignore[arg-type]
