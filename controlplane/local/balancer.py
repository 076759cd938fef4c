"""The local `serve` endpoint: a loopback TCP load balancer over the nodes' Serve proxies.

Locally every simulated node shares 127.0.0.1, so each node's Serve proxy listens on a port of
its own (the head's on the port Serve was started with, each worker node's on the one
``controlplane.local.provider`` gave it), and this process listens on ``serve.http_port``, the
endpoint `rcp up` prints. It plays the cloud load balancer in front of a KubeRay cluster's
proxies (the ``rcp-serve`` Service): it runs outside Ray, started by `rcp up` and stopped by
`rcp down` (it carries the cluster's id in its environment, ``controlplane.local.processes``),
so it outlives the head; it holds no credentials (its environment is the cluster id and PATH
only) and never talks to Ray.

What it does:
- each new client connection goes to one healthy proxy, round robin, and is spliced to it
  byte for byte (no HTTP parsing: a keep-alive connection stays on the proxy it entered); a
  connect that is refused or times out tries the next proxy at once, healthy ones first, then
  the others (a draining proxy still answers; better than no answer);
- every proxy's ``/-/healthz`` is asked every ``interval_s`` (4 times a second by default).
  Serve answers 503 there while the node drains (Serve stops counting a node Ray drains as a
  proxy node) or before the proxy knows a replica: such a proxy gets no new connection until
  it answers 200 again. A refusal or a non-200 answer takes a proxy out at once; a timeout
  only after `fall` in a row (a busy proxy is slow, not gone); `rise` answers in a row bring
  it back (`next_health`). A proxy that closes a connection it was sent bytes on without
  answering a byte is taken out at once too (a passive check: a dying proxy), so a client's
  retry goes elsewhere even before the next health check;
- everything is bounded: ``max_connections`` client connections (more are closed at once),
  ``buffer_bytes`` buffered per direction of a connection (reading pauses beyond it), an idle
  connection is closed after ``idle_timeout_s``, a health answer's first line at most 1 KiB.

Backends: the proxy ports `rcp up` allocated (``serve_proxies`` in the local cluster's state
file: the head's and one per node slot), re-read whenever the state file changes. Discovery
needs neither the GCS (down with the head) nor the Ray token: a port where no node's proxy
listens yet simply refuses the health check, and a node that joins (the autoscaler adds
external nodes) is healthy as soon as its proxy answers.

Must not: bind anything but the given loopback address, import Ray, or read the Ray token.

Run by `rcp up` as ``python -m controlplane.local.balancer --state-file <state_dir>/local-
cluster.json --host 127.0.0.1 --port <serve.http_port> --log <state_dir>/logs/...``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import cast

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
    idle_timeout_s: float = 300.0


class _Side(asyncio.Protocol):
    """One end of a spliced connection: what it reads, it writes to its peer."""

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.bytes_in = 0
        self.eof = False
        self.closed = False
        self.early: list[bytes] = []
        """What a client sent before its backend was connected (reading pauses at once, but
        a loop may deliver a first read): bounded by `buffer_bytes`."""

    def itself(self) -> _Side:
        """The protocol factory that hands this side to `create_connection`."""
        return self

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass, but is one).
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=self.conn.balancer.limits.buffer_bytes)
        if self is self.conn.client:
            self.conn.balancer.arrived(self.conn)

    def data_received(self, data: bytes) -> None:
        self.bytes_in += len(data)
        self.conn.last_active = self.conn.balancer.loop.time()
        peer = self.peer
        if peer is None:
            self.early.append(data)
            if self.bytes_in > self.conn.balancer.limits.buffer_bytes and self.transport:
                self.transport.pause_reading()
        elif peer.transport is not None and not peer.closed:
            peer.transport.write(data)

    def eof_received(self) -> bool:
        self.eof = True
        self.conn.ended(self)
        peer = self.peer
        if peer is None or peer.transport is None or peer.closed or peer.eof:
            self.conn.close()
            return False
        if peer.transport.can_write_eof():
            peer.transport.write_eof()  # after what is buffered; the answer may still come
        return True

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.conn.ended(self)
        self.conn.close()


class _Connection:
    """A client connection and the backend connection it is spliced to."""

    def __init__(self, balancer: Balancer) -> None:
        self.balancer = balancer
        self.client = _Side(self)
        self.backend: _Side | None = None
        self.port: int | None = None
        self.last_active = balancer.loop.time()
        self.done = False

    def ended(self, side: _Side) -> None:
        """`side` sent EOF or went away: a backend that does so after the client sent bytes,
        without answering one, is taken out at once (a proxy that is dying)."""
        if (
            side is self.backend
            and self.port is not None
            and side.bytes_in == 0
            and self.client.bytes_in > 0
            and not self.client.closed
        ):
            self.balancer.observe(self.port, Probe.BROKEN)

    def close(self) -> None:
        if self.done:
            return
        self.done = True
        self.balancer.connections.discard(self)
        for side in (self.client, self.backend):
            if side is not None and side.transport is not None and not side.closed:
                side.transport.close()  # after what is buffered is written


class Balancer:
    """The listening socket, the health table and the health-check loop."""

    def __init__(
        self,
        host: str,
        port: int,
        state_file: Path,
        loop: asyncio.AbstractEventLoop,
        limits: BalancerLimits | None = None,
    ) -> None:
        self.host, self.port, self.state_file, self.loop = host, port, state_file, loop
        self.limits = limits or BalancerLimits()
        self.backends: list[int] = []
        self.health: dict[int, BackendHealth] = {}
        self.connections: set[_Connection] = set()
        self.turn = 0
        self.spliced = 0
        self.rejected = 0
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
            self._close_idle()
            await asyncio.sleep(max(0.0, self.limits.interval_s - (self.loop.time() - started)))

    def _close_idle(self) -> None:
        cutoff = self.loop.time() - self.limits.idle_timeout_s
        for conn in [c for c in self.connections if c.last_active < cutoff]:
            conn.close()

    # -- connections ----------------------------------------------------------------------
    def accept(self) -> asyncio.Protocol:
        return _Connection(self).client

    def arrived(self, conn: _Connection) -> None:
        """A client connected: over the cap it is closed at once; else it waits (reading
        paused) until a backend accepts."""
        transport = conn.client.transport
        assert transport is not None
        if len(self.connections) >= self.limits.max_connections:
            self.rejected += 1
            conn.close()
            return
        self.connections.add(conn)
        transport.pause_reading()
        self.loop.create_task(self._connect(conn))

    async def _connect(self, conn: _Connection) -> None:
        """Splice `conn`'s client to the first backend that accepts, in `backend_order`."""
        self.turn += 1
        for port in backend_order(self.backends, self.healthy(), self.turn):
            if conn.done:
                return
            backend = _Side(conn)
            try:
                await asyncio.wait_for(
                    self.loop.create_connection(backend.itself, self.host, port),
                    self.limits.connect_timeout_s,
                )
            except TimeoutError:
                self.observe(port, Probe.TIMEOUT)
                continue
            except OSError:
                self.observe(port, Probe.REFUSED)
                continue
            client = conn.client.transport
            if conn.done or client is None:  # the client went away meanwhile
                if backend.transport is not None:
                    backend.transport.close()
                return
            conn.backend, conn.port = backend, port
            backend.peer, conn.client.peer = conn.client, backend
            self.spliced += 1
            if backend.transport is not None:
                backend.transport.writelines(conn.client.early)
            conn.client.early = []
            client.resume_reading()
            return
        log.warning("no proxy accepted a connection (%d known)", len(self.backends))
        conn.close()

    async def serve(self, stop: asyncio.Event) -> None:
        self.reload_backends()
        server = await self.loop.create_server(
            self.accept, self.host, self.port, backlog=min(self.limits.max_connections, 4096)
        )
        checker = self.loop.create_task(self.check_forever())
        log.info("listening on %s:%d", self.host, self.port)
        try:
            await stop.wait()
        finally:
            checker.cancel()
            server.close()
            for conn in list(self.connections):
                conn.close()
            log.info(
                "stopped: %d connections spliced, %d refused over max_connections",
                self.spliced,
                self.rejected,
            )


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    d = BalancerLimits()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--state-file", type=Path, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--log", type=Path, default=None, help="log file (default: stderr)")
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
    balancer = Balancer(args.host, args.port, args.state_file, loop, limits)
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
