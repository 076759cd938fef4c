"""The edge's HAProxy configuration, rendered from the product's settings (pure).

Owns: `EdgeSettings` (where the edge listens, which Serve proxies it sends to, its limits)
and `render`, which turns them into the files HAProxy runs with: ``haproxy.cfg``, the empty
weights map the route-table task fills, the Lua file (`rcp_edge.lua`, beside this module).
What the configuration does, request by request (docs/serving.md, "Ingress: what we chose"):

1. bounds: a head larger than ``tune.bufsize - tune.maxrewrite`` gets 400, a head not complete
   within `header_deadline_s` gets 408 and the connection closed, at most
   `max_client_connections` at once (more wait in the kernel's backlog);
2. refuses what the product does not serve, with the product's JSON error body: a path that is
   not one of the ingress's routes, compared on the bytes the client sent, so no encoding of
   ``/_rcp/...`` or ``/-/...`` gets through (404); a body sent with ``Transfer-Encoding`` (411:
   predicts carry a Content-Length; this also refuses Content-Length with Transfer-Encoding,
   chunk-size games and trailers); a declared body over ``max_body_bytes`` (413, before a
   byte of it is read);
3. drops the headers a client may not set: Serve's control headers
   (``x-request-timeout-seconds``, ``x-request-disconnect-disabled``), ``X-Rcp-*``, and any
   header the request's ``Connection`` header names; keeps a valid ``X-Request-Id`` or sets
   a fresh one;
4. routes: a ``POST <prefix>v1/models/<model>/predict`` whose model is in the weights map goes
   straight to the backend app of the pool a draw by the model's weights picks
   (``/_rcp/<model>/<pool>/...``); every other request, and every predict while the map is
   empty, goes to the ingress unchanged;
5. retries: a routed predict whose try met a refused or broken connection, a timeout, or
   Serve's own 404/500/502/503/504 is sent again to another proxy, up to ``max_attempts``
   tries; when none answers, 503 with ``Retry-After`` in the product's body.

Must not: start processes or touch files (`serve.edge.process` does), import Ray.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from serve.config import IngressConfig
from serve.inputs import ErrorCode
from serve.spec import BACKEND_ROUTE_ROOT

__all__ = [
    "ADMIN_HEALTH_PATH",
    "ADMIN_LIVE_PATH",
    "DnsProxies",
    "EdgeSettings",
    "EDGE_METRICS_PATH",
    "HAPROXY_METRICS_PATH",
    "LUA_FILE",
    "MAP_FILE",
    "StaticProxies",
    "TABLE_QUERY",
    "render",
]

LUA_SOURCE = Path(__file__).with_name("rcp_edge.lua")
LUA_FILE = "rcp_edge.lua"
MAP_FILE = "weights.map"
CONFIG_FILE = "haproxy.cfg"
ERROR_400_FILE = "400.http"
ERROR_408_FILE = "408.http"
TABLE_QUERY = "format=edge"
"""``GET <prefix>v1/models?format=edge``: the ingress's route table as the edge's Lua reads it
(`serve.app.ingress.edge_table_text`)."""
HAPROXY_METRICS_PATH = "/metrics"
"""HAProxy's own Prometheus exporter, on the admin listener only."""
EDGE_METRICS_PATH = "/rcp/metrics"
"""The route table's generation and age (`rcp_edge_route_table_*`), on the admin listener."""
ADMIN_HEALTH_PATH = "/healthz"
"""200 while at least one Serve proxy is up (readiness), else 503; admin listener."""
ADMIN_LIVE_PATH = "/livez"
"""200 whenever HAProxy answers (liveness); admin listener."""

BUFSIZE_BYTES = 65_536
MAXREWRITE_BYTES = 8_192
MAX_HEAD_BYTES = BUFSIZE_BYTES - MAXREWRITE_BYTES
"""The largest request head the edge reads (HAProxy answers 400 past it)."""
DRAW_SCALE = 1000
"""A model's map value: its cluster pool's share of the weights in thousandths."""
_MODEL_RE = "[A-Za-z0-9_.-]{1,64}"
_HEADER_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_NAME_RE = re.compile(r"[A-Za-z0-9.-]{1,253}")


@dataclass(frozen=True)
class StaticProxies:
    """Serve proxies at known addresses (the local cluster: ports chosen by `rcp up`)."""

    nodes: tuple[tuple[str, int], ...]
    """The node proxies: requests are spread over those up."""
    head: tuple[str, int] | None = None
    """The head's proxy: used only while no node proxy is up (HAProxy ``backup``)."""


