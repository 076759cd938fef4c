"""Drawing a `Timeline` as a PNG with matplotlib (the Agg backend, no display).

Owns: `draw_png(timeline, path)`: four panels over one time axis (minutes since the window's
start): replicas per model and pool (steps), GPUs by owner (stacked), requests and failed
requests per second, and the decision markers on their rows; each policy action also draws a
faint vertical line through the panels above. A panel with no data says so; the picture's
notes (e.g. "metrics unreachable: ...") are printed under the title.

Must not: fetch or compute series (`timeline.series` does). matplotlib is imported inside
`draw_png` only: the CLI must load without it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from controlplane.timeline.series import GPU_OWNERS, ROWS, Series, Timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["PNG_SIGNATURE", "draw_png"]

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
"""The first 8 bytes of every PNG file."""

_GPU_COLORS = {
    "training": "#d62728",
    "serving": "#1f77b4",
    "idle": "#c7c7c7",
    "external": "#ff7f0e",
}
_ROW_COLORS = {"training": "#d62728", "serving": "#1f77b4", "health": "#9467bd", "job": "#2ca02c"}


def _minutes(points: tuple[tuple[float, float], ...]) -> tuple[list[float], list[float]]:
    return [t / 60.0 for t, _ in points], [v for _, v in points]


def _no_data(ax: Axes, why: str) -> None:
    ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center", color="gray")


def _steps(ax: Axes, series: tuple[Series, ...], empty: str) -> None:
    drawn = False
    for s in series:
        if s.points:
            xs, ys = _minutes(s.points)
            ax.step(xs, ys, where="post", label=s.label)
            drawn = True
    if drawn:
        ax.legend(loc="upper left", fontsize="small")
    else:
        _no_data(ax, empty)


def _stacked_gpus(ax: Axes, series: tuple[Series, ...]) -> None:
    by_label = {s.label: dict(s.points) for s in series if s.points}
    if not by_label:
        _no_data(ax, "no GPU metrics")
        return
    times = sorted({t for points in by_label.values() for t in points})
    owners = [o for o in GPU_OWNERS if o in by_label]
    ax.stackplot(
        [t / 60.0 for t in times],
        [[by_label[o].get(t, 0.0) for t in times] for o in owners],
        labels=owners,
        colors=[_GPU_COLORS[o] for o in owners],
        step="post",
    )
    ax.legend(loc="upper left", fontsize="small")


def draw_png(timeline: Timeline, path: str | Path) -> Path:
    """Write `timeline` as a PNG at `path` (parent directories must exist); returns the path."""
    # Deferred: matplotlib takes about a second to load; only drawing needs it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(path)
    fig = Figure(figsize=(12, 10), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(4, 1, sharex=True, gridspec_kw={"height_ratios": [3, 3, 2, 2]})
    replicas_ax, gpus_ax, requests_ax, decisions_ax = axes
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timeline.start_s))
    title = f"rcp timeline from {start} ({(timeline.end_s - timeline.start_s) / 60:.0f} min)"
    if timeline.notes:
        title += "\n" + "\n".join(timeline.notes)
    fig.suptitle(title, fontsize="medium")

    replicas_ax.set_ylabel("running replicas")
    _steps(replicas_ax, timeline.replicas, "no replica metrics")
    gpus_ax.set_ylabel("GPUs by owner")
    _stacked_gpus(gpus_ax, timeline.gpus)
    requests_ax.set_ylabel("requests / s")
    _steps(requests_ax, timeline.requests, "no request metrics")

    decisions_ax.set_ylabel("decisions")
    decisions_ax.set_yticks(range(len(ROWS)), list(ROWS))
    decisions_ax.set_ylim(-0.5, len(ROWS) - 0.5)
    for m in timeline.markers:
        x, y = m.at_s / 60.0, ROWS.index(m.row)
        decisions_ax.plot(
            [x], [y], marker="|" if m.row == "job" else "v", ms=10, color=_ROW_COLORS[m.row]
        )
        decisions_ax.annotate(
            m.label, (x, y), xytext=(2, 4), textcoords="offset points", fontsize=6, rotation=30
        )
        if m.kind.startswith("policy."):
            for ax in (replicas_ax, gpus_ax, requests_ax):
                ax.axvline(x, color=_ROW_COLORS[m.row], alpha=0.25, lw=0.8)
    if not timeline.markers:
        _no_data(decisions_ax, "no decisions in this window")
    decisions_ax.set_xlim(0, max(1e-3, (timeline.end_s - timeline.start_s) / 60.0))
    decisions_ax.set_xlabel(f"minutes since {start}")
    fig.savefig(out, format="png", metadata={"Software": "rcp timeline"})
    return out
