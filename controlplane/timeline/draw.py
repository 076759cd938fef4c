"""Drawing a `Timeline` as a PNG with matplotlib (the Agg backend, no display).

Owns: `draw_png(timeline, path)`: four panels over one time axis (minutes since the window's
start, drawn from its first data: a series' first sample or the first decision): replicas per
model and pool (steps), GPUs by owner (stacked), requests and failed requests per second, and
the decision markers on their rows; each policy action also draws a faint vertical line
through the panels above. A marker's label goes on the lowest of `LABEL_LEVELS` lines above
its row where it clears the labels before it (`label_levels`); one that clears none is left
out and counted in the panel's note. A panel with no data says so; the picture's notes (e.g.
"metrics unreachable: ...") are printed under the title.

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
    from matplotlib.figure import Figure

__all__ = [
    "LABEL_LEVELS",
    "PNG_SIGNATURE",
    "draw_figure",
    "draw_png",
    "first_data_s",
    "label_levels",
]

LABEL_LEVELS = 3
"""Lines of labels above a row of decision markers."""
_WIDTH_IN = 12.0
_LABEL_FONT = 6
_LABEL_STEP_PT = 7.0
"""Points between two label lines (a 6-point font's line)."""

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


def first_data_s(timeline: Timeline) -> float:
    """Seconds since the window's start of its first data (0 when it has none)."""
    series = (*timeline.replicas, *timeline.gpus, *timeline.requests)
    times = [t for s in series for t, _ in s.points[:1]] + [m.at_s for m in timeline.markers]
    return max(0.0, min(times, default=0.0))


def label_levels(starts: list[float], widths: list[float]) -> list[int | None]:
    """For labels in time order, each starting at ``starts[i]`` and ``widths[i]`` long (same
    unit): the lowest of `LABEL_LEVELS` lines where it starts after the last label there
    ends; None where it would overlap on every line (left out)."""
    ends = [float("-inf")] * LABEL_LEVELS
    out: list[int | None] = []
    for x, w in zip(starts, widths, strict=True):
        level = next((k for k in range(LABEL_LEVELS) if ends[k] <= x), None)
        if level is not None:
            ends[level] = x + w
        out.append(level)
    return out


def _decisions(
    ax: Axes, timeline: Timeline, axes_above: tuple[Axes, ...], span_s: float, width_in: float
) -> None:
    """The decision markers, their labels placed so none overlaps (`label_levels`); the axis
    is `width_in` inches wide."""
    # A label's width in minutes: its characters at about 0.6 em each, over the axis's width.
    width_pt = width_in * 72.0
    per_char_min = 0.6 * _LABEL_FONT * (span_s / 60.0) / max(1.0, width_pt)
    left_out = 0
    for row in ROWS:
        marks = sorted((m for m in timeline.markers if m.row == row), key=lambda m: m.at_s)
        xs = [m.at_s / 60.0 for m in marks]
        levels = label_levels(xs, [(len(m.label) + 1) * per_char_min for m in marks])
        for m, x, level in zip(marks, xs, levels, strict=True):
            y = ROWS.index(row)
            ax.plot([x], [y], marker="|" if row == "job" else "v", ms=10, color=_ROW_COLORS[row])
            if level is None:
                left_out += 1
            else:
                ax.annotate(
                    m.label,
                    (x, y),
                    xytext=(2, 4 + level * _LABEL_STEP_PT),
                    textcoords="offset points",
                    fontsize=_LABEL_FONT,
                )
            if m.kind.startswith("policy."):
                for above in axes_above:
                    above.axvline(x, color=_ROW_COLORS[row], alpha=0.25, lw=0.8)
    if left_out:
        ax.text(
            1.0, 1.02, f"{left_out} label(s) left out where they would overlap",
            transform=ax.transAxes, ha="right", va="bottom", fontsize=_LABEL_FONT, color="gray",
        )  # fmt: skip


def draw_png(timeline: Timeline, path: str | Path) -> Path:
    """Write `timeline` as a PNG at `path` (parent directories must exist); returns the path."""
    out = Path(path)
    draw_figure(timeline).savefig(out, format="png", metadata={"Software": "rcp timeline"})
    return out


def draw_figure(timeline: Timeline) -> Figure:
    """`timeline` drawn on a matplotlib figure (Agg canvas), for `draw_png` to save."""
    # Deferred: matplotlib takes about a second to load; only drawing needs it.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(_WIDTH_IN, 10), dpi=100, layout="constrained")
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
    first_s = first_data_s(timeline)
    end_s = max(first_s + 0.06, timeline.end_s - timeline.start_s)
    decisions_ax.set_xlim(first_s / 60.0, end_s / 60.0)
    above = (replicas_ax, gpus_ax, requests_ax)
    _decisions(decisions_ax, timeline, above, end_s - first_s, _WIDTH_IN * 0.85)
    if not timeline.markers:
        _no_data(decisions_ax, "no decisions in this window")
    decisions_ax.set_xlabel(f"minutes since {start}")
    return fig
