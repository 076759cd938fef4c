"""What `rcp logs` shows by default: each rank's own output once, by rank, without Ray's lines.

Owns: `RankLines`, fed a job's log text in pieces as the API returns it (whole or followed),
giving back the lines to show: each attempt's header (``=== attempt N ...``), whatever the
control plane kept with an attempt (a section whose header is ``=== attempt N: ...``, a hung
gang's stacks), the launcher's and the control plane's own word (lines that start ``rcp: `` or
``[rcp: ``: the failed gang's summary, a truncated log's marker) and every line a rank
wrote (marked by `jobs.launcher.rank_output`), once, as ``[rank R] text`` (``[rank R @ip]``
once the log has shown more than one node), in the order they came. A line seen again (the
same worker process and line number: the local cluster's nodes share a log directory and each
forwards every worker's lines) is dropped; per worker process only the newest `SEEN_WINDOW`
line numbers are remembered (a copy arrives soon after its original; a line older than that
counts as seen), so a long log costs a bounded memory. Everything else (Ray's lines, the
driver's) is left to ``rcp logs --system``, which prints the log as it is.

Must not: call the API or print.
"""

from __future__ import annotations

import re

from jobs.launcher.rank_output import MARK_RE

__all__ = ["SEEN_WINDOW", "RankLines"]

SEEN_WINDOW = 10_000
"""Line numbers remembered per worker process for dropping copies."""

_RAY_PREFIX_IP = re.compile(r"\([^()]*\bip=([0-9a-fA-F.:]+)\)")
_OURS = ("rcp: ", "[rcp: ")
_ATTEMPT = "=== attempt "
_NOTE = re.compile(r"^=== attempt \d+: ")
"""The header of what the control plane kept with an attempt (shown whole)."""


class RankLines:
    """See the module doc. Not thread-safe: one per log being shown."""

    def __init__(self) -> None:
        self._partial = ""
        self._seen: dict[str, set[int]] = {}
        """Per worker pid, the line numbers shown (the newest `SEEN_WINDOW` of them)."""
        self._newest: dict[str, int] = {}
        self._ips: set[str] = set()
        self._in_note = False

    def feed(self, text: str) -> list[str]:
        """The lines of `text` (after what came before) to show; a line not ended yet waits
        for the next piece."""
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        return [shown for line in lines if (shown := self._line(line)) is not None]

    def flush(self) -> list[str]:
        """The last line, when the log ended without a newline."""
        last, self._partial = self._partial, ""
        shown = self._line(last) if last else None
        return [] if shown is None else [shown]

    def _line(self, line: str) -> str | None:
        if line.startswith(_ATTEMPT):
            self._in_note = _NOTE.match(line) is not None
            return line
        if self._in_note or line.startswith(_OURS):
            return line
        found = MARK_RE.search(line)
        if found is None:
            return None
        rank, pid, number = found.groups()
        if not self._first_time(pid, int(number)):
            return None
        ip = _RAY_PREFIX_IP.search(line[: found.start()])
        if ip is not None:
            self._ips.add(ip.group(1))
        where = f" @{ip.group(1)}" if ip is not None and len(self._ips) > 1 else ""
        return f"[rank {rank}{where}] {line[found.end() :]}"

    def _first_time(self, pid: str, n: int) -> bool:
        seen = self._seen.setdefault(pid, set())
        newest = max(n, self._newest.get(pid, n))
        if n in seen or n <= newest - SEEN_WINDOW:
            return False
        seen.add(n)
        self._newest[pid] = newest
        if len(seen) > 2 * SEEN_WINDOW:  # forget what no copy can still bring
            self._seen[pid] = {k for k in seen if k > newest - SEEN_WINDOW}
        return True
