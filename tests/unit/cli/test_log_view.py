"""`rcp logs`' default view (`controlplane.cli.log_view.RankLines`): each rank's own lines once,
by rank, in order; Ray's and the driver's lines only with ``--system``. Fed a driver log as the
local cluster writes it: three nodes sharing one log directory forward every worker line three
times."""

from __future__ import annotations

import pytest

from controlplane.cli.log_view import RankLines
from jobs.launcher.rank_output import mark

W0 = "(RayTrainWorker pid=101, ip=127.0.0.1) "
W1 = "(RayTrainWorker pid=202, ip=127.0.0.1) "
LOG = "\n".join(
    [
        "=== attempt 1 (Ray job job-1-1) ===",
        "2026-12-04 10:00:00,000 INFO worker.py:1 -- Connecting to existing Ray cluster",
        "(TrainController pid=77) Requesting resources to fit the maximum number of workers",
        *[W0 + mark(0, 101, 0) + "rank 0 of 2", W1 + mark(1, 202, 0) + "rank 1 of 2"] * 3,
        W1 + mark(1, 202, 1) + "Traceback (most recent call last):",
        W1 + mark(1, 202, 2) + "RuntimeError: boom",
        W1 + mark(1, 202, 1) + "Traceback (most recent call last):",  # a second monitor's copy
        "(raylet) [2026-12-04] core_worker.cc:2465: Actor with class name ... max_restarts > 0",
        "rcp: the gang failed: rank 1 of 2 (node 127.0.0.1): RuntimeError: boom",
        "=== attempt 1: hang: stacks of the workers (py-spy via Ray) ===",
        "--- rank 0 (pid 101) ---",
        '  File "train.py", line 3, in loop',
        "=== attempt 2 (Ray job job-1-2) ===",
        "(TrainController pid=78) Attempting to start training worker group",
        "(RayTrainWorker pid=303, ip=10.0.0.8) " + mark(0, 303, 0) + "rank 0 of 2, again",
        "(RayTrainWorker pid=404, ip=10.0.0.9) " + mark(1, 404, 0) + "rank 1 of 2, again",
    ]
)
SHOWN = [
    "=== attempt 1 (Ray job job-1-1) ===",
    "[rank 0] rank 0 of 2",
    "[rank 1] rank 1 of 2",
    "[rank 1] Traceback (most recent call last):",
    "[rank 1] RuntimeError: boom",
    "rcp: the gang failed: rank 1 of 2 (node 127.0.0.1): RuntimeError: boom",
    "=== attempt 1: hang: stacks of the workers (py-spy via Ray) ===",
    "--- rank 0 (pid 101) ---",
    '  File "train.py", line 3, in loop',
    "=== attempt 2 (Ray job job-1-2) ===",
    # More than one node seen (127.0.0.1 before): each line names its node.
    "[rank 0 @10.0.0.8] rank 0 of 2, again",
    "[rank 1 @10.0.0.9] rank 1 of 2, again",
]


def test_each_ranks_lines_once_by_rank_and_no_ray_line() -> None:
    view = RankLines()
    assert view.feed(LOG) + view.flush() == SHOWN


@pytest.mark.parametrize("size", [1, 7, 64, 1000])
def test_the_same_lines_whatever_pieces_the_log_comes_in(size: int) -> None:
    view = RankLines()
    shown = [line for i in range(0, len(LOG), size) for line in view.feed(LOG[i : i + size])]
    assert shown + view.flush() == SHOWN


def test_a_long_log_costs_bounded_memory_and_copies_still_drop() -> None:
    """Only the newest `SEEN_WINDOW` line numbers of a worker are kept; a copy comes soon
    after its original, so it is still dropped, and one older than the window counts as seen."""
    from controlplane.cli.log_view import SEEN_WINDOW

    view = RankLines()
    n = 3 * SEEN_WINDOW
    lines = [W0 + mark(0, 101, i) + f"step {i}" for i in range(n)]
    shown = view.feed("\n".join(lines) + "\n")
    assert len(shown) == n
    assert sum(len(s) for s in view._seen.values()) <= 2 * SEEN_WINDOW
    copies = lines[-5:] + lines[:5]  # a late monitor's copies: recent ones, and very old ones
    assert view.feed("\n".join(copies) + "\n") == []
