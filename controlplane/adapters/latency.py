"""Each served model's p99 latency, from Serve's own latency histogram as Prometheus holds it.

Owns: `PrometheusLatency.read()` (p99 ms per model over the last ``serving.latency_window_s``;
one instant query), `latency_source_url(cfg, environ)` (which Prometheus to ask) and the pure
arithmetic under them: `bucket_quantile` (a quantile from cumulative histogram buckets) and
`model_p99s` (a query's rows -> p99 per model, both pools' backends together).

The source, and why. Every backend replica records ``serve_deployment_processing_latency_ms``
(a histogram; Prometheus name ``ray_serve_deployment_processing_latency_ms_bucket``, labels
``application`` = ``rcp-<model>-<pool>``, ``deployment`` = ``Backend``, ``le``): the time the
model's replica spends on a request, which is the model's latency whatever the ingress in
front of it does (the proxy's ``ray_serve_http_request_latency_ms`` is per route and adds the
ingress hop, and the load board sees counts, not times). Ray's per-node metrics agents export
it; the Prometheus that scrapes them already keeps the window, so one query
``sum by (application, le) (increase(..._bucket[W]))`` gives the increase of every bucket of
every backend over the window, in both modes with no list of nodes here:

* local: `rcp up` starts Prometheus on loopback scraping every node's agent
  (`controlplane.local.prometheus`) and sets ``RAY_PROMETHEUS_HOST`` on the head for the Ray
  dashboard; without that variable the local server of ``observability`` is asked;
* KubeRay: ``infra/prometheus`` scrapes every Ray pod's agent and ``raycluster.yaml`` sets
  ``RAY_PROMETHEUS_HOST=http://prometheus:9090`` on the head, where the controller runs (the
  network policy already lets the head reach Prometheus's API).

Scraping every node's agent from here instead would re-do Prometheus's work each tick and
need every pod's address. The reading lags by Ray's export interval
(``metrics_report_interval_ms``, 10 s by default) plus the scrape interval; the demand
policy's upscale and downscale delays are the place for that.

A reading that is missing, non-finite or from no requests is no reading: `read` leaves the
model out and the demand policy then scales on ongoing requests alone (never on a guess).
Worked example of `bucket_quantile`: buckets (le 10: 90, le 100: 99, le 1000: 100, +Inf: 100)
hold 100 requests; the 99th is the last of the (10, 100] bucket, so p99 = 100 ms; with
(le 10: 50, le 100: 100) it is 10 + (99 - 50) / 50 x 90 = 98.2 ms (linear in the bucket, as
Prometheus's ``histogram_quantile``).

Must not: decide anything, or raise into the loop (a failed query is logged and reads as {}).
"""

from __future__ import annotations

import json
import logging
import math
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from controlplane.config import Config
from serve.spec import BACKEND_DEPLOYMENT, parse_app_name

__all__ = [
    "LATENCY_METRIC",
    "MAX_RESPONSE_BYTES",
    "PrometheusLatency",
    "bucket_quantile",
    "latency_query",
    "latency_source_url",
    "model_p99s",
]

log = logging.getLogger(__name__)

LATENCY_METRIC = "ray_serve_deployment_processing_latency_ms_bucket"
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
"""A query answer larger than this is refused (untrusted input: bounded)."""
MAX_ROWS = 20_000
"""At most this many (application, le) rows are read from one answer."""


def latency_query(window_s: float) -> str:
    """The PromQL: each backend app's bucket increases over the last `window_s` seconds."""
    return (
        f"sum by (application, le) (increase({LATENCY_METRIC}"
        f'{{deployment="{BACKEND_DEPLOYMENT}"}}[{max(1, round(window_s))}s]))'
    )


def bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The `q` quantile of a histogram given as (upper bound, cumulative count) pairs (the
    ``+Inf`` bucket included), linear within the bucket it falls in; None when the buckets
    hold no requests or are not a histogram (a negative or non-finite count). A quantile in
    the ``+Inf`` bucket is the highest finite bound (the histogram knows no more)."""
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), got {q}")
    rows = sorted(buckets)
    if not rows or any(math.isnan(le) or not math.isfinite(n) or n < 0 for le, n in rows):
        return None
    # Cumulative counts never fall; increase() over a window can wobble a little: keep the max.
    counts: list[float] = []
    for _, n in rows:
        counts.append(max(n, counts[-1]) if counts else n)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for (le, _), n in zip(rows, counts, strict=True):
        if n >= rank:
            if math.isinf(le):
                return lower if lower > 0 else None
            inside = n - below
            return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = le, n
    return None


def model_p99s(result: Sequence[Mapping[str, object]]) -> dict[str, float]:
    """p99 ms per model from `latency_query`'s result vector: the buckets of the model's
    backends in every pool summed, then `bucket_quantile`. Rows of other apps, with a bad
    ``le`` or value, are skipped; a model whose buckets give no quantile is left out."""
    by_model: dict[str, dict[float, float]] = {}
    for row in result[:MAX_ROWS]:
        metric, value = row.get("metric"), row.get("value")
        if not isinstance(metric, Mapping) or not isinstance(value, Sequence) or len(value) != 2:
            continue
        parsed = parse_app_name(str(metric.get("application", "")))
        try:
            le, n = float(str(metric.get("le"))), float(str(value[1]))
        except ValueError:
            continue
        if parsed is None or math.isnan(le) or not math.isfinite(n):
            continue
        buckets = by_model.setdefault(parsed[0], {})
        buckets[le] = buckets.get(le, 0.0) + n
    out: dict[str, float] = {}
    for model, buckets in sorted(by_model.items()):
        p99 = bucket_quantile(0.99, buckets.items())
        if p99 is not None and math.isfinite(p99):
            out[model] = p99
    return out


def latency_source_url(cfg: Config, environ: Mapping[str, str]) -> str | None:
    """The Prometheus to ask (module doc): ``RAY_PROMETHEUS_HOST`` when set, else the local
    server when ``observability.prometheus`` (and not on Kubernetes), else None."""
    url = environ.get("RAY_PROMETHEUS_HOST", "").strip()
    if url:
        return url.rstrip("/")
    if cfg.observability.prometheus and not cfg.kubernetes.enabled:
        return f"http://{cfg.ray.node_ip}:{cfg.observability.prometheus_port}"
    return None


@dataclass
class PrometheusLatency:
    """Reads p99 per model from the Prometheus at `url` (its HTTP API, one instant query)."""

    url: str
    window_s: float
    timeout_s: float = 2.0

    def read(self) -> dict[str, float]:
        """p99 ms per model over the last `window_s`; {} (logged) when Prometheus fails."""
        query = urllib.parse.urlencode({"query": latency_query(self.window_s)})
        try:
            with urllib.request.urlopen(
                f"{self.url}/api/v1/query?{query}", timeout=self.timeout_s
            ) as resp:
                raw = resp.read(MAX_RESPONSE_BYTES + 1)
            if len(raw) > MAX_RESPONSE_BYTES:
                raise ValueError(f"answer larger than {MAX_RESPONSE_BYTES} bytes")
            body = json.loads(raw)
            data = body["data"] if body.get("status") == "success" else {}
            result = data.get("result") if data.get("resultType") == "vector" else []
        except Exception as exc:  # noqa: BLE001 - never into the loop: no reading this tick
            log.warning("p99 latency from %s unavailable: %r", self.url, exc)
            return {}
        return model_p99s(result if isinstance(result, list) else [])
