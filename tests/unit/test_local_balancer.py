"""The local serve balancer (controlplane.local.balancer): health transitions, backend order,
the state file's proxy ports, the provider's port choice; then the balancer itself in this
process, on loopback, in front of small HTTP servers standing in for Serve's proxies (no Ray).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from controlplane.local.balancer import (
    BackendHealth,
    Balancer,
    BalancerLimits,
    Probe,
    backend_order,
    backends_from_state,
    next_health,
)
from controlplane.local.ports import free_loopback_ports, pick_proxy_port

UP = BackendHealth(healthy=True)
DOWN = BackendHealth()


def run(probes: list[Probe], start: BackendHealth = DOWN, rise: int = 1, fall: int = 2) -> bool:
    health = start
    for probe in probes:
        health = next_health(health, probe, rise=rise, fall=fall)
    return health.healthy


@pytest.mark.parametrize(
    ("start", "probes", "rise", "fall", "healthy"),
    [
        (DOWN, [Probe.OK], 1, 2, True),
        (DOWN, [Probe.OK], 2, 2, False),
        (DOWN, [Probe.OK, Probe.OK], 2, 2, True),
        (DOWN, [Probe.OK, Probe.TIMEOUT, Probe.OK], 2, 2, False),
        (UP, [Probe.UNHEALTHY], 1, 2, False),
        (UP, [Probe.REFUSED], 1, 2, False),
        (UP, [Probe.BROKEN], 1, 2, False),
        (UP, [Probe.TIMEOUT], 1, 2, True),
        (UP, [Probe.TIMEOUT, Probe.TIMEOUT], 1, 2, False),
        (UP, [Probe.TIMEOUT, Probe.OK, Probe.TIMEOUT], 1, 2, True),
        (DOWN, [Probe.TIMEOUT], 1, 2, False),
        (UP, [Probe.UNHEALTHY, Probe.OK], 1, 2, True),
    ],
    ids=[
        "a first good answer brings a new proxy in",
        "rise 2: one good answer is not enough",
        "rise 2: two in a row are",
        "rise 2: a timeout in between starts over",
        "a 503 (draining) takes it out at once",
        "a refusal takes it out at once",
        "a connection closed unanswered takes it out at once",
        "one timeout is a slow proxy, not a gone one",
        "fall 2: two timeouts in a row take it out",
        "a good answer between timeouts resets the count",
        "a timeout keeps an unhealthy proxy out",
        "a drained-then-undrained proxy comes back",
    ],
)
def test_health_transitions(
    start: BackendHealth, probes: list[Probe], rise: int, fall: int, healthy: bool
) -> None:
    assert run(probes, start, rise, fall) is healthy


@pytest.mark.parametrize(
    ("backends", "healthy", "turn", "order"),
    [
        ([1, 2, 3], {1, 2, 3}, 0, [1, 2, 3]),
        ([1, 2, 3], {1, 2, 3}, 1, [2, 3, 1]),
        ([1, 2, 3], {1, 2, 3}, 5, [3, 1, 2]),
        ([1, 2, 3], {1, 3}, 1, [3, 1, 2]),
        ([1, 2, 3], {2}, 7, [2, 1, 3]),
        ([1, 2, 3], set(), 4, [1, 2, 3]),
        ([], set(), 0, []),
    ],
    ids=[
        "round robin from the first",
        "the next connection starts at the next",
        "turns wrap around",
        "unhealthy proxies are skipped in the rotation",
        "the unhealthy come last, as a last resort",
        "none healthy: every one in order",
        "no proxies",
    ],
)
def test_backend_order(backends: list[int], healthy: set[int], turn: int, order: list[int]) -> None:
    assert backend_order(backends, healthy, turn) == order


@pytest.mark.parametrize(
    ("state", "ports"),
    [
        ({"serve_proxies": {"head": 7000, "nodes": [7001, 7002]}}, [7000, 7001, 7002]),
        ({"serve_proxies": {"head": 7000, "nodes": [7000, 7001]}}, [7000, 7001]),
        ({"serve_proxies": {"head": "7000", "nodes": [0, 70000, True, 7001]}}, [7001]),
        ({"serve_proxies": []}, []),
        ({}, []),
    ],
    ids=["head first", "no repeats", "non-ports left out", "wrong shape", "none recorded"],
)
def test_backends_from_state(state: dict[str, object], ports: list[int]) -> None:
    assert backends_from_state(state) == ports


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


# -- the balancer on loopback ---------------------------------------------------------------


class FakeProxy:
    """A tiny HTTP server standing in for a Serve proxy: ``/-/healthz`` answers `health`,
    anything else answers its own port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.health = 200
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        code = self.health if b"/-/healthz" in head.split(b"\r\n")[0] else 200
        body = str(self.port).encode()
        writer.write(
            b"HTTP/1.1 %d X\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (code, len(body), body)
        )
        await writer.drain()
        writer.close()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", self.port)

    def stop(self) -> None:
        assert self.server is not None
        self.server.close()


async def get(port: int) -> str:
    """One request on a new connection; the answer's body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return data.split(b"\r\n\r\n", 1)[1].decode()


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


@asynccontextmanager
async def balancer_over(
    tmp_path: Path, n: int, max_connections: int = 64
) -> AsyncIterator[tuple[Balancer, list[FakeProxy], int]]:
    lb_port, *ports = free_loopback_ports(n + 2)  # the last port: a node slot nobody holds
    proxies = [FakeProxy(p) for p in ports[:n]]
    for proxy in proxies:
        await proxy.start()
    state = tmp_path / "local-cluster.json"
    state.write_text(json.dumps({"serve_proxies": {"head": ports[0], "nodes": ports[1:]}}))
    stop = asyncio.Event()
    limits = BalancerLimits(interval_s=0.05, max_connections=max_connections)
    lb = Balancer("127.0.0.1", lb_port, state, asyncio.get_running_loop(), limits)
    task = asyncio.create_task(lb.serve(stop))
    try:
        await until(lambda: len(lb.healthy()) == n)
        yield lb, proxies, lb_port
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        for proxy in proxies:
            proxy.stop()


def test_new_connections_spread_over_healthy_proxies_and_skip_a_draining_one(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with balancer_over(tmp_path, 2) as (lb, (a, b), port):
            spread = Counter([await get(port) for _ in range(10)])
            assert spread == {str(a.port): 5, str(b.port): 5}
            b.health = 503  # Serve drains b's node
            await until(lambda: b.port not in lb.healthy())
            assert {await get(port) for _ in range(6)} == {str(a.port)}
            b.health = 200
            await until(lambda: b.port in lb.healthy())
            assert str(b.port) in {await get(port) for _ in range(4)}

    asyncio.run(scenario())


def test_a_proxy_that_went_away_is_skipped_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with balancer_over(tmp_path, 2) as (lb, (a, b), port):
            lb.limits = BalancerLimits(interval_s=60.0)  # no health check will notice
            a.stop()
            await asyncio.sleep(0.1)  # (the check loop is sleeping its last interval out)
            # Every connection is answered by b: a's refusal moves each on at once.
            assert {await get(port) for _ in range(6)} == {str(b.port)}
            assert a.port not in lb.healthy()

    asyncio.run(scenario())


def test_connections_over_the_cap_are_closed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with balancer_over(tmp_path, 1, max_connections=2) as (lb, _proxies, port):
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            await until(lambda: len(lb.connections) == 2)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed unanswered
            writer.close()
            assert lb.rejected == 1
            for _r, w in idle:
                w.close()

    asyncio.run(scenario())
