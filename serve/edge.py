"""The edge router's decisions: which requests an edge routes itself, to which backend path,
whether an answer came from the model, and the route table it reads from the ingress.

An edge is an HTTP router in front of the Serve proxies (``serve.edge_router``: locally one
process on loopback, on Kubernetes the ``rcp-edge`` Deployment). For ``POST
<route_prefix>v1/models/<model>/predict`` it picks the pool by the model's route weights, the
same way the ingress does (`serve.routing.choose_pool`), and sends the request through a proxy
straight to that (model, pool)'s backend app at
``<backend_root>/<model>/<pool>/v1/models/<model>/predict``: one Serve HTTP hop instead of two
(proxy -> ingress replica -> handle call -> backend). Every other request, and every predict
while the edge has no fresh table, goes through unchanged to the ingress deployment, which
stays the complete path (it validates, routes and retries by the same table). ``GET /-/edge/healthz`` and ``GET /-/edge/metrics`` are the edge's own (`EdgeHealth`,
`EdgeScrape`), never forwarded.

The table is the ingress's own ``GET <route_prefix>v1/models`` answer: the route weights, the
generation and a ``routing`` block with the retry budget and the longest a table may be used
(`EdgeRouting.table_max_age_s`). An edge uses a table only while it is younger than that,
and make-before-break waits that long after every ingress replica applied a new table before
it stops a replica (`serve.operations.route_applied`): a table fetched after the ingress
applied generation N is N or later, one fetched before is no longer used.

An answer is the model's when it carries ``X-Rcp-Pool`` (every backend answer does, its
errors included): it goes back to the client as it is, never retried. An answer without it
is Serve's own (a 404 for an app just deleted, a 500 for a replica that died, a 503): the
request is tried again on another pool within the budget (`serve.routing.retry_decision`).

Must not: import Ray, do I/O, read a clock or draw random numbers (the caller passes `now_s`
and the uniform draw `u`, so tests are exact).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import parse_qs

from serve.config import POOLS, IngressConfig
from serve.inputs import ErrorCode, JsonBodyError, loads_json
from serve.routing import choose_pool
from serve.spec import BACKEND_ROUTE_ROOT

__all__ = [
    "EDGE_HEALTH_PATH",
    "EDGE_METRICS_PATH",
    "MAX_TABLE_BYTES",
    "MODEL_HEADER",
    "EdgeHealth",
    "EdgeScrape",
    "EdgeRouting",
    "EdgeTable",
    "EdgeTableError",
    "Forward",
    "PredictTarget",
    "Refuse",
    "backend_path",
    "choose_backend",
    "classify",
    "is_model_answer",
    "newer_table",
    "table_from_answer",
]

MAX_TABLE_BYTES = 1_048_576
"""Largest ``v1/models`` answer an edge reads (a dozen models take a few KiB)."""

MODEL_HEADER = b"x-rcp-pool"
"""The header every backend answer carries (its pool): the model answered."""

EDGE_METRICS_PATH = "/-/edge/metrics"
"""The edge's own metrics in Prometheus's text format (`serve.edge_metrics`), answered by the
edge itself; Prometheus scrapes it."""
EDGE_HEALTH_PATH = "/-/edge/healthz"
"""The edge's own health, answered by the edge itself and never forwarded (a kubelet probe
that does not depend on Serve). Outside any route prefix, like Serve's ``/-/healthz``."""

_MODEL_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_]{0,47}")
_DEFAULTS = IngressConfig()


@dataclass(frozen=True)
class EdgeRouting:
    """The ingress's retry budget and limits, as its ``v1/models`` answer states them."""

    max_attempts: int = _DEFAULTS.max_attempts
    attempt_timeout_s: float = _DEFAULTS.attempt_timeout_s
    request_timeout_s: float = _DEFAULTS.request_timeout_s
    retry_after_s: int = _DEFAULTS.retry_after_s
    max_body_bytes: int = _DEFAULTS.max_body_bytes
    table_max_age_s: float = _DEFAULTS.edge_table_max_age_s
    backend_root: str = BACKEND_ROUTE_ROOT


_ROUTING_BOUNDS: dict[str, tuple[float, float]] = {
    "max_attempts": (1, 100),
    "attempt_timeout_s": (0.001, 3600),
    "request_timeout_s": (0.001, 3600),
    "retry_after_s": (0, 3600),
    "max_body_bytes": (1, 1 << 30),
    "table_max_age_s": (0.1, 30),
}


