"""InfiniBand sysfs: fixture trees laid out as the kernel documents them
(Documentation/ABI/stable/sysfs-class-infiniband), read once and as rates over samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.telemetry.infiniband import parse_rate, parse_state, read_ports
from controlplane.telemetry.readings import SourceReading
from controlplane.telemetry.sampling import NodeSampler

HEALTHY_COUNTERS = {
    "port_xmit_data": 1000,
    "port_rcv_data": 2000,
    "symbol_error": 0,
    "link_error_recovery": 0,
    "link_downed": 0,
    "port_rcv_errors": 0,
    "port_xmit_discards": 0,
    "port_xmit_wait": 0,
    "excessive_buffer_overrun_errors": 0,
}


def make_port(
    root: Path,
    device: str = "mlx5_0",
    port: int = 1,
    *,
    state: str = "4: ACTIVE",
    phys_state: str = "5: LinkUp",
    rate: str = "400 Gb/sec (4X NDR)",
    counters: dict[str, object] | None = None,
    hw_counters: dict[str, object] | None = None,
) -> Path:
    """Write one port's sysfs files the way the kernel shows them (value + newline)."""
    d = root / device / "ports" / str(port)
    (d / "counters").mkdir(parents=True, exist_ok=True)
    (d / "hw_counters").mkdir(parents=True, exist_ok=True)
    for name, text in (
        ("state", state),
        ("phys_state", phys_state),
        ("rate", rate),
        ("link_layer", "InfiniBand"),
    ):
        (d / name).write_text(f"{text}\n")
    for name, value in (HEALTHY_COUNTERS if counters is None else counters).items():
        (d / "counters" / name).write_text(f"{value}\n")
    for name, value in (hw_counters or {"out_of_buffer": 0}).items():
        (d / "hw_counters" / name).write_text(f"{value}\n")
    return d


@pytest.mark.parametrize(
    ("text", "rate", "width"),
    [
        pytest.param("400 Gb/sec (4X NDR)", 400.0, 4, id="ndr-4x"),
        pytest.param("100 Gb/sec (4X EDR)", 100.0, 4, id="edr-4x"),
        pytest.param("25 Gb/sec (1X EDR)", 25.0, 1, id="edr-1x-degraded"),
        pytest.param("10 Gb/sec (4X)", 10.0, 4, id="sdr-no-speed-name"),
        pytest.param("2.5 Gb/sec (1X SDR)", 2.5, 1, id="fractional"),
        pytest.param("200 Gb/sec", 200.0, None, id="no-width"),
        pytest.param("fast", None, None, id="garbage"),
    ],
)
def test_parse_rate(text: str, rate: float | None, width: int | None) -> None:
    assert parse_rate(text) == (rate, width)


@pytest.mark.parametrize(
    ("text", "name"),
    [
        pytest.param("4: ACTIVE", "ACTIVE", id="active"),
        pytest.param("1: DOWN", "DOWN", id="down"),
        pytest.param("5: LinkUp", "LinkUp", id="phys-linkup"),
        pytest.param("3: Disabled", "Disabled", id="phys-disabled"),
        pytest.param("ACTIVE", None, id="no-number"),
    ],
)
def test_parse_state(text: str, name: str | None) -> None:
    assert parse_state(text) == name


def test_reads_every_port_with_state_rate_and_counters(tmp_path: Path) -> None:
    make_port(tmp_path, "mlx5_0", 1)
    make_port(
        tmp_path, "mlx5_1", 1, state="1: DOWN", phys_state="3: Disabled", rate="10 Gb/sec (4X)"
    )
    ports, problems = read_ports(tmp_path)
    assert problems == []
    assert [(p.name, p.state, p.phys_state, p.up, p.rate_gbps, p.width) for p in ports] == [
        ("mlx5_0/1", "ACTIVE", "LinkUp", True, 400.0, 4),
        ("mlx5_1/1", "DOWN", "Disabled", False, 10.0, 4),
    ]
    assert ports[0].counters["port_rcv_data"] == 2000
    assert ports[0].hw_counters == {"out_of_buffer": 0}


