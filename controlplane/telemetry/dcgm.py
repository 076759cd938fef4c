"""GPU readings from a dcgm-exporter scrape (Prometheus text format).

Owns: parsing the exposition text (`parse_exposition`), turning DCGM fields per GPU into
`GpuReading`s (`readings_from_scrape`), DCGM's blank sentinels, which GPUs are the pod's
(`VisibleGpus`, from ``NVIDIA_VISIBLE_DEVICES``), and `DcgmSource`, which fetches the node-local
exporter over HTTP.
Must not: compute rates or judge health.

The real exporter's quirks handled here:

- Blank sentinels: a field DCGM could not read is exported as a huge number rather than left
  out: int32 blanks 0x7ffffff0.. (2147483632..2147483647), int64 blanks from
  0x7ffffffffffffff0, fp64 blanks from 2**47 (140737488355328.0); all read as None.
- Absent fields: most counters are off by default (NVLink errors, ECC); they read as None.
- Counter resets (exporter or driver restart): counters are passed on as read; the sampler's
  `counters.counter_delta` tells a wrap, jitter and a reset apart.
- Lines that are not valid exposition lines are skipped and reported in `problems`.
- An answer with no DCGM sample at all (HTTP 200 with an empty body, an HTML error page, a
  proxy's text, another exporter's metrics) is a source failure (`TelemetryError`), never a
  reading with zero GPUs: a node whose exporter is broken is not a node whose GPUs are gone.
- A negative value (every DCGM field we read is a temperature, power, clock, ratio or count)
  is a bad reading of that field: dropped (unknown) and named in `problems`.
- dcgm-exporter reports every GPU of the host. With a `VisibleGpus` (the pod's GPUs) only
  those are read; the others belong to other pods. The pod's GPUs the scrape lacks are named
  in `problems` (and counted missing by the health policy); when none of them matches (an
  exporter without the ``UUID`` label while the pod lists UUIDs), the scrape is a source
  failure, never a pod with zero GPUs.
"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass

from controlplane.telemetry.readings import (
    GpuReading,
    SourceReading,
    TelemetryError,
    throttle_reason_names,
)

__all__ = [
    "DcgmSource",
    "Sample",
    "VisibleGpus",
    "is_blank",
    "parse_exposition",
    "readings_from_scrape",
]

_INT32_BLANK = 0x7FFFFFF0
_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
_FP64_BLANK = 140737488355328.0

# Fields DCGM stores as int64: only the int64 sentinel applies (an int64 counter may pass
# 2**31 legitimately).
_INT64_FIELDS = frozenset(
    {
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    }
)
_FP64_FIELDS = frozenset(
    {
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_SM_ACTIVE",
    }
)

NVLINK_ERROR_FIELDS = {
    "crc_flit": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "crc_data": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "replay": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "recovery": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
}

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LINE = re.compile(
    rf"^(?P<name>{_NAME})(?:\{{(?P<labels>.*)\}})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$"
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


@dataclass(frozen=True)
class Sample:
    """One exposition line: metric name, labels, value."""

    name: str
    labels: dict[str, str]
    value: float


def _unescape(value: str) -> str:
    return value.replace("\\\\", "\0").replace('\\"', '"').replace("\\n", "\n").replace("\0", "\\")


def _parse_labels(text: str) -> dict[str, str] | None:
    labels: dict[str, str] = {}
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            return None
        labels[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return labels


def parse_exposition(text: str) -> tuple[list[Sample], list[str]]:
    """Samples of a Prometheus text exposition and the lines that could not be parsed."""
    samples: list[Sample] = []
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        labels = _parse_labels(m.group("labels") or "") if m else None
        if m is None or labels is None:
            problems.append(f"line {number}: not an exposition line: {line[:80]!r}")
            continue
        try:
            value = float(m.group("value"))
        except ValueError:
            problems.append(f"line {number}: {m.group('name')}: bad value {m.group('value')!r}")
            continue
        samples.append(Sample(m.group("name"), labels, value))
    return samples, problems


def is_blank(field_name: str, value: float) -> bool:
    """Whether `value` is one of DCGM's blank / not-found / not-supported sentinels."""
    if math.isnan(value) or math.isinf(value):
        return True
    if value >= _INT64_BLANK - 1024:  # float rounding: every int64 sentinel reads as ~2**63
        return True
    if field_name in _INT64_FIELDS:
        return False
    if _FP64_BLANK <= value < _FP64_BLANK + 16:
        return True
    return field_name not in _FP64_FIELDS and _INT32_BLANK <= value <= 0x7FFFFFFF


