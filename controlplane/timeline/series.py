"""The timeline's data: what `rcp timeline` plots, from the event log and metric samples.

Owns: the PromQL each metric panel reads (`QUERIES`), and `build_timeline`, a pure function
of the control plane's events (as ``GET /v1/events`` returns them) and Prometheus range
results (as ``query_range`` returns them) that yields a `Timeline`: four panels of series
with their times relative to the window's start, and the decision markers.

Panels:

* ``replicas``: RUNNING Serve replicas per model and pool (``sample/cluster``);
* ``gpus``: GPUs by owner: ``training``, ``serving`` and ``idle`` on the owned cluster pool,
  and ``external``: every GPU of the rented external pool (what is being paid for);
* ``requests``: production requests per second and failed (5xx) ones, as clients got them
  (from the edge; from Serve where the edge's metrics are missing, `queries`);
* ``decisions``: one marker per event of a decision (a policy action, a serving move or
  scale, a health step) or of a job's state change, on the row of what it is about
  (`ROWS`).

Example: events ``[{"at_s": 110, "kind": "policy.AdmitJob", ...}]`` and a replicas result
``[{"metric": {"model": "sample", "pool": "cluster"}, "values": [[100, "2"], [105, "1"]]}]``
over the window 100..130 give ``replicas = (Series("sample/cluster", ((0, 2.0), (5, 1.0))),)``
and one marker at 10 s on the ``training`` row labelled ``AdmitJob``.

Must not: read anything itself (no HTTP, no clock, no files) or draw (`timeline.draw` does).
Event messages are shown, never parsed: what is used from an event is its time, its kind and,
for a job's state change, the ``to`` state its data carries.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "QUERIES",
    "ROWS",
    "Marker",
    "Series",
    "Timeline",
    "build_timeline",
    "queries",
]

GPU_OWNERS = ("training", "serving", "idle", "external")
"""The GPU panel's series, stacked in this order."""

ROWS = ("training", "serving", "health", "job")
"""The decision panel's rows, bottom to top."""

_ROW_OF_KIND: dict[str, str] = {
    "policy.AdmitJob": "training",
    "policy.PreemptJob": "training",
    "policy.RejectJob": "training",
    "policy.MoveServeReplicas": "serving",
    "policy.ScaleServePool": "serving",
    "policy.SetRouteWeights": "serving",
    "policy.RequestExternalCapacity": "serving",
    "serve.move.start": "serving",
    "serve.move.done": "serving",
    "serve.move.unwound": "serving",
    "serve.resume": "serving",
    "serve.scale": "serving",
    "serve.external_capacity": "serving",
    "serve.external_group": "serving",
    "policy.CordonNode": "health",
    "policy.DrainNode": "health",
    "health.cordon": "health",
    "health.drain": "health",
    "health.clear": "health",
    "health.release": "health",
    "health.breaker": "health",
    "health.breaker_reset": "health",
    "health.serving_only": "health",
    "health.serving_only_end": "health",
    "job.state": "job",
}
"""Which event kinds are markers, and on which row. Other kinds (``controller.start``, ...)
are not decisions and are left out."""


def queries(rate_window_s: float) -> dict[str, str]:
    """The PromQL per metric name; `rate_window_s` is the window of the request rates (at
    least two scrapes). ``max by``: a restarted controller's last value may still be exported
    next to the new one's for a while; both say the same thing.

    ``requests`` and ``failed`` are what clients got: the responses of the edge's public
    frontend (HAProxy's ``haproxy_frontend_http_responses_total{proxy="public"}``, its own
    refusals included; its readiness and metrics endpoints are on another frontend, the admin
    listener, and not counted) and those of them with a 5xx. A try Serve answered with 500
    that the edge then sent again, and that got an answer, is one request and no failure
    here, while Serve counts an error on the backend app's route. Without the edge's metrics
    (a cluster without the edge, an older recording's time range) each falls back, with PromQL
    ``or``, to Serve's own counts: requests that reached an app (``application!=""``: each
    proxy's health checks, a draining one answering 503, carry an empty application and are
    not traffic) and those with a 5xx. HAProxy exports the 5xx series from its start, at 0;
    should it be missing while the edge answers, ``failed`` is still 0 per second, not
    Serve's count."""
    w = f"{max(1, round(rate_window_s))}s"
    responses = "haproxy_frontend_http_responses_total"
    edge = f'sum(rate({responses}{{proxy="public"}}[{w}]))'
    edge_5xx = f'sum(rate({responses}{{proxy="public",code="5xx"}}[{w}]))'
    serve = f'sum(rate(ray_serve_num_http_requests_total{{application!=""}}[{w}]))'
    serve_5xx = (
        "sum(rate(ray_serve_num_http_error_requests_total"
        f'{{application!="",error_code=~"5.."}}[{w}]))'
    )
    return {
        "replicas": 'max by (model, pool) (ray_rcp_serve_replicas{state="running"})',
        "gpus": "max by (pool, owner) (ray_rcp_gpus)",
        "requests": f"{edge} or {serve}",
        "failed": f"{edge_5xx} or 0 * {edge} or {serve_5xx}",
    }


QUERIES = queries(30.0)
"""The queries with the default rate window (30 s: six scrapes at the local 5 s interval)."""


@dataclass(frozen=True)
class Series:
    label: str
    points: tuple[tuple[float, float], ...]
    """(seconds since the window's start, value), oldest first."""