@dataclass(frozen=True)
class DnsProxies:
    """Serve proxies found by DNS (Kubernetes: a headless Service's A records)."""

    name: str
    port: int
    max_proxies: int = 64
    """Server slots HAProxy fills from the answer (more addresses than this are not used)."""


@dataclass(frozen=True)
class EdgeSettings:
    listen_host: str
    listen_port: int
    admin_host: str
    admin_port: int
    """The admin listener: metrics and the edge's own health, never the public port."""
    work_dir: str
    """Where the rendered files live (HAProxy reads the map and the Lua file from there)."""
    proxies: StaticProxies | DnsProxies
    route_prefix: str = "/"
    ingress: IngressConfig = field(default_factory=IngressConfig)
    """The limits and retry budget the ingress applies too (``serving.ingress``)."""
    max_client_connections: int = 1024
    header_deadline_s: float = 10.0
    """A request's whole head must arrive within this (slow clients are cut off: 408)."""
    client_idle_s: float = 60.0
    """A keep-alive client connection with no request for this long is closed."""
    client_write_s: float = 30.0
    """A client that reads nothing of an answer for this long is dropped."""
    threads: int = 2
    log_target: str = "stderr"
    """HAProxy's ``log`` target (``stderr`` with ``-db``; a syslog address in a pod)."""
    stats_socket: str | None = None
    """HAProxy's runtime API socket path (local: in `work_dir`); None: none."""


def render(s: EdgeSettings) -> dict[str, str]:
    """The files of an edge: name -> text, ``haproxy.cfg`` among them."""
    _check(s)
    return {
        CONFIG_FILE: _haproxy_cfg(s),
        MAP_FILE: "",
        LUA_FILE: LUA_SOURCE.read_text(),
        ERROR_400_FILE: _error_file(
            400,
            "Bad Request",
            ErrorCode.BAD_REQUEST,
            f"not an HTTP request the endpoint reads, or its head is over {MAX_HEAD_BYTES} bytes",
        ),
        ERROR_408_FILE: _error_file(
            408,
            "Request Timeout",
            ErrorCode.REQUEST_TIMEOUT,
            f"the request's head did not arrive within {s.header_deadline_s:g} s",
        ),
    }


def _error_file(status: int, reason: str, code: ErrorCode, message: str) -> str:
    """A whole HTTP answer for HAProxy's ``errorfile``: used where no request was read, so
    there is no request id to give."""
    body = json.dumps({"error": {"code": code.value, "message": message, "request_id": ""}})
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\ncache-control: no-cache\r\nconnection: close\r\n"
        f"\r\n{body}"
    )


def _check(s: EdgeSettings) -> None:
    errors = []
    if not s.route_prefix.startswith("/") or not re.fullmatch(r"[A-Za-z0-9_./-]*", s.route_prefix):
        errors.append(f"route_prefix: a path of [A-Za-z0-9_./-], got {s.route_prefix!r}")
    for name, value in (("listen_host", s.listen_host), ("admin_host", s.admin_host)):
        if not _NAME_RE.fullmatch(value):
            errors.append(f"{name}: an address, got {value!r}")
    if (s.listen_host, s.listen_port) == (s.admin_host, s.admin_port):
        errors.append("admin_port: must differ from listen_port (metrics are never public)")
    if isinstance(s.proxies, StaticProxies):
        if not s.proxies.nodes and s.proxies.head is None:
            errors.append("proxies: no Serve proxy to send requests to")
        addrs = [*s.proxies.nodes, *([s.proxies.head] if s.proxies.head else [])]
        for host, port in addrs:
            if not _NAME_RE.fullmatch(host) or not 0 < port < 65536:
                errors.append(f"proxies: bad address {host}:{port}")
    elif not _NAME_RE.fullmatch(s.proxies.name) or not 0 < s.proxies.port < 65536:
        errors.append(f"proxies: bad DNS name or port {s.proxies.name}:{s.proxies.port}")
    if s.threads < 1 or s.max_client_connections < 1:
        errors.append("threads and max_client_connections: at least 1")
    for name, seconds in (
        ("header_deadline_s", s.header_deadline_s),
        ("client_idle_s", s.client_idle_s),
        ("client_write_s", s.client_write_s),
    ):
        if not 0.01 <= seconds <= 86_400:  # NaN fails too
            errors.append(f"{name}: between 0.01 and 86400 s, got {seconds!r}")
    if errors:
        raise ValueError("edge settings: " + "; ".join(errors))


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _error(status: int, code: ErrorCode, message: str) -> str:
    """An ``lf-string`` answer in the product's error shape, the request id filled in."""
    body = json.dumps({"error": {"code": code.value, "message": message, "request_id": "RID"}})
    body = body.replace("%", "%%").replace('"RID"', '"%[var(txn.rid)]"')
    assert "'" not in body, "HAProxy single-quoted strings cannot hold a quote"
    return f"status {status} content-type application/json lf-string '{body}'"


