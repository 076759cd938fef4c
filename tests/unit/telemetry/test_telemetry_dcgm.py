"""dcgm-exporter scrapes: the default counters' names (read from dcgm-exporter's own CSV, found
through tests.reference_data; a test that needs it skips where it is missing), DCGM's blank
sentinels, absent fields, garbage lines, answers with no DCGM sample, negative values, the pod's
GPUs only, and counter resets across scrapes."""

from __future__ import annotations

import csv
from collections.abc import Mapping

import pytest

from controlplane.telemetry import dcgm
from controlplane.telemetry.agent import pod_gpus
from controlplane.telemetry.dcgm import (
    DcgmSource,
    VisibleGpus,
    is_blank,
    parse_exposition,
    readings_from_scrape,
)
from controlplane.telemetry.exporter import GPU_METRICS
from controlplane.telemetry.readings import SourceReading, TelemetryError
from controlplane.telemetry.sampling import NodeSampler
from tests.reference_data import dcgm_counters

# Fields we read that DCGM has but the default CSV does not list.
NOT_IN_CSV = {
    "DCGM_FI_DEV_SLOWDOWN_TEMP",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
}


def csv_fields() -> dict[str, tuple[str, bool]]:
    """name -> (type, enabled by default), commented-out rows included. Skips the calling
    test where the CSV is not at hand (tests.reference_data)."""
    fields: dict[str, tuple[str, bool]] = {}
    for row in csv.reader(dcgm_counters().read_text().splitlines()):
        if not row or not row[0].strip():
            continue
        name = row[0].strip()
        enabled = not name.startswith("#")
        name = name.lstrip("# ").strip()
        if name.startswith("DCGM_") and len(row) >= 2:
            fields[name] = (row[1].strip(), enabled)
    return fields


LABELS = (
    'UUID="GPU-{i:04d}-aaaa",pci_bus_id="00000000:{i:02d}:00.0",device="nvidia{i}",'
    'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-7",DCGM_FI_DRIVER_VERSION="550.54.15"'
)


def exposition(values: dict[str, dict[int, object]], types: Mapping[str, str]) -> str:
    """Exposition text as dcgm-exporter writes it: HELP/TYPE (a field not in `types` is a
    gauge), then one line per GPU."""
    lines = []
    for name, per_gpu in values.items():
        lines.append(f"# HELP {name} {name} help.")
        lines.append(f"# TYPE {name} {types.get(name, 'gauge')}")
        for gpu, value in per_gpu.items():
            lines.append(f'{name}{{gpu="{gpu}",{LABELS.format(i=gpu)}}} {value}')
    return "\n".join(lines) + "\n"


def scrape(values: dict[str, dict[int, object]]) -> str:
    """`exposition` with each field's type from the reference CSV."""
    return exposition(values, {name: kind for name, (kind, _on) in csv_fields().items()})


def temps_scrape(gpus: range) -> str:
    """GPU temperatures only, with uuid labels: needs no reference data (the tests built from
    it run in a clone without it, and it may be called while the module is collected)."""
    return exposition({"DCGM_FI_DEV_GPU_TEMP": {i: 40 + i for i in gpus}}, {})


def defaults_scrape(**overrides: dict[int, object]) -> str:
    """Every default-enabled DCGM_FI_* field for GPUs 0 and 1, with plausible values."""
    values: dict[str, dict[int, object]] = {}
    for name, (kind, enabled) in csv_fields().items():
        if enabled and name.startswith("DCGM_FI_") and kind in ("gauge", "counter"):
            values[name] = {0: 1, 1: 1}
    values.update(
        {
            "DCGM_FI_DEV_GPU_TEMP": {0: 34, 1: 81},
            "DCGM_FI_DEV_POWER_USAGE": {0: 71.5, 1: 690.25},
            "DCGM_FI_DEV_FB_USED": {0: 1000, 1: 2000},
            "DCGM_FI_DEV_FB_FREE": {0: 80000, 1: 79000},
            "DCGM_FI_DEV_FB_RESERVED": {0: 559, 1: 559},
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": {0: 0.0, 1: 0.734},
            "DCGM_FI_DEV_XID_ERRORS": {0: 0, 1: 0},
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": {0: 0, 1: 0},
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": {0: 0, 1: 0},
        }
    )
    values.update(overrides)
    return scrape(values)