@dataclass(frozen=True)
class Marker:
    at_s: float
    """Seconds since the window's start."""
    row: str
    """One of `ROWS`."""
    kind: str
    label: str
    """Short text drawn next to the marker (the kind's last part, or a job's new state)."""
    message: str


@dataclass(frozen=True)
class Timeline:
    start_s: float
    """The window's start (Unix seconds)."""
    end_s: float
    replicas: tuple[Series, ...] = ()
    gpus: tuple[Series, ...] = ()
    requests: tuple[Series, ...] = ()
    markers: tuple[Marker, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What the picture lacks and why (e.g. metrics unreachable), shown on it."""

    def summary(self) -> dict[str, Any]:
        """Per panel, each series' label and point count, and the markers per row: what was
        drawn, for ``--json`` and tests."""

        def panel(series: tuple[Series, ...]) -> dict[str, int]:
            return {s.label: len(s.points) for s in series}

        return {
            "start_s": self.start_s,
            "end_s": self.end_s,
            "replicas": panel(self.replicas),
            "gpus": panel(self.gpus),
            "requests": panel(self.requests),
            "markers": dict(Counter(m.row for m in self.markers)),
            "marker_kinds": sorted({m.kind for m in self.markers}),
            "notes": list(self.notes),
        }


MetricResult = Sequence[Mapping[str, Any]]
"""One query's ``data.result`` of a Prometheus ``query_range`` answer (a matrix)."""


def _points(values: Iterable[Sequence[Any]], start_s: float) -> tuple[tuple[float, float], ...]:
    out = []
    for t, v in values:
        try:
            at_s, value = float(t), float(v)
        except (TypeError, ValueError):
            continue  # not a sample: left out rather than failing the whole picture
        if math.isfinite(value) and math.isfinite(at_s):
            out.append((at_s - start_s, value))
    return tuple(sorted(out))


def _label_series(
    result: MetricResult, start_s: float, key: Sequence[str]
) -> dict[tuple[str, ...], tuple[tuple[float, float], ...]]:
    out: dict[tuple[str, ...], tuple[tuple[float, float], ...]] = {}
    for item in result:
        labels = item.get("metric") or {}
        out[tuple(str(labels.get(k, "")) for k in key)] = _points(item.get("values") or (), start_s)
    return out


def _sum_points(
    parts: Iterable[tuple[tuple[float, float], ...]],
) -> tuple[tuple[float, float], ...]:
    total: dict[float, float] = {}
    for points in parts:
        for t, v in points:
            total[t] = total.get(t, 0.0) + v
    return tuple(sorted(total.items()))


def _gpu_series(result: MetricResult, start_s: float) -> tuple[Series, ...]:
    by = _label_series(result, start_s, ("pool", "owner"))
    if not by:
        return ()
    cluster = {owner: by.get(("cluster", owner), ()) for owner in GPU_OWNERS[:3]}
    external = _sum_points(points for (pool, _), points in by.items() if pool == "external")
    return (
        *(Series(owner, points) for owner, points in cluster.items()),
        Series("external", external),
    )


def _marker(event: Mapping[str, Any], start_s: float) -> Marker | None:
    kind = str(event.get("kind", ""))
    row = _ROW_OF_KIND.get(kind)
    if row is None:
        return None
    if kind == "job.state":
        label = str((event.get("data") or {}).get("to") or "state")
    else:
        label = kind.split(".", 1)[-1]
    return Marker(float(event["at_s"]) - start_s, row, kind, label, str(event.get("message", "")))


def build_timeline(
    events: Iterable[Mapping[str, Any]],
    metrics: Mapping[str, MetricResult] | None,
    start_s: float,
    end_s: float,
    notes: Sequence[str] = (),
) -> Timeline:
    """The timeline of the window `start_s`..`end_s` (Unix seconds).

    `events`: the event log's entries (``at_s``, ``kind``, ``message``, ``data``); those
    outside the window are left out. `metrics`: each `QUERIES` name's range result, or None
    when the metrics could not be read (the picture then has the markers only, and `notes`
    should say why). A query missing from `metrics` gives an empty panel.
    """
    if end_s < start_s:
        raise ValueError(f"end_s: must not be before start_s ({end_s} < {start_s})")
    markers = tuple(
        sorted(
            (
                m
                for e in events
                if start_s <= float(e.get("at_s", -1.0)) <= end_s
                and (m := _marker(e, start_s)) is not None
            ),
            key=lambda m: m.at_s,
        )
    )
    if metrics is None:
        return Timeline(start_s, end_s, markers=markers, notes=tuple(notes))
    replicas = tuple(
        Series(f"{model}/{pool}", points)
        for (model, pool), points in sorted(
            _label_series(metrics.get("replicas") or (), start_s, ("model", "pool")).items()
        )
    )
    rate = _sum_points(_label_series(metrics.get("requests") or (), start_s, ()).values())
    failed = _sum_points(_label_series(metrics.get("failed") or (), start_s, ()).values())
    if rate and not failed:
        # Serve's error counter exists only after the first error: none yet is 0 per second.
        failed = tuple((t, 0.0) for t, _ in rate)
    requests = tuple(
        Series(label, points)
        for label, points in (("requests/s", rate), ("failed/s", failed))
        if points
    )
    return Timeline(
        start_s,
        end_s,
        replicas=replicas,
        gpus=_gpu_series(metrics.get("gpus") or (), start_s),
        requests=requests,
        markers=markers,
        notes=tuple(notes),
    )
