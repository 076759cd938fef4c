"""The edge router (serve.edge_router): health transitions, backend order, the state file's
proxy ports; then the edge itself in this process, on loopback, in front of small HTTP/1.1
servers standing in for Serve's proxies (no Ray): each answers its health, the ingress's route
table, a backend app's predict (with ``X-Rcp-Pool``, as every backend answer has) or Serve's
own 404 for a deleted app, and anything else as the ingress would.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.local.ports import free_loopback_ports
from serve.edge_router import (
    MAX_PROXIES,
    BackendHealth,
    Balancer,
    BalancerLimits,
    DnsProxies,
    Probe,
    StateFileProxies,
    backend_order,
    backends_from_addresses,
    backends_from_state,
    main,
    next_health,
    parse_dns_target,
)
from serve.http1 import Backend

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
    def key(i: int) -> Backend:  # a proxy per address, all on one port (as on Kubernetes)
        return (f"10.0.0.{i}", 8000)

    assert backend_order([key(b) for b in backends], {key(b) for b in healthy}, turn) == [
        key(b) for b in order
    ]


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


# -- the balancer on loopback ---------------------------------------------------------------


class FakeProxy:
    """A small keep-alive HTTP/1.1 server standing in for a Serve proxy. Shared by every
    proxy of one test: `table` (the ingress's ``v1/models`` answer) and `deleted` (pools whose
    backend app is gone: Serve's own 404, no ``X-Rcp-Pool``)."""

    def __init__(
        self, port: int, table: dict[str, Any], deleted: set[str], host: str = "127.0.0.1"
    ) -> None:
        self.host, self.port = host, port
        self.backend: Backend = (host, port)
        self.health = 200
        self.table = table
        self.deleted = deleted
        self.model_status = 200
        self.hang = False
        """Take predicts and never answer them (a proxy whose node is dying)."""
        self.seen: list[str] = []
        self.server: asyncio.Server | None = None

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if path == "/-/healthz":
            return self.health, {}, b"success" if self.health == 200 else b"draining"
        self.seen.append(f"{method} {path}")
        if path == "/v1/models":
            return 200, {"content-type": "application/json"}, json.dumps(self.table).encode()
        parts = path.split("/")
        if path.startswith("/_rcp/"):  # /_rcp/<model>/<pool>/v1/models/<model>/predict
            pool = parts[3]
            if pool in self.deleted:
                return 404, {"content-type": "text/plain"}, b"Path '/_rcp' not found."
            body_out = json.dumps({"pool": pool, "proxy": self.host, "echo": body.decode()})
            return self.model_status, {"X-Rcp-Pool": pool}, body_out.encode()
        return 200, {"X-Rcp-Pool": "ingress"}, json.dumps({"via": "ingress", "path": path}).encode()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ")
                fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
                length = int({k.lower(): v for k, v in fields.items()}.get("content-length", 0))
                body = await reader.readexactly(length) if length else b""
                if self.hang and path.startswith("/_rcp/"):
                    self.seen.append(f"{method} {path} (hung)")
                    await asyncio.Event().wait()  # until the connection is broken
                status, headers, out = self.answer(method, path, body)
                extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
                writer.write(
                    f"HTTP/1.1 {status} X\r\n{extra}content-length: {len(out)}\r\n\r\n".encode()
                    + out
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def start(self) -> None:
        self.server = await asyncio.start_server(self.handle, self.host, self.port)
        self.port = self.server.sockets[0].getsockname()[1]  # port 0: the one it got
        self.backend = (self.host, self.port)

    def stop(self) -> None:
        assert self.server is not None
        self.server.close()


class Client:
    """One keep-alive client connection to the edge."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Client:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(
        self, method: str, path: str, body: bytes = b"", headers: str = ""
    ) -> tuple[int, dict[str, str], bytes]:
        length = f"content-length: {len(body)}\r\n" if body or method == "POST" else ""
        self.writer.write(
            f"{method} {path} HTTP/1.1\r\nhost: x\r\n{headers}{length}\r\n".encode() + body
        )
        return await self.read()

    async def read(self) -> tuple[int, dict[str, str], bytes]:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        lines = head.decode().split("\r\n")
        fields = {k.lower(): v for k, v in (ln.split(": ", 1) for ln in lines[1:] if ": " in ln)}
        body = await self.reader.readexactly(int(fields.get("content-length", 0)))
        return int(lines[0].split(" ")[1]), fields, body

    def close(self) -> None:
        self.writer.close()


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("timed out")


def table(weights: dict[str, float], generation: int = 1, **routing: Any) -> dict[str, Any]:
    return {
        "models": [{"name": "sample", "weights": weights}],
        "generation": generation,
        "routing": {"table_max_age_s": 1.0, **routing},
    }


@asynccontextmanager
async def edge_over(
    tmp_path: Path,
    n: int,
    max_connections: int = 64,
    route_table: dict[str, Any] | None = None,
    head_live: bool = False,
) -> AsyncIterator[tuple[Balancer, list[FakeProxy], int]]:
    lb_port, *ports = free_loopback_ports(n + 2)  # the last port: a node slot nobody holds
    shared = route_table if route_table is not None else table({"cluster": 1.0})
    deleted: set[str] = set()
    proxies = [FakeProxy(p, shared, deleted) for p in ports[:n]]
    for proxy in proxies:
        await proxy.start()
    state = tmp_path / "local-cluster.json"
    # The head's slot is the port nobody holds: the head's proxy is only a reserve
    # (test_the_heads_proxy_takes_requests_only_while_no_other_is_healthy).
    nodes = (
        {"head": ports[n], "nodes": ports[:n]}
        if not head_live
        else {
            "head": ports[0],
            "nodes": ports[1:],
        }
    )
    state.write_text(json.dumps({"serve_proxies": nodes}))
    stop = asyncio.Event()
    limits = BalancerLimits(interval_s=0.05, max_connections=max_connections)
    source = StateFileProxies(state, "127.0.0.1")
    lb = Balancer("127.0.0.1", lb_port, source, asyncio.get_running_loop(), limits)
    task = asyncio.create_task(lb.serve(stop))
    try:
        await until(lambda: len(lb.healthy()) == n and lb.fresh_table() is not None)
        yield lb, proxies, lb_port
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        for proxy in proxies:
            proxy.stop()


PREDICT = "/v1/models/sample/predict"
JSON_HEADER = "content-type: application/json\r\n"


def test_requests_on_one_connection_spread_over_healthy_proxies_and_skip_a_draining_one(
    tmp_path: Path,
) -> None:
    """Each request picks its proxy, so a keep-alive connection leaves a draining proxy at
    its next request (the splicing balancer kept it there until the client closed)."""

    async def scenario() -> None:
        async with edge_over(tmp_path, 2) as (lb, (a, b), port):
            client = await Client.open(port)
            proxies = [json.loads((await client.send("GET", "/x"))[2])["path"] for _ in range(2)]
            assert proxies == ["/x", "/x"]
            a.seen.clear(), b.seen.clear()
            for _ in range(10):
                await client.send("GET", "/x")
            assert (a.seen.count("GET /x"), b.seen.count("GET /x")) == (5, 5)
            b.health = 503  # Serve drains b's node
            await until(lambda: b.backend not in lb.healthy())
            b.seen.clear()
            for _ in range(6):
                assert (await client.send("GET", "/x"))[0] == 200
            assert "GET /x" not in b.seen  # the same connection, no request to b
            b.health = 200
            await until(lambda: b.backend in lb.healthy())
            for _ in range(4):
                await client.send("GET", "/x")
            assert "GET /x" in b.seen
            client.close()

    asyncio.run(scenario())


def test_a_proxy_that_went_away_is_skipped_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with edge_over(tmp_path, 2) as (lb, (a, b), port):
            lb.limits = BalancerLimits(interval_s=60.0)  # no health check will notice
            a.stop()
            await asyncio.sleep(0.1)  # (the check loop is sleeping its last interval out)
            for _ in range(6):  # each on a new connection: a's refusal moves each on at once
                client = await Client.open(port)
                status, _h, body = await client.send("GET", "/x")
                client.close()
                assert status == 200, body
            assert a.backend not in lb.healthy()

    asyncio.run(scenario())


class MetricsServer(FakeProxy):
    """Not a Serve proxy: 200 with other text to any GET, 405 to anything else (what
    prometheus_client's exposition server, a Ray node's metrics, answers)."""

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        self.seen.append(f"{method} {path}")
        if method == "GET":
            return 200, {"content-type": "text/plain"}, b"# HELP up 1\nup 1\n"
        return 405, {"allow": "OPTIONS,GET"}, b"# HTTP 405 Method Not Allowed"


def test_a_port_another_server_took_over_from_a_proxy_gets_no_request(tmp_path: Path) -> None:
    """A proxy's node dies and another server binds its port: the health check sees it is
    not a Serve proxy, and no predict goes there (in a clean-clone run, predicts met a Ray
    node's metrics server on a dead node's proxy port: 405 three times, a 503 to the client)."""

    async def scenario() -> None:
        async with edge_over(tmp_path, 2) as (lb, (a, b), port):
            b.stop()
            await until(lambda: b.backend not in lb.healthy())
            squatter = MetricsServer(b.port, a.table, a.deleted)
            await squatter.start()
            try:
                await until(lambda: "GET /-/healthz" in squatter.seen)
                await until(lambda: squatter.seen.count("GET /-/healthz") >= 3)
                assert b.backend not in lb.healthy()
                assert lb.health[b.backend].last is Probe.FOREIGN
                client = await Client.open(port)
                for _ in range(10):
                    status, _h, body = await client.send("POST", PREDICT, b"{}", JSON_HEADER)
                    assert status == 200, body
                client.close()
                assert [s for s in squatter.seen if "healthz" not in s] == []
            finally:
                squatter.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("answer", "probe"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nsuccess", Probe.OK),
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n7\r\nsuccess\r\n0\r\n\r\n",
            Probe.OK,
        ),
        (b"HTTP/1.1 503 X\r\ncontent-length: 8\r\n\r\ndraining", Probe.UNHEALTHY),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nup 1\n", Probe.FOREIGN),
        (b"SSH-2.0-OpenSSH_9.6\r\n", Probe.FOREIGN),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 9000\r\n\r\n" + b"x" * 9000, Probe.FOREIGN),
        (b"", Probe.BROKEN),
        (None, Probe.REFUSED),
    ],
    ids=[
        "Serve's 200",
        "Serve's 200, chunked (as Ray 2.60 sends it)",
        "a draining proxy's 503",
        "another server's 200",
        "not HTTP",
        "an answer too long for a health check",
        "closed without a byte",
        "nothing listens",
    ],
)
def test_what_a_health_check_makes_of_an_answer(
    tmp_path: Path, answer: bytes | None, probe: Probe
) -> None:
    async def scenario() -> None:
        async def reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer or b"")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(reply, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        if answer is None:
            server.close()
            await server.wait_closed()
        source = StateFileProxies(tmp_path / "none.json", "127.0.0.1")
        lb = Balancer("127.0.0.1", 0, source, asyncio.get_running_loop(), BalancerLimits())
        try:
            assert await lb.check(("127.0.0.1", port)) is probe
        finally:
            server.close()

    asyncio.run(scenario())


def test_connections_over_the_cap_are_closed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with edge_over(tmp_path, 1, max_connections=2) as (lb, _proxies, port):
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            await until(lambda: len(lb.connections) == 2)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(reader.read(), 5) == b""  # closed unanswered
            writer.close()
            assert lb.rejected == 1
            for _r, w in idle:
                w.close()

    asyncio.run(scenario())


def test_a_predict_goes_straight_to_the_backend_of_a_pool_the_weights_pick(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        routes = table({"cluster": 1.0, "external": 3.0})
        async with edge_over(tmp_path, 2, route_table=routes) as (lb, proxies, port):
            client = await Client.open(port)
            pools = Counter()
            for i in range(200):
                status, headers, body = await client.send(
                    "POST", PREDICT, b'{"x": %d}' % i, JSON_HEADER
                )
                assert status == 200, body
                answer = json.loads(body)
                assert answer["echo"] == f'{{"x": {i}}}'  # the body reached the backend as sent
                assert headers["x-rcp-attempts"] == "1"
                assert len(headers["x-request-id"]) == 32  # one was given to the request
                pools[answer["pool"]] += 1
            assert 25 <= pools["cluster"] <= 75 and pools["cluster"] + pools["external"] == 200
            backend_paths = {s for p in proxies for s in p.seen if s.startswith("POST")}
            assert backend_paths == {
                "POST /_rcp/sample/cluster/v1/models/sample/predict",
                "POST /_rcp/sample/external/v1/models/sample/predict",
            }
            # Everything else goes to the ingress unchanged; so does an unknown model.
            listed = json.loads((await client.send("GET", "/v1/models?x=1"))[2])
            assert listed == {"via": "ingress", "path": "/v1/models?x=1"}
            unknown = await client.send("POST", "/v1/models/other/predict", b"{}", JSON_HEADER)
            assert json.loads(unknown[2])["path"] == "/v1/models/other/predict"
            assert lb.counts["routed"] == 200
            client.close()

    asyncio.run(scenario())


def test_an_answer_serve_gave_itself_is_tried_on_the_other_pool(tmp_path: Path) -> None:
    """A pool's app deleted while the edge still routes to it: Serve's 404 carries no
    X-Rcp-Pool, so the request is tried again on the other pool; the model's own error is
    returned as it is."""

    async def scenario() -> None:
        routes = table({"cluster": 1.0, "external": 1.0})
        async with edge_over(tmp_path, 1, route_table=routes) as (lb, (proxy,), port):
            proxy.deleted.add("cluster")
            client = await Client.open(port)
            attempts = Counter()
            for _ in range(40):
                status, headers, body = await client.send("POST", PREDICT, b"{}", JSON_HEADER)
                assert status == 200 and json.loads(body)["pool"] == "external"
                attempts[headers["x-rcp-attempts"]] += 1
            assert set(attempts) == {"1", "2"} and attempts["2"] == lb.counts["retried"] > 0
            proxy.deleted.clear()
            proxy.model_status = 500  # the model failed in both pools: its answer, not retried
            retried = lb.counts["retried"]
            for _ in range(10):
                status, headers, _ = await client.send("POST", PREDICT, b"{}", JSON_HEADER)
                assert (status, headers["x-rcp-attempts"]) == (500, "1")
            assert lb.counts["retried"] == retried
            # Nothing serves: 503 with Retry-After once the budget is spent.
            proxy.deleted.update({"cluster", "external"})
            status, headers, body = await client.send("POST", PREDICT, b"{}", JSON_HEADER)
            error = json.loads(body)["error"]
            assert (status, error["code"], headers["retry-after"]) == (503, "no_capacity", "1")
            assert headers["x-rcp-attempts"] == "3" and error["request_id"]
            client.close()

    asyncio.run(scenario())


def test_a_stale_table_sends_predicts_through_the_ingress(tmp_path: Path) -> None:
    async def scenario() -> None:
        routes = table({"cluster": 1.0}, table_max_age_s=0.2)
        async with edge_over(tmp_path, 1, route_table=routes) as (lb, (proxy,), port):
            client = await Client.open(port)
            status, headers, _ = await client.send("POST", PREDICT, b"{}", JSON_HEADER)
            assert headers["x-rcp-pool"] == "cluster"
            routes["generation"] = "no longer a table"  # every fetch is refused from now on
            await until(lambda: lb.fresh_table() is None)
            status, headers, body = await client.send("POST", PREDICT, b"{}", JSON_HEADER)
            assert (status, json.loads(body)["via"]) == (200, "ingress")
            client.close()

    asyncio.run(scenario())


def test_what_the_edge_refuses_itself(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with edge_over(tmp_path, 1) as (lb, (proxy,), port):
            client = await Client.open(port)
            path = "/_rcp/sample/cluster/v1/models/sample/predict"
            status, _h, body = await client.send("POST", path, b"{}", JSON_HEADER)
            assert (status, json.loads(body)["error"]["code"]) == (404, "not_found")
            big = b"x" * (1_048_576 + 1)
            status, headers, body = await client.send("POST", PREDICT, big, JSON_HEADER)
            assert (status, json.loads(body)["error"]["code"]) == (413, "body_too_large")
            assert headers["connection"] == "close"
            client.close()
            client = await Client.open(port)
            client.writer.write(b"NOT HTTP AT ALL\r\n\r\n")
            status, _h, body = await client.read()
            assert (status, json.loads(body)["error"]["code"]) == (400, "bad_request")
            client.close()
            assert not any(s.startswith("POST /_rcp") for s in proxy.seen)

    asyncio.run(scenario())


def test_a_client_waiting_for_100_continue_gets_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with edge_over(tmp_path, 1) as (_lb, _proxies, port):
            client = await Client.open(port)
            client.writer.write(
                f"POST {PREDICT} HTTP/1.1\r\nhost: x\r\n{JSON_HEADER}content-length: 2\r\n"
                "expect: 100-continue\r\n\r\n".encode()
            )
            line = await asyncio.wait_for(client.reader.readuntil(b"\r\n\r\n"), 5)
            assert line.startswith(b"HTTP/1.1 100")
            client.writer.write(b"{}")
            status, headers, _ = await client.read()
            assert (status, headers["x-rcp-pool"]) == (200, "cluster")
            client.close()

    asyncio.run(scenario())


# -- proxies found by DNS (Kubernetes: the headless rcp-serve-proxies Service) -------------


def info(host: str, port: int = 8000) -> tuple[Any, ...]:
    """One getaddrinfo entry, as the resolver answers."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return (family, socket.SOCK_STREAM, 6, "", (host, port))


@pytest.mark.parametrize(
    ("infos", "limit", "expected"),
    [
        ([info("10.0.0.2"), info("10.0.0.1")], 256, ["10.0.0.1", "10.0.0.2"]),
        ([info("10.0.0.10"), info("10.0.0.9")], 256, ["10.0.0.9", "10.0.0.10"]),
        ([info("10.0.0.1"), info("10.0.0.1")], 256, ["10.0.0.1"]),
        ([info("fd00::1"), info("10.0.0.1")], 256, ["10.0.0.1", "fd00::1"]),
        ([info("not-an-ip"), (2, 1, 6, "", ()), (2,), info("10.0.0.1")], 256, ["10.0.0.1"]),
        ([info(f"10.0.1.{i}") for i in range(10)], 3, ["10.0.1.0", "10.0.1.1", "10.0.1.2"]),
        ([], 256, []),
    ],
    ids=[
        "in address order",
        "numeric order, not text order",
        "no repeats",
        "IPv4 before IPv6",
        "anything but an IP address is left out",
        "at most the limit",
        "no answer",
    ],
)
def test_backends_from_addresses(infos: list[Any], limit: int, expected: list[str]) -> None:
    assert backends_from_addresses(infos, 8000, limit) == [(h, 8000) for h in expected]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("proxies.rcp.svc.cluster.local:8000", ("proxies.rcp.svc.cluster.local", 8000)),
        ("proxies.:1", ("proxies.", 1)),
        ("proxies", "NAME:PORT"),
        (":8000", "NAME:PORT"),
        ("bad_name:8000", "NAME:PORT"),
        ("-bad.local:8000", "NAME:PORT"),
        ("a" * 64 + ".local:8000", "NAME:PORT"),
        ("proxies:0", "1-65535"),
        ("proxies:65536", "1-65535"),
        ("proxies:http", "1-65535"),
    ],
)  # fmt: skip
def test_parse_dns_target(text: str, expected: tuple[str, int] | str) -> None:
    if isinstance(expected, tuple):
        assert parse_dns_target(text) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            parse_dns_target(text)