def test_reference_csv_has_the_names_we_read_and_export() -> None:
    fields = csv_fields()
    assert "DCGM_FI_DEV_GPU_TEMP" in fields and fields["DCGM_FI_DEV_GPU_TEMP"][1]
    ours = {name for name, _key, _help in GPU_METRICS if name.startswith("DCGM_")}
    missing = sorted(ours - set(fields) - NOT_IN_CSV)
    assert missing == [], f"exported under DCGM names the exporter does not know: {missing}"


def test_default_scrape_becomes_one_reading_per_gpu() -> None:
    reading = readings_from_scrape(defaults_scrape())
    assert reading.problems == ()
    g0, g1 = reading.gpus
    assert (g0.gpu, g0.uuid, g0.temp_c, g0.power_w) == (0, "GPU-0000-aaaa", 34.0, 71.5)
    assert (g1.temp_c, g1.tensor_active_ratio, g1.fb_used_mib, g1.fb_total_mib) == (
        81.0,
        0.734,
        2000.0,
        2000.0 + 79000.0 + 559.0,
    )
    assert g1.last_xid == 0 and g1.row_remap_failure is False
    # off by default in dcgm-exporter: absent, so unknown rather than zero
    assert g1.ecc_dbe_volatile is None and g1.nvlink_error_counts == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("DCGM_FI_DEV_GPU_TEMP", 2147483632, id="int32-blank"),
        pytest.param("DCGM_FI_DEV_GPU_TEMP", 2147483634, id="int32-not-supported"),
        pytest.param("DCGM_FI_DEV_POWER_USAGE", 140737488355328.0, id="fp64-blank"),
        pytest.param("DCGM_FI_DEV_POWER_USAGE", 140737488355330.0, id="fp64-not-supported"),
        pytest.param("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 9223372036854775792, id="int64-blank"),
        pytest.param("DCGM_FI_DEV_GPU_TEMP", "NaN", id="nan"),
    ],
)
def test_blank_sentinels_read_as_unknown(field: str, value: object) -> None:
    assert is_blank(field, float(value))  # type: ignore[arg-type]
    g = readings_from_scrape(defaults_scrape(**{field: {0: value, 1: 50}})).gpus[0]
    attr = {"DCGM_FI_DEV_GPU_TEMP": "temp_c", "DCGM_FI_DEV_POWER_USAGE": "power_w"}.get(field)
    if attr:
        assert getattr(g, attr) is None