def _servers(s: EdgeSettings, track: str | None = None) -> list[str]:
    """The proxies as server lines; with `track`, static servers follow that backend's checks
    (one health check per proxy, not one per backend; DNS-filled slots cannot track)."""
    p = s.proxies
    if isinstance(p, DnsProxies):
        return [
            f"server-template proxy 1-{p.max_proxies} {p.name}:{p.port} resolvers dns "
            "init-addr none resolve-prefer ipv4 check"
        ]
    named = [(f"node{i}", host, port, "") for i, (host, port) in enumerate(p.nodes)]
    if p.head is not None:
        named.append(("head", p.head[0], p.head[1], " backup"))
    return [
        f"server {name} {host}:{port}{bck}" + (f" track {track}/{name}" if track else " check")
        for name, host, port, bck in named
    ]


ROUTED_RETRY_ON = "conn-failure empty-response junk-response response-timeout 404 500 502 503 504"
"""A routed predict is tried again on a failed connection or Serve's own failure (by status:
a model's 500 too; docs/serving.md, "Retries")."""
PASSED_RETRY_ON = "conn-failure empty-response junk-response"
"""A request passed to the ingress is tried again only when no answer came (the ingress
retries the rest itself)."""


def _backend(
    name: str, retry_on: str, check: str, s: EdgeSettings, no_capacity: str, retry_after: str
) -> list[str]:
    """A backend over the Serve proxies: ``routed`` checks them, ``ingress`` follows its
    checks; when no try answers, 503 ``no_capacity`` with Retry-After."""
    return [
        f"backend {name}",
        "    balance roundrobin",
        check,
        f"    retry-on {retry_on}",
        f"    retries {s.ingress.max_attempts - 1}",
        "    option redispatch 1",
        *(
            f"    http-error status {code} {no_capacity} hdr retry-after {retry_after}"
            for code in (502, 503, 504)
        ),
        *(f"    {line}" for line in _servers(s, track=None if name == "routed" else "routed")),
        "",
    ]


