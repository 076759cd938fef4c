"""Work the runner's tick must not wait on for long, on threads of its own.

Owns `Submissions` (Ray Job submissions, waited for at most ``jobs.submit_timeout_s``) and
`Background` (checkpoint reads and stack fetches on a small pool, keyed by what they are for).

Must not: decide anything about a job: results are plain data handed back to the tick thread.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["SubmitBusy", "SubmitTimeout"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class SubmitTimeout(RuntimeError):
    """Ray did not accept a submission in time (or an earlier one still hangs)."""


class SubmitBusy(SubmitTimeout):
    """Not submitted at all: an earlier submission still hangs. Not the job's failure."""


@dataclass
class _Outcome:
    """One submission's end as its thread and the waiting tick see it (under the lock)."""

    finished: bool = False
    abandoned: bool = False
    error: BaseException | None = None


class Submissions:
    """Runs Ray Job submissions on daemon threads, so the tick waits at most `timeout_s`.

    A submission still hanging then is abandoned: if Ray accepts it later, `on_late_accept`
    runs (the runner stops that Ray Job). While one hangs, new ones fail at once (`SubmitBusy`):
    Ray is not answering, and one tick must not wait once per admitted job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hanging: dict[str, threading.Thread] = {}

    def hanging(self) -> str | None:
        """The id of an abandoned submission that still hangs (the smallest), or None."""
        with self._lock:
            self._hanging = {k: t for k, t in self._hanging.items() if t.is_alive()}
            return min(self._hanging) if self._hanging else None

    def run(
        self,
        submission_id: str,
        submit: Callable[[], None],
        on_late_accept: Callable[[], None],
        timeout_s: float,
    ) -> None:
        hanging = self.hanging()
        if hanging is not None:
            raise SubmitBusy(
                f"Ray has not answered the submission of {hanging} yet; "
                "not submitting more until it does"
            )
        state = _Outcome()

        def work() -> None:
            error: BaseException | None = None
            try:
                submit()
            except BaseException as exc:  # handed to the waiting tick (or logged if late)
                error = exc
            with self._lock:
                state.finished, state.error = True, error
                late = state.abandoned
            if late and error is None:
                on_late_accept()
            elif late:
                log.info("abandoned submission %s failed late: %s", submission_id, error)

        thread = threading.Thread(target=work, name=f"rcp-submit-{submission_id}", daemon=True)
        thread.start()
        thread.join(timeout_s)
        with self._lock:
            if not state.finished:
                state.abandoned = True
                self._hanging[submission_id] = thread
                raise SubmitTimeout(f"Ray did not accept the submission within {timeout_s:g}s")
        if state.error is not None:
            raise state.error


class Background(Generic[T]):
    """Work of one kind of result `T` on worker threads (one pool per runner), keyed by what
    it is for: the tick starts it, waits a bounded time (`wait`) and takes what finished
    (`take`); work still running is taken by a later tick and never started twice."""

    def __init__(self, pool: concurrent.futures.ThreadPoolExecutor) -> None:
        self._pool = pool
        self._pending: dict[tuple[str, ...], concurrent.futures.Future[T]] = {}

    def start(self, key: tuple[str, ...], fn: Callable[[], T]) -> None:
        if key not in self._pending:
            self._pending[key] = self._pool.submit(fn)

    def pending(self, key: tuple[str, ...]) -> bool:
        return key in self._pending

    def wait(self, keys: Iterable[tuple[str, ...]], deadline_s: float) -> None:
        """Until every future of `keys` is done or `deadline_s` (``time.monotonic``) passed."""
        futures = [self._pending[k] for k in keys if k in self._pending]
        if futures:
            concurrent.futures.wait(futures, timeout=max(0.0, deadline_s - time.monotonic()))

    def take(self, key: tuple[str, ...]) -> tuple[bool, T | None, BaseException | None]:
        """``(done, result, error)``; a done future is forgotten once taken."""
        future = self._pending.get(key)
        if future is None or not future.done():
            return False, None, None
        del self._pending[key]
        error = future.exception()
        return True, None if error is not None else future.result(), error

    def drop(self, keep: Callable[[tuple[str, ...]], bool]) -> None:
        """Forget finished work nobody will take (its job moved on)."""
        for key in [k for k, f in self._pending.items() if f.done() and not keep(k)]:
            del self._pending[key]
