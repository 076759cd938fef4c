"""Attempts' logs: what `rcp logs` and the API read, fetched from Ray as little as possible.

Owns `AttemptLogs` (`JobRunner.read_logs`): a window of the driver logs of every attempt of a
job, oldest first, each under a header line, with what the control plane kept with the
attempt (a hung gang's stacks, `Store.put_attempt_note`). An ended attempt's log never changes
and is fetched once (`limits.ENDED_LOGS_CACHE_CHARS` kept in all); the live attempt's at most
once per `limits.LIVE_LOG_CACHE_S` however many clients follow it; each is cut at
`limits.MAX_ATTEMPT_LOG_CHARS` with a marker line (`LOG_TRUNCATED_MARKER`). Also the tail of
a failed attempt's log that becomes its reason (`_tail_of`).

Must not: call Ray but through the Ray Jobs adapter (`ray_jobs.RayJobs.logs`), or write the
store.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from controlplane.service.runner import limits
from controlplane.service.runner.ray_jobs import RayJobsApi
from controlplane.store import JobRecord, Store
from jobs import launcher

__all__ = ["LOG_TRUNCATED_MARKER", "AttemptLogs"]

LOG_TRUNCATED_MARKER = "\n[rcp: log truncated here: the control plane keeps the first {n} characters of an attempt's log; read the rest with `ray job logs {sid}`]\n"


class AttemptLogs:
    """Reads and caches attempts' logs (see the module doc). Thread-safe."""

    def __init__(self, store: Store, ray_jobs: RayJobsApi, clock: Callable[[], float]) -> None:
        self.store = store
        self.ray = ray_jobs
        self.clock = clock
        self._ended_logs: collections.OrderedDict[str, str] = collections.OrderedDict()
        """Logs of attempts whose Ray Job ended, by submission id (see `read`)."""
        self._live_logs: dict[str, tuple[float, str]] = {}
        """(fetched at, log) of live attempts, by submission id (see `limits.LIVE_LOG_CACHE_S`)."""
        self._logs_lock = threading.Lock()
        self._fetch_locks: dict[str, threading.Lock] = {}
        self._log_sizes: collections.OrderedDict[str, int] = collections.OrderedDict()
        """Lengths of ended attempts' parts of the log, by submission id (see `read`)."""

    def read(self, job: JobRecord, offset: int, limit: int) -> tuple[str, int]:
        """``(text, size)``: `limit` characters from `offset` of the driver logs of every
        attempt, oldest first, each under a header line, and their length, fetching only the
        attempts that window touches.

        An attempt whose Ray Job has ended never changes: its log is fetched from Ray once and
        kept (`limits.ENDED_LOGS_CACHE_CHARS` in all, least recently used out first). The live
        attempt's log is fetched at most once per `limits.LIVE_LOG_CACHE_S` however many clients
        follow it (concurrent readers wait for one fetch). Each attempt's log is cut at
        `limits.MAX_ATTEMPT_LOG_CHARS` with a marker line. Thread-safe (the API calls it from its
        log-read threads).

        Where each attempt starts needs the sizes of those before it: an ended attempt's size
        never changes and is kept (`_log_sizes`, a few bytes per attempt) once it was fetched;
        the live attempt is the last, so it is fetched (within `limits.LIVE_LOG_CACHE_S`) for its
        size. A read thus holds at most the window's attempts and the live one; only the first
        read of a job after a controller start fetches its older attempts, one at a time, to
        learn their sizes.
        """
        attempts = int(job.info.get("attempt", 0))
        end = offset + max(0, limit)
        pieces: list[str] = []
        pos = 0
        for a in range(1, attempts + 1):
            sep = "\n" if a < attempts else ""
            size = self._known_size(job, a)
            part = None
            if size is None:
                part = self._part(job, a)
                size = len(part)
            lo, hi = max(offset, pos), min(end, pos + size + len(sep))
            if lo < hi:
                if part is None:
                    part = self._part(job, a)
                    size = len(part)
                    hi = min(end, pos + size + len(sep))
                pieces.append((part + sep)[lo - pos : hi - pos])
            pos += size + len(sep)
        return "".join(pieces), pos

    def _ended(self, job: JobRecord, attempt: int) -> bool:
        return attempt < int(job.info.get("attempt", 0)) or bool(job.info.get("ray_done"))

    def _known_size(self, job: JobRecord, attempt: int) -> int | None:
        """The length of an ended attempt's part of the log, if known (None: fetch it)."""
        if not self._ended(job, attempt):
            return None
        with self._logs_lock:
            return self._log_sizes.get(f"{job.job_id}-{attempt}")

    def _part(self, job: JobRecord, attempt: int) -> str:
        """One attempt's part of the log: a header line, then its (capped) log, then what the
        control plane kept with the attempt (a hung gang's stacks, `Store.put_attempt_note`,
        written before the attempt ends, so an ended attempt's part never changes)."""
        sid = f"{job.job_id}-{attempt}"
        ended = self._ended(job, attempt)
        part = f"=== attempt {attempt} (Ray job {sid}) ===\n{self._attempt_log(sid, ended)}"
        note = self.store.attempt_note(job.job_id, attempt)
        if note:
            part += ("" if part.endswith("\n") else "\n") + note
        if ended:
            with self._logs_lock:
                self._log_sizes[sid] = len(part)
                self._log_sizes.move_to_end(sid)
                while len(self._log_sizes) > limits.LOG_SIZE_INDEX_ENTRIES:
                    self._log_sizes.popitem(last=False)
        return part

    def _cached_log(self, sid: str, ended: bool) -> str | None:
        with self._logs_lock:
            if sid in self._ended_logs:
                self._ended_logs.move_to_end(sid)
                return self._ended_logs[sid]
            live = self._live_logs.get(sid)
            if not ended and live is not None and self.clock() - live[0] < limits.LIVE_LOG_CACHE_S:
                return live[1]
            return None

    def _attempt_log(self, sid: str, ended: bool) -> str:
        text = self._cached_log(sid, ended)
        if text is not None:
            return text
        with self._logs_lock:
            fetching = self._fetch_locks.setdefault(sid, threading.Lock())
        with fetching:  # one fetch per attempt at a time; the others then read the cache
            text = self._cached_log(sid, ended)
            if text is not None:
                return text
            text = _cap_log(str(self.ray.logs(sid)), sid)
            now = self.clock()
            with self._logs_lock:
                self._live_logs = {
                    k: v for k, v in self._live_logs.items() if now - v[0] < limits.LIVE_LOG_CACHE_S
                }
                if ended:
                    self._live_logs.pop(sid, None)
                    if len(text) <= limits.ENDED_LOGS_CACHE_CHARS:
                        cache = self._ended_logs
                        cache[sid] = text
                        while sum(len(t) for t in cache.values()) > limits.ENDED_LOGS_CACHE_CHARS:
                            cache.popitem(last=False)
                else:
                    self._live_logs[sid] = (now, text)
                self._fetch_locks.pop(sid, None)
        return text


def _tail_of(text: str, chars: int) -> str:
    """The last `chars` of a failed attempt's log; when the launcher named what failed the
    gang (its `launcher.GANG_FAILED_PREFIX` line: the rank, its node and exit code or
    exception), that line instead: the tail is then the other ranks being stopped."""
    text = text.strip()
    if not text:
        return "no logs"
    at = text.rfind(launcher.GANG_FAILED_PREFIX)
    if at >= 0:
        line = text[at + len(launcher.GANG_FAILED_PREFIX) :].split("\n", 1)[0].strip()
        if line:
            return line[-chars:]
    return text[-chars:]


def _cap_log(text: str, sid: str) -> str:
    """`text` cut at `limits.MAX_ATTEMPT_LOG_CHARS`, with the marker line when anything was cut."""
    if len(text) <= limits.MAX_ATTEMPT_LOG_CHARS:
        return text
    return text[: limits.MAX_ATTEMPT_LOG_CHARS] + LOG_TRUNCATED_MARKER.format(
        n=limits.MAX_ATTEMPT_LOG_CHARS, sid=sid
    )
