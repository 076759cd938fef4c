"""Reading the timeline's metrics from Prometheus's HTTP API (``/api/v1/query_range``).

Owns: `read_metrics(url, queries, start_s, end_s)`: one range query per name, bounded in
time and size, its answer checked for the shape `timeline.series` reads (a matrix), and
`MetricsUnavailable`, raised with a sentence saying what went wrong (unreachable, an error
answer, a malformed one) so the caller can draw the events alone and say why.

Must not: interpret the samples (`timeline.series` does) or write anything.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_ANSWER_BYTES", "MAX_POINTS", "MetricsUnavailable", "read_metrics", "step_for"]

MAX_ANSWER_BYTES = 16 << 20
"""The largest answer read from Prometheus per query; a larger one is refused."""
MAX_POINTS = 720
"""About the most points per series: the step grows with the window to stay under it."""


class MetricsUnavailable(Exception):
    """The metrics could not be read; the message says why, for the picture's note."""


def step_for(start_s: float, end_s: float, min_step_s: float = 5.0) -> float:
    """The query step: `min_step_s` (the scrape interval), or coarser for a long window so a
    series has at most `MAX_POINTS` points. Example: 1 h -> 5 s (720 points); 6 h -> 30 s."""
    return max(min_step_s, math.ceil((end_s - start_s) / MAX_POINTS))


def _matrix(name: str, answer: Any) -> list[dict[str, Any]]:
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        raise MetricsUnavailable(f"Prometheus refused the {name!r} query: {error or answer!r}")
    data = answer.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise MetricsUnavailable(f"Prometheus answered the {name!r} query with no matrix")
    result = data.get("result")
    if not isinstance(result, list) or not all(
        isinstance(r, dict)
        and isinstance(r.get("metric", {}), dict)
        and isinstance(r.get("values"), list)
        and all(isinstance(v, list) and len(v) == 2 for v in r["values"])
        for r in result
    ):
        raise MetricsUnavailable(f"Prometheus's answer to the {name!r} query is malformed")
    return result


def read_metrics(
    url: str,
    queries: Mapping[str, str],
    start_s: float,
    end_s: float,
    *,
    step_s: float | None = None,
    timeout_s: float = 10.0,
) -> dict[str, list[dict[str, Any]]]:
    """Each query's range result over `start_s`..`end_s` from the Prometheus at `url`.
    Raises `MetricsUnavailable` on the first query that fails (the server is then most
    likely down for all of them)."""
    step = step_s if step_s is not None else step_for(start_s, end_s)
    base = url.rstrip("/") + "/api/v1/query_range?"
    out: dict[str, list[dict[str, Any]]] = {}
    for name, promql in queries.items():
        params = {"query": promql, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}", "step": step}
        request = urllib.request.Request(base + urllib.parse.urlencode(params))
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                raw = resp.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raw = exc.read(MAX_ANSWER_BYTES + 1)  # Prometheus explains a 400/422 in JSON
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise MetricsUnavailable(f"cannot reach Prometheus at {url}: {reason}") from exc
        if len(raw) > MAX_ANSWER_BYTES:
            raise MetricsUnavailable(
                f"Prometheus's answer to the {name!r} query exceeds {MAX_ANSWER_BYTES} bytes"
            )
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise MetricsUnavailable(
                f"Prometheus's answer to the {name!r} query is not JSON"
            ) from exc
        out[name] = _matrix(name, answer)
    return out
