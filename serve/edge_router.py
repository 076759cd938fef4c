"""The local `serve` endpoint: an HTTP/1.1 edge router over the nodes' Serve proxies.

Locally every simulated node shares 127.0.0.1, so each node's Serve proxy listens on a port of
its own (the head's on the port Serve was started with, each worker node's on the one
``controlplane.local.provider`` gave it), and this process listens on ``serve.http_port``, the
endpoint `rcp up` prints. It plays the cloud load balancer in front of a KubeRay cluster's
proxies (the ``rcp-serve`` Service): it runs outside Ray, started by `rcp up` and stopped by
`rcp down` (it carries the cluster's id in its environment, ``controlplane.local.processes``),
so it outlives the head; it holds no credentials (its environment is the cluster id and PATH
only) and never talks to Ray.

What it does with each request (it reads HTTP: `serve.http1`):
- **a predict it may route goes straight to the model's backend app** (`serve.edge`): for
  ``POST <route_prefix>v1/models/<m>/predict`` it picks the pool by the route weights of the
  ingress's own table (``GET v1/models``, fetched every ``interval_s`` through a proxy, used
  only while younger than its ``table_max_age_s``) and sends the request through a proxy to
  ``/_rcp/<m>/<pool>/...``, the backend app's route prefix: one Serve HTTP hop, not the
  ingress replica's two. An answer without ``X-Rcp-Pool`` is Serve's own (the app was just
  deleted, the replica died): the request is tried again, preferring the other pool, within
  the table's budget, then answered 503 with ``Retry-After``. The model's own answers, errors
  included, go back as they are. Without a fresh table, or for a model it does not know,
  the request goes to the ingress like anything else;
- **everything else is passed to the ingress unchanged** through a proxy;
- **each request picks its proxy**, round robin over the healthy ones, so a keep-alive
  connection leaves a draining proxy at its next request. A connect that is refused or times
  out, or a new connection a proxy closes without answering a byte (every request here is
  idempotent), moves on to the next proxy at once, healthy ones first, then the others;
- every proxy's ``/-/healthz`` is asked every ``interval_s`` (4 times a second by default).
  Serve answers 503 there while the node drains (Serve stops counting a node Ray drains as a
  proxy node) or before the proxy knows a replica: such a proxy gets no request until it
  answers 200 again. A refusal or a non-200 answer takes a proxy out at once; a timeout only
  after `fall` in a row (a busy proxy is slow, not gone); `rise` answers in a row bring it
  back (`next_health`). A broken connection takes it out at once too (a passive check);
- everything is bounded: ``max_connections`` client connections (more are closed at once),
  a request's head and body (`serve.http1`; the body limit is the table's
  ``max_body_bytes``, refused with 413 before it is read), an answer's size
  (``max_answer_bytes``), ``buffer_bytes`` written ahead to a slow client, an idle client
  connection closed after ``idle_timeout_s``, 32 idle keep-alive connections per proxy.

Backends: the proxy ports `rcp up` allocated (``serve_proxies`` in the local cluster's state
file: the head's and one per node slot), re-read whenever the state file changes. Discovery
needs neither the GCS (down with the head) nor the Ray token: a port where no node's proxy
listens yet simply refuses the health check, and a node that joins (the autoscaler adds
external nodes) is healthy as soon as its proxy answers.

Must not: bind anything but the given loopback address, import Ray, or read the Ray token.

Run by `rcp up` as ``python -m serve.edge_router --state-file <state_dir>/local-
cluster.json --host 127.0.0.1 --port <serve.http_port> --route-prefix <serving.route_prefix>
--log <state_dir>/logs/...``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from serve.edge import (
    EdgeRouting,
    EdgeTable,
    EdgeTableError,
    PredictTarget,
    Refuse,
    choose_backend,
    classify,
    is_model_answer,
    table_from_answer,
)
from serve.http1 import (
    ConnectFailed,
    HttpError,
    Request,
    RequestReader,
    Response,
    UpstreamBroken,
    Upstreams,
    UpstreamTimeout,
    encode_request,
    encode_response,
)
from serve.inputs import ErrorCode, error_body, request_id
from serve.routing import retry_decision

__all__ = [
    "BackendHealth",
    "Balancer",
    "BalancerLimits",
    "Probe",
    "backend_order",
    "backends_from_state",
    "main",
    "next_health",
]

log = logging.getLogger("rcp.balancer")

HEALTH_PATH = "/-/healthz"
MAX_STATUS_LINE_BYTES = 1024


class Probe(str, Enum):
    """What one health check (or a spliced connection) said about a proxy."""

    OK = "ok"  # /-/healthz answered 200
    UNHEALTHY = "unhealthy"  # answered, not 200 (503 while draining or without replicas)
    REFUSED = "refused"  # nothing listens on the port
    TIMEOUT = "timeout"  # no answer in time
    BROKEN = "broken"  # closed a client's connection without answering a byte


@dataclass(frozen=True)
class BackendHealth:
    """One proxy's health as the balancer sees it. A new backend is unhealthy until its first
    good answer (a port no node listens on yet)."""

    healthy: bool = False
    successes: int = 0
    """Good answers in a row."""
    timeouts: int = 0
    """Timeouts in a row."""
    last: Probe | None = None


def next_health(health: BackendHealth, probe: Probe, rise: int = 1, fall: int = 2) -> BackendHealth:
    """The health after `probe`. A definite failure (refused, not 200, a broken connection)
    takes the proxy out at once; `fall` timeouts in a row do; `rise` good answers in a row
    bring it back.

    Worked example (rise=2, fall=2): healthy, TIMEOUT -> still healthy (1 timeout);
    TIMEOUT -> out; OK -> still out (1 success); OK -> healthy. Healthy, UNHEALTHY (a 503:
    the node drains) -> out at once.
    """
    if probe is Probe.OK:
        successes = health.successes + 1
        return BackendHealth(health.healthy or successes >= rise, successes, 0, probe)
    if probe is Probe.TIMEOUT:
        timeouts = health.timeouts + 1
        return BackendHealth(health.healthy and timeouts < fall, 0, timeouts, probe)
    return BackendHealth(False, 0, 0, probe)


def backend_order(backends: Sequence[int], healthy: set[int], turn: int) -> list[int]:
    """The order to try backends for the `turn`-th connection: the healthy ones round robin
    (starting at ``turn mod len(healthy)``), then the others in their order, tried only when
    every healthy one refused.

    >>> backend_order([7001, 7002, 7003], {7001, 7003}, turn=1)
    [7003, 7001, 7002]
    """
    up = [b for b in backends if b in healthy]
    down = [b for b in backends if b not in healthy]
    if up:
        k = turn % len(up)
        up = up[k:] + up[:k]
    return up + down


def backends_from_state(state: dict[str, object]) -> list[int]:
    """The proxy ports the state file records: the head's first, then each node slot's.
    Anything that is not a TCP port number is left out."""
    proxies = state.get("serve_proxies")
    if not isinstance(proxies, dict):
        return []
    ports = [proxies.get("head"), *(proxies.get("nodes") or [])]
    seen: list[int] = []
    for p in ports:
        if isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536 and p not in seen:
            seen.append(p)
    return seen


@dataclass(frozen=True)
class BalancerLimits:
    """How the balancer checks and bounds (the defaults are `rcp up`'s)."""

    interval_s: float = 0.25
    """Seconds between two health checks of a proxy."""
    check_timeout_s: float = 1.0
    connect_timeout_s: float = 1.0
    rise: int = 1
    fall: int = 2
    max_connections: int = 1024
    buffer_bytes: int = 256 * 1024
    """Bytes buffered for a slow client before the edge waits for it to read."""
    idle_timeout_s: float = 300.0
    """A client connection with no request for this long is closed."""
    max_answer_bytes: int = 16 * 1024 * 1024
    """Largest answer a proxy may send (a 502 beyond it)."""


class Balancer:
    """The listening socket, the health table, the route table and the requests."""

    def __init__(
        self,
        host: str,
        port: int,
        state_file: Path,
        loop: asyncio.AbstractEventLoop,
        limits: BalancerLimits | None = None,
        route_prefix: str = "/",
    ) -> None:
        self.host, self.port, self.state_file, self.loop = host, port, state_file, loop
        self.limits = limits or BalancerLimits()
        self.route_prefix = route_prefix
        self.backends: list[int] = []
        self.health: dict[int, BackendHealth] = {}
        self.connections: set[asyncio.StreamWriter] = set()
        self.upstreams = Upstreams(host, self.limits.connect_timeout_s)
        self.table: EdgeTable | None = None
        self.rng = random.Random()
        self.turn = 0
        self.rejected = 0
        self.counts: Counter[str] = Counter()
        """Requests by what the edge did: routed (straight to a backend), passed (to the
        ingress), refused (answered here), retried (tries after a request's first),
        unavailable (503 after every try)."""
        self._state_mtime_ns = -1

    # -- health ---------------------------------------------------------------------------
    def observe(self, port: int, probe: Probe) -> None:
        """Apply one probe's result to `port`'s health; log a change."""
        old = self.health.get(port)
        if old is None:
            return
        new = next_health(old, probe, self.limits.rise, self.limits.fall)
        self.health[port] = new
        if new.healthy != old.healthy:
            log.info("proxy %s:%d %s (%s)", self.host, port, "in" if new.healthy else "out", probe)

    def healthy(self) -> set[int]:
        return {p for p, h in self.health.items() if h.healthy}

    def reload_backends(self) -> None:
        """Re-read the state file's proxy ports when the file changed."""
        try:
            mtime = self.state_file.stat().st_mtime_ns
        except OSError:
            return  # `rcp down` removes it before stopping us: keep the last list
        if mtime == self._state_mtime_ns:
            return
        self._state_mtime_ns = mtime
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return
        ports = backends_from_state(state if isinstance(state, dict) else {})
        if ports and ports != self.backends:
            self.backends = ports
            self.health = {p: self.health.get(p, BackendHealth()) for p in ports}
            log.info("proxies: %s", ", ".join(str(p) for p in ports))

    async def check(self, port: int) -> Probe:
        """One ``GET /-/healthz`` on `port`."""
        writer: asyncio.StreamWriter | None = None
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, port), self.limits.check_timeout_s
            )
            assert writer is not None
            writer.write(
                f"GET {HEALTH_PATH} HTTP/1.1\r\nHost: {self.host}:{port}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            line = await asyncio.wait_for(
                reader.read(MAX_STATUS_LINE_BYTES), self.limits.check_timeout_s
            )
        except TimeoutError:
            return Probe.TIMEOUT
        except OSError:
            return Probe.REFUSED
        finally:
            if writer is not None:
                writer.close()
        parts = line.split(b"\r\n", 1)[0].split()
        return Probe.OK if len(parts) >= 2 and parts[1] == b"200" else Probe.UNHEALTHY

    async def check_forever(self) -> None:
        while True:
            started = self.loop.time()
            self.reload_backends()
            ports = list(self.backends)
            results = await asyncio.gather(*(self.check(p) for p in ports))
            for port, probe in zip(ports, results, strict=True):
                self.observe(port, probe)
            await asyncio.sleep(max(0.0, self.limits.interval_s - (self.loop.time() - started)))

    # -- the route table ------------------------------------------------------------------
    async def fetch_table(self) -> None:
        """Ask the ingress (through a proxy) for its route table, ``GET <prefix>v1/models``;
        keep the last good one (it ages out, `EdgeTable.fresh`)."""
        sent_s = self.loop.time()
        target = self.route_prefix.rstrip("/") + "/v1/models"
        data = encode_request("GET", target, [(b"host", self.host.encode())], b"")
        answer = await self._send_any(data, self.limits.check_timeout_s, head_only=False)
        if not isinstance(answer, Response) or answer.status != 200:
            return
        try:
            table = table_from_answer(answer.body, sent_s)
        except EdgeTableError as exc:
            log.warning("%s", exc)
            return
        old = self.table
        self.table = table
        if old is None or old.generation != table.generation:
            log.info("route table generation %d: %s", table.generation, dict(table.weights))

    async def fetch_table_forever(self) -> None:
        while True:
            started = self.loop.time()
            try:
                await self.fetch_table()
            except Exception:  # never let one bad answer stop the edge from routing
                log.exception("route table fetch failed")
            await asyncio.sleep(max(0.0, self.limits.interval_s - (self.loop.time() - started)))

    def fresh_table(self) -> EdgeTable | None:
        table = self.table
        return table if table is not None and table.fresh(self.loop.time()) else None

    # -- requests -------------------------------------------------------------------------
    async def client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: its requests one at a time, each sent on its own."""
        if len(self.connections) >= self.limits.max_connections:
            self.rejected += 1
            writer.close()
            return
        self.connections.add(writer)
        transport = writer.transport
        transport.set_write_buffer_limits(high=self.limits.buffer_bytes)
        table = self.table
        requests = RequestReader(
            reader, writer, table.routing.max_body_bytes if table else EdgeRouting().max_body_bytes
        )
        try:
            while True:
                try:
                    request = await requests.next(self.limits.idle_timeout_s)
                except HttpError as exc:
                    self.counts["refused"] += 1
                    code = ErrorCode.BODY_TOO_LARGE if exc.status == 413 else ErrorCode.BAD_REQUEST
                    writer.write(_error(exc.status, code, exc.message, False))
                    await _linger(reader, writer)
                    break
                if request is None:
                    break
                head_only = request.method == "HEAD"
                answer = await self.answer(request)
                keep = request.keep_alive and answer.keep_alive
                writer.write(
                    encode_response(
                        answer.status, answer.headers, answer.body, keep, head_only=head_only
                    )
                )
                await writer.drain()
                if not keep:
                    break
        except (ConnectionError, OSError):
            pass  # the client went away
        finally:
            self.connections.discard(writer)
            writer.close()

    async def answer(self, request: Request) -> Response:
        """Route a predict straight to a backend when the table allows; pass anything else to
        the ingress; refuse a backend path."""
        table = self.fresh_table()
        backend_root = table.routing.backend_root if table else EdgeRouting().backend_root
        target = classify(request.method, request.target, self.route_prefix, backend_root)
        if isinstance(target, Refuse):
            self.counts["refused"] += 1
            rid = request_id(_text(request.header(_REQUEST_ID)))
            return Response(
                target.status,
                [(b"content-type", _JSON), (b"x-request-id", rid.encode())],
                error_body(target.code, target.message, rid),
                True,
            )
        if target is not None and table is not None:
            routed = await self.route(request, target, table)
            if routed is not None:
                return routed
        return await self.pass_through(request)

    async def route(
        self, request: Request, target: PredictTarget, table: EdgeTable
    ) -> Response | None:
        """Send a predict to a backend chosen by `table`, trying again on another pool when
        the answer did not come from the model; None when the table names no pool for it
        (the ingress then answers)."""
        rid = request_id(_text(request.header(_REQUEST_ID)))
        headers = [(n, v) for n, v in request.headers if n.lower() != _REQUEST_ID]
        headers.append((_REQUEST_ID, rid.encode()))
        started = self.loop.time()
        tried: set[str] = set()
        attempts = 0
        why = "no pool has ready replicas"
        while True:
            forward = choose_backend(target, table, self.loop.time(), self.rng.random(), tried)
            if forward is None:
                if attempts == 0:
                    return None
                break
            attempts += 1
            tried.add(forward.pool)
            r = table.routing
            remaining_s = r.request_timeout_s - (self.loop.time() - started)
            data = encode_request(request.method, forward.path, headers, request.body)
            answer = await self._send_any(
                data, max(0.001, min(r.attempt_timeout_s, remaining_s)), head_only=False
            )
            if isinstance(answer, Response) and is_model_answer(answer.headers):
                self.counts["routed"] += 1
                kept = [(n, v) for n, v in answer.headers if n.lower() not in _EDGE_HEADERS]
                answer.headers = [
                    *kept,
                    (_REQUEST_ID, rid.encode()),
                    (_ATTEMPTS, str(attempts).encode()),
                ]
                return answer
            why = (
                f"the {forward.pool} pool answered {answer.status} without the model"
                if isinstance(answer, Response)
                else f"the {forward.pool} pool: {answer}"
            )
            log.warning("request %s: %s try %d: %s", rid, target.model, attempts, why)
            decision = retry_decision(
                attempts, r.max_attempts, self.loop.time() - started, r.request_timeout_s
            )
            if not decision.retry:
                why = f"{why}; {decision.reason}"
                break
            self.counts["retried"] += 1
            await asyncio.sleep(_RETRY_BACKOFF_S * attempts)
            table = self.fresh_table() or table  # weights may have changed meanwhile
        self.counts["unavailable"] += 1
        retry_after = table.routing.retry_after_s
        message = (
            f"model {target.model!r} cannot be served right now ({why}); retry after {retry_after}s"
        )
        return Response(
            503,
            [
                (b"content-type", _JSON),
                (b"retry-after", str(retry_after).encode()),
                (b"x-request-id", rid.encode()),
                (_ATTEMPTS, str(attempts).encode()),
            ],
            error_body(ErrorCode.NO_CAPACITY, message, rid),
            True,
        )

    async def pass_through(self, request: Request) -> Response:
        """Send a request unchanged to a proxy (the ingress answers it)."""
        self.counts["passed"] += 1
        table = self.fresh_table()
        routing = table.routing if table is not None else EdgeRouting()
        data = encode_request(request.method, request.target, request.headers, request.body)
        answer = await self._send_any(
            data, routing.request_timeout_s + _PASS_MARGIN_S, head_only=request.method == "HEAD"
        )
        if isinstance(answer, Response):
            return answer
        self.counts["unavailable"] += 1
        rid = request_id(_text(request.header(_REQUEST_ID)))
        return Response(
            503,
            [
                (b"content-type", _JSON),
                (b"retry-after", str(routing.retry_after_s).encode()),
                (b"x-request-id", rid.encode()),
            ],
            error_body(ErrorCode.NO_CAPACITY, f"no Serve proxy answered ({answer})", rid),
            True,
        )

    async def _send_any(self, data: bytes, timeout_s: float, *, head_only: bool) -> Response | str:
        """Send one request to the first proxy that takes it, in `backend_order`: a refused
        or timed-out connect, or a new connection the proxy closed without answering a byte
        (the request is idempotent: it reached no model), moves on to the next proxy at once.
        The answer, or why none came."""
        self.turn += 1
        why = f"none of {len(self.backends)} proxies accepted"
        for port in backend_order(self.backends, self.healthy(), self.turn):
            try:
                return await self.upstreams.exchange(
                    port,
                    data,
                    head_only=head_only,
                    timeout_s=timeout_s,
                    max_bytes=self.limits.max_answer_bytes,
                )
            except ConnectFailed as exc:
                self.observe(port, Probe.REFUSED if exc.refused else Probe.TIMEOUT)
            except UpstreamBroken as exc:
                if exc.answered:
                    return f"the proxy on port {port} broke off its answer"
                self.observe(port, Probe.BROKEN)
                why = f"the proxy on port {port} closed the connection"
            except UpstreamTimeout:
                return f"no answer within {timeout_s:g}s"
            except HttpError as exc:
                return exc.message
        return why

    async def serve(self, stop: asyncio.Event) -> None:
        self.reload_backends()
        server = await asyncio.start_server(
            self.client,
            self.host,
            self.port,
            backlog=min(self.limits.max_connections, 4096),
            limit=_READ_LIMIT,
        )
        tasks = [
            self.loop.create_task(self.check_forever()),
            self.loop.create_task(self.fetch_table_forever()),
        ]
        log.info("listening on %s:%d", self.host, self.port)
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            server.close()
            for writer in list(self.connections):
                writer.close()
            self.upstreams.close()
            log.info(
                "stopped: requests %s, %d connections refused over max_connections",
                dict(self.counts),
                self.rejected,
            )


_JSON = b"application/json"
_REQUEST_ID = b"x-request-id"
_ATTEMPTS = b"x-rcp-attempts"
_EDGE_HEADERS = frozenset({_REQUEST_ID, _ATTEMPTS})
"""Headers of a routed answer the edge writes itself (the request's id, its tries)."""
_RETRY_BACKOFF_S = 0.02
_PASS_MARGIN_S = 5.0
"""A passed request waits the ingress's own request timeout and this much more."""
_READ_LIMIT = 64 * 1024


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """After refusing a request, let the client finish sending (up to `_LINGER_BYTES` or
    `_LINGER_S`) before closing: closing with unread bytes resets the connection, and the
    client would lose the answer that says what was wrong."""
    with contextlib.suppress(Exception):
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        loop = asyncio.get_running_loop()
        deadline, left = loop.time() + _LINGER_S, _LINGER_BYTES
        while left > 0 and loop.time() < deadline:
            data = await asyncio.wait_for(reader.read(_READ_LIMIT), deadline - loop.time())
            if not data:
                return
            left -= len(data)


_LINGER_S = 2.0
_LINGER_BYTES = 8 * 1024 * 1024


def _text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None


def _error(status: int, code: ErrorCode, message: str, keep_alive: bool) -> bytes:
    rid = request_id(None)
    return encode_response(
        status,
        [(b"content-type", _JSON), (b"x-request-id", rid.encode())],
        error_body(code, message, rid),
        keep_alive,
    )


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    d = BalancerLimits()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-file", type=Path, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", type=Path, default=None, help="log file (default: stderr)")
    p.add_argument(
        "--route-prefix", default="/", help="the ingress's route prefix (serving.route_prefix)"
    )
    p.add_argument("--interval-s", type=float, default=d.interval_s)
    p.add_argument("--max-connections", type=int, default=d.max_connections)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if not args.host.startswith("127."):
        print(f"--host must be a loopback address, got {args.host!r}", file=sys.stderr)
        return 2
    if not (0 < args.interval_s <= 60) or not (0 < args.max_connections <= 65536):
        print("--interval-s must be in (0, 60], --max-connections in (0, 65536]", file=sys.stderr)
        return 2
    logging.basicConfig(
        filename=args.log,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    with contextlib.suppress(ImportError):
        import uvloop  # deferred: optional (Ray's serve extra installs it); a faster loop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    limits = replace(
        BalancerLimits(), interval_s=args.interval_s, max_connections=args.max_connections
    )
    balancer = Balancer(args.host, args.port, args.state_file, loop, limits, args.route_prefix)
    log.info("pid %d, state file %s", os.getpid(), args.state_file)
    try:
        loop.run_until_complete(balancer.serve(stop))
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", args.host, args.port, exc)
        return 1
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
