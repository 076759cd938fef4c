"""What the runner writes in a job's info, and how it reads it back: the runner's vocabulary.

Owns:

* the codes that start the reasons in a job's state history (`Reason`) and the kinds of an
  attempt's end (`AttemptEnd`), as `policies.attempts` decides them (re-exported here);
* the info a job forgets when it is re-queued (`_REQUEUE_INFO`) and the one an attempt's end
  records (`attempt_end`: its entry in ``attempts``, the stall and wall totals);
* the job's checkpoint prefix (`checkpoint_uri`, as recorded at admission: `uri_of`);
* reading info and signals values without trusting their types (`_count`, `_finite`,
  `_info_step`, `_hint_step`, `_progress_of`, `_submission_id`): info is JSON from the store,
  an older runner wrote other shapes, and the signals actor passes on what jobs report.

Must not: read or write the store, or call Ray (pure functions of records and config).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from controlplane.config import Config
from controlplane.store import JobRecord
from jobs.signals import trust
from jobs.spec import JOBS_AREA
from jobs.storage_uri import parse_storage_uri
from policies.attempts import AttemptEnd, Reason

__all__ = [
    "PROGRESS_INFO_KEYS",
    "SIGNAL_TOKEN_INFO",
    "AttemptEnd",
    "Reason",
    "attempt_end",
    "checkpoint_uri",
    "uri_of",
]

MAX_ATTEMPTS_KEPT = 100
"""Attempt ends kept in a job's info (``attempts``, newest last)."""
ATTEMPT_REASON_CHARS = 400
"""The most of a log tail kept as an attempt's end reason (its last characters)."""

SIGNAL_TOKEN_INFO = "signal_token"
"""The job-info key of the current attempt's signal token."""

_REQUEUE_INFO: Mapping[str, Any] = {
    "preempting": None,
    "preempt_checkpoint": None,
    "preempt_kind": None,
    "stopping": None,
    "stop_sent": None,
    "placement": None,
    "ray_done": True,
}
"""What a re-queued job's info forgets (its gang is gone) and records (its Ray Job ended)."""


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


def attempt_end(job: JobRecord, kind: AttemptEnd, reason: str, now: float) -> dict[str, Any]:
    """The info that records how the current attempt ended: its entry in ``attempts`` (with
    ``checkpoint_step``, the committed step the next attempt resumes from)
    (newest last, at most `MAX_ATTEMPTS_KEPT`), its checkpoint stall and wall seconds
    added to the totals, its ``progress`` cleared. {} once recorded (idempotent)."""
    attempt = _count(job.info.get("attempt"))
    if not attempt:
        return {}
    raw = job.info.get("attempts")
    attempts = [a for a in raw if isinstance(a, Mapping)] if isinstance(raw, list) else []
    if attempts and attempts[-1].get("attempt") == attempt:
        return {}
    progress = job.info.get("progress")
    progress = progress if isinstance(progress, Mapping) else {}
    # The step the next attempt resumes from, as storage showed it when this one ended: the
    # step that answered a preemption request, else the newest committed one.
    committed = _count(job.info.get("preempt_checkpoint"))
    if committed is None:
        checkpoint = job.info.get("checkpoint")
        committed = _count(checkpoint.get("step")) if isinstance(checkpoint, Mapping) else None
    attempts.append(
        {
            "attempt": attempt,
            "admitted_s": _finite(job.info.get("admitted_s")),
            "ended_s": now,
            "kind": kind.value,
            "reason": reason[-ATTEMPT_REASON_CHARS:],
            "step": _count(progress.get("step")),
            "checkpoint_step": committed,
        }
    )
    totals = {}
    for key in ("stall_s", "wall_s"):
        before = _finite(job.info.get(f"{key}_total")) or 0.0
        totals[f"{key}_total"] = before + (_finite(progress.get(key)) or 0.0)
    return {"attempts": attempts[-MAX_ATTEMPTS_KEPT:], "progress": None, **totals}


PROGRESS_INFO_KEYS = ("step", "step_at_s", "stall_s", "wall_s")
"""What ``info["progress"]`` keeps of the signals actor's progress record."""
MAX_STEP = 10**12
"""Steps at or above this are not believed (the checkpoint layout's step width)."""


def _count(value: Any) -> int | None:
    """An int in [0, `MAX_STEP`), else None (bools, floats and strings are not counts)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_STEP:
        return None
    return value


def _finite(value: Any) -> float | None:
    """A finite number >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _reported_step(value: Any) -> int | None:
    """A step the signals actor passed on as a number: its progress stats are floats
    (``committed_step`` 99 arrives as 99.0); an integral finite one in range, else None."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return _count(value)


def _info_step(value: Any) -> int | None:
    """The step of ``info["checkpoint"]`` when it is one the controller read from storage
    (an older runner stored the loop's word there, without ``read_s``: not believed)."""
    if not isinstance(value, Mapping) or "read_s" not in value:
        return None
    return _count(value.get("step"))


def _hint_step(value: Any, attempt: Any) -> int | None:
    """The step of the signals actor's checkpoint hint, when it is this attempt's."""
    if not isinstance(value, Mapping) or value.get("attempt") != attempt:
        return None
    return _count(value.get("step"))


def _progress_of(sig: Mapping[str, Any], attempt: Any) -> dict[str, Any] | None:
    """This attempt's progress from the signals actor, checked: ``step`` a count,
    ``step_at_s`` a finite time, ``stall_s``/``wall_s`` finite (else 0), ``committed_step`` a
    count or None. None (the watchdog stays unarmed) for anything else: another attempt's, no
    step yet, a malformed record."""
    raw = sig.get("progress") if isinstance(sig, Mapping) else None
    if sig.get("attempt") != attempt or not isinstance(raw, Mapping):
        return None
    step, step_at_s = _count(raw.get("step")), _finite(raw.get("step_at_s"))
    if step is None or step_at_s is None:
        return None
    return {
        "step": step,
        "step_at_s": step_at_s,
        "stall_s": _finite(raw.get("stall_s")) or 0.0,
        "wall_s": _finite(raw.get("wall_s")) or 0.0,
        "committed_step": _reported_step(raw.get("committed_step")),
    }


def _submission_id(job_id: str, info: Mapping[str, Any]) -> str | None:
    """The current attempt's Ray submission id from a job's info, trusting no type."""
    sid = info.get("submission_id")
    if isinstance(sid, str) and sid:
        return sid
    attempt = info.get("attempt")
    if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt > 0:
        return f"{job_id}-{attempt}"
    return None