@dataclass(frozen=True)
class EdgeTable:
    """One fetched route table. `fetched_s` is when its request was sent (the edge's clock)."""

    generation: int
    weights: Mapping[str, Mapping[str, float]]
    routing: EdgeRouting = field(default_factory=EdgeRouting)
    fetched_s: float = 0.0

    def fresh(self, now_s: float) -> bool:
        """Whether the edge may still route by this table at `now_s`."""
        return 0.0 <= now_s - self.fetched_s < self.routing.table_max_age_s


class EdgeTableError(ValueError):
    """A ``v1/models`` answer the edge cannot route by; the message says what is wrong."""


def table_from_answer(raw: bytes, fetched_s: float) -> EdgeTable:
    """The route table in the ingress's ``v1/models`` answer `raw` (a JSON object with
    ``generation``, ``models`` and ``routing``). It is checked like any input: bounded,
    strict JSON, every weight and limit a finite number within its bounds. A ``routing`` key
    the edge does not know is ignored (a newer ingress), a missing one takes its default."""
    if len(raw) > MAX_TABLE_BYTES:
        raise EdgeTableError(f"route table of {len(raw)} bytes exceeds {MAX_TABLE_BYTES}")
    try:
        doc = loads_json(raw)
    except JsonBodyError as exc:
        raise EdgeTableError(f"route table: {exc.message}") from exc
    if not isinstance(doc, dict):
        raise EdgeTableError("route table: not a JSON object")
    generation = doc.get("generation")
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        raise EdgeTableError(f"route table: generation must be an integer >= 0, got {generation!r}")
    models = doc.get("models")
    if not isinstance(models, list):
        raise EdgeTableError("route table: models must be a list")
    return EdgeTable(
        generation=generation,
        weights=dict(_weights(models)),
        routing=_routing(doc.get("routing", {})),
        fetched_s=fetched_s,
    )


def _weights(models: list[Any]) -> Iterable[tuple[str, dict[str, float]]]:
    for i, entry in enumerate(models):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not _MODEL_NAME_RE.fullmatch(name):
            raise EdgeTableError(f"route table: models[{i}].name is not a model name: {name!r}")
        weights = entry.get("weights")
        if not isinstance(weights, dict):
            raise EdgeTableError(f"route table: models[{i}].weights must be an object")
        out: dict[str, float] = {}
        for pool, w in weights.items():
            if pool not in POOLS:
                raise EdgeTableError(f"route table: models[{i}].weights: unknown pool {pool!r}")
            if not _number(w) or not 0 <= w <= 1e6:
                raise EdgeTableError(
                    f"route table: models[{i}].weights.{pool} must be a finite number in "
                    f"[0, 1e6], got {w!r}"
                )
            out[pool] = float(w)
        yield name, out


def _routing(block: object) -> EdgeRouting:
    if not isinstance(block, dict):
        raise EdgeTableError("route table: routing must be an object")
    values: dict[str, Any] = {}
    for f in fields(EdgeRouting):
        if f.name not in block:
            continue
        v = block[f.name]
        if f.name == "backend_root":
            if not isinstance(v, str) or not re.fullmatch(r"/[A-Za-z0-9_\-]{1,32}", v):
                raise EdgeTableError(f"route table: routing.backend_root is not a path: {v!r}")
            values[f.name] = v
            continue
        low, high = _ROUTING_BOUNDS[f.name]
        if not _number(v) or not low <= v <= high:
            raise EdgeTableError(
                f"route table: routing.{f.name} must be a finite number in [{low:g}, {high:g}],"
                f" got {v!r}"
            )
        values[f.name] = int(v) if f.type in ("int", int) else float(v)
    return EdgeRouting(**values)


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class PredictTarget:
    """A predict request the edge may route itself."""

    model: str
    query: str = ""


@dataclass(frozen=True)
class Refuse:
    """A request the edge answers itself."""

    status: int
    code: ErrorCode
    message: str


@dataclass(frozen=True)
class EdgeHealth:
    """A probe of the edge's own health (`EDGE_HEALTH_PATH`): the edge answers it from what
    it knows (its healthy proxies, its route table), never a proxy. `live` (the query
    ``probe=live``, a liveness probe) asks only whether the edge answers at all: 200 even
    while no proxy is healthy, so a Serve outage does not restart every edge."""

    live: bool = False


@dataclass(frozen=True)
class EdgeScrape:
    """A scrape of the edge's own metrics (`EDGE_METRICS_PATH`, `serve.edge_metrics`),
    answered by the edge itself."""


@dataclass(frozen=True)
class Forward:
    """Send the request to `model`'s backend app in `pool`, at `path`."""

    model: str
    pool: str
    path: str


