"""The edge router's metrics: what clients got, what each try found, and the route table's age.

Owns: `EdgeMetrics`, the edge's counters and gauges on a registry of its own, rendered in
Prometheus's text format for ``GET /-/edge/metrics`` (Prometheus scrapes it: locally the
``rcp-edge`` job of the embedded Prometheus, on Kubernetes the edge pods' PodMonitor).

The production alert counts failed requests here (``rcp_edge_requests_total{code="5xx"}``),
not at the Serve proxies: a try the edge repeats elsewhere after Serve's own 500 (a replica
that died) is no failed request, while Serve counts it as one on the backend app's route.

Must not: decide anything, import Ray.
"""

from __future__ import annotations

from enum import Enum

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

__all__ = ["CONTENT_TYPE", "EdgeMetrics", "Outcome", "TryResult"]

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class Outcome(str, Enum):
    """What the edge did with a request."""

    ROUTED = "routed"  # straight to a backend app, by the route table
    PASSED = "passed"  # to the ingress, unchanged
    REFUSED = "refused"  # answered by the edge: malformed, too large, a backend path
    UNAVAILABLE = "unavailable"  # 503: no try got an answer from a model or the ingress
    LOCAL = "local"  # the edge's own endpoints (/-/edge/...)


class TryResult(str, Enum):
    """What one try of a routed predict found."""

    MODEL = "model"  # the model answered (X-Rcp-Pool), whatever the status
    SERVE = "serve"  # Serve answered itself: app deleted, replica dead, ...
    FAILED = "failed"  # no answer: broken connection, timeout, no proxy took it


class EdgeMetrics:
    """One edge's metrics. Label values are fixed sets (outcomes, status classes, pools from
    the route table, try results), so the series stay few whatever clients send."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "rcp_edge_requests",
            "Requests the edge answered, by what it did (outcome) and the status class it "
            "answered (code: 2xx, 4xx, 5xx)",
            ["outcome", "code"],
            registry=self.registry,
        )
        self.tries = Counter(
            "rcp_edge_tries",
            "Tries of routed predicts, by pool and what the try found",
            ["pool", "result"],
            registry=self.registry,
        )
        self.table_generation = Gauge(
            "rcp_edge_route_table_generation",
            "Generation of the route table the edge routes by (-1: none yet)",
            registry=self.registry,
        )
        self.table_age = Gauge(
            "rcp_edge_route_table_age_seconds",
            "Seconds since the edge sent the request that fetched its route table (-1: none)",
            registry=self.registry,
        )
        self.proxies = Gauge(
            "rcp_edge_proxies",
            "Serve proxies the edge knows, by health",
            ["state"],
            registry=self.registry,
        )
        self.connections = Gauge(
            "rcp_edge_client_connections",
            "Client connections open",
            registry=self.registry,
        )
        self.table_generation.set(-1)
        self.table_age.set(-1)

    def answered(self, outcome: Outcome, status: int) -> None:
        code = f"{status // 100}xx" if 100 <= status < 600 else "other"
        self.requests.labels(outcome.value, code).inc()

    def tried(self, pool: str, result: TryResult) -> None:
        self.tries.labels(pool, result.value).inc()

    def render(
        self,
        *,
        table_generation: int | None,
        table_age_s: float | None,
        healthy: int,
        known: int,
        connections: int,
    ) -> bytes:
        """The text a scrape gets; the gauges are set from the edge's state first."""
        self.table_generation.set(-1 if table_generation is None else table_generation)
        self.table_age.set(-1 if table_age_s is None else table_age_s)
        self.proxies.labels("healthy").set(healthy)
        self.proxies.labels("out").set(known - healthy)
        self.connections.set(connections)
        return generate_latest(self.registry)