def _haproxy_cfg(s: EdgeSettings) -> str:
    ing = s.ingress
    work = s.work_dir.rstrip("/")
    prefix = s.route_prefix if s.route_prefix.endswith("/") else s.route_prefix + "/"
    pre = re.escape(prefix)
    # The path's field holding the model: "/" + prefix segments + v1/models/<model>.
    model_field = 1 + len([p for p in prefix.split("/") if p]) + 3
    root = BACKEND_ROUTE_ROOT.rstrip("/")
    retry_after = str(ing.retry_after_s)
    no_capacity = _error(
        503, ErrorCode.NO_CAPACITY, "no replica could answer; try again after Retry-After"
    )
    stats = [f"    stats socket {s.stats_socket} mode 600 level admin"] if s.stats_socket else []
    resolvers = (
        [
            "resolvers dns",
            "    parse-resolv-conf",
            "    resolve_retries 3",
            "    timeout resolve 250ms",
            "    timeout retry 250ms",
            "    hold valid 1s",
            "    hold obsolete 1s",
            "    accepted_payload_size 8192",
            "",
        ]
        if isinstance(s.proxies, DnsProxies)
        else []
    )
    check = (
        "    option httpchk GET /-/healthz\n"
        "    http-check expect string success\n"
        "    default-server inter 250ms fastinter 250ms downinter 500ms fall 1 rise 1"
        " observe layer4 error-limit 1 on-error mark-down"
    )
    lines = [
        "# Rendered by serve.edge.config from the product's settings; do not edit.",
        "global",
        f"    maxconn {s.max_client_connections + 64}",
        f"    nbthread {s.threads}",
        f"    tune.bufsize {BUFSIZE_BYTES}",
        f"    tune.maxrewrite {MAXREWRITE_BYTES}",
        "    tune.http.maxhdr 100",
        f"    log {s.log_target} format short local0 info",
        f"    setenv RCP_EDGE_MAP {work}/{MAP_FILE}",
        f"    setenv RCP_EDGE_TABLE_PATH {prefix}v1/models?{TABLE_QUERY}",
        "    setenv RCP_EDGE_BACKEND routed",
        f"    lua-load {work}/{LUA_FILE}",
        *stats,
        "",
        *resolvers,
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    option dontlog-normal",
        "    option http-keep-alive",
        f"    timeout connect {_ms(min(2.0, ing.attempt_timeout_s))}",
        f"    timeout client {_ms(s.client_write_s)}",
        f"    timeout server {_ms(ing.attempt_timeout_s)}",
        f"    timeout http-request {_ms(s.header_deadline_s)}",
        f"    timeout http-keep-alive {_ms(s.client_idle_s)}",
        f"    timeout queue {_ms(min(5.0, ing.request_timeout_s))}",
        "    timeout check 1s",
        f"    errorfile 400 {work}/{ERROR_400_FILE}",
        f"    errorfile 408 {work}/{ERROR_408_FILE}",
        "",
        "frontend public",
        f"    bind {s.listen_host}:{s.listen_port}",
        f"    maxconn {s.max_client_connections}",
        # A fresh id: the edge's pid, the request's second, its number in this process and the
        # client's address and port, in hex (cheaper than a random UUID per request).
        "    unique-id-format %{+X}o%pid-%Ts-%rt-%ci-%cp",
        # The request id: the client's if it is one the product accepts, else a fresh one.
        f"    http-request set-var(txn.rid) req.hdr(x-request-id) if {{ req.hdr_cnt(x-request-id) eq 1 }} {{ req.hdr(x-request-id) -m reg ^{_HEADER_RE.pattern}$ }}",
        "    http-request set-var(txn.rid) unique-id unless { var(txn.rid) -m found }",
        "    http-request set-header x-request-id %[var(txn.rid)]",
        "    http-after-response set-header x-request-id %[var(txn.rid)] if { var(txn.rid) -m found }",
        f"    acl route_predict path_reg ^{pre}v1/models/{_MODEL_RE}/predict/?$",
        f"    acl route_other path_reg ^{pre}(healthz|v1/models)/?$",
        f"    http-request return {_error(404, ErrorCode.NOT_FOUND, f'no such route; use POST {prefix}v1/models/<model>/predict or GET {prefix}v1/models')} unless route_predict || route_other",
        f"    http-request return {_error(411, ErrorCode.LENGTH_REQUIRED, 'send the body with a Content-Length; a body with Transfer-Encoding is not accepted')} if {{ req.hdr_cnt(transfer-encoding) gt 0 }}",
        f"    http-request return {_error(413, ErrorCode.BODY_TOO_LARGE, f'body exceeds the limit of {ing.max_body_bytes} bytes')} if {{ req.hdr_val(content-length) gt {ing.max_body_bytes} }}",
        "    http-request del-header x-request-timeout-seconds",
        "    http-request del-header x-request-disconnect-disabled",
        "    http-request del-header x-rcp- -m beg",
        "    http-request lua.rcp_strip_connection_headers if { req.hdr(connection),lower -m reg ^(?!(close|keep-alive)$) }",
        f"    http-request wait-for-body time {_ms(s.header_deadline_s)}",
        f"    http-request set-var(txn.model) path,field({model_field},/) if route_predict METH_POST",
        f"    http-request set-var(txn.share) var(txn.model),map({work}/{MAP_FILE}) if {{ var(txn.model) -m found }}",
        f"    http-request set-var(txn.draw) rand({DRAW_SCALE}),sub(txn.share) if {{ var(txn.share) -m found }}",
        f"    http-request set-path {root}/%[var(txn.model)]/cluster/v1/models/%[var(txn.model)]/predict if {{ var(txn.draw) -m int lt 0 }}",
        f"    http-request set-path {root}/%[var(txn.model)]/external/v1/models/%[var(txn.model)]/predict if {{ var(txn.draw) -m int ge 0 }}",
        "    use_backend routed if { var(txn.draw) -m found }",
        "    default_backend ingress",
        "",
        "frontend admin",
        f"    bind {s.admin_host}:{s.admin_port}",
        "    maxconn 64",
        f"    http-request use-service prometheus-exporter if {{ path {HAPROXY_METRICS_PATH} }}",
        f"    http-request use-service lua.rcp_edge_metrics if {{ path {EDGE_METRICS_PATH} }}",
        f"    http-request return status 200 content-type text/plain string ok if {{ path {ADMIN_LIVE_PATH} }}",
        f"    http-request return status 200 content-type text/plain string ok if {{ path {ADMIN_HEALTH_PATH} }} {{ nbsrv(routed) gt 0 }}",
        f"    http-request return status 503 content-type text/plain string 'no Serve proxy is up' if {{ path {ADMIN_HEALTH_PATH} }}",
        "    http-request return status 404",
        "",
        *_backend("routed", ROUTED_RETRY_ON, check, s, no_capacity, retry_after),
        *_backend("ingress", PASSED_RETRY_ON, check, s, no_capacity, retry_after),
    ]
    return "\n".join(lines)
