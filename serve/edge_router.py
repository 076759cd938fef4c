"""The `serve` endpoint: an HTTP/1.1 edge router over the nodes' Serve proxies.

It runs outside Ray, holds no credentials and never talks to Ray, so it outlives the head:

- **locally** every simulated node shares 127.0.0.1, so each node's Serve proxy listens on a
  port of its own (the head's on the port Serve was started with, each worker node's on the
  one ``controlplane.local.provider`` gave it), and one edge process listens on loopback on
  ``serve.http_port``, the endpoint `rcp up` prints; `rcp up` starts it and `rcp down` stops
  it (it carries the cluster's id in its environment, ``controlplane.local.processes``; that
  and PATH are its whole environment);
- **on Kubernetes** it is the ``rcp-edge`` Deployment (infra/k8s/edge.yaml; replicas scaled by
  a HorizontalPodAutoscaler on CPU, since its cost per request is CPU), in front of the Serve
  proxies of every head and worker pod, found by DNS (the headless ``rcp-serve-proxies``
  Service: one address per ready pod). ``--listen-any`` is the only way it binds anything but
  loopback.

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
  answers 200 again. Only Serve's own 200 counts (its body is ``success``): a port a dead
  node's proxy left may be taken by another server, which answers 200 to any GET
  (`health_probe`). A refusal or any other answer takes a proxy out at once; a timeout only
  after `fall` in a row (a busy proxy is slow, not gone); `rise` answers in a row bring it
  back (`next_health`). A broken connection takes it out at once too (a passive check);
- everything is bounded: ``max_connections`` client connections (more are closed at once),
  a request's head and body (`serve.http1`; the body limit is the table's
  ``max_body_bytes``, refused with 413 before it is read), an answer's size
  (``max_answer_bytes``), ``buffer_bytes`` written ahead to a slow client, an idle client
  connection closed after ``idle_timeout_s``, 32 idle keep-alive connections per proxy.

And it answers ``GET /-/edge/healthz`` itself (`serve.edge.EdgeHealth`, never forwarded):
200 while at least one proxy is healthy, else 503, with the count and the generation of the
fresh route table (null without one), for a kubelet's readiness probe; with
``?probe=live`` (the liveness probe) 200 whenever it answers at all. ``GET /-/edge/metrics``
is its metrics in Prometheus's text format (`serve.edge_metrics`: what clients got by outcome
and status class, what each routed try found, the route table's generation and age, the
proxies by health), which the production alert counts failed requests from.

Backends (`ProxySource`), each a (host, port); every ``interval_s`` the edge asks its source
again and health-checks what it lists. Discovery needs neither the GCS (down with the head)
nor the Ray token: an address where no proxy listens yet simply refuses the health check, and
a node that joins is healthy as soon as its proxy answers.

- `StateFileProxies` (``--state-file``, local): the proxy ports `rcp up` allocated
  (``serve_proxies`` in the local cluster's state file: the head's and one per node slot) on
  the edge's own loopback host, re-read whenever the file changes;
- `DnsProxies` (``--proxies-dns NAME:PORT``, Kubernetes): NAME's addresses (at most
  `MAX_PROXIES`, resolved off the event loop), each on PORT. A failed or empty lookup keeps
  the last list.

Must not: bind anything but the given loopback address unless told ``--listen-any``, import
Ray, or read the Ray token.

Run by `rcp up` as ``python -m serve.edge_router --state-file <state_dir>/local-
cluster.json --host 127.0.0.1 --port <serve.http_port> --route-prefix <serving.route_prefix>
--log <state_dir>/logs/...``; on Kubernetes as ``python -m serve.edge_router
--proxies-dns=rcp-serve-proxies.rcp.svc.cluster.local:8000 --listen-any --port=8000``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import random
import re
import signal
import socket
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from serve.edge import (
    EdgeHealth,
    EdgeRouting,
    EdgeScrape,
    EdgeTable,
    EdgeTableError,
    PredictTarget,
    Refuse,
    choose_backend,
    classify,
    is_model_answer,
    newer_table,
    table_from_answer,
)
from serve.edge_metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from serve.edge_metrics import EdgeMetrics, Outcome, TryResult
from serve.http1 import (
    Backend,
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
    read_response,
)
from serve.inputs import ErrorCode, error_body, request_id
from serve.routing import retry_decision

__all__ = [
    "MAX_PROXIES",
    "BackendHealth",
    "Balancer",
    "BalancerLimits",
    "DnsProxies",
    "Probe",
    "ProxySource",
    "StateFileProxies",
    "backend_order",
    "backends_from_addresses",
    "backends_from_state",
    "health_probe",
    "listen_and_source",
    "main",
    "next_health",
    "parse_args",
    "parse_dns_target",
]

log = logging.getLogger("rcp.balancer")

HEALTH_PATH = "/-/healthz"
HEALTHY_BODY = b"success"
"""What a Serve proxy's ``/-/healthz`` answers with its 200 (Ray Serve's ``HEALTHY_MESSAGE``)."""
MAX_HEALTH_ANSWER_BYTES = 4096
MAX_PROXIES = 256
"""Most proxies the edge takes from one DNS answer (the rest are left out, with a warning)."""


class Probe(str, Enum):
    """What one health check (or a spliced connection) said about a proxy."""

    OK = "ok"  # /-/healthz answered 200 "success"
    UNHEALTHY = "unhealthy"  # answered, not 200 (503 while draining or without replicas)
    FOREIGN = "foreign"  # answered, but not as a Serve proxy would: something else has the port
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


def health_probe(answer: Response) -> Probe:
    """What a proxy's answer to ``GET /-/healthz`` says. Only Serve's own healthy answer is
    OK: a port a proxy left may be taken by another server (a Ray node's metrics server,
    seen in a clean-clone run) that answers 200 to any GET and 405 to a predict.

    >>> health_probe(Response(200, [], b"success", False))
    <Probe.OK: 'ok'>
    >>> health_probe(Response(503, [], b"This node is being drained.", False))
    <Probe.UNHEALTHY: 'unhealthy'>
    >>> health_probe(Response(200, [], b"# HELP python_info ...", False))
    <Probe.FOREIGN: 'foreign'>
    """
    if answer.status != 200:
        return Probe.UNHEALTHY
    return Probe.OK if answer.body.strip() == HEALTHY_BODY else Probe.FOREIGN


def backend_order(
    backends: Sequence[Backend],
    healthy: set[Backend],
    turn: int,
    reserve: Collection[Backend] = (),
) -> list[Backend]:
    """The order to try backends for the `turn`-th request: the healthy ones round robin
    (starting at ``turn mod len(healthy)``), then the healthy `reserve` ones (the head's
    proxy: used only while no other proxy is healthy), then the others in their order, tried
    only when every healthy one refused.

    >>> a, b, c = ("10.0.0.1", 8000), ("10.0.0.2", 8000), ("10.0.0.3", 8000)
    >>> backend_order([a, b, c], {a, c}, turn=1) == [c, a, b]
    True
    >>> backend_order([a, b, c], {a, b, c}, turn=1, reserve={a}) == [c, b, a]
    True
    """
    up = [b for b in backends if b in healthy and b not in reserve]
    spare = [b for b in backends if b in healthy and b in reserve]
    down = [b for b in backends if b not in healthy]
    if up:
        k = turn % len(up)
        up = up[k:] + up[:k]
    return up + spare + down


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


AddrInfo = tuple[Any, ...]
"""One entry of ``getaddrinfo``'s answer: (family, type, proto, canonname, sockaddr)."""


