"""The NVML source against a fake `pynvml` module (no GPU, no driver here).

The fake implements the calls NvmlSource makes with NVML's documented semantics: NVMLError on
unsupported queries, milliwatts for power, bytes for memory, XID events drained with a zero
timeout until NVML_ERROR_TIMEOUT, GPM samples compared pairwise.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import pytest

from controlplane.telemetry.nvml import NvmlSource
from controlplane.telemetry.readings import TelemetryError
from controlplane.telemetry.sampling import NodeSampler

NOT_SUPPORTED, INVALID_ARGUMENT, TIMEOUT, GPU_IS_LOST, DRIVER_NOT_LOADED = 3, 2, 10, 15, 9
MESSAGES = {
    3: "Not Supported",
    2: "Invalid Argument",
    10: "Timeout",
    15: "GPU is lost",
    9: "Driver Not Loaded",
}


class NVMLError(Exception):
    """Like pynvml's: carries the NVML return code in `value`."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return MESSAGES[self.value]


@dataclass
class FakeGpu:
    uuid: str
    temp_c: int = 40
    arch: int = 9  # Hopper
    nvlink_states: list[int] = field(default_factory=lambda: [1, 1, 1, 1])
    nvlink_errors: dict[tuple[int, int], int] = field(default_factory=dict)
    ecc_uncorrected: int | None = 0
    remap: tuple[int, int, int, int] | None = (0, 0, 0, 0)
    reasons: int = 0
    tensor_pct: float = 42.0
    lost: bool = False


def fake_pynvml(gpus: list[FakeGpu], xid_events: list[tuple[int, int]] | None = None) -> Any:
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    consts = dict(
        NVML_TEMPERATURE_GPU=0,
        NVML_TEMPERATURE_THRESHOLD_SLOWDOWN=1,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_MEMORY_ERROR_TYPE_CORRECTED=0,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        NVML_FEATURE_ENABLED=1,
        NVML_NVLINK_MAX_LINKS=18,
        NVML_NVLINK_ERROR_DL_REPLAY=0,
        NVML_NVLINK_ERROR_DL_RECOVERY=1,
        NVML_NVLINK_ERROR_DL_CRC_FLIT=2,
        NVML_NVLINK_ERROR_DL_CRC_DATA=3,
        NVML_DEVICE_ARCH_HOPPER=9,
        NVML_GPM_METRICS_GET_VERSION=1,
        NVML_GPM_METRIC_ANY_TENSOR_UTIL=5,
        NVML_SUCCESS=0,
        nvmlEventTypeXidCriticalError=8,
    )
    for k, v in consts.items():
        setattr(m, k, v)
    events = list(xid_events or [])
    calls: list[str] = []
    m.calls = calls  # type: ignore[attr-defined]

    def gpu(h: int) -> FakeGpu:
        if gpus[h].lost:
            raise NVMLError(GPU_IS_LOST)
        return gpus[h]

    def unsupported(*_a: Any) -> Any:
        raise NVMLError(NOT_SUPPORTED)

    def nvlink_state(h: int, link: int) -> int:
        states = gpu(h).nvlink_states
        if link >= len(states):
            raise NVMLError(INVALID_ARGUMENT)
        return states[link]

    def event_wait(_set: Any, timeout_ms: int) -> Any:
        assert timeout_ms == 0, "the agent must never block waiting for events"
        if not events:
            raise NVMLError(TIMEOUT)
        h, xid = events.pop(0)
        return types.SimpleNamespace(device=h, eventData=xid)

    class Sample:
        def __init__(self) -> None:
            self.tensor_pct = 0.0

    class Metric:
        def __init__(self) -> None:
            self.metricId, self.nvmlReturn, self.value = 0, 0, 0.0

    class MetricsGet:
        def __init__(self) -> None:
            self.version = self.numMetrics = 0
            self.sample1: Sample | None = None
            self.sample2: Sample | None = None
            self.metrics = [Metric() for _ in range(4)]

    def gpm_get(h: int, sample: Sample) -> Sample:
        sample.tensor_pct = gpu(h).tensor_pct
        return sample

    def metrics_get(req: MetricsGet) -> MetricsGet:
        assert req.metrics[0].metricId == 5 and req.sample1 is not None and req.sample2 is not None
        req.metrics[0].value = req.sample2.tensor_pct
        return req

    def ecc(h: int, kind: int, _counter: int) -> int:
        value = gpu(h).ecc_uncorrected if kind == 1 else 3
        if value is None:
            raise NVMLError(NOT_SUPPORTED)
        return value

    def remapped(h: int) -> tuple[int, int, int, int]:
        if gpu(h).remap is None:
            raise NVMLError(NOT_SUPPORTED)
        return gpu(h).remap  # type: ignore[return-value]

    funcs = dict(
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: gpus[h].uuid.encode(),
        nvmlEventSetCreate=lambda: "events",
        nvmlDeviceRegisterEvents=lambda h, kinds, s: None,
        nvmlEventSetWait=event_wait,
        nvmlEventSetFree=lambda s: None,
        nvmlDeviceGetTemperature=lambda h, s: gpu(h).temp_c,
        nvmlDeviceGetTemperatureThreshold=lambda h, t: 87,
        nvmlDeviceGetPowerUsage=lambda h: 312_500,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000,
        nvmlDeviceGetClockInfo=lambda h, c: 1980 if c == 1 else 2619,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: gpu(h).reasons,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=2 * 2**30, total=80 * 2**30),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=100, memory=30),
        nvmlDeviceGetTotalEccErrors=ecc,
        nvmlDeviceGetRemappedRows=remapped,
        nvmlDeviceGetNvLinkState=nvlink_state,
        nvmlDeviceGetNvLinkErrorCounter=lambda h, link, c: gpu(h).nvlink_errors.get((link, c), 0),
        nvmlDeviceGetArchitecture=lambda h: gpu(h).arch,
        nvmlGpmQueryDeviceSupport=lambda h: types.SimpleNamespace(isSupportedDevice=1),
        nvmlGpmSampleAlloc=Sample,
        nvmlGpmSampleGet=gpm_get,
        nvmlGpmSampleFree=lambda s: None,
        nvmlGpmMetricsGet=metrics_get,
        c_nvmlGpmMetricsGet_t=MetricsGet,
    )
    for k, v in funcs.items():
        setattr(m, k, v)
    return m