def test_int64_counter_past_int32_range_is_a_value_not_a_blank() -> None:
    assert not is_blank("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 2147483640.0)
    assert not is_blank("DCGM_FI_DEV_GPU_TEMP", 2147483631.0)


def test_garbage_lines_are_skipped_and_named() -> None:
    text = (
        defaults_scrape()
        + 'DCGM_FI_DEV_GPU_TEMP{gpu="0" 12\nthis is not a metric\n'
        + 'DCGM_FI_DEV_SM_CLOCK{gpu="0"} fast\n'
    )
    samples, problems = parse_exposition(text)
    assert len(problems) == 3
    assert any("bad value 'fast'" in p for p in problems)
    assert readings_from_scrape(text).gpus[0].temp_c == 34.0


def test_labels_with_escapes_and_timestamps_parse() -> None:
    text = 'DCGM_FI_DEV_GPU_TEMP{gpu="3",modelName="A \\"quoted\\", name",UUID="GPU-x"} 55 1700000000000\n'
    (s,), problems = parse_exposition(text)
    assert problems == [] and s.labels["modelName"] == 'A "quoted", name' and s.value == 55.0
    assert readings_from_scrape(text).gpus[0].gpu == 3


def test_throttle_mask_and_nvlink_totals_when_enabled() -> None:
    text = defaults_scrape(
        DCGM_FI_DEV_CLOCK_THROTTLE_REASONS={0: 0x40 | 0x4, 1: 0},
        DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL={0: 12, 1: 0},
        DCGM_FI_DEV_ECC_DBE_VOL_TOTAL={0: 1, 1: 0},
        DCGM_FI_DEV_ROW_REMAP_FAILURE={0: 1, 1: 0},
    )
    g0, g1 = readings_from_scrape(text).gpus
    assert g0.throttle_reasons == ("sw_power_cap", "hw_thermal_slowdown") and g0.thermal_throttle
    assert not g1.thermal_throttle
    assert g0.nvlink_error_counts == {"crc_flit": 12} and g0.ecc_dbe_volatile == 1
    assert g0.row_remap_failure is True


class _Scrapes:
    """A source that replays scrape texts, as DcgmSource would fetch them."""

    kind = "dcgm"

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def read(self) -> SourceReading:
        return readings_from_scrape(self.texts.pop(0))

    def inject_fault(self, kind: str) -> None:
        raise AssertionError


def test_counter_reset_and_new_xid_across_scrapes() -> None:
    texts = [
        defaults_scrape(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL={0: 1000, 1: 0}),
        defaults_scrape(
            DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL={0: 1010, 1: 0},
            DCGM_FI_DEV_XID_ERRORS={0: 79, 1: 0},
        ),
        # exporter/driver restarted: the counter starts again from zero
        defaults_scrape(
            DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL={0: 4, 1: 0},
            DCGM_FI_DEV_XID_ERRORS={0: 79, 1: 0},
        ),
    ]
    clock = [0.0]
    s = NodeSampler("n1", "cluster", _Scrapes(texts), clock=lambda: clock[0])
    first = s.sample()["gpus"][0]
    assert first["nvlink_errors_per_s"] is None and first["new_xids"] == []
    clock[0] = 2.0
    second = s.sample()["gpus"][0]
    assert second["nvlink_errors_per_s"] == pytest.approx(5.0)
    assert second["new_xids"] == [79]
    clock[0] = 4.0
    third = s.sample()["gpus"][0]
    assert third["nvlink_errors_per_s"] is None  # a reset: no rate for that interval
    assert third["new_xids"] == []  # the same last XID is not new


NOT_DCGM = [
    pytest.param("", id="empty-body"),
    pytest.param("\n\n", id="blank-lines"),
    pytest.param(
        "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>", id="html"
    ),
    pytest.param(
        "# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 12\n", id="go-only"
    ),
    pytest.param('DCGM_FI_DEV_GPU_TEMP{UUID="GPU-x"} 40\n', id="dcgm-without-gpu-label"),
    pytest.param("ok\n", id="plain-text"),
]


@pytest.mark.parametrize("text", NOT_DCGM)
def test_an_answer_with_no_dcgm_sample_is_a_source_failure(text: str) -> None:
    with pytest.raises(TelemetryError, match="no DCGM_FI_"):
        readings_from_scrape(text)


def answer_every_scrape(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """Every dcgm-exporter scrape gets an HTTP 200 with `text` as its body."""

    class Answer:
        def __enter__(self) -> Answer:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def read(self) -> bytes:
            return text.encode()

    monkeypatch.setattr(dcgm.urllib.request, "urlopen", lambda url, timeout: Answer())


@pytest.mark.parametrize("text", NOT_DCGM)
def test_an_empty_200_makes_no_sample_not_a_node_with_zero_gpus(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer_every_scrape(monkeypatch, text)
    summary = NodeSampler("n1", "cluster", DcgmSource("http://x/metrics"), gpus_expected=8).sample()
    assert summary["source_ok"] is False and summary["gpus"] == []
    assert "dcgm-exporter at http://x/metrics" in summary["problems"][0]


def test_a_negative_value_loses_that_field_only() -> None:
    text = defaults_scrape(
        DCGM_FI_DEV_ECC_DBE_VOL_TOTAL={0: -1, 1: 0},
        DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL={0: -7, 1: 3},
    )
    reading = readings_from_scrape(text)
    g0, g1 = reading.gpus
    assert g0.ecc_dbe_volatile is None and g0.nvlink_error_counts == {}
    assert g0.temp_c == 34.0 and g1.nvlink_error_counts == {"crc_flit": 3}
    assert len(reading.problems) == 2 and "negative value -1" in reading.problems[0]


def test_a_negative_counter_does_not_lose_the_sample() -> None:
    class Negative:
        kind = "dcgm"

        def read(self) -> SourceReading:
            g = readings_from_scrape(defaults_scrape()).gpus[0]
            from dataclasses import replace

            return SourceReading(gpus=(replace(g, nvlink_error_counts={"crc_flit": -5}),))

        def inject_fault(self, kind: str) -> None:
            raise AssertionError

    summary = NodeSampler("n1", "cluster", Negative()).sample()
    assert summary["source_ok"] is True and summary["gpus"][0]["temp_c"] == 34.0
    assert summary["bad_counter_readings"] == 1
    assert any("negative value -5" in p for p in summary["problems"])


def test_jitter_is_not_billions_of_errors_per_second() -> None:
    texts = [
        defaults_scrape(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL={0: 2**40, 1: 0}),
        defaults_scrape(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL={0: 2**40 - 2, 1: 0}),
    ]
    clock = [0.0]
    s = NodeSampler("n1", "cluster", _Scrapes(texts), clock=lambda: clock[0])
    s.sample()
    clock[0] = 1.0
    assert s.sample()["gpus"][0]["nvlink_errors_per_s"] == 0.0


@pytest.mark.parametrize(
    ("value", "entries", "expected"),
    [
        pytest.param(None, (), None, id="unset-host-owns-all"),
        pytest.param("", (), None, id="empty"),
        pytest.param("all", (), None, id="all"),
        pytest.param("void", (), None, id="void"),
        pytest.param("none", (), VisibleGpus(), id="none"),
        pytest.param(
            "GPU-0002-aaaa,GPU-0005-aaaa",
            (),
            VisibleGpus(frozenset({"GPU-0002-aaaa", "GPU-0005-aaaa"})),
            id="uuids",
        ),
        pytest.param("1, 3", (), VisibleGpus(indexes=frozenset({1, 3})), id="indexes"),
        pytest.param("MIG-1234", (), None, id="mig-only-counts-all"),
        pytest.param(
            "/var/run/nvidia-container-devices",
            ("GPU-0001-aaaa",),
            VisibleGpus(frozenset({"GPU-0001-aaaa"})),
            id="volume-mounts",
        ),
    ],
)
def test_visible_gpus_parse(
    value: str | None, entries: tuple[str, ...], expected: VisibleGpus | None
) -> None:
    assert VisibleGpus.parse(value, entries) == expected


def test_only_the_pods_gpus_are_counted() -> None:
    host = temps_scrape(range(8))
    assert len(readings_from_scrape(host).gpus) == 8
    by_uuid = readings_from_scrape(host, VisibleGpus.parse("GPU-0002-aaaa,GPU-0005-aaaa"))
    assert [(g.gpu, g.temp_c) for g in by_uuid.gpus] == [(2, 42.0), (5, 45.0)]
    by_index = readings_from_scrape(host, VisibleGpus.parse("0,7"))
    assert [g.gpu for g in by_index.gpus] == [0, 7]
    # A GPU of the pod that dcgm does not report is missing (the health policy's business).
    assert len(readings_from_scrape(host, VisibleGpus.parse("GPU-0002-aaaa,GPU-9")).gpus) == 1


def _no_uuid_scrape(gpus: range) -> str:
    return "".join(f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",modelName="H100"}} 40\n' for i in gpus)


@pytest.mark.parametrize(
    ("text", "visible", "gpus", "problems"),
    [
        pytest.param(
            temps_scrape(range(8)),
            "GPU-0002-aaaa,GPU-0009-aaaa",
            [2],
            ["pod GPU GPU-0009-aaaa: not in the dcgm scrape"],
            id="partial-uuid-match-keeps-matched-names-unmatched",
        ),
        pytest.param(
            temps_scrape(range(4)),
            "1,6",
            [1],
            ["pod GPU 6: not in the dcgm scrape"],
            id="partial-index-match",
        ),
        pytest.param(_no_uuid_scrape(range(8)), "3", [3], [], id="index-needs-no-uuid-label"),
        pytest.param(_no_uuid_scrape(range(8)), "none", [], [], id="pod-without-gpus"),
    ],
)
def test_the_pods_gpus_the_scrape_lacks_are_problems(
    text: str, visible: str, gpus: list[int], problems: list[str]
) -> None:
    reading = readings_from_scrape(text, VisibleGpus.parse(visible))
    assert [g.gpu for g in reading.gpus] == gpus
    assert [p.split(" (")[0] for p in reading.problems] == problems


@pytest.mark.parametrize(
    ("text", "visible"),
    [
        pytest.param(_no_uuid_scrape(range(8)), "GPU-aaaa,GPU-bbbb", id="exporter-without-uuid"),
        pytest.param(
            temps_scrape(range(8)),
            "GPU-ffff-0000",
            id="uuid-of-another-host",
        ),
        pytest.param(_no_uuid_scrape(range(4)), "5,6", id="indexes-beyond-the-host"),
    ],
)
def test_a_scrape_matching_none_of_the_pods_gpus_is_a_source_failure(
    text: str, visible: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(TelemetryError, match="none of the pod's GPUs"):
        readings_from_scrape(text, VisibleGpus.parse(visible))

    answer_every_scrape(monkeypatch, text)
    source = DcgmSource("http://x/metrics", visible=VisibleGpus.parse(visible))
    summary = NodeSampler("n1", "cluster", source, gpus_expected=2).sample()
    assert summary["source_ok"] is False and summary["gpus"] == []


def test_the_agent_reads_the_pods_gpus_from_nvidia_visible_devices() -> None:
    assert pod_gpus({"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}) == VisibleGpus(
        frozenset({"GPU-a", "GPU-b"})
    )
    assert pod_gpus({}) is None