@dataclass(frozen=True)
class VisibleGpus:
    """The GPUs of this pod, as ``NVIDIA_VISIBLE_DEVICES`` names them: UUIDs or host indexes
    (dcgm-exporter's ``UUID`` and ``gpu`` labels). The NVIDIA device plugin sets it to the
    GPUs the pod was given (Ray's per-worker ``CUDA_VISIBLE_DEVICES`` indexes the container's
    devices, so it cannot say which host GPUs are ours)."""

    uuids: frozenset[str] = frozenset()
    indexes: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, value: str | None, entries: Iterable[str] = ()) -> VisibleGpus | None:
        """From the variable's value; None means every GPU of the host is ours.

        Unset, empty, ``void`` (no NVIDIA runtime: a bare-metal node or a host-owning pod) and
        ``all`` count every GPU; ``none`` counts none. With the device plugin's
        ``volume-mounts`` strategy the value is a directory whose entry names are the devices:
        the caller lists it and passes them as `entries`. MIG devices (``MIG-...``) cannot be
        matched to a dcgm ``gpu`` label and are ignored; a list of nothing else counts every
        GPU.
        """
        text = (value or "").strip()
        if text.lower() in ("", "void", "all"):
            return None
        if text.lower() == "none":
            return cls()
        names = list(entries) if text.startswith("/") else text.split(",")
        uuids = frozenset(n.strip() for n in names if n.strip().startswith("GPU-"))
        indexes = frozenset(int(n) for n in (x.strip() for x in names) if n.isdigit())
        if not uuids and not indexes:
            return None
        return cls(uuids, indexes)

    def __contains__(self, gpu: tuple[int, str | None]) -> bool:
        index, uuid = gpu
        return index in self.indexes or (uuid is not None and uuid in self.uuids)


def _gpu_fields(
    samples: Iterable[Sample], problems: list[str]
) -> tuple[dict[int, dict[str, float]], dict[int, str]]:
    fields: dict[int, dict[str, float]] = {}
    uuids: dict[int, str] = {}
    for s in samples:
        if not s.name.startswith("DCGM_FI_") or "gpu" not in s.labels:
            continue
        try:
            gpu = int(s.labels["gpu"])
        except ValueError:
            continue
        # NVLink per-link fields carry a link label; the *_TOTAL fields do not.
        if "link" in s.labels:
            continue
        fields.setdefault(gpu, {})
        if "UUID" in s.labels:
            uuids[gpu] = s.labels["UUID"]
        if is_blank(s.name, s.value):
            continue
        if s.value < 0:
            problems.append(f"gpu {gpu} {s.name}: negative value {s.value:g}; reading ignored")
            continue
        fields[gpu][s.name] = s.value
    return fields, uuids


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _pods_gpus(
    fields: dict[int, dict[str, float]],
    uuids: dict[int, str],
    visible: VisibleGpus,
    problems: list[str],
) -> list[int]:
    """The host indexes of the scrape's GPUs that are the pod's; the pod's GPUs the scrape
    does not show are named in `problems`. `TelemetryError` when none of the pod's GPUs is in
    the scrape (see the module doc): reading that as "the pod has no GPUs" would mark every
    GPU missing."""
    ours = [gpu for gpu in sorted(fields) if (gpu, uuids.get(gpu)) in visible]
    seen_uuids = {uuids[g] for g in ours if g in uuids}
    unmatched = sorted(visible.uuids - seen_uuids) + [
        str(i) for i in sorted(visible.indexes - set(ours))
    ]
    if not visible.uuids and not visible.indexes:
        return []  # NVIDIA_VISIBLE_DEVICES=none: a pod given no GPUs
    if not ours:
        has_uuid = "with" if uuids else "without"
        raise TelemetryError(
            f"none of the pod's GPUs ({', '.join(unmatched)}) is among the "
            f"{len(fields)} GPU(s) the exporter reports (gpu labels "
            f"{', '.join(str(g) for g in sorted(fields))}, {has_uuid} UUID labels); "
            "cannot tell which GPUs are this pod's: check NVIDIA_VISIBLE_DEVICES and the "
            "exporter's labels"
        )
    for name in unmatched:
        problems.append(f"pod GPU {name}: not in the dcgm scrape (missing from the host?)")
    return ours


