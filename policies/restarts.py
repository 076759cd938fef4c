"""When a gang that crashed or hung runs again, and when its job gives up.

Owns two pure functions the runner calls when an attempt of a RUNNING gang ends badly:

* `failure_signature(text, literals)`: what makes two failures "the same". The line a user
  would read (the last exception line of the log tail, else its last lines) with what changes
  between two runs of the same bug taken out: addresses, ids, pids, IPs and ports, times,
  durations, steps, and the job's own ids (`literals`: the submission id names the attempt).
* `decide_restart(failure, record, limits) -> (Restart | GiveUp, record)`: the job's restart
  memory (`RestartRecord`, stored by the caller) goes in and comes back; nothing is kept here.

The rules, in order:

1. The same signature as the previous failure, and no progress in between, gives up at once
   ("same failure twice before any progress"): a typo must not burn every restart. Progress
   means a step committed since the previous failure, or a step this attempt reported past
   the one it started from (see `AttemptFailure.progressed`).
2. ``max_restarts`` restarts already used gives up, naming the count and the last failure.
3. Otherwise restart after ``backoff_initial_s * 2**restarts_used``, at most ``backoff_max_s``.

Worked example (max_restarts=3, backoff 10 s doubling, at most 600 s): attempt 1 crashes at
step 40 with "CUDA error: an illegal memory access" after committing step 30: restart 1 in
10 s. Attempt 2 resumes at 31 and crashes with the same error at step 35, no new commit, but
it reported step 35 > 30: progress, restart 2 in 20 s. Attempt 3 raises
``NameError: name 'lr' is not defined`` before its first step: restart 3 in 40 s (a new
signature). Attempt 4 raises the same NameError, nothing committed, no step: give up,
"same failure twice before any progress: NameError: name 'lr' is not defined".

Must not: read clocks, logs or the store (the caller passes what it read).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

__all__ = [
    "AttemptFailure",
    "FailureKind",
    "GiveUp",
    "Restart",
    "RestartLimits",
    "RestartRecord",
    "decide_restart",
    "exception_line",
    "failure_signature",
]


class FailureKind(str, Enum):
    CRASH = "crash"
    """The gang's Ray Job failed: a worker raised, a worker process was killed, a node died."""
    HANG = "hang"
    """The gang reported no new step for its stall timeout; the runner stopped it."""


@dataclass(frozen=True)
class AttemptFailure:
    """How one attempt ended, as the runner read it."""

    kind: FailureKind
    message: str
    """What the user reads: the log tail (trimmed), or the hang's description."""
    signature: str
    """`failure_signature` of the message (for a hang: a fixed string)."""
    committed_step: int | None
    """The newest step committed in storage now (None: none yet)."""
    start_step: int | None
    """The committed step the attempt started from (None: a fresh start)."""
    reported_step: int | None
    """The last step this attempt reported (None: it reported none)."""

    def progressed(self, committed_at_last_failure: int | None) -> bool:
        """A step committed since the previous failure, or a step reported past the start.

        E.g. committed 30 -> 30, started at 30, reported 35: True (it trained).
        committed 30 -> 30, started at 30, reported 30 or nothing: False."""
        if _newer(self.committed_step, committed_at_last_failure):
            return True
        if self.reported_step is None:
            return False
        return self.start_step is None or self.reported_step > self.start_step


@dataclass(frozen=True)
class RestartRecord:
    """A job's restart memory (kept in its info by the caller)."""

    restarts: int = 0
    """Restarts used so far (crashes and hangs; never preemptions or health moves)."""
    last_signature: str | None = None
    """The signature of the previous failure, if any."""
    committed_at_last_failure: int | None = None
    """The newest committed step when the previous failure happened."""


@dataclass(frozen=True)
class RestartLimits:
    max_restarts: int
    backoff_initial_s: float
    backoff_max_s: float


@dataclass(frozen=True)
class Restart:
    """Run the job again (a new attempt) once `after_s` seconds have passed."""

    after_s: float
    reason: str


