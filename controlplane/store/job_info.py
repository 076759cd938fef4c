"""A job's info: what the runner writes there, and the typed readers of it.

Owns:

* the codes that start the reasons in a job's state history (`Reason`) and the kinds of an
  attempt's end (`AttemptEnd`), as `policies.attempts` decides them (re-exported here);
* the info a job forgets when it is re-queued (`REQUEUE_INFO`) and the one an attempt's end
  records (`attempt_end`: its entry in ``attempts``, the stall and wall totals);
* the job's checkpoint prefix (`checkpoint_uri`, as recorded at admission: `uri_of`);
* the runner's checked reads of info and signals values (`info_step`, `hint_step`,
  `progress_of`, `submission_id`): the signals actor passes on what jobs report;
* `job_facts`: the recovery keys read back, typed, for the API's job view
  (`api.job_views.job_to_json`) and the controller's per-job gauges (`job_metrics`):

  * ``checkpoint``: the newest committed step as read from object storage,
    ``{"step", "uri", "committed_unix_s", "read_s"}`` (without ``read_s`` it is an older
    runner's record of the loop's own word, and not shown);
  * ``checkpoint_uri``: the job's checkpoint prefix;
  * ``progress``: the current attempt's ``{"step", "step_at_s", "stall_s", "wall_s"}``;
  * ``stall_s_total``, ``wall_s_total``: checkpoint stall and wall seconds of ended attempts;
  * ``restarts`` (crash and hang restarts used) and ``hangs``;
  * ``attempts``: each attempt's end, newest last,
    ``{"attempt", "admitted_s", "ended_s", "kind", "reason", "step", "checkpoint_step"}``,
    and ``"in_place"`` (the restart's index) for a restart of the run's workers in place.

Every key is optional and its type untrusted: info is JSON from the store, an older runner
wrote other shapes, and a listing must never fail on one job. A value of the wrong type, a
non-finite number or a negative count reads as absent (`as_count`, `as_finite`, `_text`,
`as_mapping`); text is cut to `MAX_TEXT_CHARS`.

Checkpoint overhead is training time spent stalled on checkpoints over wall time, summed over
the ended attempts plus, while an attempt runs, the running one. Example: ended attempts
stalled 3 s of 1000 s and the running one 1 s of 600 s: (3 + 1) / (1000 + 600) = 0.25 %.

Must not: read or write the store, or call Ray (pure functions of records and config);
`job_facts` reads no other info key (``signal_token`` is a secret).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.config import Config
from controlplane.store import JobRecord
from jobs.signals import trust
from jobs.spec import JOBS_AREA
from jobs.storage_uri import parse_storage_uri
from policies.attempts import AttemptEnd, Reason

__all__ = [
    "PROGRESS_INFO_KEYS",
    "RESTART_KINDS",
    "SIGNAL_TOKEN_INFO",
    "Attempt",
    "AttemptEnd",
    "Commit",
    "JobFacts",
    "Progress",
    "Reason",
    "attempt_end",
    "checkpoint_uri",
    "job_facts",
    "uri_of",
]

RESTART_KINDS = frozenset({"crash", "hang"})
"""Attempt ends that spend one of the job's ``max_restarts``."""
MAX_ATTEMPTS_KEPT = 100
"""Attempt ends kept in a job's info (``attempts``, newest last), and the most read back."""
ATTEMPT_REASON_CHARS = 400
"""The most of a log tail kept as an attempt's end reason (its last characters)."""
MAX_TEXT_CHARS = 500
"""The longest reason, kind or URI `job_facts` shows; longer ones end in ``...``."""
MAX_STEP = 10**12
"""Steps at or above this are not believed by the runner (the checkpoint layout's step width)."""
MAX_COUNT = 2**53
"""Counts and steps above this are not believed by `job_facts` (JSON numbers past it lose
precision)."""

SIGNAL_TOKEN_INFO = "signal_token"
"""The job-info key of the current attempt's signal token."""
PROGRESS_INFO_KEYS = ("step", "step_at_s", "stall_s", "wall_s")
"""What ``info["progress"]`` keeps of the signals actor's progress record."""

REQUEUE_INFO: Mapping[str, Any] = {
    "preempting": None,
    "preempt_checkpoint": None,
    "preempt_kind": None,
    "stopping": None,
    "stop_sent": None,
    "placement": None,
    "ray_done": True,
}
"""What a re-queued job's info forgets (its gang is gone) and records (its Ray Job ended)."""


