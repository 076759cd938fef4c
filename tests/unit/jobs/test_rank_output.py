"""`jobs.launcher.rank_output`: a rank's stdout and stderr, and a child's it starts, marked
line by line for `rcp logs`; a failure's traceback printed once. Each case runs in a real
child interpreter (the descriptors it redirects are the process's own), and its output is read
as Ray's log monitor would read the worker's files."""

from __future__ import annotations

import subprocess
import sys

from jobs.launcher.rank_output import MARK_RE

SCRIPT = r"""
import os, subprocess, sys
from jobs.launcher.rank_output import marked_output, print_failure

print("before: not marked", flush=True)
with marked_output(3):
    print("hello from python")
    os.write(1, b"raw write, no newline at first")
    os.write(1, b" ... then the end\n")
    print("to stderr", file=sys.stderr)
    subprocess.run([sys.executable, "-c", "print('from the child'); print('child err', file=__import__('sys').stderr)"], check=True)
    try:
        raise RuntimeError("rank 3 gives up")
    except RuntimeError as exc:
        print_failure(3, exc)
    sys.stdout.write("unflushed tail")
print("after: not marked", flush=True)
"""


def run() -> tuple[list[str], list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.splitlines(), done.stderr.splitlines()


def test_every_line_of_the_rank_and_its_child_is_marked_once_with_one_count() -> None:
    out, err = run()
    assert out[0] == "before: not marked" and out[-1] == "after: not marked"
    marked = [(MARK_RE.match(line), line) for line in out[1:-1] + err]
    assert all(m is not None for m, _ in marked), [line for m, line in marked if m is None]
    texts = {line[m.end() :]: m.groups() for m, line in marked if m is not None}
    assert {
        "hello from python",
        "raw write, no newline at first ... then the end",
        "to stderr",
        "from the child",
        "child err",
        "RuntimeError: rank 3 gives up",
        "unflushed tail",
    } <= set(texts)
    assert {rank for rank, _, _ in texts.values()} == {"3"}
    assert len({pid for _, pid, _ in texts.values()}) == 1  # the rank's process, not the child
    numbers = [int(n) for _, _, n in texts.values()]
    assert len(numbers) == len(set(numbers))  # one count over both streams: a line's key
    # The traceback is whole: its header, the frame and the error's own line, once each.
    tb = [t for t in texts if t.startswith(("rank 3 failed:", "Traceback", "RuntimeError"))]
    assert tb == [
        "rank 3 failed:",
        "Traceback (most recent call last):",
        "RuntimeError: rank 3 gives up",
    ]


def test_a_line_that_never_ends_goes_out_in_bounded_pieces() -> None:
    script = (
        "import os\nfrom jobs.launcher.rank_output import marked_output\n"
        "with marked_output(0):\n    os.write(1, b'x' * (3 << 20))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=60, check=True
    )
    pieces = done.stdout.splitlines()
    assert len(pieces) >= 3 and all(MARK_RE.match(p.decode()[:40]) for p in pieces)
    assert all(len(p) <= (1 << 20) + (1 << 16) + 40 for p in pieces)  # a line, one read, a mark
    assert sum(p.count(b"x") for p in pieces) == 3 << 20