class FakeResolver:
    """Answers lookups from `answer`: a list of addresses, an exception to raise, or None to
    hang (a DNS server that does not answer)."""

    def __init__(self, answer: list[str] | Exception | None) -> None:
        self.answer = answer
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, name: str, port: int) -> list[tuple[Any, ...]]:
        self.asked.append((name, port))
        if self.answer is None:
            await asyncio.sleep(60)
        if isinstance(self.answer, Exception):
            raise self.answer
        return [info(h, port) for h in self.answer or []]


def test_dns_lookups_and_failures_keep_the_last_list(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        resolver = FakeResolver(["10.0.0.2", "10.0.0.1"])
        dns = DnsProxies("proxies.rcp", 8000, timeout_s=0.05, resolve=resolver)
        assert await dns.poll() == [("10.0.0.1", 8000), ("10.0.0.2", 8000)]
        assert resolver.asked == [("proxies.rcp", 8000)]
        for failure in [socket.gaierror(-2, "Name or service not known"), [], None]:
            resolver.answer = failure
            assert await dns.poll() is None  # the edge keeps what it has
        assert caplog.text.count("keeping the last proxies") == 1  # logged once, not per try
        resolver.answer = ["10.0.0.3"]
        assert await dns.poll() == [("10.0.0.3", 8000)]
        assert "resolves again" in caplog.text
        resolver.answer = [f"10.0.2.{i}" for i in range(MAX_PROXIES + 5)]
        assert len(await dns.poll() or []) == MAX_PROXIES
        assert "the rest left out" in caplog.text

    caplog.set_level("INFO", logger="rcp.balancer")
    asyncio.run(scenario())


def test_the_state_file_is_read_again_only_when_it_changed(tmp_path: Path) -> None:
    async def scenario() -> None:
        state = tmp_path / "local-cluster.json"
        source = StateFileProxies(state, "127.0.0.1")
        assert await source.poll() is None  # no file yet
        state.write_text(json.dumps({"serve_proxies": {"head": 7000, "nodes": [7001]}}))
        assert await source.poll() == [("127.0.0.1", 7000), ("127.0.0.1", 7001)]
        assert await source.poll() is None  # unchanged
        state.unlink()
        assert await source.poll() is None  # `rcp down` removed it: keep the last list

    asyncio.run(scenario())


def test_an_edge_over_proxies_found_by_dns(tmp_path: Path) -> None:
    """Two proxies on one port at two loopback addresses (as pods on one Service port): the
    edge finds them by (fake) DNS, spreads requests over both, answers its own health, drops
    a proxy the DNS answer no longer names, and keeps its list while DNS fails."""

    async def scenario() -> None:
        routes = table({"cluster": 1.0}, generation=4)
        a = FakeProxy(0, routes, set(), host="127.0.0.2")
        await a.start()
        b = FakeProxy(a.port, routes, set(), host="127.0.0.3")
        await b.start()
        resolver = FakeResolver(["127.0.0.3", "127.0.0.2"])
        dns = DnsProxies("proxies.rcp", a.port, timeout_s=1.0, resolve=resolver)
        (edge_port,) = free_loopback_ports(1)
        limits = BalancerLimits(interval_s=0.05)
        lb = Balancer("127.0.0.1", edge_port, dns, asyncio.get_running_loop(), limits)
        stop = asyncio.Event()
        task = asyncio.create_task(lb.serve(stop))
        try:
            await until(lambda: len(lb.healthy()) == 2 and lb.fresh_table() is not None)
            assert lb.backends == [a.backend, b.backend]
            client = await Client.open(edge_port)
            hosts = Counter()
            for _ in range(10):
                status, _h, body = await client.send("POST", PREDICT, b"{}", JSON_HEADER)
                assert status == 200, body
                hosts[json.loads(body)["proxy"]] += 1
            assert hosts == {"127.0.0.2": 5, "127.0.0.3": 5}
            status, headers, body = await client.send("GET", "/-/edge/healthz")
            assert (status, headers["content-type"]) == (200, "application/json")
            assert json.loads(body) == {
                "status": "ok",
                "proxies_healthy": 2,
                "table_generation": 4,
            }
            resolver.answer = socket.gaierror(-2, "Name or service not known")
            await asyncio.sleep(0.2)  # several lookups fail meanwhile
            assert lb.backends == [a.backend, b.backend]
            resolver.answer = ["127.0.0.3"]  # a's pod is no longer ready
            await until(lambda: lb.backends == [b.backend])
            assert a.backend not in lb.health and a.backend not in lb.upstreams.idle
            a.seen.clear()
            for _ in range(4):
                assert (await client.send("POST", PREDICT, b"{}", JSON_HEADER))[0] == 200
            assert a.seen == []
            b.health = 503  # the last proxy drains: the edge is not ready
            await until(lambda: not lb.healthy())
            status, _h, body = await client.send("GET", "/-/edge/healthz")
            assert status == 503
            assert json.loads(body)["status"] == "unavailable"
            assert json.loads(body)["proxies_healthy"] == 0
            live = await client.send("GET", "/-/edge/healthz?probe=live")
            assert live[0] == 200  # alive all the same: no restart for a Serve outage
            assert json.loads(live[2])["status"] == "unavailable"
            assert not [s for p in (a, b) for s in p.seen if "/-/edge" in s]  # never forwarded
            client.close()
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)
            a.stop()
            b.stop()

    asyncio.run(scenario())


