"""Each rank's own output, marked so `rcp logs` can show it once, by rank, apart from Ray's.

Owns: `marked_output(rank)`, which runs a gang worker's code (a function gang's loop, a command
gang's command: a child started inside inherits it) with its file descriptors 1 and 2 going
through a pipe each; a thread per pipe writes every line to the original descriptor behind
`mark(rank, pid, n)`, ``[rcp r<rank> p<pid> #<n>] ``: the rank, this worker process and the
line's number in it (both streams count together). Ray forwards the worker's output to the
driver's log as ever; the marks let a reader keep each rank's lines (`MARK_RE`) and drop the
copies a shared log directory makes (the local cluster's nodes share one: every node's log
monitor forwards every worker's lines), by (pid, n). Also `print_failure`: a rank's
traceback, printed once, through the marks, before the error goes on to Ray Train.

Must not: import Ray or `controlplane`; lose a line the rank wrote before it returned (the
pipes are drained before the descriptors are put back).
"""

from __future__ import annotations

import itertools
import os
import re
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, suppress

__all__ = ["MARK_RE", "mark", "marked_output", "print_failure"]

MARK_RE = re.compile(r"\[rcp r(\d+) p(\d+) #(\d+)\] ")
"""A marked line's mark: rank, pid, line number (anywhere in the line: Ray puts its own
``(RayTrainWorker pid=..., ip=...)`` in front)."""
_DRAIN_S = 5.0
"""How long the end of a rank waits for its relays to write what is left in the pipes."""
_CHUNK = 65536
_MAX_LINE = 1 << 20
"""Bytes of an unended line held before they are written as a line of their own."""


def mark(rank: int, pid: int, n: int) -> str:
    return f"[rcp r{rank} p{pid} #{n}] "


def _relay(
    read_fd: int, out_fd: int, rank: int, counter: Iterator[int], lock: threading.Lock
) -> None:
    """Copy `read_fd` to `out_fd` line by line, each behind its mark, until EOF."""
    pid = os.getpid()
    pending = b""
    try:
        while chunk := os.read(read_fd, _CHUNK):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            if len(pending) > _MAX_LINE:  # a line that never ends goes out in pieces
                lines.append(pending)
                pending = b""
            for line in lines:
                _write(out_fd, rank, pid, counter, lock, line)
        if pending:
            _write(out_fd, rank, pid, counter, lock, pending)
    except OSError:
        pass  # the descriptor went away with the process: nothing left to copy
    finally:
        os.close(read_fd)


def _write(
    out_fd: int, rank: int, pid: int, counter: Iterator[int], lock: threading.Lock, line: bytes
) -> None:
    with lock:
        data = mark(rank, pid, next(counter)).encode() + line + b"\n"
        while data:
            data = data[os.write(out_fd, data) :]


@contextmanager
def marked_output(rank: int) -> Iterator[None]:
    """Run the block with this process's stdout and stderr marked as `rank`'s (module doc)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    counter, lock = itertools.count(), threading.Lock()
    saved: dict[int, int] = {}
    relays: dict[int, threading.Thread] = {}
    try:
        for fd in (1, 2):
            saved[fd] = os.dup(fd)
            read_fd, write_fd = os.pipe()
            os.dup2(write_fd, fd)
            os.close(write_fd)
            relay = threading.Thread(
                target=_relay,
                args=(read_fd, saved[fd], rank, counter, lock),
                name=f"rcp-rank-output-{fd}",
                daemon=True,
            )
            relay.start()
            relays[fd] = relay
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with suppress(OSError, ValueError):
                stream.flush()
        for fd, original in saved.items():
            os.dup2(original, fd)  # the pipe's last writer here goes: its relay sees EOF
        for fd, relay in relays.items():
            relay.join(_DRAIN_S)  # a child still holding the pipe keeps it open: not forever
            if not relay.is_alive():  # else it still writes there: the descriptor stays
                os.close(saved.pop(fd))
        for fd in set(saved) - set(relays):
            os.close(saved.pop(fd))


def print_failure(rank: int, exc: BaseException) -> None:
    """`exc`'s traceback, whole, on this rank's stderr (marked when inside `marked_output`)."""
    text = "".join(traceback.format_exception(exc))
    sys.stderr.write(f"rank {rank} failed:\n{text}")
    sys.stderr.flush()
