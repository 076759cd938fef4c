"""Job driver logs for the runner's fakes of Ray: ranged reads, and the bytes they served.

Owns: `LogsFromText`, a mixin that gives a fake `RayJobsApi` its `log_slice` / `log_tail`
from the fake's own ``logs(sid)`` text (as Ray's dashboard agent serves a file by range), and
`SyntheticLog`, a log of any length (gigabytes) computed from the offset, never held whole,
counting every byte it serves. Must not: be imported by product code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.adapters.driver_logs import LogSlice

__all__ = ["LogsFromText", "SyntheticLog"]


def _slice(data: bytes, start: int | None, max_bytes: int) -> LogSlice:
    if start is None:
        start = max(0, len(data) - max_bytes)
    return LogSlice(data[start : start + max_bytes], min(start, len(data)), len(data))


class LogsFromText:
    """`log_slice` and `log_tail` over ``self.logs(sid)`` (the test's text, UTF-8)."""

    def logs(self, sid: str) -> str:
        raise NotImplementedError

    def log_slice(self, sid: str, start: int, max_bytes: int) -> LogSlice:
        return _slice(self.logs(sid).encode(), start, max_bytes)

    def log_tail(self, sid: str, max_bytes: int) -> LogSlice:
        return _slice(self.logs(sid).encode(), None, max_bytes)


@dataclass
class SyntheticLog:
    """A log of `size` bytes: `line` repeated, then `tail` as its last bytes. Reads cost
    only what they return; `served` counts every byte handed out, `reads` every call."""

    size: int
    tail: bytes = b""
    line: bytes = b"step ok loss=0.125 throughput=1234.5 samples/s\n"
    served: int = 0
    reads: list[tuple[int | None, int]] = field(default_factory=list)

    def _at(self, start: int, n: int) -> bytes:
        end = min(self.size, start + n)
        body_end = self.size - len(self.tail)
        out = bytearray()
        pos = start
        while pos < min(end, body_end):
            k = pos % len(self.line)
            chunk = self.line[k : k + min(end, body_end) - pos]
            out += chunk
            pos += len(chunk)
        if end > body_end:
            out += self.tail[max(0, start - body_end) : end - body_end]
        return bytes(out)

    def read(self, start: int | None, max_bytes: int) -> LogSlice:
        self.reads.append((start, max_bytes))
        first = max(0, self.size - max_bytes) if start is None else min(start, self.size)
        data = self._at(first, max_bytes)
        self.served += len(data)
        return LogSlice(data, first, self.size)