def test_the_edge_health_takes_only_get_and_head(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with edge_over(tmp_path, 1) as (_lb, (proxy,), port):
            client = await Client.open(port)
            status, headers, body = await client.send("HEAD", "/-/edge/healthz")
            assert (status, body) == (200, b"")
            status, _h, body = await client.send("POST", "/-/edge/healthz", b"{}", JSON_HEADER)
            assert (status, json.loads(body)["error"]["code"]) == (405, "method_not_allowed")
            assert not [s for s in proxy.seen if "/-/edge" in s]
            client.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--state-file=s.json", "--listen-any"], "--listen-any"),
        (["--proxies-dns=p.rcp:8000", "--listen-any", "--host=127.0.0.1"], "--listen-any"),
        (["--state-file=s.json", "--host=0.0.0.0"], "--host must be a loopback address"),
        (["--proxies-dns=p.rcp:8000", "--host=10.0.0.1"], "--host must be a loopback address"),
        (["--proxies-dns=p.rcp"], "--proxies-dns must be NAME:PORT"),
        (["--state-file=s.json", "--port=70000"], "--port must be in 1-65535"),
    ],
    ids=[
        "0.0.0.0 only for a pod, never over the local state file",
        "--listen-any with a --host is ambiguous",
        "the local edge binds loopback only",
        "no other address either",
        "a DNS target without a port",
        "a port out of range",
    ],
)
def test_main_refuses_to_listen_off_loopback_unless_told(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    port = [] if any(a.startswith("--port") for a in argv) else ["--port=8000"]
    assert main([*argv, *port]) == 2
    assert message in capsys.readouterr().err


def test_a_state_file_and_dns_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--state-file=s.json", "--proxies-dns=p.rcp:8000", "--port=8000"])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples of a Prometheus text exposition, parsed by prometheus_client's own parser."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_edge_counts_what_clients_got_and_what_each_try_found(tmp_path: Path) -> None:
    """GET /-/edge/metrics: a predict the edge tried again after Serve's own 404 is one 2xx
    answer (what the production alert counts), with one 'serve' try and one 'model' try."""

    async def scenario() -> None:
        routes = table({"cluster": 1.0, "external": 1.0}, generation=5)
        async with edge_over(tmp_path, 1, route_table=routes) as (lb, (proxy,), port):
            proxy.deleted.add("cluster")
            client = await Client.open(port)
            for _ in range(20):
                assert (await client.send("POST", PREDICT, b"{}", JSON_HEADER))[0] == 200
            assert (await client.send("POST", "/_rcp/x", b"{}", JSON_HEADER))[0] == 404
            status, headers, body = await client.send("GET", "/-/edge/metrics")
            assert status == 200 and headers["content-type"].startswith("text/plain")
            got = scrape(body.decode())
            routed_2xx = (("code", "2xx"), ("outcome", "routed"))
            assert got[("rcp_edge_requests_total", routed_2xx)] == 20
            assert got[("rcp_edge_requests_total", (("code", "4xx"), ("outcome", "refused")))] == 1
            retried = lb.counts["retried"]
            assert retried > 0
            serve_tries = (("pool", "cluster"), ("result", "serve"))
            assert got[("rcp_edge_tries_total", serve_tries)] == retried
            model_tries = (("pool", "external"), ("result", "model"))
            assert got[("rcp_edge_tries_total", model_tries)] == 20
            assert ("rcp_edge_requests_total", (("code", "5xx"), ("outcome", "routed"))) not in got
            assert got[("rcp_edge_route_table_generation", ())] == 5
            assert 0 <= got[("rcp_edge_route_table_age_seconds", ())] < 1.0
            assert got[("rcp_edge_proxies", (("state", "healthy"),))] == 1
            # The scrape itself is counted as the edge's own.
            again = scrape((await client.send("GET", "/-/edge/metrics"))[2].decode())
            assert again[("rcp_edge_requests_total", (("code", "2xx"), ("outcome", "local")))] == 1
            assert (await client.send("POST", "/-/edge/metrics", b"{}", JSON_HEADER))[0] == 405
            client.close()

    asyncio.run(scenario())


def test_requests_in_flight_on_a_proxy_that_is_gone_go_to_another_at_once(
    tmp_path: Path,
) -> None:
    """A proxy whose node dies may keep its connections open while it no longer answers; once
    its port refuses, the edge breaks them and sends their requests through another proxy,
    long before the try's timeout (30 s here)."""

    async def scenario() -> None:
        routes = table({"cluster": 1.0}, attempt_timeout_s=30.0)
        async with edge_over(tmp_path, 2, route_table=routes) as (lb, (a, b), port):
            a.hang = True
            clients = [await Client.open(port) for _ in range(4)]
            sent = [
                asyncio.create_task(c.send("POST", PREDICT, b"{}", JSON_HEADER)) for c in clients
            ]
            await until(lambda: any("(hung)" in s for s in a.seen))
            a.stop()  # its port refuses from now on; the hung connections stay open
            answers = await asyncio.wait_for(asyncio.gather(*sent), 10)
            assert [(status, h["x-rcp-attempts"]) for status, h, _ in answers] == [(200, "1")] * 4
            hung = sum("(hung)" in s for s in a.seen)
            assert hung >= 1 and sum(s.startswith("POST /_rcp") for s in b.seen) == 4
            assert a.backend not in lb.healthy()
            for c in clients:
                c.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("healthy", "reserve", "order"),
    [
        ({1, 2, 3}, {1}, [3, 2, 1]),
        ({1, 3}, {1}, [3, 1, 2]),
        ({1}, {1}, [1, 2, 3]),
        ({2, 3}, {1}, [3, 2, 1]),
    ],
    ids=[
        "the reserve comes after every healthy proxy",
        "the round robin skips it",
        "alone healthy, it takes the requests",
        "an unhealthy reserve is one of the last resorts",
    ],
)
def test_backend_order_with_a_reserve(
    healthy: set[int], reserve: set[int], order: list[int]
) -> None:
    def key(i: int) -> Backend:
        return (f"10.0.0.{i}", 8000)

    got = backend_order(
        [key(b) for b in (1, 2, 3)], {key(b) for b in healthy}, 1, {key(b) for b in reserve}
    )
    assert got == [key(b) for b in order]


def test_the_heads_proxy_takes_requests_only_while_no_other_is_healthy(tmp_path: Path) -> None:
    """Locally the state file names the head's proxy: a request the head's proxy has in
    flight when the head dies would freeze the replica answering it (it looks the proxy up
    in the GCS, gone with the head), so the edge uses it only while no node's proxy is."""

    async def scenario() -> None:
        async with edge_over(tmp_path, 2, head_live=True) as (lb, (head, node), port):
            assert lb.proxies.reserve == {head.backend}
            client = await Client.open(port)
            head.seen.clear()
            for _ in range(6):
                assert (await client.send("POST", PREDICT, b"{}", JSON_HEADER))[0] == 200
            assert not any(s.startswith("POST") for s in head.seen)
            node.health = 503  # the only node's proxy drains: the head's is all there is
            await until(lambda: node.backend not in lb.healthy())
            assert (await client.send("POST", PREDICT, b"{}", JSON_HEADER))[0] == 200
            assert any(s.startswith("POST /_rcp") for s in head.seen)
            client.close()

    asyncio.run(scenario())
