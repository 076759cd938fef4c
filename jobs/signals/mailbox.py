"""The job signals actor: the per-job mailbox itself, its name and its checks on callers.

Owns: `JobSignals` (the Ray actor class; `_JobSignals` is its plain class, which the tests
and the controller's type hints use), its name and namespace, what it keeps per job
(`_JobRecord`) and the limits on what it accepts (`MAX_RANKS`, finite numbers, paths under the
job's prefix). The trust model is the package's (`jobs.signals`), the checks `trust`'s.

Must not: import `controlplane`; log or print the token or a job's credentials; keep anything
for a job the control plane did not register.
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Mapping
from typing import TypeGuard

import ray

from jobs.signals.reports import (
    MAX_REASON_CHARS,
    PROGRESS_KEYS,
    RESTORE_SOURCES,
    CheckpointReport,
    InPlaceReport,
    JobStatus,
    NotRegistered,
    ProgressReport,
    Rejection,
    RestoreReport,
    WorkerReport,
)
from jobs.signals.trust import (
    ADMIN_NONCE_WINDOW_S,
    AdminAuth,
    admin_auth,
    token_sha256,
    under_prefix,
)
from jobs.storage_credentials import StorageCredentials, check_credentials

__all__ = [
    "MAX_IN_PLACE_KEPT",
    "MAX_RANKS",
    "SIGNALS_ACTOR_NAME",
    "SIGNALS_NAMESPACE",
    "JobSignals",
]


SIGNALS_ACTOR_NAME = "rcp-job-signals"
SIGNALS_NAMESPACE = "rcp"
MAX_RANKS = 65536
"""Ranks the actor records per attempt (`worker_started`); a larger rank is refused."""
MAX_IN_PLACE_KEPT = 64
"""Restarts in place the actor keeps per attempt (`restarting_in_place`), the newest."""


class _JobRecord(JobStatus):
    """What the actor keeps per job: `JobStatus` plus the token's hash and the attempt's
    storage credentials."""

    token_sha256: str
    credentials: StorageCredentials | None


class _JobSignals:
    """Per-job mailbox between the control plane and training loops. Two kinds of callers:

    * the control plane (`register`, `put_credentials`, `status`, `request_checkpoint`,
      `clear_request`, `forget`, `forget_many`, `rejections`) presents
      ``auth=admin_auth(secret, nonce, method, args)``; a wrong MAC, or a nonce not larger
      than the last accepted one or outside `ADMIN_NONCE_WINDOW_S`, raises `PermissionError`;
    * a job (`worker_started`, `progress`, `checkpointed`, `poll`, `credentials`) presents
      its attempt's signal token; a call for an unregistered job, another attempt, with a
      wrong token, or (`checkpointed`) a path outside the job's prefix changes nothing,
      returns False (or None) and is counted. Nothing is kept for an unregistered job.
    """

    def __init__(self, admin_secret: str) -> None:
        self._admin_secret = admin_secret
        self._last_nonce = 0
        self._jobs: dict[str, _JobRecord] = {}
        self._rejected: dict[str, int] = {}

    # -- checks --------------------------------------------------------------------------------

    def _reject(self, job: _JobRecord | None, why: Rejection) -> bool:
        self._rejected[why.value] = self._rejected.get(why.value, 0) + 1
        if job is not None:
            job["rejected_calls"] += 1
        return False

    def _admin(self, method: str, args: tuple[object, ...], auth: AdminAuth) -> None:
        """Check an admin call's ``(nonce, mac)``; the nonce is used up when it checks out.
        `auth` comes from whoever called the actor: it is checked, not trusted, to be one."""
        try:
            nonce, mac = int(auth[0]), str(auth[1])
            want = admin_auth(self._admin_secret, nonce, method, args)[1]
        except Exception:  # malformed auth, or arguments that are not JSON
            nonce, mac, want = 0, "", "-"
        if not hmac.compare_digest(mac, want):
            self._reject(None, Rejection.BAD_ADMIN_KEY)
            raise PermissionError(f"rcp-job-signals: {method}: wrong admin MAC")
        window_ns = int(ADMIN_NONCE_WINDOW_S * 1e9)
        if nonce <= self._last_nonce or abs(nonce - time.time_ns()) > window_ns:
            self._reject(None, Rejection.REPLAYED_NONCE)
            raise PermissionError(f"rcp-job-signals: {method}: replayed or stale nonce")
        self._last_nonce = nonce

    def _caller(self, job_id: str, attempt: int, token: str) -> tuple[_JobRecord | None, bool]:
        """The job's record and whether this job-side call may act on it."""
        job = self._jobs.get(job_id) if isinstance(job_id, str) else None
        if job is None:
            return None, self._reject(None, Rejection.UNKNOWN_JOB)
        if not isinstance(token, str) or not hmac.compare_digest(
            token_sha256(token), job["token_sha256"]
        ):
            return job, self._reject(job, Rejection.BAD_TOKEN)
        if attempt != job["attempt"]:
            return job, self._reject(job, Rejection.STALE_ATTEMPT)
        return job, True

    # -- the control plane's side --------------------------------------------------------------

    def register(
        self, job_id: str, attempt: int, token_hash: str, prefix: str, *, auth: AdminAuth
    ) -> None:
        """Accept signals for `attempt` of `job_id` from callers holding the token whose
        SHA-256 is `token_hash`, with checkpoints under `prefix` (see `checkpoint_prefix`). Registering the
        same attempt and token again keeps what the workers reported; anything else starts
        the record afresh (the latest checkpoint is kept: it is the job's, not the attempt's)."""
        self._admin("register", (job_id, attempt, token_hash, prefix), auth)
        old = self._jobs.get(job_id)
        if old and (old["attempt"], old["token_sha256"]) == (attempt, token_hash):
            old["checkpoint_prefix"] = prefix
            return
        self._jobs[job_id] = _JobRecord(
            attempt=attempt,
            token_sha256=token_hash,
            checkpoint_prefix=prefix,
            started_ranks=[],
            workers={},
            progress=None,
            checkpoint=old["checkpoint"] if old else None,
            requested_at_s=None,
            rejected_calls=old["rejected_calls"] if old else 0,
            credentials=None,
            credentials_expire_unix_s=None,
            in_place=[],
            restore=None,
        )

    def put_credentials(
        self, job_id: str, attempt: int, credentials: StorageCredentials, *, auth: AdminAuth
    ) -> bool:
        """Hold `credentials` (scoped to the job's prefix) for `attempt` of `job_id`, replacing
        the ones held; the job fetches them with its token (`credentials`). False (nothing
        kept) for a job not registered, another attempt or malformed credentials."""
        self._admin("put_credentials", (job_id, attempt, credentials), auth)
        job = self._jobs.get(job_id)
        if job is None or job["attempt"] != attempt:
            return False
        try:
            checked = check_credentials(credentials)
        except ValueError:
            return self._reject(job, Rejection.BAD_VALUE)
        job["credentials"] = checked
        job["credentials_expire_unix_s"] = checked["expires_unix_s"]
        return True

    def request_checkpoint(self, job_id: str, at_s: float, *, auth: AdminAuth) -> bool:
        self._admin("request_checkpoint", (job_id, at_s), auth)
        job = self._jobs.get(job_id)
        if job is None:
            return False
        job["requested_at_s"] = at_s
        return True

    def clear_request(self, job_id: str, *, auth: AdminAuth) -> None:
        self._admin("clear_request", (job_id,), auth)
        job = self._jobs.get(job_id)
        if job is not None:
            job["requested_at_s"] = None

    def status(self, job_id: str, *, auth: AdminAuth) -> JobStatus | NotRegistered:
        """What the job reported ({} when it is not registered); never the token's hash."""
        self._admin("status", (job_id,), auth)
        job = self._jobs.get(job_id)
        if job is None:
            return NotRegistered()
        return JobStatus(
            attempt=job["attempt"],
            checkpoint_prefix=job["checkpoint_prefix"],
            started_ranks=list(job["started_ranks"]),
            workers={r: w.copy() for r, w in job["workers"].items()},
            progress=job["progress"].copy() if job["progress"] else None,
            checkpoint=job["checkpoint"],
            requested_at_s=job["requested_at_s"],
            rejected_calls=job["rejected_calls"],
            credentials_expire_unix_s=job["credentials_expire_unix_s"],
            in_place=[r.copy() for r in job["in_place"]],
            restore=job["restore"].copy() if job["restore"] else None,
        )

    def rejections(self, *, auth: AdminAuth) -> dict[str, int]:
        """Refused calls so far, by `Rejection` reason."""
        self._admin("rejections", (), auth)
        return dict(self._rejected)

    def forget(self, job_id: str, *, auth: AdminAuth) -> None:
        self._admin("forget", (job_id,), auth)
        self._jobs.pop(job_id, None)

    def forget_many(self, job_ids: list[str], *, auth: AdminAuth) -> int:
        """`forget` for every id in `job_ids` (one call, one MAC); returns how many it held."""
        self._admin("forget_many", (job_ids,), auth)
        if not isinstance(job_ids, list | tuple):
            return 0
        return sum(self._jobs.pop(j, None) is not None for j in job_ids if isinstance(j, str))

    # -- the job's side ------------------------------------------------------------------------

    def worker_started(
        self,
        job_id: str,
        attempt: int,
        rank: int,
        token: str,
        pid: int | None = None,
        node_id: str | None = None,
    ) -> bool:
        """Rank `rank` started; `pid` and `node_id` (hex) name its process, where the
        controller asks Ray for its stack when the job hangs."""
        job, ok = self._caller(job_id, attempt, token)
        if not ok or job is None:
            return False
        if not _is_int(rank) or not 0 <= rank < MAX_RANKS:
            return self._reject(job, Rejection.BAD_VALUE)
        if rank not in job["started_ranks"]:
            job["started_ranks"].append(rank)
        worker = WorkerReport()
        if _is_int(pid) and pid > 0:
            worker["pid"] = pid
        if isinstance(node_id, str) and node_id and len(node_id) <= 64 and node_id.isalnum():
            worker["node_id"] = node_id
        job["workers"][rank] = worker
        return True

    def progress(
        self, job_id: str, attempt: int, step: int, stats: Mapping[str, object], token: str
    ) -> bool:
        """The job reached `step` (rank 0, every ``RCP_STEP_REPORT_S``). The actor stamps when
        the step last grew (``step_at_s``, its own clock): the hang watchdog reads that.
        `stats` keeps only `PROGRESS_KEYS`, each a finite number >= 0."""
        job, ok = self._caller(job_id, attempt, token)
        if not ok or job is None:
            return False
        if not _is_int(step) or step < 0 or not isinstance(stats, Mapping):
            return self._reject(job, Rejection.BAD_VALUE)
        now = time.time()
        last = job["progress"]
        step_at_s = now if last is None or step > last["step"] else last["step_at_s"]
        progress = ProgressReport(step=step, at_s=now, step_at_s=step_at_s)
        for key in PROGRESS_KEYS:
            value = stats.get(key)
            if _is_number(value) and math.isfinite(value) and value >= 0:
                progress[key] = float(value)
        job["progress"] = progress
        return True

    def checkpointed(
        self, job_id: str, attempt: int, step: int, path: str, at_s: float, token: str
    ) -> bool:
        job, ok = self._caller(job_id, attempt, token)
        if not ok or job is None:
            return False
        if not under_prefix(path, job["checkpoint_prefix"]):
            return self._reject(job, Rejection.PATH_OUTSIDE_PREFIX)
        job["checkpoint"] = CheckpointReport(
            attempt=attempt,
            step=int(step),
            path=path,
            at_s=float(at_s),
            answers_request=job["requested_at_s"] is not None,
        )
        return True

    def restarting_in_place(
        self, job_id: str, attempt: int, index: int, reason: str, token: str
    ) -> bool:
        """The run is restarting its workers (`jobs.launcher.in_place`), the `index`-th time:
        kept (once per index, the newest `MAX_IN_PLACE_KEPT`, `reason` cut to
        `MAX_REASON_CHARS`) for the controller to record; the old workers, their progress and
        restore are forgotten (the new worker group reports afresh, so the hang watchdog
        re-arms on its first step)."""
        job, ok = self._caller(job_id, attempt, token)
        if not ok or job is None:
            return False
        if not _is_int(index) or index < 1 or not isinstance(reason, str):
            return self._reject(job, Rejection.BAD_VALUE)
        if any(r["index"] == index for r in job["in_place"]):
            return True
        last = job["progress"]["step"] if job["progress"] else None
        report = InPlaceReport(
            index=index, at_s=time.time(), reason=reason[:MAX_REASON_CHARS], step=last
        )
        job["in_place"] = [*job["in_place"], report][-MAX_IN_PLACE_KEPT:]
        job["started_ranks"], job["workers"] = [], {}
        job["progress"], job["restore"] = None, None
        return True

    def restored(
        self, job_id: str, attempt: int, step: int, source: str, restore_s: float, token: str
    ) -> bool:
        """Rank 0 restored `step` from `source` (``memory`` or ``storage``) in `restore_s`."""
        job, ok = self._caller(job_id, attempt, token)
        if not ok or job is None:
            return False
        if (
            not _is_int(step)
            or step < 0
            or source not in RESTORE_SOURCES
            or not _is_number(restore_s)
            or not math.isfinite(restore_s)
            or restore_s < 0
        ):
            return self._reject(job, Rejection.BAD_VALUE)
        job["restore"] = RestoreReport(
            step=step, source=source, restore_s=float(restore_s), at_s=time.time()
        )
        return True

    def poll(self, job_id: str, attempt: int, token: str) -> bool:
        """True while a checkpoint-now request is pending for this attempt of `job_id`."""
        job, ok = self._caller(job_id, attempt, token)
        return bool(ok and job is not None and job["requested_at_s"] is not None)

    def credentials(self, job_id: str, attempt: int, token: str) -> StorageCredentials | None:
        """This attempt's storage credentials (scoped to its prefix), or None: refused (wrong
        token, another attempt, an unknown job) or none held yet."""
        job, ok = self._caller(job_id, attempt, token)
        if not ok or job is None or job["credentials"] is None:
            return None
        return StorageCredentials(**job["credentials"])


JobSignals = ray.remote(num_cpus=0, max_restarts=-1)(_JobSignals)
"""The actor class; the control plane creates the one named `SIGNALS_ACTOR_NAME`."""


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
