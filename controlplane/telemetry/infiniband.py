"""InfiniBand ports from sysfs: ``<root>/<device>/ports/<n>/{state,phys_state,rate,...}``.

Owns: reading one snapshot of every port under `root` (default ``/sys/class/infiniband``)
into `IbPortReading`s, the kernel's counter widths, and which counters are errors.
Must not: keep history (rates are computed by `sampling` with `counters.CounterRates`).

Formats (Linux ``Documentation/ABI/stable/sysfs-class-infiniband``):

- ``state``: ``"4: ACTIVE"``; ``phys_state``: ``"5: LinkUp"``; ``link_layer``: ``InfiniBand``
  or ``Ethernet``; ``rate``: ``"400 Gb/sec (4X NDR)"``, ``"10 Gb/sec (4X)"``.
- ``counters/<name>``: one decimal number. ``port_xmit_data`` and ``port_rcv_data`` count
  4-byte words (multiply by 4 for bytes); 64 bits wide where the HCA has extended counters,
  32 otherwise. Error counters are narrow and saturate at their maximum (IBA PortCounters).
- ``hw_counters/<name>``: driver-specific, 64-bit.

A missing directory yields no ports; a file that is missing, unreadable or not a number is
left out and named in `problems`, so one bad file never hides the rest of the port.
"""

from __future__ import annotations

import re
from pathlib import Path

from controlplane.telemetry.readings import IbPortReading

__all__ = [
    "BYTES_PER_DATA_WORD",
    "COUNTER_WIDTH_BITS",
    "ERROR_COUNTERS",
    "is_saturated",
    "parse_rate",
    "parse_state",
    "read_ports",
]

BYTES_PER_DATA_WORD = 4
"""port_xmit_data / port_rcv_data count octets divided by 4."""

COUNTER_WIDTH_BITS: dict[str, int | None] = {
    "symbol_error": 16,
    "link_error_recovery": 8,
    "link_downed": 8,
    "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16,
    "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16,
    "port_xmit_constraint_errors": 8,
    "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4,
    "excessive_buffer_overrun_errors": 4,
    "VL15_dropped": 16,
    "port_xmit_wait": 32,
    # 32 (legacy) or 64 (extended) bits, depending on the HCA: None lets counters try both.
    "port_xmit_data": None,
    "port_rcv_data": None,
    "port_xmit_packets": None,
    "port_rcv_packets": None,
    "unicast_xmit_packets": 64,
    "unicast_rcv_packets": 64,
    "multicast_xmit_packets": 64,
    "multicast_rcv_packets": 64,
}
"""Widths of the standard ``counters/*`` files (IBA PortCounters / PortCountersExtended)."""

ERROR_COUNTERS: tuple[str, ...] = (
    "symbol_error",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
"""Counters whose increase is an error (summed into a port's errors per second). link_downed
is judged on its own; port_xmit_wait is congestion, not an error."""

_STATE = re.compile(r"^\s*(\d+)\s*:\s*(\S+)\s*$")
_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec(?:\s*\((\d+)X(?:\s+([A-Za-z]+))?\))?")


def parse_state(text: str) -> str | None:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; anything else -> None."""
    m = _STATE.match(text)
    return m.group(2) if m else None


def parse_rate(text: str) -> tuple[float | None, int | None]:
    """``"400 Gb/sec (4X NDR)"`` -> (400.0, 4); unparseable parts -> None."""
    m = _RATE.match(text)
    if not m:
        return None, None
    return float(m.group(1)), int(m.group(2)) if m.group(2) else None


def is_saturated(name: str, value: int) -> bool:
    width = COUNTER_WIDTH_BITS.get(name)
    return width is not None and width < 64 and value == (1 << width) - 1


def _read_text(path: Path, problems: list[str]) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except FileNotFoundError:
        problems.append(f"{path}: missing")
    except OSError as exc:  # EINVAL/EIO: some counters cannot be read on some HCAs
        problems.append(f"{path}: unreadable ({exc.strerror or exc})")
    return None


def _read_counters(directory: Path, problems: list[str]) -> dict[str, int]:
    values: dict[str, int] = {}
    if not directory.is_dir():
        return values
    for path in sorted(directory.iterdir()):
        if not path.is_file():
            continue
        text = _read_text(path, problems)
        if text is None:
            continue
        try:
            value = int(text, 10)
        except ValueError:
            problems.append(f"{path}: not a counter value: {text[:40]!r}")
            continue
        if value < 0:
            problems.append(f"{path}: negative counter value {value}")
            continue
        if is_saturated(path.name, value):
            problems.append(f"{path}: saturated at {value}; its rate reads 0")
        values[path.name] = value
    return values


def read_ports(root: str | Path = "/sys/class/infiniband") -> tuple[list[IbPortReading], list[str]]:
    """Every port of every device under `root`, and the problems met reading them."""
    root = Path(root)
    problems: list[str] = []
    ports: list[IbPortReading] = []
    if not root.is_dir():
        return ports, problems
    for device_dir in sorted(root.iterdir()):
        ports_dir = device_dir / "ports"
        if not ports_dir.is_dir():
            problems.append(f"{device_dir}: no ports directory")
            continue
        for port_dir in sorted(ports_dir.iterdir(), key=lambda p: (len(p.name), p.name)):
            if not port_dir.name.isdigit():
                problems.append(f"{port_dir}: not a port number")
                continue
            state_text = _read_text(port_dir / "state", problems)
            phys_text = _read_text(port_dir / "phys_state", problems)
            rate_text = _read_text(port_dir / "rate", problems)
            link_layer = _read_text(port_dir / "link_layer", [])
            state = parse_state(state_text) if state_text is not None else None
            phys = parse_state(phys_text) if phys_text is not None else None
            if state_text is not None and state is None:
                problems.append(f"{port_dir / 'state'}: cannot parse {state_text[:40]!r}")
            if phys_text is not None and phys is None:
                problems.append(f"{port_dir / 'phys_state'}: cannot parse {phys_text[:40]!r}")
            rate_gbps, width = parse_rate(rate_text) if rate_text is not None else (None, None)
            if rate_text is not None and rate_gbps is None:
                problems.append(f"{port_dir / 'rate'}: cannot parse {rate_text[:40]!r}")
            ports.append(
                IbPortReading(
                    device=device_dir.name,
                    port=int(port_dir.name),
                    state=state,
                    phys_state=phys,
                    rate_gbps=rate_gbps,
                    width=width,
                    link_layer=link_layer,
                    counters=_read_counters(port_dir / "counters", problems),
                    hw_counters=_read_counters(port_dir / "hw_counters", problems),
                )
            )
    return ports, problems