def readings_from_scrape(text: str, visible: VisibleGpus | None = None) -> SourceReading:
    """GPU readings from one dcgm-exporter scrape (no IB: dcgm-exporter does not export it),
    of the GPUs in `visible` (None: all of the host's). `TelemetryError` for a scrape without
    a DCGM GPU sample and when none of the pod's GPUs matches (see the module doc)."""
    samples, problems = parse_exposition(text)
    fields, uuids = _gpu_fields(samples, problems)
    if not fields:
        shown = " ".join(text.split())[:80]
        raise TelemetryError(
            "dcgm-exporter answered with no DCGM_FI_* GPU samples "
            f"({len(text)} bytes{': ' + repr(shown) if shown else ''}); "
            "is the URL a dcgm-exporter, and is it ready?"
        )
    ours = sorted(fields) if visible is None else _pods_gpus(fields, uuids, visible, problems)
    gpus = []
    for gpu in ours:
        f = fields[gpu]
        used = f.get("DCGM_FI_DEV_FB_USED")
        free = f.get("DCGM_FI_DEV_FB_FREE")
        total = None
        if used is not None and free is not None:
            total = used + free + f.get("DCGM_FI_DEV_FB_RESERVED", 0.0)
        mask = f.get(
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", f.get("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
        )
        remap_failure = f.get("DCGM_FI_DEV_ROW_REMAP_FAILURE")
        remap_pending = f.get("DCGM_FI_DEV_ROW_REMAP_PENDING")
        nvlink = {k: int(f[name]) for k, name in NVLINK_ERROR_FIELDS.items() if name in f}
        tensor = f.get("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
        gpus.append(
            GpuReading(
                gpu=gpu,
                uuid=uuids.get(gpu),
                temp_c=f.get("DCGM_FI_DEV_GPU_TEMP"),
                slowdown_temp_c=f.get("DCGM_FI_DEV_SLOWDOWN_TEMP"),
                power_w=f.get("DCGM_FI_DEV_POWER_USAGE"),
                power_limit_w=f.get("DCGM_FI_DEV_POWER_MGMT_LIMIT"),
                sm_clock_mhz=f.get("DCGM_FI_DEV_SM_CLOCK"),
                mem_clock_mhz=f.get("DCGM_FI_DEV_MEM_CLOCK"),
                throttle_reasons=throttle_reason_names(int(mask)) if mask is not None else (),
                fb_used_mib=used,
                fb_total_mib=total,
                gpu_util_pct=f.get("DCGM_FI_DEV_GPU_UTIL"),
                tensor_active_ratio=None if tensor is None else min(max(tensor, 0.0), 1.0),
                last_xid=_int(f.get("DCGM_FI_DEV_XID_ERRORS")),
                ecc_sbe_volatile=_int(f.get("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")),
                ecc_dbe_volatile=_int(f.get("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")),
                remapped_rows_correctable=_int(f.get("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS")),
                remapped_rows_uncorrectable=_int(f.get("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")),
                row_remap_pending=None if remap_pending is None else remap_pending > 0,
                row_remap_failure=None if remap_failure is None else remap_failure > 0,
                nvlink_error_counts=nvlink,
            )
        )
    return SourceReading(gpus=tuple(gpus), problems=tuple(problems))


class DcgmSource:
    """Scrapes a node-local dcgm-exporter. NVLink link state is not exported by it (None)."""

    kind = "dcgm"

    def __init__(
        self, url: str, timeout_s: float = 2.0, visible: VisibleGpus | None = None
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.visible = visible

    def read(self) -> SourceReading:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as response:
                text = response.read().decode("utf-8", errors="replace")
        except (urllib.error.URLError, OSError) as exc:
            raise TelemetryError(f"dcgm-exporter at {self.url} did not answer: {exc}") from exc
        try:
            return readings_from_scrape(text, self.visible)
        except TelemetryError as exc:
            raise TelemetryError(f"dcgm-exporter at {self.url}: {exc}") from exc

    def inject_fault(self, kind: str) -> None:
        raise TelemetryError("fault injection needs telemetry.source=simulated (this is dcgm)")