def backends_from_addresses(
    infos: Iterable[AddrInfo], port: int, limit: int = MAX_PROXIES
) -> list[Backend]:
    """The proxies in a DNS answer: each distinct IP address on `port`, in address order (so
    the round robin keeps its place when a server shuffles its records), at most `limit`.
    Anything that is not an IP address is left out.

    >>> infos = [(2, 1, 6, "", ("10.0.0.9", 8000)), (2, 1, 6, "", ("10.0.0.10", 8000)),
    ...          (2, 1, 6, "", ("10.0.0.9", 8000))]
    >>> backends_from_addresses(infos, 8000)
    [('10.0.0.9', 8000), ('10.0.0.10', 8000)]
    """
    found: dict[str, ipaddress.IPv4Address | ipaddress.IPv6Address] = {}
    for info in infos:
        sockaddr = info[4] if len(info) >= 5 else None
        host = sockaddr[0] if isinstance(sockaddr, tuple) and sockaddr else None
        if not isinstance(host, str) or host in found:
            continue
        try:
            found[host] = ipaddress.ip_address(host)
        except ValueError:
            continue
    ordered = sorted(found, key=lambda h: (found[h].version, found[h]))
    return [(host, port) for host in ordered[:limit]]


_DNS_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME_RE = re.compile(rf"(?=.{{1,253}}\Z){_DNS_LABEL}(\.{_DNS_LABEL})*\.?")


