"""The serve endpoint's edge against the real HAProxy process (`serve.edge`), over fake Serve
proxies on loopback (aiohttp servers that record what reaches them): no Ray.

Each finding of the endpoint's security review (issue 27) is a test here: oversized heads,
slow clients, chunked bodies, encoded internal routes, clients' Serve control headers,
hop-by-hop headers, the edge's own metrics on the public listener; and the routing the product
keeps: predicts by the route table's weights, Serve's own failures tried again elsewhere, a
stale table sending predicts through the ingress.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import requests
from aiohttp import web

from controlplane.local.ports import free_loopback_ports
from serve.config import IngressConfig
from serve.edge.config import (
    ADMIN_HEALTH_PATH,
    EDGE_METRICS_PATH,
    HAPROXY_METRICS_PATH,
    EdgeSettings,
    StaticProxies,
)
from serve.edge.process import check, command, write

HOST = "127.0.0.1"
MAX_BODY = 65_536
TABLE = "rcp-edge-table 1\ngeneration {gen}\nmax_age_s 1\nmodel sample {share}\n"


@dataclass
class FakeProxy:
    """A Serve proxy stand-in: ``/-/healthz``, the ingress's table, everything else echoed
    with what arrived. `fail_next` answers that many requests with Serve's own 500."""

    port: int
    share: int = 1000
    generation: int = 1
    serve_table: bool = True
    fail_next: int = 0
    model_errors: bool = False
    """Answer every predict as a model that raised: 500 with ``X-Rcp-Pool``."""
    seen: list[dict[str, object]] = field(default_factory=list)

    def app(self) -> web.Application:
        async def healthz(_r: web.Request) -> web.Response:
            return web.Response(text="success")

        async def models(r: web.Request) -> web.Response:
            if r.query.get("format") == "edge":
                if not self.serve_table:
                    return web.Response(status=503)
                return web.Response(text=TABLE.format(gen=self.generation, share=self.share))
            self.seen.append({"path": r.path, "headers": dict(r.headers)})
            return web.json_response({"models": [], "via": "ingress"})

        async def anything(r: web.Request) -> web.Response:
            body = await r.read()
            self.seen.append({"path": r.raw_path, "headers": dict(r.headers), "len": len(body)})
            if self.model_errors:
                body = {"error": {"code": "model_error", "message": "m", "request_id": "r"}}
                return web.json_response(body, status=500, headers={"X-Rcp-Pool": "p"})
            if self.fail_next > 0:
                self.fail_next -= 1
                return web.Response(status=500, text="Internal Server Error")
            return web.json_response(
                {"path": r.raw_path, "proxy": self.port}, headers={"X-Rcp-Pool": "p"}
            )

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/-/healthz", healthz)
        app.router.add_get("/v1/models", models)
        app.router.add_route("*", "/{tail:.*}", anything)
        return app


class Proxies:
    """Fake proxies served from one background event loop."""

    def __init__(self, ports: list[int]) -> None:
        self.log: list[dict[str, object]] = []  # every proxy's requests, in arrival order
        self.proxies = [FakeProxy(p, seen=self.log) for p in ports]
        self.loop = asyncio.new_event_loop()
        self.runners: list[web.AppRunner] = []
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        for p in self.proxies:
            self._call(self._start(p))

    def _call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)  # type: ignore[arg-type]

    async def _start(self, p: FakeProxy) -> None:
        runner = web.AppRunner(p.app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, HOST, p.port).start()
        self.runners.append(runner)

    def close(self) -> None:
        for r in self.runners:
            self._call(r.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)

    def seen(self) -> list[dict[str, object]]:
        return list(self.log)

    def last_headers(self) -> dict[str, str]:
        headers = self.log[-1]["headers"]
        assert isinstance(headers, dict)
        return {str(k).lower(): str(v) for k, v in headers.items()}


@dataclass
class Edge:
    url: str
    admin: str
    port: int
    proc: subprocess.Popen[bytes]
    proxies: Proxies

    def worker(self) -> psutil.Process:
        children = psutil.Process(self.proc.pid).children()
        assert children, "HAProxy's worker is not running"
        return children[0]


def wait_for(what: str, cond: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Until `cond()` is truthy; raises naming `what` and the last answer."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}; last: {last!r}")