@dataclass(frozen=True)
class GiveUp:
    """The job FAILS with `reason`."""

    reason: str


def decide_restart(
    failure: AttemptFailure, record: RestartRecord, limits: RestartLimits
) -> tuple[Restart | GiveUp, RestartRecord]:
    """Restart or give up, and the record to store (see the module doc for the rules)."""
    what = f"{failure.kind.value}: {failure.message}"
    after = RestartRecord(
        restarts=record.restarts,
        last_signature=failure.signature,
        committed_at_last_failure=failure.committed_step,
    )
    same = record.last_signature is not None and record.last_signature == failure.signature
    if same and not failure.progressed(record.committed_at_last_failure):
        return GiveUp(f"same failure twice before any progress: {what}"), after
    if record.restarts >= limits.max_restarts:
        return (
            GiveUp(
                f"gave up after {record.restarts} restart(s) (max_restarts="
                f"{limits.max_restarts}); last failure: {what}"
            ),
            after,
        )
    backoff_s = min(limits.backoff_max_s, limits.backoff_initial_s * 2.0**record.restarts)
    used = record.restarts + 1
    return (
        Restart(
            after_s=backoff_s,
            reason=f"restart {used} of {limits.max_restarts} in {backoff_s:g}s after {what}",
        ),
        replace(after, restarts=used),
    )


def _newer(step: int | None, than: int | None) -> bool:
    return step is not None and (than is None or step > than)


_EXCEPTION_LINE = re.compile(
    r"(?:^|[\s)(])[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Fault)\b(?:[:(]|$)"
    r"|\bexit(?:ed)? (?:with )?(?:code|status)\b|\bKilled\b|\bSegmentation fault\b"
)
_TIME = r"\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?"
_VOLATILE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"\b\d{{4}}-\d{{2}}-\d{{2}}[ T]{_TIME}(?:Z|[+-]\d{{2}}:?\d{{2}})?"), "<time>"),
    (re.compile(rf"\b{_TIME}\b"), "<time>"),
    (re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b"), "<id>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<addr>"),
    (re.compile(r"\b[0-9a-fA-F]{16,}\b"), "<id>"),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"), "<ip>"),
    (
        re.compile(r"\b(pid|tid|port|step|rank|worker|attempt|node)([=: ]+)\d+", re.IGNORECASE),
        r"\1\2<n>",
    ),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:ms|s|sec|secs|seconds|min|minutes)\b"), "<duration>"),
)
SIGNATURE_LINES = 3
"""Lines of the tail that make the signature when it holds no exception line."""
MAX_SIGNATURE_CHARS = 300


def exception_line(text: str) -> str | None:
    """The last line of `text` that names an exception or an exit (a traceback's own last
    line: its type and message), stripped; None when none does."""
    picked = [ln.strip() for ln in text.splitlines() if _EXCEPTION_LINE.search(ln.strip())]
    return picked[-1] if picked else None


def failure_signature(text: str, literals: Sequence[str] = ()) -> str:
    """The normalised line that identifies a failure (see the module doc).

    E.g. ``(RayTrainWorker pid=4242, ip=10.0.0.7) NameError: name 'lr' is not defined`` and
    ``(RayTrainWorker pid=977, ip=10.0.0.9) NameError: name 'lr' is not defined`` both give
    ``(RayTrainWorker pid=<n>, ip=<ip>) NameError: name 'lr' is not defined``; an exit code
    (1 against 137) is kept: a SIGKILL is not the same failure as an exception."""
    for literal in sorted((lit for lit in literals if lit), key=len, reverse=True):
        text = text.replace(literal, "<job>")
    line = exception_line(text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    out = line if line is not None else "\n".join(lines[-SIGNATURE_LINES:])
    for pattern, replacement in _VOLATILE:
        out = pattern.sub(replacement, out)
    return out[-MAX_SIGNATURE_CHARS:]
