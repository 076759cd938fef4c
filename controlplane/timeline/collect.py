"""Gathering a timeline's inputs: the event log through the API and the metrics from Prometheus.

Owns: `collect(events_page, prometheus_url, start_s, end_s)`: every event of the window (read
page by page through `events_page`, e.g. the SDK's ``Client.events``; at most `MAX_EVENTS`),
the `QUERIES`' range results (or none, with a note saying why, when Prometheus cannot be
read), and the `Timeline` `series.build_timeline` makes of them. `TimelineInputs` is what was
read, so a run can be saved (``rcp timeline --save-inputs``) and drawn again or tested.

Must not: draw (`timeline.draw`) or reach the store or Ray: events come through the API.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controlplane.timeline.metrics import MetricsUnavailable, read_metrics
from controlplane.timeline.series import QUERIES, Timeline, build_timeline

__all__ = ["EVENTS_PAGE", "MAX_EVENTS", "EventsPage", "TimelineInputs", "collect"]

EVENTS_PAGE = 5000
"""Events asked for per API call."""
MAX_EVENTS = 200_000
"""The most events read for one picture; past it the oldest in the window are left out."""

EventsPage = Callable[[int, int], Sequence[Mapping[str, Any]]]
"""``(after_seq, limit) -> events with seq > after_seq``, oldest first (the API's paging)."""


@dataclass(frozen=True)
class TimelineInputs:
    start_s: float
    end_s: float
    events: list[dict[str, Any]]
    metrics: dict[str, list[dict[str, Any]]] | None
    notes: list[str] = field(default_factory=list)

    def timeline(self) -> Timeline:
        return build_timeline(self.events, self.metrics, self.start_s, self.end_s, self.notes)

    def to_json(self) -> dict[str, Any]:
        return {
            "start_s": self.start_s,
            "end_s": self.end_s,
            "events": self.events,
            "metrics": self.metrics,
            "notes": self.notes,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TimelineInputs:
        return cls(
            float(data["start_s"]),
            float(data["end_s"]),
            list(data["events"]),
            None if data.get("metrics") is None else dict(data["metrics"]),
            list(data.get("notes") or ()),
        )


def read_events(
    events_page: EventsPage, start_s: float, end_s: float
) -> tuple[list[dict[str, Any]], bool]:
    """The events of the window, oldest first, and whether `MAX_EVENTS` cut some off."""
    found: list[dict[str, Any]] = []
    after, cut = 0, False
    while True:
        page = events_page(after, EVENTS_PAGE)
        for e in page:
            if start_s <= float(e["at_s"]) <= end_s:
                found.append(dict(e))
        if len(page) < EVENTS_PAGE:
            break
        after = int(page[-1]["seq"])
        if len(found) > MAX_EVENTS:
            found, cut = found[-MAX_EVENTS:], True
    return found, cut


def collect(
    events_page: EventsPage,
    prometheus_url: str | None,
    start_s: float,
    end_s: float,
    queries: Mapping[str, str] = QUERIES,
) -> TimelineInputs:
    """What a timeline of `start_s`..`end_s` is drawn from. Without `prometheus_url`, or when
    Prometheus cannot be read, the metrics are None and a note says why."""
    events, cut = read_events(events_page, start_s, end_s)
    notes = [f"only the newest {MAX_EVENTS} events of the window are shown"] if cut else []
    metrics: dict[str, list[dict[str, Any]]] | None = None
    if prometheus_url is None:
        notes.append("no Prometheus URL: events only (replica, GPU and request panels empty)")
    else:
        try:
            metrics = read_metrics(prometheus_url, queries, start_s, end_s)
        except MetricsUnavailable as exc:
            notes.append(f"metrics unreachable, events only: {exc}")
    return TimelineInputs(start_s, end_s, events, metrics, notes)
