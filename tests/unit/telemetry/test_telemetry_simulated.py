"""The simulated source's faults end-to-end without Ray: sampler -> exporter text -> verdict."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from controlplane.config import ConfigError, HealthConfig, load_config
from controlplane.telemetry.dcgm import DcgmSource
from controlplane.telemetry.exporter import SummaryCollector
from controlplane.telemetry.readings import TelemetryError
from controlplane.telemetry.sampling import NodeSampler
from controlplane.telemetry.simulated import HOT_GPU_TEMP_C, SimulatedSource
from controlplane.telemetry.sources import make_source
from controlplane.telemetry.verdicts import judge
from policies.health import HealthReason, Verdict


def sampled(faults: list[str], samples_after: int = 2, num_gpus: int = 4):
    clock = [0.0]
    src = SimulatedSource(num_gpus, num_ib_ports=2)
    sampler = NodeSampler("node-a", "cluster", src, gpus_expected=num_gpus, clock=lambda: clock[0])
    sampler.sample()
    for kind in faults:
        src.inject_fault(kind)
    for _ in range(samples_after):
        clock[0] += 1.0
        sampler.sample()
    return src, sampler


@pytest.mark.parametrize(
    ("fault", "reason", "verdict"),
    [
        pytest.param("hot-gpu", HealthReason.GPU_OVERHEATED, Verdict.UNHEALTHY, id="hot-gpu"),
        pytest.param("xid", HealthReason.XID_FATAL, Verdict.UNHEALTHY, id="xid"),
        # Fabric faults: the GPUs still serve replicas, no gang may use the node.
        pytest.param(
            "nvlink-errors", HealthReason.NVLINK_ERRORS, Verdict.SERVING_ONLY, id="nvlink-errors"
        ),
        pytest.param("ib-errors", HealthReason.IB_ERRORS, Verdict.SERVING_ONLY, id="ib-errors"),
        pytest.param(
            "ib-link-down", HealthReason.IB_LINK_DOWN, Verdict.SERVING_ONLY, id="ib-link-down"
        ),
    ],
)
def test_each_fault_takes_the_node_out_within_two_samples(
    fault: str, reason: HealthReason, verdict: Verdict
) -> None:
    _, sampler = sampled([fault], samples_after=2)
    verdicts, _ = judge({"node-a": sampler.recent()}, HealthConfig(), None, 10.0)
    assert verdicts["node-a"].verdict is verdict, verdicts["node-a"].reason
    assert reason in verdicts["node-a"].reasons


def test_no_fault_is_healthy() -> None:
    _, sampler = sampled([], samples_after=5)
    verdicts, _ = judge({"node-a": sampler.recent()}, HealthConfig(), None, 10.0)
    assert verdicts["node-a"].verdict is Verdict.HEALTHY, verdicts["node-a"].reason
    latest = sampler.latest()
    assert latest is not None and latest["ib_ports"][0]["xmit_bytes_per_s"] == 1e9


def test_clear_stops_the_fault_and_the_node_recovers() -> None:
    src, sampler = sampled(["hot-gpu"], samples_after=2)
    src.inject_fault("clear")
    for t in (10.0, 11.0, 12.0):  # after the samples at 0, 1, 2
        sampler.clock = lambda t=t: t
        sampler.sample()
    verdicts, _ = judge({"node-a": sampler.recent()}, HealthConfig(), None, 10.0)
    assert verdicts["node-a"].verdict is Verdict.HEALTHY, verdicts["node-a"].reason
    assert sampler.latest()["faults"] == []  # type: ignore[index]


def test_exporter_renders_dcgm_names_with_node_pool_gpu_and_port_labels() -> None:
    _, sampler = sampled(["hot-gpu"], samples_after=1)
    registry = CollectorRegistry()
    registry.register(SummaryCollector(sampler.latest))
    text = generate_latest(registry).decode()
    assert f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",node="node-a",pool="cluster"}} {HOT_GPU_TEMP_C}' in text
    assert 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="3",node="node-a",pool="cluster"}' in text
    assert (
        'rcp_gpu_throttle_reason{gpu="0",node="node-a",pool="cluster",reason="hw_thermal_slowdown"} 1.0'
        in text
    )
    assert 'rcp_ib_port_up{node="node-a",pool="cluster",port="mlx5_1/1"} 1.0' in text
    assert (
        'rcp_ib_port_counters{counter="port_xmit_data",node="node-a",pool="cluster",port="mlx5_0/1"}'
        in text
    )


def test_exporter_is_empty_before_the_first_sample() -> None:
    registry = CollectorRegistry()
    registry.register(SummaryCollector(lambda: None))
    assert "DCGM_FI_DEV_GPU_TEMP" not in generate_latest(registry).decode()


@pytest.mark.parametrize(
    ("num_gpus", "kind", "message"),
    [
        pytest.param(4, "melt", "unknown fault 'melt'", id="unknown-kind"),
        pytest.param(0, "hot-gpu", "needs a node with GPUs", id="cpu-node-hot-gpu"),
        pytest.param(0, "ib-errors", "needs a node with IB ports", id="cpu-node-ib"),
    ],
)
def test_bad_fault_requests_are_refused(num_gpus: int, kind: str, message: str) -> None:
    with pytest.raises(TelemetryError, match=message):
        SimulatedSource(num_gpus).inject_fault(kind)


def test_unreachable_exporter_is_no_sample_not_missing_gpus() -> None:
    src = DcgmSource("http://127.0.0.1:9/metrics", timeout_s=0.5)
    sampler = NodeSampler("node-a", "cluster", src, gpus_expected=8)
    summary = sampler.sample()
    assert summary["source_ok"] is False and "did not answer" in summary["problems"][0]
    verdicts, _ = judge({"node-a": sampler.recent()}, HealthConfig(), None, 100.0)
    assert HealthReason.GPU_MISSING not in verdicts["node-a"].reasons
    assert verdicts["node-a"].reasons == (HealthReason.NO_TELEMETRY,)


def test_unknown_source_is_named() -> None:
    with pytest.raises(TelemetryError, match="unknown source 'ipmi'"):
        make_source("ipmi")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        pytest.param("telemetry.source=ipmi", "telemetry.source: must be one of", id="source"),
        pytest.param(
            "telemetry.interval_s=0", "telemetry.interval_s: must be >= 0.05", id="interval"
        ),
        pytest.param("telemetry.exporter_port=70000", "telemetry.exporter_port", id="port"),
        pytest.param("health.hot_samples=0", "health.hot_samples: must be >= 1", id="hot-samples"),
        pytest.param("health.fatal_xids=[79,-1]", "health.fatal_xids[1]", id="xid"),
        pytest.param("health.gpu_temp_c=hot", "health.gpu_temp_c", id="type"),
    ],
)
def test_config_errors_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)


def test_config_defaults() -> None:
    cfg = load_config(None, [])
    assert (cfg.telemetry.source, cfg.telemetry.exporter_port, cfg.health.gpu_temp_c) == (
        "simulated",
        0,
        78.0,
    )


def test_source_that_cannot_start_is_retried_and_reported() -> None:
    from controlplane.telemetry.sources import RetryingSource

    attempts = []

    def factory() -> SimulatedSource:
        attempts.append(1)
        if len(attempts) == 1:
            raise TelemetryError("NVML could not start (is the NVIDIA driver loaded?): no driver")
        return SimulatedSource(2)

    sampler = NodeSampler("node-a", "cluster", RetryingSource("nvml", factory), gpus_expected=2)
    first = sampler.sample()
    assert first["source_ok"] is False and "NVML could not start" in first["problems"][0]
    second = sampler.sample()
    assert second["source_ok"] is True and len(second["gpus"]) == 2 and len(attempts) == 2


def test_judge_parses_only_what_the_state_has_not_seen() -> None:
    """Seen summaries are skipped before parsing (bench/bench_health.py: parsing all of them
    was ~95% of the health phase); a seen one that would not even parse proves it."""
    _, sampler = sampled(["hot-gpu"], samples_after=2)
    history = sampler.recent()
    verdicts, state = judge({"node-a": history}, HealthConfig(), None, 10.0)
    assert verdicts["node-a"].verdict is Verdict.UNHEALTHY
    broken = {**history[0], "gpus": [{"no": "gpu index"}]}  # node_sample would raise on it
    again, state2 = judge({"node-a": [broken, *history]}, HealthConfig(), state, 11.0)
    assert again["node-a"].verdict is Verdict.UNHEALTHY
    assert state2.nodes["node-a"].last_sampled_s == history[-1]["sampled_s"]