def test_reads_every_field_in_si_units() -> None:
    nv = fake_pynvml([FakeGpu("GPU-a", temp_c=55, reasons=0x40)])
    (g,) = NvmlSource(nv).read().gpus
    assert (g.uuid, g.temp_c, g.slowdown_temp_c) == ("GPU-a", 55.0, 87.0)
    assert (g.power_w, g.power_limit_w) == (312.5, 700.0)
    assert (g.sm_clock_mhz, g.mem_clock_mhz) == (1980.0, 2619.0)
    assert (g.fb_used_mib, g.fb_total_mib, g.gpu_util_pct) == (2048.0, 81920.0, 100.0)
    assert g.throttle_reasons == ("hw_thermal_slowdown",) and g.thermal_throttle
    assert (g.ecc_sbe_volatile, g.ecc_dbe_volatile) == (3, 0)
    assert (g.row_remap_pending, g.row_remap_failure) == (False, False)
    assert (g.nvlink_links_total, g.nvlink_links_up) == (4, 4)
    assert g.last_xid == 0 and g.new_xids == ()


def test_tensor_activity_needs_two_gpm_samples_and_hopper() -> None:
    nv = fake_pynvml([FakeGpu("GPU-h", tensor_pct=42.0), FakeGpu("GPU-a", arch=8)])
    src = NvmlSource(nv)
    first = src.read().gpus
    assert first[0].tensor_active_ratio is None  # one GPM sample is not a measurement
    second = src.read().gpus
    assert second[0].tensor_active_ratio == pytest.approx(0.42)
    assert second[1].tensor_active_ratio is None  # Ampere: no GPM


def test_xid_events_are_drained_per_gpu_without_waiting() -> None:
    nv = fake_pynvml([FakeGpu("GPU-0"), FakeGpu("GPU-1")], xid_events=[(1, 79), (1, 13), (0, 48)])
    src = NvmlSource(nv)
    g0, g1 = src.read().gpus
    assert g0.new_xids == (48,) and g1.new_xids == (79, 13) and g1.last_xid == 13
    g0, g1 = src.read().gpus
    assert g0.new_xids == () and g1.new_xids == () and g1.last_xid == 13


def test_nvlink_down_and_error_counters_summed_over_links() -> None:
    nv = fake_pynvml(
        [FakeGpu("GPU-0", nvlink_states=[1, 0, 1], nvlink_errors={(0, 2): 5, (2, 2): 7, (1, 0): 3})]
    )
    (g,) = NvmlSource(nv).read().gpus
    assert (g.nvlink_links_total, g.nvlink_links_up) == (3, 2)
    assert g.nvlink_error_counts == {"crc_flit": 12, "replay": 3, "recovery": 0, "crc_data": 0}


def test_unsupported_queries_read_as_unknown() -> None:
    nv = fake_pynvml([FakeGpu("GPU-0", ecc_uncorrected=None, remap=None, nvlink_states=[])])
    (g,) = NvmlSource(nv).read().gpus
    assert g.ecc_dbe_volatile is None and g.row_remap_failure is None
    assert g.nvlink_links_total is None and g.nvlink_error_counts == {}
    assert g.temp_c == 40.0


def test_lost_gpu_is_left_out_and_named() -> None:
    gpus = [FakeGpu("GPU-0"), FakeGpu("GPU-1")]
    src = NvmlSource(fake_pynvml(gpus))
    gpus[1].lost = True
    reading = src.read()
    assert [g.gpu for g in reading.gpus] == [0]
    assert reading.problems == ("gpu 1: NVML error: GPU is lost",)
    summary = NodeSampler("n1", "cluster", src, gpus_expected=2).sample()
    assert len(summary["gpus"]) == 1 and summary["gpus_expected"] == 2


def test_missing_driver_is_a_clear_error() -> None:
    nv = fake_pynvml([])

    def no_driver() -> None:
        raise NVMLError(DRIVER_NOT_LOADED)

    nv.nvmlInit = no_driver
    with pytest.raises(TelemetryError, match="NVML could not start.*Driver Not Loaded"):
        NvmlSource(nv)


def test_fault_injection_is_refused() -> None:
    with pytest.raises(TelemetryError, match="needs telemetry.source=simulated"):
        NvmlSource(fake_pynvml([])).inject_fault("hot-gpu")


def test_close_shuts_nvml_down() -> None:
    nv = fake_pynvml([FakeGpu("GPU-0")])
    src = NvmlSource(nv)
    src.read()
    src.read()
    src.close()
    assert nv.calls == ["init", "shutdown"]