def classify(
    method: str, target: str, route_prefix: str, backend_root: str
) -> PredictTarget | EdgeHealth | EdgeScrape | Refuse | None:
    """What the edge does with a request for `target` (path and query, as sent): a predict
    it may route (`PredictTarget`), a probe of the edge itself (`EdgeHealth`, GET or HEAD
    `EDGE_HEALTH_PATH`), a scrape of its metrics (`EdgeScrape`, GET `EDGE_METRICS_PATH`),
    one it refuses (`Refuse`: a client may not address a backend app,
    ``backend_root``, through the edge, nor send anything but GET or HEAD to the edge's
    health), or None: pass it to the ingress.

    >>> classify("POST", "/v1/models/sample/predict", "/", "/_rcp")
    PredictTarget(model='sample', query='')
    >>> classify("GET", "/-/edge/healthz", "/api", "/_rcp")
    EdgeHealth(live=False)
    >>> classify("GET", "/v1/models", "/", "/_rcp") is None
    True
    """
    path, _, query = target.partition("?")
    if path == EDGE_HEALTH_PATH:
        if method in ("GET", "HEAD"):
            return EdgeHealth(live="live" in parse_qs(query).get("probe", ()))
        return Refuse(
            405, ErrorCode.METHOD_NOT_ALLOWED, f"{EDGE_HEALTH_PATH} takes GET or HEAD, not {method}"
        )
    if path == EDGE_METRICS_PATH:
        if method in ("GET", "HEAD"):
            return EdgeScrape()
        return Refuse(
            405, ErrorCode.METHOD_NOT_ALLOWED, f"{EDGE_METRICS_PATH} takes GET, not {method}"
        )
    if path == backend_root or path.startswith(backend_root + "/"):
        return Refuse(
            404,
            ErrorCode.NOT_FOUND,
            f"no route {path!r}; use POST /v1/models/<model>/predict or GET /v1/models",
        )
    if method != "POST":
        return None
    prefix = route_prefix.rstrip("/")
    if prefix and not path.startswith(prefix + "/"):
        return None
    parts = path[len(prefix) :].split("/")
    # "/v1/models/<m>/predict" -> ["", "v1", "models", m, "predict"]; nothing else is ours.
    if len(parts) != 5 or parts[0] or parts[1:3] != ["v1", "models"] or parts[4] != "predict":
        return None
    if not _MODEL_NAME_RE.fullmatch(parts[3]):
        return None  # the ingress answers with the message a client needs
    return PredictTarget(parts[3], query)


def backend_path(backend_root: str, model: str, pool: str, query: str = "") -> str:
    """Where `model`'s predict goes on `pool`'s backend app (its route prefix, then the
    public path, which the backend validates as the ingress does)."""
    path = f"{backend_root}/{model}/{pool}/v1/models/{model}/predict"
    return f"{path}?{query}" if query else path


def choose_backend(
    target: PredictTarget,
    table: EdgeTable | None,
    now_s: float,
    u: float,
    tried: Collection[str] = (),
) -> Forward | None:
    """The backend for one try of `target`, or None when the edge must not route it itself
    (no table, a stale one, a model the table does not know, or no pool with weight: the
    ingress then answers, with its own message). Pools in `tried` are avoided while another
    pool has weight (`serve.routing.choose_pool`).

    Example: weights {"cluster": 1, "external": 3}, fresh table: u=0.1 -> cluster; u=0.5 ->
    external; u=0.1 with tried={"cluster"} -> external.
    """
    if table is None or not table.fresh(now_s):
        return None
    weights = table.weights.get(target.model)
    if not weights:
        return None
    pool = choose_pool(weights, u, tried)
    if pool is None:
        return None
    path = backend_path(table.routing.backend_root, target.model, pool, target.query)
    return Forward(target.model, pool, path)


def newer_table(current: EdgeTable | None, fetched: EdgeTable, now_s: float) -> EdgeTable:
    """The table to route by after a fetch: the fetched one, unless the current one is still
    fresh and newer. Ingress replicas apply a new table one after another, so two fetches a
    quarter second apart may answer generation N and then N-1; routing goes forward only.
    The current table keeps its own fetch time, so it still ages out on time (and a
    generation that really went back, a fresh deploy, is taken once it has).

    >>> old, new = EdgeTable(4, {}, fetched_s=0.0), EdgeTable(3, {}, fetched_s=0.5)
    >>> newer_table(old, new, now_s=0.5).generation, newer_table(old, new, now_s=2.0).generation
    (4, 3)
    """
    if current is not None and current.fresh(now_s) and current.generation > fetched.generation:
        return current
    return fetched


def is_model_answer(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether an answer came from the model's replica (it carries `MODEL_HEADER`), not from
    Serve itself. Header names as received (any case)."""
    return any(name.lower() == MODEL_HEADER for name, _ in headers)