def test_missing_root_means_no_ports(tmp_path: Path) -> None:
    assert read_ports(tmp_path / "absent") == ([], [])


def test_missing_files_and_garbage_values_are_named_and_the_rest_kept(tmp_path: Path) -> None:
    d = make_port(
        tmp_path,
        counters={
            "port_xmit_data": "12abc",
            "symbol_error": "-3",
            "port_rcv_data": 40,
            "link_downed": "",
        },
    )
    (d / "rate").unlink()
    (d / "phys_state").write_text("LinkUp\n")
    ports, problems = read_ports(tmp_path)
    (p,) = ports
    assert p.counters == {"port_rcv_data": 40}
    assert p.rate_gbps is None and p.phys_state is None and p.state == "ACTIVE"
    text = "\n".join(problems)
    for expected in (
        "rate: missing",
        "phys_state: cannot parse",
        "port_xmit_data: not a counter",
        "symbol_error: negative",
        "link_downed: not a counter",
    ):
        assert expected in text


def test_saturated_error_counter_is_reported(tmp_path: Path) -> None:
    make_port(tmp_path, counters={**HEALTHY_COUNTERS, "symbol_error": 65535})
    _, problems = read_ports(tmp_path)
    assert any("symbol_error: saturated at 65535" in p for p in problems)


class _NoGpus:
    kind = "nvml"

    def read(self) -> SourceReading:
        return SourceReading()

    def inject_fault(self, kind: str) -> None:
        raise AssertionError


def sampler_over(root: Path) -> tuple[NodeSampler, list[float]]:
    clock = [0.0]
    s = NodeSampler("n1", "cluster", _NoGpus(), ib_sysfs_root=root, clock=lambda: clock[0])
    return s, clock


def test_rates_from_deltas_count_data_in_4_byte_words(tmp_path: Path) -> None:
    s, clock = sampler_over(tmp_path)
    make_port(tmp_path, counters={**HEALTHY_COUNTERS, "port_xmit_data": 1000, "symbol_error": 2})
    first = s.sample()["ib_ports"][0]
    assert first["xmit_bytes_per_s"] is None and first["errors_per_s"] is None
    clock[0] = 2.0
    make_port(
        tmp_path,
        counters={
            **HEALTHY_COUNTERS,
            "port_xmit_data": 1000 + 500_000,
            "port_rcv_data": 2000,
            "symbol_error": 12,
            "port_rcv_errors": 4,
        },
    )
    p = s.sample()["ib_ports"][0]
    assert p["xmit_bytes_per_s"] == pytest.approx(500_000 * 4 / 2.0)
    assert p["rcv_bytes_per_s"] == 0.0
    assert p["errors_per_s"] == pytest.approx((10 + 4) / 2.0)


def test_rates_across_32_bit_wrap_and_counter_reset(tmp_path: Path) -> None:
    s, clock = sampler_over(tmp_path)
    make_port(tmp_path, counters={"port_xmit_data": 2**32 - 1000, "port_rcv_data": 5_000_000})
    s.sample()
    clock[0] = 1.0
    make_port(tmp_path, counters={"port_xmit_data": 3000, "port_rcv_data": 100})  # wrap; reset
    p = s.sample()["ib_ports"][0]
    assert p["xmit_bytes_per_s"] == pytest.approx(4000 * 4)
    assert p["rcv_bytes_per_s"] is None  # a reset: no rate for that interval
    clock[0] = 2.0
    make_port(tmp_path, counters={"port_xmit_data": 4000, "port_rcv_data": 300})
    p = s.sample()["ib_ports"][0]
    assert p["rcv_bytes_per_s"] == pytest.approx(200 * 4)  # counted from the reset's value


def test_link_downed_increase_is_reported_once(tmp_path: Path) -> None:
    s, clock = sampler_over(tmp_path)
    make_port(tmp_path)
    s.sample()
    make_port(tmp_path, counters={**HEALTHY_COUNTERS, "link_downed": 1})
    clock[0] = 1.0
    assert s.sample()["ib_ports"][0]["link_downed_delta"] == 1
    clock[0] = 2.0
    assert s.sample()["ib_ports"][0]["link_downed_delta"] == 0
