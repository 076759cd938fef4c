"""A Ray Job driver's log, read by byte range from the node that writes it, never whole.

Owns: `LogSlice` (some bytes of a log, where they start, and how long the log was when read)
and `read_driver_log`, the HTTP read behind `ray_jobs.RayJobs.log_slice` / `log_tail`.

Why not Ray's Jobs API: ``JobSubmissionClient.get_job_logs`` (``GET /api/jobs/<id>/logs``)
answers the whole log in one JSON string, and ``tail_job_logs`` streams it from its first
byte; neither takes an offset. The state API's ``/api/v0/logs/file`` takes a line count, not
a byte range, so one long line is still read whole. The file itself is served with byte
ranges: Ray's job supervisor writes the driver's output to ``job-driver-<submission id>.log``
in the logs directory of the node it runs on and records that node's dashboard agent as the
job's ``driver_agent_http_address``; the agent serves its logs directory at ``/logs/`` with
aiohttp's static files (Ray's ``LogAgent``), which answer ``Range: bytes=a-b`` with 206 and a
``Content-Range: bytes a-b/<size>``, a suffix range ``bytes=-n`` with the last n bytes, and a
range that starts at or past the end with 416 and ``Content-Range: bytes */<size>``. Ray's
own job log endpoint reaches the same agent, so nothing new has to be reachable.

Every read asks for at most `max_bytes` and reads at most that much of the answer whatever
the server sends (a server that ignored the range would otherwise send the whole file).

Must not: import ``ray`` (the adapter, `ray_jobs`, finds the agent's address), cache, or
decide what to read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote

import requests

__all__ = ["DRIVER_LOG_FILE", "LogSlice", "read_driver_log"]

DRIVER_LOG_FILE = "job-driver-{submission_id}.log"
"""Ray's name for a job driver's log (``ray.dashboard.modules.job.common.JOB_LOGS_PATH_TEMPLATE``;
a unit test checks the two agree)."""

_CONTENT_RANGE = re.compile(r"bytes (?:(\d+)-(\d+)|\*)/(\d+)")


@dataclass(frozen=True)
class LogSlice:
    """`data`: bytes of a log from byte `start`; `size`: the log's length when it was read
    (0 and no data: no log yet)."""

    data: bytes
    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + len(self.data)


def read_driver_log(
    agent_url: str,
    submission_id: str,
    *,
    start: int | None,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
    timeout_s: tuple[float, float] = (5.0, 30.0),
) -> LogSlice:
    """At most `max_bytes` of `submission_id`'s driver log from byte `start`, or its last
    `max_bytes` when `start` is None, read from the dashboard agent at `agent_url`.

    No log file yet (404) is an empty slice of size 0; a `start` at or past the end is an
    empty slice with the current size. RuntimeError naming the status for any other answer,
    and for a 200 to a range request that does not start at 0 (the server ignored the range:
    the bytes wanted are not the ones it sends); ``requests`` errors (timeouts) pass through.
    """
    if max_bytes < 1 or (start is not None and start < 0):
        raise ValueError(f"start {start} and max_bytes {max_bytes}: want start >= 0, max >= 1")
    name = quote(DRIVER_LOG_FILE.format(submission_id=submission_id), safe="")
    want = f"bytes=-{max_bytes}" if start is None else f"bytes={start}-{start + max_bytes - 1}"
    with requests.get(
        f"{agent_url.rstrip('/')}/logs/{name}",
        headers={**dict(headers or {}), "Range": want, "Accept-Encoding": "identity"},
        timeout=timeout_s,
        stream=True,
    ) as resp:
        if resp.status_code == 404:
            return LogSlice(b"", start or 0, 0)
        total = _content_range(resp.headers.get("Content-Range"))
        if resp.status_code == 416 and total is not None:
            return LogSlice(b"", start or total[2], total[2])
        if resp.status_code == 206 and total is not None:
            data: bytes = resp.raw.read(max_bytes)
            return LogSlice(data, total[0], total[2])
        if resp.status_code == 200 and not start:
            size = int(resp.headers.get("Content-Length") or 0)
            if start is None and size > max_bytes:
                raise RuntimeError(
                    f"the dashboard agent at {agent_url} ignored the range {want!r} of "
                    f"{submission_id}'s log ({size} bytes); not reading it whole"
                )
            return LogSlice(resp.raw.read(max_bytes), 0, size)
        body = resp.raw.read(300).decode("utf-8", errors="replace").strip()
        raise RuntimeError(
            f"reading {submission_id}'s driver log ({want}) from the dashboard agent at "
            f"{agent_url}: HTTP {resp.status_code} {body}"
        )


def _content_range(header: str | None) -> tuple[int, int, int] | None:
    """(first byte, last byte, size) of ``bytes a-b/size``; (size, size, size) for
    ``bytes */size``; None when absent or malformed."""
    match = _CONTENT_RANGE.fullmatch((header or "").strip())
    if match is None:
        return None
    size = int(match.group(3))
    if match.group(1) is None:
        return size, size, size
    return int(match.group(1)), int(match.group(2)), size
