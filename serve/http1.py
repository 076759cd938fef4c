"""HTTP/1.1 on asyncio streams for the edge router (``serve.edge_router``).

Owns: reading a client's requests one at a time (keep-alive and pipelined, a
``100 Continue`` when a client waits for one), sending a request to a Serve proxy over a
pooled keep-alive connection and reading its answer (`Upstreams`), and the bytes of a request
or an answer with the hop-by-hop headers replaced. Parsing is httptools' (llhttp, the parser
uvicorn and so Serve's proxies use). Everything is bounded: a request's head
(`MAX_HEAD_BYTES`), its body (the caller's limit, a declared length refused before it is
read), an answer's size, idle connections per proxy.

Must not: decide where a request goes (`serve.edge` and `serve.edge_router` do), import Ray.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass
from http import HTTPStatus

import httptools

__all__ = [
    "HOP_BY_HOP",
    "Backend",
    "MAX_HEAD_BYTES",
    "ConnectFailed",
    "HttpError",
    "Request",
    "RequestReader",
    "Response",
    "UpstreamBroken",
    "UpstreamTimeout",
    "Upstreams",
    "encode_request",
    "encode_response",
]

MAX_HEAD_BYTES = 64 * 1024
"""Largest request line plus headers a client may send (431 beyond it)."""
MAX_HEADERS = 100
_READ_BYTES = 64 * 1024

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"expect",
        b"content-length",
    }
)
"""Headers that describe one connection, not the message: never forwarded (the edge writes
its own ``content-length`` and ``connection``)."""

Headers = list[tuple[bytes, bytes]]
Backend = tuple[str, int]
"""A Serve proxy: its (host, port)."""


@dataclass
class Request:
    method: str
    target: str
    """Path and query, as the client sent them."""
    headers: Headers
    body: bytes
    keep_alive: bool

    def header(self, name: bytes) -> bytes | None:
        """The first value of header `name` (lowercase), or None."""
        for n, v in self.headers:
            if n.lower() == name:
                return v
        return None


@dataclass
class Response:
    status: int
    headers: Headers
    body: bytes
    keep_alive: bool


class HttpError(Exception):
    """A client request the edge answers itself with `status` and closes: malformed, too
    large, an upgrade."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ConnectFailed(Exception):
    """No connection to the proxy: `refused` (nothing listens) or a timeout."""

    def __init__(self, refused: bool) -> None:
        super().__init__("refused" if refused else "connect timed out")
        self.refused = refused


class UpstreamBroken(Exception):
    """The proxy closed the connection before a whole answer. `answered` says whether any
    byte of one had come; `fresh` whether the connection was new (not a pooled one the proxy
    may have closed while idle)."""

    def __init__(self, answered: bool, fresh: bool) -> None:
        super().__init__("closed before a whole answer")
        self.answered = answered
        self.fresh = fresh


class UpstreamTimeout(Exception):
    """No whole answer within the time allowed."""


class _RequestParts:
    """httptools callbacks collecting requests; limits are checked after each feed."""

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self.parser = httptools.HttpRequestParser(self)
        self.done: collections.deque[Request] = collections.deque()
        self.in_message = False
        self.continue_wanted = False
        self.error: HttpError | None = None
        self._start()

    def _start(self) -> None:
        self.url: list[bytes] = []
        self.headers: Headers = []
        self.body: list[bytes] = []
        self.head_bytes = 0
        self.body_bytes = 0

    def on_message_begin(self) -> None:
        self.in_message = True
        self._start()

    def on_url(self, url: bytes) -> None:
        self.url.append(url)
        self.head_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        self.head_bytes += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        if len(self.headers) > MAX_HEADERS:
            self.error = HttpError(431, f"more than {MAX_HEADERS} headers")
        for name, value in self.headers:
            low = name.lower()
            if low == b"content-length" and value.strip().isdigit():
                if int(value) > self.max_body_bytes:
                    self.error = self.error or HttpError(
                        413,
                        f"body of {int(value)} bytes exceeds the limit of "
                        f"{self.max_body_bytes} bytes",
                    )
            elif low == b"expect" and value.strip().lower() == b"100-continue":
                self.continue_wanted = True

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.max_body_bytes:
            self.error = self.error or HttpError(
                413, f"body exceeds the limit of {self.max_body_bytes} bytes"
            )
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        self.continue_wanted = False
        self.done.append(
            Request(
                method=self.parser.get_method().decode("ascii", "replace"),
                target=b"".join(self.url).decode("latin-1"),
                headers=self.headers,
                body=b"".join(self.body),
                keep_alive=self.parser.should_keep_alive(),
            )
        )
        self._start()


