"""The local cluster's port choices (controlplane.local.ports): the Serve proxy port the
node provider gives a node it starts."""

from __future__ import annotations

import random
import socket

import pytest

from controlplane.local import ports
from controlplane.local.ports import (
    ephemeral_port_range,
    pick_proxy_port,
    quiet_loopback_ports,
    quiet_port_ranges,
)


@pytest.mark.parametrize(
    ("held", "listening", "port"),
    [
        (set(), None, 7001),
        ({7001}, None, 7002),
        ({7001, 7002}, {7001, 7002}, None),
        ({7001, 7002}, {7002}, 7001),
        ({7001, 7002}, None, None),
    ],
    ids=[
        "the first free",
        "skips a held one",
        "all held and answering: none",
        "a held port nothing listens on (its node died) is reused",
        "all held, nothing known about listeners: none",
    ],
)
def test_pick_proxy_port(held: set[int], listening: set[int] | None, port: int | None) -> None:
    assert pick_proxy_port([7001, 7002], held, listening) == port


@pytest.mark.parametrize(
    ("ephemeral", "ray_workers", "ranges"),
    [
        ((32768, 60999), (10002, 19999), [range(20000, 32768), range(61000, 65536)]),
        ((49152, 65535), (10002, 19999), [range(20000, 49152)]),
        ((20000, 65535), (10002, 19999), []),
        (
            (32768, 60999),
            (25000, 26000),
            [range(20000, 25000), range(26001, 32768), range(61000, 65536)],
        ),
        ((1024, 65535), (10002, 19999), []),
    ],
    ids=[
        "Linux's default: below and above the kernel's range",
        "the IANA range: below it only",
        "the kernel takes all from 20000 up: none",
        "Ray's workers told to use other ports: cut out of the range",
        "the kernel takes everything: none",
    ],
)
def test_quiet_port_ranges(
    ephemeral: tuple[int, int], ray_workers: tuple[int, int], ranges: list[range]
) -> None:
    assert quiet_port_ranges(ephemeral, ray_workers) == ranges


def test_quiet_loopback_ports_are_free_and_outside_what_the_kernel_hands_out() -> None:
    low, high = ephemeral_port_range()
    ports = quiet_loopback_ports(6, random.Random(7))
    assert len(set(ports)) == 6
    for port in ports:
        assert not low <= port <= high and not 10002 <= port <= 19999, port
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: raises if not


def test_without_quiet_ranges_the_ports_are_the_kernels_free_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the kernel's range covers every port from 20000 up, the listeners still get
    ports: free ephemeral ones, as before quiet ports existed."""
    monkeypatch.setattr(ports, "ephemeral_port_range", lambda: (1024, 65535))
    chosen = ports.quiet_loopback_ports(3)
    assert len(set(chosen)) == 3
    for port in chosen:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
