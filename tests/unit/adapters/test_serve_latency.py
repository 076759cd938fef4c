"""p99 per model from Serve's latency histogram as Prometheus answers it (pure parts), and
the reader against a real HTTP server on loopback that answers like Prometheus's API."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from controlplane.adapters.latency import (
    MAX_RESPONSE_BYTES,
    PrometheusLatency,
    bucket_quantile,
    latency_query,
    latency_source_url,
    model_p99s,
)
from controlplane.config import load_config

INF = math.inf


@pytest.mark.parametrize(
    ("buckets", "p99"),
    [
        pytest.param([(10, 90), (100, 99), (1000, 100), (INF, 100)], 100.0, id="at-a-bound"),
        pytest.param([(10, 50), (100, 100), (INF, 100)], 98.2, id="linear-in-bucket"),
        pytest.param([(100, 0), (200, 100), (INF, 100)], 199.0, id="all-in-one-bucket"),
        pytest.param([(100, 0), (500, 0), (INF, 10)], 500.0, id="beyond-last-bound"),
        pytest.param([(INF, 10)], None, id="only-inf-bucket"),
        pytest.param([(10, 0), (INF, 0)], None, id="no-requests"),
        pytest.param([], None, id="no-buckets"),
        pytest.param([(10, -1), (INF, 5)], None, id="negative-count"),
        pytest.param([(10, math.nan), (INF, 5)], None, id="nan-count"),
        pytest.param([(10, 5), (INF, INF)], None, id="infinite-count"),
        pytest.param([(10, 10.2), (100, 10.0), (INF, 10.2)], 9.9, id="increase-wobble"),
        pytest.param([(INF, 100), (10, 100), (1, 0)], 9.91, id="unsorted"),
    ],
)
def test_bucket_quantile(buckets: list[tuple[float, float]], p99: float | None) -> None:
    got = bucket_quantile(0.99, buckets)
    assert got == (None if p99 is None else pytest.approx(p99))


def test_bucket_quantile_needs_a_quantile() -> None:
    with pytest.raises(ValueError, match="q must be in"):
        bucket_quantile(1.0, [(INF, 1)])


def row(app: str, le: str, value: object) -> dict[str, Any]:
    return {"metric": {"application": app, "le": le}, "value": [1700000000.0, value]}


def test_model_p99s_sums_both_pools_per_model() -> None:
    """The model's p99 is over both pools' backends together: 90 fast requests in the cluster
    pool and 10 slow ones in the external pool give the p99 of all 100."""
    result = [
        row("rcp-sample-cluster", "10", "90"),
        row("rcp-sample-cluster", "500", "90"),
        row("rcp-sample-cluster", "+Inf", "90"),
        row("rcp-sample-external", "10", "0"),
        row("rcp-sample-external", "500", "10"),
        row("rcp-sample-external", "+Inf", "10"),
        row("rcp-idle-cluster", "10", "0"),
        row("rcp-idle-cluster", "+Inf", "0"),
        row("rcp-ingress", "10", "1000"),  # not a backend
        row("other-app", "10", "5"),
        row("rcp-sample-cluster", "x", "5"),  # bad le
        row("rcp-sample-cluster", "10", "NaN"),  # non-finite: skipped
        {"metric": {"application": "rcp-sample-cluster"}},  # no value
        {"value": [0, "1"]},  # no metric
    ]
    # 100 requests; the 99th lies in (10, 500]: 10 + (99 - 90) / 10 x 490 = 451
    assert model_p99s(result) == {"sample": pytest.approx(451.0)}


def test_the_query_reads_the_backends_bucket_increases() -> None:
    q = latency_query(30)
    assert q == (
        "sum by (application, le) (increase("
        'ray_serve_deployment_processing_latency_ms_bucket{deployment="Backend"}[30s]))'
    )
    assert "[1s]" in latency_query(0.2)


@pytest.mark.parametrize(
    ("environ", "overrides", "url"),
    [
        pytest.param(
            {"RAY_PROMETHEUS_HOST": "http://prometheus:9090/"},
            ["kubernetes.enabled=true"],
            "http://prometheus:9090",
            id="the-dashboards-prometheus",
        ),
        pytest.param(
            {}, ["observability.prometheus_port=9191"], "http://127.0.0.1:9191", id="local"
        ),
        pytest.param({}, ["observability.prometheus=false"], None, id="none-locally"),
    ],
)
def test_latency_source_url(environ: dict[str, str], overrides: list[str], url: str | None) -> None:
    assert latency_source_url(load_config(overrides=overrides), environ) == url


class _Prometheus(BaseHTTPRequestHandler):
    answer: bytes = b""
    queries: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        type(self).queries.append(parse_qs(urlparse(self.path).query)["query"][0])
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(type(self).answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def prometheus() -> Iterator[tuple[str, type[_Prometheus]]]:
    handler = type("Handler", (_Prometheus,), {"answer": b"", "queries": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def answer(result: list[dict[str, Any]]) -> bytes:
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}
    ).encode()


@pytest.mark.parametrize(
    ("body", "p99s"),
    [
        pytest.param(
            answer([row("rcp-m-cluster", "100", "0"), row("rcp-m-cluster", "+Inf", "4")]),
            {"m": 100.0},
            id="all-beyond-the-last-bound-reads-as-it",
        ),
        pytest.param(
            answer([row("rcp-m-cluster", "200", "0"), row("rcp-m-cluster", "300", "100")]),
            {"m": pytest.approx(299.0)},
            id="a-reading",
        ),
        pytest.param(answer([]), {}, id="no-traffic"),
        pytest.param(b'{"status": "error", "error": "bad query"}', {}, id="prometheus-error"),
        pytest.param(b"not json", {}, id="garbage"),
        pytest.param(b" " * (MAX_RESPONSE_BYTES + 1), {}, id="oversized"),
    ],
)
def test_the_reader_asks_prometheus_and_never_raises(
    prometheus: tuple[str, type[_Prometheus]], body: bytes, p99s: dict[str, float]
) -> None:
    url, handler = prometheus
    handler.answer = body
    assert PrometheusLatency(url, window_s=20).read() == p99s
    assert handler.queries == [latency_query(20)]


def test_the_reader_without_prometheus_reads_nothing() -> None:
    assert PrometheusLatency("http://127.0.0.1:9", window_s=20, timeout_s=0.5).read() == {}