class RequestReader:
    """A client connection's requests, one at a time."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_body_bytes: int
    ) -> None:
        self.reader, self.writer = reader, writer
        self.parts = _RequestParts(max_body_bytes)
        self.eof = False

    def set_max_body_bytes(self, limit: int) -> None:
        self.parts.max_body_bytes = limit

    async def next(self, idle_timeout_s: float) -> Request | None:
        """The next request; None when the client closed between requests or sent nothing
        for `idle_timeout_s`. Raises `HttpError` for a request the edge must refuse."""
        parts = self.parts
        while not parts.done:
            if self.eof:
                if parts.in_message:
                    raise HttpError(400, "the connection closed in the middle of a request")
                return None
            try:
                data = await asyncio.wait_for(self.reader.read(_READ_BYTES), idle_timeout_s)
            except TimeoutError:
                if parts.in_message:
                    raise HttpError(408, "the request did not arrive in time") from None
                return None
            if not data:
                self.eof = True
                continue
            try:
                parts.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                raise HttpError(501, "protocol upgrades are not supported") from None
            except httptools.HttpParserError:
                raise HttpError(400, "malformed HTTP request") from None
            if parts.error is not None:
                raise parts.error
            if parts.head_bytes > MAX_HEAD_BYTES:
                raise HttpError(431, f"request head exceeds {MAX_HEAD_BYTES} bytes")
            if parts.continue_wanted and parts.in_message:
                parts.continue_wanted = False
                self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return parts.done.popleft()


class _ResponseParts:
    def __init__(self, head_only: bool, max_bytes: int) -> None:
        self.head_only = head_only
        self.max_bytes = max_bytes
        self.parser = httptools.HttpResponseParser(self)
        self.headers: Headers = []
        self.body: list[bytes] = []
        self.size = 0
        self.complete = False
        self.too_big = False
        self.keep_alive = False
        """Read in the callbacks: httptools forgets it once the message is complete."""

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        self.size += len(name) + len(value)

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        if self.head_only:  # an answer to HEAD has no body, whatever its headers say
            self.complete = True

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.max_bytes:
            self.too_big = True
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True


async def read_response(
    reader: asyncio.StreamReader, head_only: bool, max_bytes: int, fresh: bool
) -> Response:
    """Read one answer (`HttpError` 502 past `max_bytes`; `UpstreamBroken` when the
    connection ends first or the bytes are not HTTP)."""
    parts = _ResponseParts(head_only, max_bytes)
    answered = False
    while not parts.complete:
        data = await reader.read(_READ_BYTES)
        if not data:
            raise UpstreamBroken(answered, fresh)
        answered = True
        try:
            parts.parser.feed_data(data)
        except httptools.HttpParserError:
            if not parts.complete:  # (a HEAD answer's parser may complain past its head)
                raise UpstreamBroken(True, fresh) from None
        if parts.too_big:
            raise HttpError(502, f"the answer exceeds {max_bytes} bytes")
    return Response(
        status=parts.parser.get_status_code(),
        headers=parts.headers,
        body=b"".join(parts.body),
        keep_alive=parts.keep_alive,
    )


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Upstreams:
    """Keep-alive connections to the proxies, at most `max_idle` idle ones per proxy."""

    def __init__(self, connect_timeout_s: float, max_idle: int = 32) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.max_idle = max_idle
        self.idle: dict[Backend, list[_Conn]] = {}
        self.kept: set[Backend] | None = None
        """The proxies whose connections are pooled (None: all); `forget` sets it."""
        self.busy: dict[Backend, set[asyncio.StreamWriter]] = {}
        """Connections with a request in flight, per proxy (`abort` breaks them)."""

    async def exchange(
        self, backend: Backend, data: bytes, *, head_only: bool, timeout_s: float, max_bytes: int
    ) -> Response:
        """Send `data` (a whole request) to the proxy `backend` and return its answer. A
        pooled connection the proxy closed while idle is replaced by a new one at once (the
        request never reached it). Raises `ConnectFailed`, `UpstreamBroken`,
        `UpstreamTimeout`, or `HttpError` (502) for an answer too large."""
        pool = self.idle.get(backend)
        while pool:
            conn = pool.pop()
            try:
                return await self._send(backend, conn, data, head_only, timeout_s, max_bytes, False)
            except UpstreamBroken as exc:
                if exc.answered:
                    raise
        conn = await self._connect(backend)
        return await self._send(backend, conn, data, head_only, timeout_s, max_bytes, True)

    async def _connect(self, backend: Backend) -> _Conn:
        host, port = backend
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=_READ_BYTES),
                self.connect_timeout_s,
            )
        except TimeoutError:
            raise ConnectFailed(refused=False) from None
        except OSError:
            raise ConnectFailed(refused=True) from None

    async def _send(
        self,
        backend: Backend,
        conn: _Conn,
        data: bytes,
        head_only: bool,
        timeout_s: float,
        max_bytes: int,
        fresh: bool,
    ) -> Response:
        reader, writer = conn
        keep = False
        busy = self.busy.setdefault(backend, set())
        busy.add(writer)
        try:
            writer.write(data)
            response = await asyncio.wait_for(
                read_response(reader, head_only, max_bytes, fresh), timeout_s
            )
            keep = response.keep_alive
            return response
        except TimeoutError:
            raise UpstreamTimeout() from None
        except (ConnectionError, OSError):
            raise UpstreamBroken(False, fresh) from None
        finally:
            busy.discard(writer)
            kept = self.kept is None or backend in self.kept
            pool = self.idle.setdefault(backend, []) if kept else []
            if keep and kept and len(pool) < self.max_idle:
                pool.append(conn)
            else:
                writer.close()

    def abort(self, backend: Backend) -> int:
        """Break every connection to `backend`, idle or with a request in flight, and return
        how many had a request in flight: the proxy is gone (its port refuses, or it closed a
        connection unanswered), and a request in flight there would otherwise wait out its
        whole timeout, since a proxy whose node dies does not always close its connections
        at once. Each such request sees its connection broken (`UpstreamBroken`) and goes on
        to another proxy."""
        for _reader, writer in self.idle.pop(backend, []):
            writer.close()
        in_flight = list(self.busy.get(backend, ()))
        for writer in in_flight:
            writer.transport.abort()
        return len(in_flight)

    def forget(self, keep: set[Backend]) -> None:
        """Close the idle connections to every proxy not in `keep` (it left the list), and
        pool none to them from now on (an exchange in flight closes its connection)."""
        self.kept = set(keep)
        for backend in [b for b in self.idle if b not in keep]:
            for _reader, writer in self.idle.pop(backend):
                writer.close()

    def close(self) -> None:
        self.forget(set())


def encode_request(method: str, target: str, headers: Headers, body: bytes) -> bytes:
    """The bytes of a request to a proxy: the client's end-to-end headers and the body with
    its length (a request the edge read whole, chunked or not)."""
    out = [f"{method} {target} HTTP/1.1\r\n".encode("latin-1")]
    out.extend(n + b": " + v + b"\r\n" for n, v in headers if n.lower() not in HOP_BY_HOP)
    if body or method not in ("GET", "HEAD"):
        out.append(b"content-length: %d\r\n" % len(body))
    out.append(b"\r\n")
    out.append(body)
    return b"".join(out)


def encode_response(
    status: int,
    headers: Headers,
    body: bytes,
    keep_alive: bool,
    *,
    head_only: bool = False,
) -> bytes:
    """The bytes of an answer to a client. `head_only` (an answer to HEAD): the proxy's own
    ``content-length`` is kept and no body is sent."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    out = [f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")]
    for n, v in headers:
        low = n.lower()
        if low not in HOP_BY_HOP or (head_only and low == b"content-length"):
            out.append(n + b": " + v + b"\r\n")
    if not head_only:
        out.append(b"content-length: %d\r\n" % len(body))
    if not keep_alive:
        out.append(b"connection: close\r\n")
    out.append(b"\r\n")
    if not head_only:
        out.append(body)
    return b"".join(out)