def parse_dns_target(text: str) -> tuple[str, int]:
    """``NAME:PORT`` (``--proxies-dns``) as (name, port); ValueError says what is wrong.

    >>> parse_dns_target("rcp-serve-proxies.rcp.svc.cluster.local:8000")
    ('rcp-serve-proxies.rcp.svc.cluster.local', 8000)
    """
    name, sep, port_text = text.rpartition(":")
    if not sep or not _DNS_NAME_RE.fullmatch(name):
        raise ValueError(f"--proxies-dns must be NAME:PORT with NAME a DNS name, got {text!r}")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"--proxies-dns: the port must be in 1-65535, got {port_text!r}")
    return name, int(port_text)


class ProxySource(Protocol):
    """Where the edge's proxies come from."""

    def describe(self) -> str:
        """For the log."""
        ...

    async def poll(self) -> list[Backend] | None:
        """The proxies now, or None to keep the last list (nothing changed, or the source
        could not be read)."""
        ...

    @property
    def reserve(self) -> set[Backend]:
        """Proxies used only while no other is healthy (`backend_order`)."""
        ...


class StateFileProxies:
    """The proxy ports the local state file records, on the edge's own loopback host (every
    simulated node shares it). Read again only when the file changed."""

    def __init__(self, state_file: Path, host: str) -> None:
        self.state_file, self.host = state_file, host
        self._mtime_ns = -1
        self._reserve: set[Backend] = set()

    @property
    def reserve(self) -> set[Backend]:
        """The head's proxy. The head is the one node whose loss takes the GCS with it, and a
        Serve replica answering an HTTP request looks up the proxy that took it by name (a
        synchronous GCS call, per request, in Ray 2.60's ``receive_asgi_messages``): a
        request the head's proxy still had in flight when the head died would freeze the
        replica until the GCS is back. So no request enters through the head's proxy while a
        worker node's proxy is healthy."""
        return self._reserve

    def describe(self) -> str:
        return f"state file {self.state_file}"

    async def poll(self) -> list[Backend] | None:
        try:
            mtime = self.state_file.stat().st_mtime_ns
        except OSError:
            return None  # `rcp down` removes it before stopping us: keep the last list
        if mtime == self._mtime_ns:
            return None
        self._mtime_ns = mtime
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        state = state if isinstance(state, dict) else {}
        ports = backends_from_state(state)
        head = state.get("serve_proxies", {}).get("head") if ports else None
        self._reserve = {(self.host, head)} if isinstance(head, int) and head in ports else set()
        return [(self.host, p) for p in ports] or None


Resolver = Callable[[str, int], Awaitable[Sequence[AddrInfo]]]
"""Looks a name up: (name, port) -> getaddrinfo's answer."""


