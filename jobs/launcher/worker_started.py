"""Telling the control plane a gang's worker started, with its pid and node.

Owns: `report_started` (the call to the job's signals actor, asked again while the actor is
being replaced or refuses, for at most `WORKER_STARTED_DEADLINE_S`), `report_this_worker` (this
Ray Train worker's pid and node id, only under the control plane), `started_then` (a
function gang's per-worker loop that reports before it calls the user's function, its output
marked as the rank's and a failure's traceback printed once: `jobs.launcher.rank_output`) and
`rank_output`.

Must not: import `controlplane`, import Ray at module level (the Ray Job's driver sets
``RAY_DEDUP_LOGS`` before Ray is first imported), log the signal token, or let an
unreachable signals actor stop the job.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from jobs.launcher.rank_output import marked_output, print_failure
from jobs.signals.environment import ENV_ATTEMPT, ENV_JOB_ID, ENV_SIGNAL_TOKEN

if TYPE_CHECKING:
    from jobs.signals.handle import SignalsHandle

__all__ = [
    "WORKER_STARTED_DEADLINE_S",
    "rank_output",
    "report_started",
    "report_this_worker",
    "started_then",
]


WORKER_STARTED_DEADLINE_S = 60.0
"""How long a worker keeps trying to report that it started while the signals actor is dead
(the controller replaces it on its next tick) or refuses it (restarted with the head, it
knows the attempt again once the controller registers it). Past that it trains anyway; the
gang then counts as not started (``jobs.gang_start_timeout_s``)."""


def report_started(
    job_id: str,
    attempt: int,
    rank: int,
    token: str,
    deadline_s: float = WORKER_STARTED_DEADLINE_S,
    handle: SignalsHandle | None = None,
    *,
    pid: int | None = None,
    node_id: str | None = None,
) -> bool | None:
    """Tell the signals actor this worker started: its answer, or None when there is no
    actor under the name. `pid` and `node_id` (hex) name the worker's process, whose stacks
    the controller asks Ray for when the job hangs. A dead actor is looked up by name again
    (`SignalsHandle`) and a refusal asked again until `deadline_s`; then a refusal is False."""
    import ray

    from jobs.signals.handle import SignalsHandle

    signals = handle if handle is not None else SignalsHandle()
    args: tuple[object, ...] = (job_id, attempt, rank, token)
    if pid is not None or node_id is not None:
        args = (*args, pid, node_id)
    give_up_s = time.monotonic() + deadline_s
    lost = False
    while True:
        try:
            accepted = bool(signals.call("worker_started", *args, timeout_s=30))
            if accepted or time.monotonic() >= give_up_s:
                return accepted
            # Refused. After a head restart Ray restarts the actor with an empty mailbox, and
            # the controller registers this attempt again on its next tick: ask again.
        except LookupError:
            if not lost:
                return None  # no actor under the name at all: not under the control plane
        except ray.exceptions.RayActorError:
            lost = True  # dropped: the next call looks the name up again
        if time.monotonic() >= give_up_s:
            print("rcp: the job signals actor is unreachable; not reported", file=sys.stderr)
            return None
        time.sleep(min(1.0, signals.resolve_interval_s))


def report_this_worker(rank: int) -> None:
    """`report_started` for this Ray Train worker (its pid and node), under the control plane."""
    import ray

    job_id = os.environ.get(ENV_JOB_ID)
    if not job_id:
        return
    attempt = int(os.environ.get(ENV_ATTEMPT, "0"))
    token = os.environ.get(ENV_SIGNAL_TOKEN, "")
    node_id = ray.get_runtime_context().get_node_id()
    accepted = report_started(job_id, attempt, rank, token, pid=os.getpid(), node_id=node_id)
    if accepted is False:
        print(
            f"rcp: the control plane refused worker {rank} of job {job_id} attempt "
            f"{attempt} (wrong signal token or a stale attempt); it will not count "
            "as started",
            file=sys.stderr,
        )


def started_then(train_fn: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
    def worker_loop(config: dict[str, Any]) -> Any:
        import ray.train  # heavy (pandas, pyarrow): only where a gang runs

        rank = ray.train.get_context().get_world_rank()
        with rank_output(rank):
            report_this_worker(rank)
            try:
                return train_fn(config)
            except BaseException as exc:
                print_failure(rank, exc)
                raise

    return worker_loop


def rank_output(rank: int) -> AbstractContextManager[None]:
    """Under the control plane (``RCP_JOB_ID`` set), the rank's output marked for `rcp logs`
    (`jobs.launcher.rank_output`); elsewhere (a laptop run) left as it is."""
    return marked_output(rank) if ENV_JOB_ID in os.environ else nullcontext()
