"""GPU readings through NVML (the `nvidia-ml-py` package, imported as `pynvml`).

Owns: `NvmlSource`, the only code that calls NVML. It is imported lazily: constructing an
`NvmlSource` without a `pynvml` module given imports it then, and raises `TelemetryError` if the
package or the driver is missing. Tests pass a fake module.
Must not: change any GPU setting (no clocks, no persistence mode, no GPM streaming), compute
rates or judge health.

XIDs come from critical-XID events, registered once and drained without waiting on every
read; tensor-pipe activity needs Hopper or newer with GPM support (the metric between this
read's GPM sample and the previous one). A query that is not supported or fails yields None
for its field only.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from controlplane.telemetry.readings import (
    GpuReading,
    SourceReading,
    TelemetryError,
    throttle_reason_names,
)

__all__ = ["NvmlSource"]

_NVLINK_COUNTERS = {
    "replay": "NVML_NVLINK_ERROR_DL_REPLAY",
    "recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
    "crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA",
}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Gpu:
    """Per-GPU handles and state kept between reads."""

    def __init__(self, index: int, handle: Any) -> None:
        self.index = index
        self.handle = handle
        self.gpm_sample: Any = None
        self.gpm_supported: bool | None = None
        self.nvlink_links: int | None = None
        self.last_xid: int | None = None
        self.uuid: str | None = None


class NvmlSource:
    kind = "nvml"

    def __init__(self, pynvml: ModuleType | None = None) -> None:
        if pynvml is None:
            try:
                pynvml = importlib.import_module("pynvml")
            except ImportError as exc:
                raise TelemetryError(
                    "telemetry.source=nvml needs the nvidia-ml-py package "
                    "(pip install 'nvidia-ml-py>=12.535,<14')"
                ) from exc
        self.nv = pynvml
        try:
            self.nv.nvmlInit()
        except self.nv.NVMLError as exc:
            raise TelemetryError(
                f"NVML could not start (is the NVIDIA driver loaded?): {exc}"
            ) from exc
        self.gpus = [
            _Gpu(i, self.nv.nvmlDeviceGetHandleByIndex(i))
            for i in range(self.nv.nvmlDeviceGetCount())
        ]
        for g in self.gpus:
            uuid = self._call(self.nv.nvmlDeviceGetUUID, g.handle)
            g.uuid = None if uuid is None else _text(uuid)
        self.events: Any = None
        try:
            self.events = self.nv.nvmlEventSetCreate()
            for g in self.gpus:
                self.nv.nvmlDeviceRegisterEvents(
                    g.handle, self.nv.nvmlEventTypeXidCriticalError, self.events
                )
        except self.nv.NVMLError:
            self.events = None  # XIDs are then unknown (None), not zero

    def close(self) -> None:
        for g in self.gpus:
            if g.gpm_sample is not None:
                self._call(self.nv.nvmlGpmSampleFree, g.gpm_sample)
        if self.events is not None:
            self._call(self.nv.nvmlEventSetFree, self.events)
        self._call(self.nv.nvmlShutdown)

    def _call(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)`, or None when NVML says no (not supported, no permission). A lost GPU
        (NVML_ERROR_GPU_IS_LOST) is raised: the whole GPU is then left out of the reading."""
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            if getattr(exc, "value", None) == getattr(self.nv, "NVML_ERROR_GPU_IS_LOST", 15):
                raise
            return None

    def _drain_xids(self) -> dict[int, list[int]]:
        by_gpu: dict[int, list[int]] = {}
        if self.events is None:
            return by_gpu
        by_uuid = {g.uuid: g.index for g in self.gpus if g.uuid is not None}
        for _ in range(1024):  # bounded: never spin on a flood of events
            try:
                data = self.nv.nvmlEventSetWait(self.events, 0)
            except self.nv.NVMLError:
                break  # NVML_ERROR_TIMEOUT: nothing pending
            uuid = self._call(self.nv.nvmlDeviceGetUUID, data.device)
            index = by_uuid.get(_text(uuid)) if uuid is not None else None
            if index is not None:
                by_gpu.setdefault(index, []).append(int(data.eventData))
        return by_gpu

    def _nvlink(self, g: _Gpu) -> tuple[int | None, int | None, dict[str, int]]:
        nv = self.nv
        if g.nvlink_links is None:
            links = 0
            for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
                if self._call(nv.nvmlDeviceGetNvLinkState, g.handle, link) is None:
                    break
                links += 1
            g.nvlink_links = links
        if not g.nvlink_links:
            return None, None, {}
        up = 0
        errors: dict[str, int] = {}
        for link in range(g.nvlink_links):
            if self._call(nv.nvmlDeviceGetNvLinkState, g.handle, link) == nv.NVML_FEATURE_ENABLED:
                up += 1
            for name, const in _NVLINK_COUNTERS.items():
                value = self._call(
                    nv.nvmlDeviceGetNvLinkErrorCounter, g.handle, link, getattr(nv, const)
                )
                if value is not None:
                    errors[name] = errors.get(name, 0) + int(value)
        return g.nvlink_links, up, errors

    def _tensor_active(self, g: _Gpu) -> float | None:
        nv = self.nv
        if g.gpm_supported is None:
            arch = self._call(nv.nvmlDeviceGetArchitecture, g.handle)
            support = self._call(nv.nvmlGpmQueryDeviceSupport, g.handle)
            g.gpm_supported = bool(
                arch is not None
                and arch >= nv.NVML_DEVICE_ARCH_HOPPER
                and support is not None
                and support.isSupportedDevice
            )
        if not g.gpm_supported:
            return None
        sample = self._call(nv.nvmlGpmSampleAlloc)
        if sample is None or self._call(nv.nvmlGpmSampleGet, g.handle, sample) is None:
            return None
        previous, g.gpm_sample = g.gpm_sample, sample
        if previous is None:
            return None
        try:
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = 1
            request.sample1 = previous
            request.sample2 = sample
            request.metrics[0].metricId = nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL
            result = nv.nvmlGpmMetricsGet(request)
            metric = result.metrics[0]
            if metric.nvmlReturn != nv.NVML_SUCCESS:
                return None
            return min(max(float(metric.value) / 100.0, 0.0), 1.0)
        except nv.NVMLError:
            return None
        finally:
            self._call(nv.nvmlGpmSampleFree, previous)

    def _read_gpu(self, g: _Gpu, xids: list[int]) -> GpuReading:
        nv, h, call = self.nv, g.handle, self._call

        def ecc(kind: Any) -> int | None:
            return _int(call(nv.nvmlDeviceGetTotalEccErrors, h, kind, nv.NVML_VOLATILE_ECC))

        power_mw = call(nv.nvmlDeviceGetPowerUsage, h)
        limit_mw = call(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        reasons_fn = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        reasons = call(reasons_fn, h)
        memory = call(nv.nvmlDeviceGetMemoryInfo, h)
        util = call(nv.nvmlDeviceGetUtilizationRates, h)
        remap = call(nv.nvmlDeviceGetRemappedRows, h)
        links_total, links_up, nvlink_errors = self._nvlink(g)
        if xids:
            g.last_xid = xids[-1]
        elif g.last_xid is None and self.events is not None:
            g.last_xid = 0
        return GpuReading(
            gpu=g.index,
            uuid=g.uuid,
            temp_c=_float(call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)),
            slowdown_temp_c=_float(
                call(
                    nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
                )
            ),
            power_w=None if power_mw is None else power_mw / 1000.0,
            power_limit_w=None if limit_mw is None else limit_mw / 1000.0,
            sm_clock_mhz=_float(call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)),
            mem_clock_mhz=_float(call(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)),
            throttle_reasons=() if reasons is None else throttle_reason_names(int(reasons)),
            fb_used_mib=None if memory is None else memory.used / 2**20,
            fb_total_mib=None if memory is None else memory.total / 2**20,
            gpu_util_pct=None if util is None else float(util.gpu),
            tensor_active_ratio=self._tensor_active(g),
            last_xid=g.last_xid,
            new_xids=tuple(xids),
            ecc_sbe_volatile=ecc(nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ecc_dbe_volatile=ecc(nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            remapped_rows_correctable=None if remap is None else int(remap[0]),
            remapped_rows_uncorrectable=None if remap is None else int(remap[1]),
            row_remap_pending=None if remap is None else bool(remap[2]),
            row_remap_failure=None if remap is None else bool(remap[3]),
            nvlink_links_total=links_total,
            nvlink_links_up=links_up,
            nvlink_error_counts=nvlink_errors,
        )

    def read(self) -> SourceReading:
        xids = self._drain_xids()
        problems = []
        gpus = []
        for g in self.gpus:
            try:
                gpus.append(self._read_gpu(g, xids.get(g.index, [])))
            except self.nv.NVMLError as exc:  # GPU_IS_LOST: the GPU is left out
                problems.append(f"gpu {g.index}: NVML error: {exc}")
        return SourceReading(gpus=tuple(gpus), problems=tuple(problems))

    def inject_fault(self, kind: str) -> None:
        raise TelemetryError("fault injection needs telemetry.source=simulated (this is nvml)")


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