class DnsProxies:
    """The addresses of `name` (a headless Service: one A record per ready pod), each on
    `port`. Resolved off the event loop (``loop.getaddrinfo`` runs in a thread) within
    `timeout_s`; a failed, slow or empty lookup keeps the last list (logged once until a
    lookup succeeds again). `resolve` is for tests (no real DNS)."""

    def __init__(
        self,
        name: str,
        port: int,
        timeout_s: float = 1.0,
        resolve: Resolver | None = None,
        limit: int = MAX_PROXIES,
    ) -> None:
        self.name, self.port, self.timeout_s, self.limit = name, port, timeout_s, limit
        self.resolve = resolve or _getaddrinfo
        self.failing = False
        self.truncated = False

    def describe(self) -> str:
        return f"DNS {self.name}:{self.port}"

    @property
    def reserve(self) -> set[Backend]:
        """None: the headless Service the edge resolves selects the worker pods' proxies
        only (infra/k8s/services.yaml), never the head's (`StateFileProxies.reserve`)."""
        return set()

    async def poll(self) -> list[Backend] | None:
        try:
            infos = await asyncio.wait_for(self.resolve(self.name, self.port), self.timeout_s)
        except (TimeoutError, OSError) as exc:  # socket.gaierror is an OSError
            self._failed(f"{exc!r}")
            return None
        infos = list(infos)
        found = backends_from_addresses(infos, self.port, self.limit)
        if not found:
            self._failed("no IP addresses in the answer")
            return None
        if self.failing:
            self.failing = False
            log.info("DNS %s resolves again", self.name)
        truncated = len({i[4][0] for i in infos if len(i) >= 5 and i[4]}) > self.limit
        if truncated and not self.truncated:
            log.warning("DNS %s: more than %d addresses, the rest left out", self.name, self.limit)
        self.truncated = truncated
        return found

    def _failed(self, why: str) -> None:
        if not self.failing:
            self.failing = True
            log.warning("DNS %s failed (%s); keeping the last proxies", self.name, why)


async def _getaddrinfo(name: str, port: int) -> Sequence[AddrInfo]:
    loop = asyncio.get_running_loop()
    return await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)