def edge_settings(
    work: Path, public: int, admin: int, proxy_ports: list[int], **kw: object
) -> EdgeSettings:
    return EdgeSettings(
        listen_host=HOST,
        listen_port=public,
        admin_host=HOST,
        admin_port=admin,
        work_dir=str(work),
        proxies=StaticProxies(nodes=tuple((HOST, p) for p in proxy_ports)),
        header_deadline_s=2.0,
        **kw,  # type: ignore[arg-type]
    )


@contextlib.contextmanager
def running_edge(settings: EdgeSettings, proxies: Proxies) -> Iterator[Edge]:
    """The edge's HAProxy as `rcp up` runs it, until the block ends."""
    config = write(settings)
    check(config)
    log = open(Path(settings.work_dir) / "haproxy.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(command(config), stdout=log, stderr=subprocess.STDOUT)
    e = Edge(
        f"http://{HOST}:{settings.listen_port}",
        f"http://{HOST}:{settings.admin_port}",
        settings.listen_port,
        proc,
        proxies,
    )
    try:
        wait_for("the edge's route table", lambda: _generation(e) == 1)
        yield e
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    public, admin, *proxy_ports = free_loopback_ports(5)
    proxies = Proxies(proxy_ports[:2])
    # Node proxies 0 and 1 answer; slot 2 has none (a node not started): it stays down.
    settings = edge_settings(
        tmp_path_factory.mktemp("edge"),
        public,
        admin,
        proxy_ports[:3],
        ingress=IngressConfig(max_body_bytes=MAX_BODY, attempt_timeout_s=2.0),
    )
    try:
        with running_edge(settings, proxies) as e:
            yield e
    finally:
        proxies.close()


def _generation(e: Edge) -> int:
    try:
        text = requests.get(e.admin + EDGE_METRICS_PATH, timeout=2).text
    except requests.RequestException:
        return -2
    for line in text.splitlines():
        if line.startswith("rcp_edge_route_table_generation "):
            return int(line.split()[1])
    return -2


def predict(e: Edge, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.post(
        e.url + "/v1/models/sample/predict", json={"inputs": [[1.0]]}, headers=headers, timeout=10
    )


def raw(e: Edge, data: bytes, timeout_s: float = 5.0) -> bytes:
    """Send `data` on a fresh connection; what came back until the edge closed or went quiet."""
    with socket.create_connection((HOST, e.port), timeout=timeout_s) as s:
        # The edge may close before reading everything; its answer is still there.
        with contextlib.suppress(OSError):
            s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
                if b"\r\n\r\n" in out and _complete(out):
                    break
        except OSError:
            pass
        return out


def _complete(out: bytes) -> bool:
    head, _, body = out.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def status(out: bytes) -> int:
    return int(out.split(b" ", 2)[1]) if out.startswith(b"HTTP/1.") else 0


def test_a_predict_goes_to_the_pool_the_weights_pick(edge: Edge) -> None:
    for p in edge.proxies.proxies:
        p.share = 1000
    answer = predict(edge)
    assert answer.status_code == 200
    assert answer.json()["path"] == "/_rcp/sample/cluster/v1/models/sample/predict"
    for p in edge.proxies.proxies:
        p.share, p.generation = 0, 2
    wait_for("table generation 2", lambda: _generation(edge) == 2)
    assert predict(edge).json()["path"] == "/_rcp/sample/external/v1/models/sample/predict"
    for p in edge.proxies.proxies:
        p.share, p.generation = 1000, 1
    wait_for("table generation 1", lambda: _generation(edge) == 1)


def test_serves_own_500_is_tried_again_on_another_proxy(edge: Edge) -> None:
    edge.proxies.proxies[0].fail_next = 1
    edge.proxies.proxies[1].fail_next = 1
    answer = predict(edge)
    assert answer.status_code == 200, answer.text
    assert answer.headers["X-Rcp-Pool"] == "p"


def test_a_models_own_500_is_tried_max_attempts_times(edge: Edge) -> None:
    """HAProxy tells answers apart by status only: the model's 500 is tried again like Serve's
    (docs/serving.md, "Retries"), up to max_attempts tries, then the last answer goes back."""
    before = len(edge.proxies.seen())
    for p in edge.proxies.proxies:
        p.model_errors = True
    try:
        answer = predict(edge)
    finally:
        for p in edge.proxies.proxies:
            p.model_errors = False
    assert answer.status_code == 500
    assert answer.json()["error"]["code"] == "model_error"
    assert len(edge.proxies.seen()) - before == IngressConfig().max_attempts


def test_a_stale_table_sends_predicts_through_the_ingress(edge: Edge) -> None:
    for p in edge.proxies.proxies:
        p.serve_table = False
    try:
        wait_for("the table dropped", lambda: _generation(edge) == -1, timeout_s=5)
        answer = predict(edge)
        assert answer.json()["path"] == "/v1/models/sample/predict"  # unchanged: the ingress's
    finally:
        for p in edge.proxies.proxies:
            p.serve_table = True
        wait_for("the table back", lambda: _generation(edge) == 1)


@pytest.mark.parametrize(
    "target",
    [
        b"/_rcp/sample/external/v1/models/sample/predict",
        b"/%5Frcp/sample/external/v1/models/sample/predict",
        b"/_rcp%2Fsample/external/v1/models/sample/predict",
        b"/%5frcp/sample/external/v1/models/sample/predict",
        b"//_rcp/sample/external/v1/models/sample/predict",
        b"/./_rcp/sample/external/v1/models/sample/predict",
        b"/v1/models/../../_rcp/sample/external/v1/models/sample/predict",
        b"/v1/models/sample%2F..%2F..%2F_rcp/predict",
        b"/-/routes",
        b"/-/healthz",
        b"http://127.0.0.1/_rcp/sample/external/v1/models/sample/predict",
        b"/metrics",
        b"/rcp/metrics",
    ],
)
def test_no_encoding_of_an_internal_route_reaches_a_proxy(edge: Edge, target: bytes) -> None:
    before = len(edge.proxies.seen())
    out = raw(
        edge,
        b"POST "
        + target
        + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
    )
    assert status(out) in (400, 404), out[:200]
    assert len(edge.proxies.seen()) == before, edge.proxies.seen()[before:]


def test_the_edges_metrics_and_health_are_on_the_admin_listener_only(edge: Edge) -> None:
    assert requests.get(edge.admin + HAPROXY_METRICS_PATH, timeout=5).status_code == 200
    assert (
        "rcp_edge_route_table_age_seconds"
        in requests.get(edge.admin + EDGE_METRICS_PATH, timeout=5).text
    )
    assert requests.get(edge.admin + ADMIN_HEALTH_PATH, timeout=5).status_code == 200
    for path in (HAPROXY_METRICS_PATH, EDGE_METRICS_PATH, "/-/edge/metrics", "/-/edge/healthz"):
        assert requests.get(edge.url + path, timeout=5).status_code == 404


def test_clients_control_and_hop_by_hop_headers_are_dropped(edge: Edge) -> None:
    answer = predict(
        edge,
        headers={
            "x-request-timeout-seconds": "0",
            "x-request-disconnect-disabled": "?1",
            "X-Rcp-Pool": "external",
            "Connection": "keep-alive, X-Secret-Hop",
            "X-Secret-Hop": "1",
            "X-Kept": "1",
        },
    )
    assert answer.status_code == 200
    got = set(edge.proxies.last_headers())
    assert "x-kept" in got
    for dropped in (
        "x-request-timeout-seconds",
        "x-request-disconnect-disabled",
        "x-rcp-pool",
        "x-secret-hop",
    ):
        assert dropped not in got, dropped


def test_a_request_id_is_kept_when_valid_and_replaced_otherwise(edge: Edge) -> None:
    assert predict(edge, headers={"X-Request-Id": "abc-1"}).headers["X-Request-Id"] == "abc-1"
    assert edge.proxies.last_headers()["x-request-id"] == "abc-1"
    replaced = predict(edge, headers={"X-Request-Id": "bad id <script>"}).headers["X-Request-Id"]
    assert replaced != "bad id <script>"
    assert re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", replaced), replaced
    assert predict(edge).headers["X-Request-Id"] != replaced  # a fresh one per request


def test_an_oversized_declared_body_gets_413_before_it_is_read(edge: Edge) -> None:
    before = len(edge.proxies.seen())
    t0 = time.monotonic()
    out = raw(
        edge,
        b"POST /v1/models/sample/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % (MAX_BODY + 1),
    )
    assert status(out) == 413 and time.monotonic() - t0 < 1.5  # no body was waited for
    assert json.loads(out.partition(b"\r\n\r\n")[2])["error"]["code"] == "body_too_large"
    assert len(edge.proxies.seen()) == before


@pytest.mark.parametrize(
    "head",
    [
        b"Transfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: gzip, chunked\r\n",
    ],
    ids=["chunked", "te-then-cl", "cl-then-te", "gzip-chunked"],
)
def test_a_body_with_transfer_encoding_is_refused(edge: Edge, head: bytes) -> None:
    before = len(edge.proxies.seen())
    chunks = b"".join(b"2\r\nab\r\n" for _ in range(1000)) + b"0\r\nHost: evil\r\n\r\n"
    out = raw(
        edge,
        b"POST /v1/models/sample/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + head
        + b"\r\n"
        + chunks,
    )
    assert status(out) in (411, 422), out[:200]
    assert len(edge.proxies.seen()) == before


def test_oversized_heads_are_refused_and_memory_stays_bounded(edge: Edge) -> None:
    out = raw(
        edge, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    )
    assert status(out) in (400, 431), out[:200]
    worker = edge.worker()
    rss_before = worker.memory_info().rss

    def attempt() -> None:
        with socket.create_connection((HOST, edge.port), timeout=10) as s:
            s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: ")
            try:
                for _ in range(16 * 16):  # 16 MiB in 64 KiB pieces
                    s.sendall(b"a" * 65536)
            except OSError:
                return  # refused and closed: what the edge should do

    threads = [threading.Thread(target=attempt) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    grown = worker.memory_info().rss - rss_before
    assert grown < 16 * 1024 * 1024, f"the edge grew {grown} bytes under three 16 MiB heads"


def test_slow_clients_neither_delay_others_nor_stay(edge: Edge) -> None:
    slow: list[socket.socket] = []
    try:
        for _ in range(200):
            s = socket.create_connection((HOST, edge.port), timeout=5)
            s.sendall(b"POST /v1/models/sample/predict HTTP/1.1\r\nH")
            slow.append(s)
        started = time.monotonic()
        for i in range(6):  # a byte a second from each slow client, predicts meanwhile
            for s in slow:
                with contextlib.suppress(OSError):
                    s.sendall(b"o")
            t0 = time.monotonic()
            assert predict(edge).status_code == 200
            assert time.monotonic() - t0 < 2.0
            time.sleep(max(0.0, started + i + 1 - time.monotonic()))
        # The header deadline (2 s here) cut every slow client off with 408.
        cut = 0
        for s in slow:
            s.settimeout(2)
            try:
                data = s.recv(200)
            except OSError:
                data = b""
            cut += data.startswith(b"HTTP/1.1 408") or data == b""
        assert cut == len(slow)
    finally:
        for s in slow:
            s.close()


def test_a_reload_applies_new_limits_without_failing_a_request(tmp_path: Path) -> None:
    """What `rcp up` does when the rendered configuration changed: write, check, SIGUSR2 to
    HAProxy's master. A client sending all along gets every answer."""
    public, admin, *proxy_ports = free_loopback_ports(4)
    proxies = Proxies(proxy_ports)
    settings = edge_settings(tmp_path, public, admin, proxy_ports)
    big = b'{"inputs": [[' + b"1," * 1500 + b"1]]}"
    try:
        with running_edge(settings, proxies) as e, requests.Session() as session:
            url = e.url + "/v1/models/sample/predict"
            headers = {"Content-Type": "application/json"}
            assert session.post(url, data=big, headers=headers, timeout=5).status_code == 200
            statuses: list[int] = []
            stop = threading.Event()

            def client() -> None:
                with requests.Session() as own:
                    while not stop.is_set():
                        r = own.post(url, data=b'{"inputs": [[1]]}', headers=headers, timeout=5)
                        statuses.append(r.status_code)

            sender = threading.Thread(target=client)
            sender.start()
            try:
                write(dataclasses.replace(settings, ingress=IngressConfig(max_body_bytes=1000)))
                check(Path(settings.work_dir) / "haproxy.cfg")
                os.kill(e.proc.pid, signal.SIGUSR2)

                def refused() -> bool:
                    r = requests.post(url, data=big, headers=headers, timeout=5)
                    return r.status_code == 413

                wait_for("the new body limit", refused)
                time.sleep(1.0)
            finally:
                stop.set()
                sender.join(10)
            assert e.proc.poll() is None, "the master exited on reload"
            assert statuses and set(statuses) == {200}, statuses
    finally:
        proxies.close()
