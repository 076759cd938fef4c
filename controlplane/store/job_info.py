"""What a job's attempts and checkpoints look like from outside: read from `JobRecord.info`.

Owns: reading, typed and defensively, the keys `controlplane.loop.act.jobs` records about a
job's recovery, for the API's job view (`api.job_views.job_to_json`) and the controller's per-job
gauges (`job_metrics`):

* ``checkpoint``: the newest committed step as read from object storage,
  ``{"step", "uri", "committed_unix_s", "read_s"}`` (without ``read_s`` it is an older
  runner's record of the loop's own word, and not shown);
* ``checkpoint_uri``: the job's checkpoint prefix;
* ``progress``: the current attempt's ``{"step", "step_at_s", "stall_s", "wall_s"}``;
* ``stall_s_total``, ``wall_s_total``: checkpoint stall and wall seconds of ended attempts;
* ``restarts`` (crash and hang restarts used) and ``hangs``;
* ``attempts``: each attempt's end, newest last,
  ``{"attempt", "admitted_s", "ended_s", "kind", "reason", "step", "checkpoint_step"}``.

Every key is optional and its type untrusted: info is JSON from the store, an older runner
wrote other shapes, and a listing must never fail on one job. A value of the wrong type, a
non-finite number or a negative count reads as absent; text is cut to `MAX_TEXT_CHARS`.

Checkpoint overhead is training time spent stalled on checkpoints over wall time, summed over
the ended attempts plus, while an attempt runs, the running one. Example: ended attempts
stalled 3 s of 1000 s and the running one 1 s of 600 s: (3 + 1) / (1000 + 600) = 0.25 %.

Must not: write anything, or read any other info key (``signal_token`` is a secret).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RESTART_KINDS",
    "Attempt",
    "Commit",
    "JobFacts",
    "Progress",
    "job_facts",
]

RESTART_KINDS = frozenset({"crash", "hang"})
"""Attempt ends that spend one of the job's ``max_restarts``."""
MAX_ATTEMPTS = 100
"""The most attempts read (the runner keeps at most this many, newest last)."""
MAX_TEXT_CHARS = 500
"""The longest reason, kind or URI shown; longer ones end in ``...``."""
MAX_COUNT = 2**53
"""Counts and steps above this are not believed (JSON numbers past it lose precision)."""


def _number(value: Any) -> float | None:
    """A finite real number, else None (bools, strings, NaN and inf are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None
    return number if math.isfinite(number) else None


def _seconds(value: Any) -> float | None:
    """A finite number >= 0, else None."""
    number = _number(value)
    return number if number is not None and number >= 0 else None


def _count(value: Any) -> int | None:
    """An int in [0, `MAX_COUNT`], else None (1.0 is not a count)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        return None
    return value


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return value if len(value) <= MAX_TEXT_CHARS else value[: MAX_TEXT_CHARS - 3] + "..."


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class Commit:
    """The newest committed checkpoint step."""

    step: int
    uri: str | None
    committed_unix_s: float | None
    """When its manifest landed (None: the record does not say)."""

    def age_s(self, now_s: float) -> float | None:
        if self.committed_unix_s is None:
            return None
        return max(0.0, now_s - self.committed_unix_s)


@dataclass(frozen=True)
class Progress:
    """The current attempt's step and checkpoint cost so far."""

    step: int
    step_at_s: float | None
    """When the step last grew (None: not said)."""
    stall_s: float
    wall_s: float


@dataclass(frozen=True)
class Attempt:
    """How one attempt ended."""

    attempt: int | None
    admitted_s: float | None
    ended_s: float | None
    kind: str
    reason: str
    step: int | None
    """The last step the attempt reported (None: none, or not said)."""
    checkpoint_step: int | None = None
    """The committed step (as storage showed it) the next attempt resumes from (None: none)."""


@dataclass(frozen=True)
class JobFacts:
    """Everything `job_facts` could read; absent or malformed keys are None, 0 or empty."""

    checkpoint_uri: str | None
    commit: Commit | None
    progress: Progress | None
    ended_stall_s: float
    ended_wall_s: float
    restarts: int
    hangs: int
    attempts: tuple[Attempt, ...]

    def stall_wall_s(self, attempt_running: bool) -> tuple[float, float]:
        """(stall, wall) seconds: the ended attempts', plus the current attempt's while one
        runs (`attempt_running`: the job is ADMITTED or RUNNING)."""
        stall, wall = self.ended_stall_s, self.ended_wall_s
        if attempt_running and self.progress is not None:
            stall += self.progress.stall_s
            wall += self.progress.wall_s
        return stall, wall

    def overhead_ratio(self, attempt_running: bool) -> float | None:
        """Checkpoint stall over wall time (0.0025 is 0.25 %); None before any wall time."""
        stall, wall = self.stall_wall_s(attempt_running)
        return min(1.0, stall / wall) if wall > 0 else None


def _commit(raw: Any) -> Commit | None:
    """The committed step, when the controller read it from storage (``read_s``): an older
    runner stored the training loop's own word under the same key, which is not believed."""
    data = _mapping(raw)
    step = _count(data.get("step"))
    if step is None or _seconds(data.get("read_s")) is None:
        return None
    return Commit(step, _text(data.get("uri")), _seconds(data.get("committed_unix_s")))


def _progress(raw: Any) -> Progress | None:
    data = _mapping(raw)
    step = _count(data.get("step"))
    if step is None:
        return None
    return Progress(
        step=step,
        step_at_s=_seconds(data.get("step_at_s")),
        stall_s=_seconds(data.get("stall_s")) or 0.0,
        wall_s=_seconds(data.get("wall_s")) or 0.0,
    )


def _attempts(raw: Any) -> tuple[Attempt, ...]:
    if not isinstance(raw, list):
        return ()
    out = []
    for item in raw[-MAX_ATTEMPTS:]:
        data = _mapping(item)
        kind = _text(data.get("kind"))
        if kind is None:
            continue
        out.append(
            Attempt(
                attempt=_count(data.get("attempt")),
                admitted_s=_seconds(data.get("admitted_s")),
                ended_s=_seconds(data.get("ended_s")),
                kind=kind,
                reason=_text(data.get("reason")) or "",
                step=_count(data.get("step")),
                checkpoint_step=_count(data.get("checkpoint_step")),
            )
        )
    return tuple(out)


def job_facts(info: Mapping[str, Any]) -> JobFacts:
    """Read the runner's recovery keys of `info` (see the module doc); never raises."""
    attempts = _attempts(info.get("attempts"))
    restarts = _count(info.get("restarts"))
    if restarts is None:
        restarts = sum(1 for a in attempts if a.kind in RESTART_KINDS)
    hangs = _count(info.get("hangs"))
    if hangs is None:
        hangs = sum(1 for a in attempts if a.kind == "hang")
    return JobFacts(
        checkpoint_uri=_text(info.get("checkpoint_uri")),
        commit=_commit(info.get("checkpoint")),
        progress=_progress(info.get("progress")),
        ended_stall_s=_seconds(info.get("stall_s_total")) or 0.0,
        ended_wall_s=_seconds(info.get("wall_s_total")) or 0.0,
        restarts=restarts,
        hangs=hangs,
        attempts=attempts,
    )