def _addr(backend: Backend) -> str:
    host, port = backend
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class BalancerLimits:
    """How the balancer checks and bounds (the defaults are `rcp up`'s)."""

    interval_s: float = 0.25
    """Seconds between two health checks of a proxy."""
    check_timeout_s: float = 1.0
    table_timeout_s: float = 2.0
    """Longest a route table fetch may take (its age counts from when it was sent)."""
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
        proxies: ProxySource,
        loop: asyncio.AbstractEventLoop,
        limits: BalancerLimits | None = None,
        route_prefix: str = "/",
    ) -> None:
        self.host, self.port, self.proxies, self.loop = host, port, proxies, loop
        self.limits = limits or BalancerLimits()
        self.route_prefix = route_prefix
        self.backends: list[Backend] = []
        self.health: dict[Backend, BackendHealth] = {}
        self.connections: set[asyncio.StreamWriter] = set()
        self.upstreams = Upstreams(self.limits.connect_timeout_s)
        self.table: EdgeTable | None = None
        self.rng = random.Random()
        self.turn = 0
        self.rejected = 0
        self.counts: Counter[str] = Counter()
        """Requests by what the edge did (`serve.edge_metrics.Outcome`: routed straight to a
        backend, passed to the ingress, refused, unavailable, local), and retried (tries
        after a request's first); logged when the edge stops."""
        self.metrics = EdgeMetrics()

    # -- health ---------------------------------------------------------------------------
    def observe(self, backend: Backend, probe: Probe) -> None:
        """Apply one probe's result to `backend`'s health; log a change. A proxy that is gone
        (its port refuses, or it closed a connection unanswered) has its connections broken
        at once, so the requests in flight there go on to another proxy instead of waiting
        out their timeout (`Upstreams.abort`); a draining one (503) keeps them: it finishes
        what it has."""
        old = self.health.get(backend)
        if old is None:
            return
        new = next_health(old, probe, self.limits.rise, self.limits.fall)
        self.health[backend] = new
        if new.healthy != old.healthy:
            log.info("proxy %s %s (%s)", _addr(backend), "in" if new.healthy else "out", probe)
        if probe in (Probe.REFUSED, Probe.BROKEN, Probe.FOREIGN):
            moved = self.upstreams.abort(backend)
            if moved:
                log.warning(
                    "proxy %s gone (%s): %d request(s) in flight there go to another proxy",
                    _addr(backend),
                    probe.value,
                    moved,
                )

    def healthy(self) -> set[Backend]:
        return {b for b, h in self.health.items() if h.healthy}

    async def discover(self) -> None:
        """Ask the source for the proxies; take a new, non-empty list (a new proxy starts
        unhealthy, a known one keeps its health; idle connections to a gone one close)."""
        found = await self.proxies.poll()
        if found and found != self.backends:
            self.backends = found
            self.health = {b: self.health.get(b, BackendHealth()) for b in found}
            self.upstreams.forget(set(found))
            log.info("proxies: %s", ", ".join(_addr(b) for b in found))

    async def check(self, backend: Backend) -> Probe:
        """One ``GET /-/healthz`` on `backend`."""
        host, port = backend
        writer: asyncio.StreamWriter | None = None
        timeout_s = self.limits.check_timeout_s
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
            assert writer is not None
            writer.write(
                f"GET {HEALTH_PATH} HTTP/1.1\r\nHost: {_addr(backend)}\r\n"
                "Connection: close\r\n\r\n".encode()
            )
            answer = await asyncio.wait_for(
                read_response(reader, False, MAX_HEALTH_ANSWER_BYTES, fresh=True), timeout_s
            )
        except TimeoutError:
            return Probe.TIMEOUT
        except OSError:
            return Probe.REFUSED
        except UpstreamBroken as exc:  # closed unanswered: gone; a cut or garbled answer
            return Probe.FOREIGN if exc.answered else Probe.BROKEN
        except HttpError:  # an answer over MAX_HEALTH_ANSWER_BYTES: not Serve's
            return Probe.FOREIGN
        finally:
            if writer is not None:
                writer.close()
        return health_probe(answer)

    async def check_all(self) -> None:
        """Check every proxy at once."""
        backends = list(self.backends)
        results = await asyncio.gather(*(self.check(b) for b in backends))
        for backend, probe in zip(backends, results, strict=True):
            self.observe(backend, probe)

    async def every_interval(self, step: Callable[[], Awaitable[None]], what: str) -> None:
        """Run `step` every ``interval_s`` (its own time included), for good: an exception is
        logged, never the end of the edge's discovery, checks or routing."""
        while True:
            started = self.loop.time()
            try:
                await step()
            except Exception:
                log.exception("%s failed", what)
            await asyncio.sleep(max(0.0, self.limits.interval_s - (self.loop.time() - started)))

    # -- the route table ------------------------------------------------------------------
    async def fetch_table(self) -> None:
        """Ask the ingress (through a proxy) for its route table, ``GET <prefix>v1/models``;
        keep the last good one (it ages out, `EdgeTable.fresh`)."""
        sent_s = self.loop.time()
        target = self.route_prefix.rstrip("/") + "/v1/models"
        data = encode_request("GET", target, [(b"host", self.host.encode())], b"")
        answer = await self._send_any(data, self.limits.table_timeout_s, head_only=False)
        if not isinstance(answer, Response) or answer.status != 200:
            return
        try:
            table = table_from_answer(answer.body, sent_s)
        except EdgeTableError as exc:
            log.warning("%s", exc)
            return
        old = self.table
        self.table = table = newer_table(old, table, self.loop.time())
        if old is None or old.generation != table.generation:
            log.info("route table generation %d: %s", table.generation, dict(table.weights))

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
                    self.answered(Outcome.REFUSED, exc.status)
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
        the ingress; refuse a backend path; answer the edge's own endpoints. Counted by what
        was done and the status answered (`counts`, `metrics`)."""
        outcome, response = await self._answer(request)
        self.answered(outcome, response.status)
        return response

    def answered(self, outcome: Outcome, status: int) -> None:
        self.counts[outcome.value] += 1
        self.metrics.answered(outcome, status)

    async def _answer(self, request: Request) -> tuple[Outcome, Response]:
        table = self.fresh_table()
        backend_root = table.routing.backend_root if table else EdgeRouting().backend_root
        target = classify(request.method, request.target, self.route_prefix, backend_root)
        if isinstance(target, EdgeHealth):
            return Outcome.LOCAL, self.health_answer(table, target.live)
        if isinstance(target, EdgeScrape):
            return Outcome.LOCAL, self.metrics_answer()
        if isinstance(target, Refuse):
            rid = request_id(_text(request.header(_REQUEST_ID)))
            return Outcome.REFUSED, _error_answer(target.status, target.code, target.message, rid)
        if target is not None and table is not None:
            routed = await self.route(request, target, table)
            if routed is not None:
                return routed
        return await self.pass_through(request)

    def metrics_answer(self) -> Response:
        """The edge's metrics (`serve.edge_metrics`), as a scrape gets them."""
        table = self.table
        body = self.metrics.render(
            table_generation=table.generation if table is not None else None,
            table_age_s=self.loop.time() - table.fetched_s if table is not None else None,
            healthy=len(self.healthy()),
            known=len(self.backends),
            connections=len(self.connections),
        )
        return Response(200, [(b"content-type", METRICS_CONTENT_TYPE)], body, True)

    def health_answer(self, table: EdgeTable | None, live: bool = False) -> Response:
        """The edge's own health (`serve.edge.EdgeHealth`): 200 while a proxy is healthy,
        else 503 (`live`: 200 anyway, the edge answers); the healthy proxies and the fresh
        route table's generation (null: none)."""
        healthy = len(self.healthy())
        doc = {
            "status": "ok" if healthy else "unavailable",
            "proxies_healthy": healthy,
            "table_generation": table.generation if table is not None else None,
        }
        return Response(
            200 if healthy or live else 503,
            [(b"content-type", _JSON), (b"cache-control", b"no-store")],
            json.dumps(doc).encode(),
            True,
        )

    async def route(
        self, request: Request, target: PredictTarget, table: EdgeTable
    ) -> tuple[Outcome, Response] | None:
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
                self.metrics.tried(forward.pool, TryResult.MODEL)
                kept = [(n, v) for n, v in answer.headers if n.lower() not in _EDGE_HEADERS]
                answer.headers = [
                    *kept,
                    (_REQUEST_ID, rid.encode()),
                    (_ATTEMPTS, str(attempts).encode()),
                ]
                return Outcome.ROUTED, answer
            self.metrics.tried(
                forward.pool, TryResult.SERVE if isinstance(answer, Response) else TryResult.FAILED
            )
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
        retry_after = table.routing.retry_after_s
        message = (
            f"model {target.model!r} cannot be served right now ({why}); retry after {retry_after}s"
        )
        extra = [(b"retry-after", str(retry_after).encode()), (_ATTEMPTS, str(attempts).encode())]
        return Outcome.UNAVAILABLE, _error_answer(503, ErrorCode.NO_CAPACITY, message, rid, extra)

    async def pass_through(self, request: Request) -> tuple[Outcome, Response]:
        """Send a request unchanged to a proxy (the ingress answers it)."""
        table = self.fresh_table()
        routing = table.routing if table is not None else EdgeRouting()
        data = encode_request(request.method, request.target, request.headers, request.body)
        answer = await self._send_any(
            data, routing.request_timeout_s + _PASS_MARGIN_S, head_only=request.method == "HEAD"
        )
        if isinstance(answer, Response):
            return Outcome.PASSED, answer
        rid = request_id(_text(request.header(_REQUEST_ID)))
        message = f"no Serve proxy answered ({answer})"
        extra = [(b"retry-after", str(routing.retry_after_s).encode())]
        return Outcome.UNAVAILABLE, _error_answer(503, ErrorCode.NO_CAPACITY, message, rid, extra)

    async def _send_any(self, data: bytes, timeout_s: float, *, head_only: bool) -> Response | str:
        """Send one request to the first proxy that takes it, in `backend_order`: a refused
        or timed-out connect, or a new connection the proxy closed without answering a byte
        (the request is idempotent: it reached no model), moves on to the next proxy at once.
        The answer, or why none came."""
        self.turn += 1
        why = f"none of {len(self.backends)} proxies accepted"
        reserve = self.proxies.reserve
        for backend in backend_order(self.backends, self.healthy(), self.turn, reserve):
            try:
                return await self.upstreams.exchange(
                    backend,
                    data,
                    head_only=head_only,
                    timeout_s=timeout_s,
                    max_bytes=self.limits.max_answer_bytes,
                )
            except ConnectFailed as exc:
                self.observe(backend, Probe.REFUSED if exc.refused else Probe.TIMEOUT)
            except UpstreamBroken as exc:
                if exc.answered:
                    return f"the proxy {_addr(backend)} broke off its answer"
                self.observe(backend, Probe.BROKEN)
                why = f"the proxy {_addr(backend)} closed the connection"
            except UpstreamTimeout:
                return f"no answer within {timeout_s:g}s"
            except HttpError as exc:
                return exc.message
        return why

    async def serve(self, stop: asyncio.Event) -> None:
        await self.discover()
        server = await asyncio.start_server(
            self.client,
            self.host,
            self.port,
            backlog=min(self.limits.max_connections, 4096),
            limit=_READ_LIMIT,
        )
        tasks = [
            self.loop.create_task(self.every_interval(self.discover, "proxy discovery")),
            self.loop.create_task(self.every_interval(self.check_all, "health check")),
            self.loop.create_task(self.every_interval(self.fetch_table, "route table fetch")),
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


def _error_answer(
    status: int,
    code: ErrorCode,
    message: str,
    rid: str,
    extra: Sequence[tuple[bytes, bytes]] = (),
) -> Response:
    """An answer the edge gives itself: the endpoint's JSON error body with the request's
    id (`serve.inputs.error_body`), and `extra` headers."""
    headers = [(b"content-type", _JSON), (b"x-request-id", rid.encode()), *extra]
    return Response(status, headers, error_body(code, message, rid), True)


def _error(status: int, code: ErrorCode, message: str, keep_alive: bool) -> bytes:
    """`_error_answer`'s bytes, for a request that could not be read (a fresh id)."""
    answer = _error_answer(status, code, message, request_id(None))
    return encode_response(answer.status, answer.headers, answer.body, keep_alive)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (`rcp up`'s locally, infra/k8s/edge.yaml's on Kubernetes)."""
    d = BalancerLimits()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--state-file", type=Path, help="the local cluster's state file (proxy ports, loopback)"
    )
    source.add_argument(
        "--proxies-dns",
        metavar="NAME:PORT",
        help="a headless Service's name (one address per ready proxy) and the proxies' port",
    )
    p.add_argument("--host", default=None, help="the loopback address to listen on (127.0.0.1)")
    p.add_argument(
        "--listen-any",
        action="store_true",
        help="listen on 0.0.0.0, for a pod (with --proxies-dns): the only way off loopback",
    )
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", type=Path, default=None, help="log file (default: stderr)")
    p.add_argument(
        "--route-prefix", default="/", help="the ingress's route prefix (serving.route_prefix)"
    )
    p.add_argument("--interval-s", type=float, default=d.interval_s)
    p.add_argument("--max-connections", type=int, default=d.max_connections)
    return p.parse_args(argv)


def listen_and_source(args: argparse.Namespace, timeout_s: float) -> tuple[str, ProxySource]:
    """Where to listen and where the proxies come from; ValueError says which flag is wrong.
    Loopback unless ``--listen-any`` (a pod, whose proxies are found by DNS)."""
    if args.listen_any:
        if args.proxies_dns is None or args.host is not None:
            raise ValueError(
                "--listen-any (0.0.0.0, for a pod) needs --proxies-dns and no --host; "
                "the local edge listens on loopback only"
            )
        host = "0.0.0.0"
    else:
        host = args.host or "127.0.0.1"
        if not host.startswith("127."):
            raise ValueError(f"--host must be a loopback address, got {host!r}")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1-65535, got {args.port}")
    if args.proxies_dns is not None:
        name, port = parse_dns_target(args.proxies_dns)
        return host, DnsProxies(name, port, timeout_s)
    return host, StateFileProxies(args.state_file, host)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not (0 < args.interval_s <= 60) or not (0 < args.max_connections <= 65536):
        print("--interval-s must be in (0, 60], --max-connections in (0, 65536]", file=sys.stderr)
        return 2
    limits = replace(
        BalancerLimits(), interval_s=args.interval_s, max_connections=args.max_connections
    )
    try:
        host, proxies = listen_and_source(args, limits.check_timeout_s)
    except ValueError as exc:
        print(exc, file=sys.stderr)
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
    balancer = Balancer(host, args.port, proxies, loop, limits, args.route_prefix)
    log.info("pid %d, proxies from %s", os.getpid(), proxies.describe())
    try:
        loop.run_until_complete(balancer.serve(stop))
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", host, args.port, exc)
        return 1
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
