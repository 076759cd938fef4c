"""Attempts' logs: what `rcp logs` and the API read, fetched from Ray by byte range, never whole.

Owns `AttemptLogs` (`JobRunner.read_logs`): a window of the driver logs of every attempt of a
job, oldest first, each under a header line, with what the control plane kept with the
attempt (a hung gang's stacks, `Store.put_attempt_note`). Offsets and sizes are bytes of the
UTF-8 text. Only the bytes the window covers are asked of Ray (`RayJobsApi.log_slice`), and
nothing past an attempt's first `MAX_ATTEMPT_LOG_BYTES` (a marker line,
`LOG_TRUNCATED_MARKER`, stands for the rest), so a multi-GB log costs a follower what it
reads. Where each attempt starts needs the sizes of those before it: an ended attempt's never
changes and is kept once learned; the live attempt's is asked again at most once per
`LIVE_LOG_CACHE_S`, however many clients follow it. Also the tail of a failed
attempt's log that becomes its reason (`tail_of`).

Must not: call Ray but through the Ray Jobs adapter (`ray_jobs.RayJobs.log_slice`,
`log_tail`), or write the store.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.adapters.ray_jobs import RayJobsApi
from controlplane.store import JobRecord, Store
from jobs import launcher
from policies.restarts import exception_line

__all__ = ["LOG_TRUNCATED_MARKER", "AttemptLogs"]

MAX_ATTEMPT_LOG_BYTES = 32 << 20
"""The most of one attempt's log the runner serves: its first bytes (so offsets stay valid)."""
LOG_SIZE_INDEX_ENTRIES = 100_000
"""Ended attempts whose log size `JobRunner.read_logs` remembers (least recently used out)."""
LIVE_LOG_CACHE_S = 2.0
"""How long a live attempt's log size is used again before Ray is asked anew."""

LOG_TRUNCATED_MARKER = "\n[rcp: log truncated here: the control plane serves the first {n} bytes of an attempt's log; read the rest with `ray job logs {sid}`]\n"

_UTF8_MAX_TAIL = 3
"""Continuation bytes a UTF-8 character can have after its first byte."""


@dataclass(frozen=True)
class _Part:
    """One attempt's part of the log, as regions of bytes: header, the first `log_bytes` of
    Ray's log, the marker (when Ray's log is longer), the kept note."""

    sid: str
    header: bytes
    log_bytes: int
    marker: bytes
    note: bytes

    @property
    def size(self) -> int:
        return len(self.header) + self.log_bytes + len(self.marker) + len(self.note)