def as_count(value: Any, most: int = MAX_STEP - 1) -> int | None:
    """An int in [0, `most`], else None (bools, floats and strings are not counts)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        return None
    return value


def as_finite(value: Any) -> float | None:
    """A finite number >= 0, else None (bools, strings, NaN and inf are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return value if len(value) <= MAX_TEXT_CHARS else value[: MAX_TEXT_CHARS - 3] + "..."


def as_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def checkpoint_uri(cfg: Config, job: JobRecord) -> str:
    """The job's checkpoint prefix: ``checkpoint.uri``, else ``<storage.uri>/jobs/<job
    id>``, in the canonical form `jobs.storage_uri` gives it (the spec's URI passed that
    parser at submission). The signals actor refuses checkpoint hints outside it; the
    controller reads committed steps there; the job writes and restores only there."""
    if job.spec.checkpoint.uri:
        return str(parse_storage_uri(job.spec.checkpoint.uri))
    area = f"{cfg.storage.uri.rstrip('/')}/{JOBS_AREA}"
    return trust.checkpoint_prefix(area, job.job_id)


def uri_of(cfg: Config, job: JobRecord) -> str:
    """The prefix recorded at admission (a job admitted before it was recorded: now)."""
    uri = job.info.get("checkpoint_uri")
    return uri if isinstance(uri, str) and uri else checkpoint_uri(cfg, job)


def attempt_end(
    job: JobRecord,
    kind: AttemptEnd,
    reason: str,
    now: float,
    in_place: int | None = None,
    step: int | None = None,
) -> dict[str, Any]:
    """The info that records how the current attempt ended: its entry in ``attempts`` (with
    ``checkpoint_step``, the committed step the next attempt resumes from)
    (newest last, at most `MAX_ATTEMPTS_KEPT`), its checkpoint stall and wall seconds
    added to the totals, its ``progress`` cleared. `in_place`: the run restarted its workers
    itself (that restart's index, in the entry as ``in_place``); the attempt goes on. `step`:
    the last step the failed run reported, when known better than the recorded progress. {}
    once recorded (idempotent)."""
    attempt = as_count(job.info.get("attempt"))
    if not attempt:
        return {}
    raw = job.info.get("attempts")
    attempts = [a for a in raw if isinstance(a, Mapping)] if isinstance(raw, list) else []
    if in_place is None:
        recorded = bool(attempts) and attempts[-1].get("attempt") == attempt
        if recorded and attempts[-1].get("in_place") is None:
            return {}
    elif any((a.get("attempt"), a.get("in_place")) == (attempt, in_place) for a in attempts):
        return {}
    progress = as_mapping(job.info.get("progress"))
    # The step the next attempt resumes from, as storage showed it when this one ended: the
    # step that answered a preemption request, else the newest committed one.
    committed = as_count(job.info.get("preempt_checkpoint"))
    if committed is None:
        committed = as_count(as_mapping(job.info.get("checkpoint")).get("step"))
    attempts.append(
        {
            "attempt": attempt,
            "admitted_s": as_finite(job.info.get("admitted_s")),
            "ended_s": now,
            "kind": kind.value,
            "reason": reason[-ATTEMPT_REASON_CHARS:],
            "step": step if step is not None else as_count(progress.get("step")),
            "checkpoint_step": committed,
            **({"in_place": in_place} if in_place is not None else {}),
        }
    )
    totals = {}
    for key in ("stall_s", "wall_s"):
        before = as_finite(job.info.get(f"{key}_total")) or 0.0
        totals[f"{key}_total"] = before + (as_finite(progress.get(key)) or 0.0)
    return {"attempts": attempts[-MAX_ATTEMPTS_KEPT:], "progress": None, **totals}


def _reported_step(value: Any) -> int | None:
    """A step the signals actor passed on as a number: its progress stats are floats
    (``committed_step`` 99 arrives as 99.0); an integral finite one in range, else None."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return as_count(value)


def info_step(value: Any) -> int | None:
    """The step of ``info["checkpoint"]`` when it is one the controller read from storage
    (an older runner stored the loop's word there, without ``read_s``: not believed)."""
    if not isinstance(value, Mapping) or "read_s" not in value:
        return None
    return as_count(value.get("step"))


def hint_step(value: Any, attempt: Any) -> int | None:
    """The step of the signals actor's checkpoint hint, when it is this attempt's."""
    if not isinstance(value, Mapping) or value.get("attempt") != attempt:
        return None
    return as_count(value.get("step"))


def progress_of(sig: Mapping[str, Any], attempt: Any) -> dict[str, Any] | None:
    """This attempt's progress from the signals actor, checked: ``step`` a count,
    ``step_at_s`` a finite time, ``stall_s``/``wall_s`` finite (else 0), ``committed_step`` a
    count or None. None (the watchdog stays unarmed) for anything else: another attempt's, no
    step yet, a malformed record."""
    raw = sig.get("progress") if isinstance(sig, Mapping) else None
    if sig.get("attempt") != attempt or not isinstance(raw, Mapping):
        return None
    step, step_at_s = as_count(raw.get("step")), as_finite(raw.get("step_at_s"))
    if step is None or step_at_s is None:
        return None
    return {
        "step": step,
        "step_at_s": step_at_s,
        "stall_s": as_finite(raw.get("stall_s")) or 0.0,
        "wall_s": as_finite(raw.get("wall_s")) or 0.0,
        "committed_step": _reported_step(raw.get("committed_step")),
    }


def submission_id(job_id: str, info: Mapping[str, Any]) -> str | None:
    """The current attempt's Ray submission id from a job's info, trusting no type."""
    sid = info.get("submission_id")
    if isinstance(sid, str) and sid:
        return sid
    attempt = info.get("attempt")
    if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt > 0:
        return f"{job_id}-{attempt}"
    return None


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
    in_place: int | None = None
    """The run restarted its workers itself, this many times so far (the attempt went on)."""


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
    data = as_mapping(raw)
    step = as_count(data.get("step"), MAX_COUNT)
    if step is None or as_finite(data.get("read_s")) is None:
        return None
    return Commit(step, _text(data.get("uri")), as_finite(data.get("committed_unix_s")))


def _progress(raw: Any) -> Progress | None:
    data = as_mapping(raw)
    step = as_count(data.get("step"), MAX_COUNT)
    if step is None:
        return None
    return Progress(
        step=step,
        step_at_s=as_finite(data.get("step_at_s")),
        stall_s=as_finite(data.get("stall_s")) or 0.0,
        wall_s=as_finite(data.get("wall_s")) or 0.0,
    )


def _attempts(raw: Any) -> tuple[Attempt, ...]:
    if not isinstance(raw, list):
        return ()
    out = []
    for item in raw[-MAX_ATTEMPTS_KEPT:]:
        data = as_mapping(item)
        kind = _text(data.get("kind"))
        if kind is None:
            continue
        out.append(
            Attempt(
                attempt=as_count(data.get("attempt"), MAX_COUNT),
                admitted_s=as_finite(data.get("admitted_s")),
                ended_s=as_finite(data.get("ended_s")),
                kind=kind,
                reason=_text(data.get("reason")) or "",
                step=as_count(data.get("step"), MAX_COUNT),
                checkpoint_step=as_count(data.get("checkpoint_step"), MAX_COUNT),
                in_place=as_count(data.get("in_place"), MAX_COUNT),
            )
        )
    return tuple(out)


def job_facts(info: Mapping[str, Any]) -> JobFacts:
    """Read the runner's recovery keys of `info` (see the module doc); never raises."""
    attempts = _attempts(info.get("attempts"))
    restarts = as_count(info.get("restarts"), MAX_COUNT)
    if restarts is None:
        restarts = sum(1 for a in attempts if a.kind in RESTART_KINDS)
    hangs = as_count(info.get("hangs"), MAX_COUNT)
    if hangs is None:
        hangs = sum(1 for a in attempts if a.kind == "hang")
    return JobFacts(
        checkpoint_uri=_text(info.get("checkpoint_uri")),
        commit=_commit(info.get("checkpoint")),
        progress=_progress(info.get("progress")),
        ended_stall_s=as_finite(info.get("stall_s_total")) or 0.0,
        ended_wall_s=as_finite(info.get("wall_s_total")) or 0.0,
        restarts=restarts,
        hangs=hangs,
        attempts=attempts,
    )
