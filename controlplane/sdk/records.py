"""What the API answers, as the SDK hands it back: frozen records (`Job`, `Attempt`, `User`),
a listing with the rows the control plane skipped (`JobList`), and the final job states.

Must not: do I/O.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

__all__ = ["TERMINAL_STATES", "Attempt", "Job", "JobList", "User"]

TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


@dataclass(frozen=True)
class Attempt:
    """How one attempt of a job ended (`Job.attempts`, newest last)."""

    attempt: int | None
    kind: str
    """crash, hang, preempted, health, start-failed, succeeded, failed, cancelled,
    max-runtime or lost; crash and hang spend one of the job's ``max_restarts``."""
    reason: str
    ended_s: float | None = None
    admitted_s: float | None = None
    step: int | None = None
    """The last step the attempt reported (None: none)."""
    checkpoint_step: int | None = None
    """The committed step the next attempt resumes from, as the control plane read it from
    object storage when this attempt ended (for a preemption: the step that answered it)."""
    in_place: int | None = None
    """The run restarted its workers itself, the n-th time (the attempt went on); None: the
    attempt ended."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attempt:
        return cls(
            attempt=data.get("attempt"),
            kind=str(data.get("kind", "")),
            reason=str(data.get("reason", "")),
            ended_s=data.get("ended_s"),
            admitted_s=data.get("admitted_s"),
            step=data.get("step"),
            checkpoint_step=data.get("checkpoint_step"),
            in_place=data.get("in_place"),
        )


@dataclass(frozen=True)
class Job:
    """A job as the API reports it. `last_checkpoint` is the newest committed step
    (``{"step", "uri", "committed_unix_s", "age_s"}``; None: none yet);
    `checkpoint_overhead_pct` the training time stalled on checkpoints over wall time, in
    percent; `restarts` of `max_restarts` are spent by crashes and hangs only; `attempts`
    (only from `Client.status`) say how each attempt ended; `progress` is the running
    attempt's step and when it last grew; `ettr` the effective training time ratio since
    the first admission (productive training over wall time); `recoveries` (only from
    `Client.status`) each failure's ``{"failed_s", "kind", "in_place", "seconds", "source",
    "restored_step"}``: ``seconds`` to the first new step (None: not resumed yet), ``source``
    where the restore read the checkpoint (``memory``, ``storage``)."""

    id: str
    state: str
    name: str
    queue: str
    priority_class: str
    num_workers: int
    gpus_per_worker: int
    submitted_s: float
    owner: str | None = None
    """The user who submitted it (None: a job from before users)."""
    num_preemptions: int = 0
    attempt: int = 0
    ray_job_id: str | None = None
    last_checkpoint: Mapping[str, Any] | None = None
    checkpoint_uri: str | None = None
    checkpoint_overhead_pct: float | None = None
    restarts: int = 0
    max_restarts: int | None = None
    hangs: int = 0
    progress: Mapping[str, Any] | None = None
    attempts: tuple[Attempt, ...] = ()
    ettr: float | None = None
    estimated_start_s: float | None = None
    """A queued job's estimated start: its reservation's time when it heads the queue (as of
    the last tick), else None (unknown)."""
    recoveries: tuple[Mapping[str, Any], ...] = ()
    message: str | None = None
    history: tuple[Mapping[str, Any], ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def last_committed_step(self) -> int | None:
        """The newest committed checkpoint step (None: none committed yet)."""
        return None if not self.last_checkpoint else self.last_checkpoint.get("step")

    @property
    def checkpoint_age_s(self) -> float | None:
        """Seconds since the newest checkpoint committed, as of the request."""
        return None if not self.last_checkpoint else self.last_checkpoint.get("age_s")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        """Each field from its key (a field with a default may be absent); `raw` is `data`."""
        plain = {
            f.name: data[f.name] if f.default is MISSING else data.get(f.name, f.default)
            for f in fields(cls)
            if f.name not in ("attempts", "recoveries", "history", "raw")
        }
        return cls(
            **plain,
            attempts=tuple(Attempt.from_json(a) for a in data.get("attempts") or ()),
            recoveries=tuple(data.get("recoveries") or ()),
            history=tuple(data.get("history", ())),
            raw=dict(data),
        )


@dataclass(frozen=True)
class User:
    """A user of the API (`Client.users_list`). `token` is set only in the answer of
    `Client.users_add` and `Client.users_rotate_token`: the one time it is shown."""

    name: str
    role: str
    queues: tuple[str, ...]
    created_s: float
    rotated_s: float
    expires_s: float | None = None
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> User:
        return cls(
            name=str(data["name"]),
            role=str(data["role"]),
            queues=tuple(data.get("queues") or ()),
            created_s=float(data["created_s"]),
            rotated_s=float(data["rotated_s"]),
            expires_s=data.get("expires_s"),
            token=data.get("token"),
        )


class JobList(list[Job]):
    """The jobs of a listing, plus `invalid`: stored rows the control plane skips because they
    no longer validate, each ``{"id", "state", "error"}`` (see `rcp status`)."""

    def __init__(self, jobs: Iterator[Job] | builtins.list[Job], invalid: Any = ()) -> None:
        super().__init__(jobs)
        self.invalid: builtins.list[dict[str, Any]] = [dict(r) for r in invalid]