class AttemptLogs:
    """Reads attempts' logs by byte range (see the module doc). Thread-safe."""

    def __init__(self, store: Store, ray_jobs: RayJobsApi, clock: Callable[[], float]) -> None:
        self.store = store
        self.ray = ray_jobs
        self.clock = clock
        self._lock = threading.Lock()
        self._ended_sizes: collections.OrderedDict[str, tuple[int, int]] = collections.OrderedDict()
        """(size of the part, size of Ray's log) of ended attempts, by submission id (least
        recently used out past `LOG_SIZE_INDEX_ENTRIES`)."""
        self._live_sizes: dict[str, tuple[float, int]] = {}
        """(asked at, size of Ray's log) of live attempts, by submission id."""
        self._probe_locks: dict[str, threading.Lock] = {}

    def read(self, job: JobRecord, offset: int, limit: int) -> tuple[str, int]:
        """``(text, size)``: the bytes `offset` .. `offset + limit` of the driver logs of every
        attempt, oldest first, each under a header line, decoded, and their length in bytes.

        A character cut by either end of the window belongs to the earlier window: the text
        starts after the continuation bytes at `offset` and ends with the character `offset +
        limit` cuts, so consecutive windows (a follower's reads from each ``next_offset``)
        join into the whole text. Thread-safe (the API calls it from its log-read threads).
        """
        attempts = int(job.info.get("attempt", 0))
        end = offset + max(0, limit)
        want = end + _UTF8_MAX_TAIL if limit > 0 else end
        pieces: list[bytes] = []
        pos = 0
        for a in range(1, attempts + 1):
            sep = b"\n" if a < attempts else b""
            part = None
            size = self._known_size(job, a)
            if size is None:
                part = self._part(job, a)
                size = part.size
            lo, hi = max(offset, pos), min(want, pos + size + len(sep))
            if lo < hi:
                part = part or self._part(job, a)
                pieces.append(self._bytes(part, sep, lo - pos, hi - pos))
            pos += size + len(sep)
        if limit <= 0:
            return "", pos
        return _whole_characters(b"".join(pieces), offset > 0, end - offset), pos

    def _ended(self, job: JobRecord, attempt: int) -> bool:
        return attempt < int(job.info.get("attempt", 0)) or bool(job.info.get("ray_done"))

    def _known_size(self, job: JobRecord, attempt: int) -> int | None:
        """The size of an ended attempt's part, if known (None: build the part)."""
        if not self._ended(job, attempt):
            return None
        with self._lock:
            known = self._ended_sizes.get(f"{job.job_id}-{attempt}")
        return None if known is None else known[0]

    def _part(self, job: JobRecord, attempt: int) -> _Part:
        """One attempt's part (`_Part`; the note is written before the attempt ends, so an
        ended attempt's part never changes). Asks Ray for the log's size only."""
        sid = f"{job.job_id}-{attempt}"
        ended = self._ended(job, attempt)
        with self._lock:
            known = self._ended_sizes.get(sid) if ended else None
        ray_size = known[1] if known is not None else self._ray_size(sid, ended)
        cap = MAX_ATTEMPT_LOG_BYTES
        marker = LOG_TRUNCATED_MARKER.format(n=cap, sid=sid) if ray_size > cap else ""
        note = self.store.attempt_note(job.job_id, attempt)
        part = _Part(
            sid,
            f"=== attempt {attempt} (Ray job {sid}) ===\n".encode(),
            min(ray_size, cap),
            marker.encode(),
            f"\n{note}".encode() if note else b"",
        )
        if ended:
            with self._lock:
                self._ended_sizes[sid] = (part.size, ray_size)
                self._ended_sizes.move_to_end(sid)
                while len(self._ended_sizes) > LOG_SIZE_INDEX_ENTRIES:
                    self._ended_sizes.popitem(last=False)
        return part

    def _ray_size(self, sid: str, ended: bool) -> int:
        """The length of Ray's log of `sid`: a one-byte tail read (a live attempt's is
        cached; concurrent readers wait for one probe)."""
        if ended:
            return self.ray.log_tail(sid, 1).size
        with self._lock:
            fresh = self._fresh_size(sid)
            if fresh is not None:
                return fresh
            probing = self._probe_locks.setdefault(sid, threading.Lock())
        with probing:
            with self._lock:
                fresh = self._fresh_size(sid)
            if fresh is not None:
                return fresh
            size = self.ray.log_tail(sid, 1).size
            now = self.clock()
            with self._lock:
                fresh_s = LIVE_LOG_CACHE_S
                self._live_sizes = {
                    k: v for k, v in self._live_sizes.items() if now - v[0] < fresh_s
                }
                self._live_sizes[sid] = (now, size)
                self._probe_locks.pop(sid, None)
            return size

    def _fresh_size(self, sid: str) -> int | None:
        known = self._live_sizes.get(sid)
        if known is not None and self.clock() - known[0] < LIVE_LOG_CACHE_S:
            return known[1]
        return None

    def _bytes(self, part: _Part, sep: bytes, lo: int, hi: int) -> bytes:
        """Bytes `lo` .. `hi` of `part` and its separator; of Ray's log, only those."""
        out: list[bytes] = []
        at = 0
        for region in (part.header, None, part.marker, part.note, sep):
            length = part.log_bytes if region is None else len(region)
            a, b = max(lo, at), min(hi, at + length)
            if a < b:
                if region is None:
                    got = self.ray.log_slice(part.sid, a - at, b - a)
                    out.append(got.data[: b - a])
                else:
                    out.append(region[a - at : b - at])
            at += length
        return b"".join(out)


def _whole_characters(data: bytes, skip_head: bool, cut: int) -> str:
    """`data` (read from a window's start, `cut` bytes wanted, up to 3 more) decoded: the
    continuation bytes it starts with skipped when `skip_head` (they end the character the
    window before completed), and the character at `cut` completed."""
    start = 0
    if skip_head:
        while start < min(_UTF8_MAX_TAIL, len(data)) and 0x80 <= data[start] < 0xC0:
            start += 1
    stop = min(cut, len(data))
    while stop < len(data) and stop - cut < _UTF8_MAX_TAIL and 0x80 <= data[stop] < 0xC0:
        stop += 1
    return data[start:stop].decode("utf-8", errors="replace")


def tail_of(text: str, chars: int) -> str:
    """What failed an attempt, from the end of its log, at most `chars`: the launcher's word
    when it named it (its `launcher.GANG_FAILED_PREFIX` line: the rank, its node and exit code
    or exception; the tail is then the other ranks being stopped), else the last line that
    names an exception or an exit (a traceback's own last line: its type and message), else
    the last `chars` of the log."""
    text = text.strip()
    if not text:
        return "no logs"
    at = text.rfind(launcher.GANG_FAILED_PREFIX)
    if at >= 0:
        line = text[at + len(launcher.GANG_FAILED_PREFIX) :].split("\n", 1)[0].strip()
        if line:
            return line[-chars:]
    named = exception_line(text)
    return named[:chars] if named else text[-chars:]
