"""The job signals: the mailbox between the control plane and a job's training loops.

Owns `JobSignals`, a small named Ray actor (namespace ``rcp``, name ``rcp-job-signals``) that
the control plane creates, the job environment's variable names (``RCP_*``, set by the runner,
read by `jobs.launcher` and `jobs.checkpointing`), `SignalsHandle` (a job's handle on the
actor, found again after the controller replaced it) and the prefix and trust checks. The
actor holds, per job and attempt, which workers have started (rank, pid, node), the job's
progress (step, when it last grew, checkpoint stall and wall seconds, saves, committed step),
the latest checkpoint the job reported (step, path, time), whether the control plane asked
for a checkpoint now and, with ``storage.job_credentials=scoped``, the attempt's storage
credentials (scoped to its prefix: `put_credentials`, fetched by the job with its token:
`credentials`; `status` shows only when they expire). It is a mailbox, not a source of truth: the control plane copies what it
reads into its durable store every tick, and reads committed steps from object storage.

The job's side is `jobs.checkpointing.Checkpointing`: rank 0 polls `poll` every
``RCP_SIGNAL_POLL_S``, reports `progress` every ``RCP_STEP_REPORT_S`` and, after saving and
committing a requested checkpoint, `checkpointed`; `jobs.launcher` reports `worker_started`.

Trust (any Ray job in the cluster can reach the actor by name, see docs/operations.md, "Job
signals"): the control plane registers each attempt with the SHA-256 of a fresh secret
(``RCP_SIGNAL_TOKEN``) and the job's checkpoint prefix (``RCP_CHECKPOINT_URI``); the actor
refuses job-side calls without that attempt's token and checkpoints outside that prefix
(`under_prefix`). Its control-plane methods need an HMAC (`admin_auth`) over a fresh nonce,
the method and its arguments, keyed with the secret the controller created this actor with
(derived from the controller's admin key, `derive_admin_secret`; the key itself never leaves
the controller, and no call carries a secret). A recorded call cannot be replayed: nonces
only grow and must be recent (`ADMIN_NONCE_WINDOW_S`). The controller talks only to the
actor whose id it pinned when it created it (`controlplane.adapters.ray_jobs.RayJobs`).

Must not: import `controlplane` (the runner passes everything through the ``RCP_*``
environment variables named here); log or print the token or a job's credentials.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Literal, TypedDict, TypeGuard
from urllib.parse import urlsplit

import ray
from ray.actor import ActorHandle

from jobs.storage_credentials import StorageCredentials, check_credentials

__all__ = [
    "ADMIN_NONCE_WINDOW_S",
    "ENV_ATTEMPT",
    "ENV_CHECKPOINT_ENABLED",
    "ENV_CHECKPOINT_INTERVAL_S",
    "ENV_CHECKPOINT_KEEP_LAST",
    "ENV_CHECKPOINT_URI",
    "ENV_MTBF_S",
    "ENV_STEP_REPORT_S",
    "ENV_STORAGE_CREDENTIALS",
    "ENV_STORAGE_ENDPOINT_URL",
    "ENV_STORAGE_REGION",
    "MAX_RANKS",
    "PROGRESS_KEYS",
    "ENV_JOB_ID",
    "ENV_SIGNAL_POLL_S",
    "ENV_SIGNAL_TOKEN",
    "SIGNALS_ACTOR_NAME",
    "SIGNALS_RESOLVE_INTERVAL_S",
    "SIGNALS_NAMESPACE",
    "STORAGE_CREDENTIALS_FROM_SIGNALS",
    "AdminAuth",
    "CheckpointReport",
    "JobSignals",
    "JobStatus",
    "NotRegistered",
    "ProgressReport",
    "Rejection",
    "SignalsHandle",
    "WorkerReport",
    "admin_auth",
    "checkpoint_prefix",
    "derive_admin_secret",
    "get_signals",
    "token_sha256",
    "under_prefix",
]


SIGNALS_ACTOR_NAME = "rcp-job-signals"
SIGNALS_NAMESPACE = "rcp"
ENV_JOB_ID = "RCP_JOB_ID"
ENV_ATTEMPT = "RCP_ATTEMPT"
ENV_SIGNAL_POLL_S = "RCP_SIGNAL_POLL_S"
ENV_SIGNAL_TOKEN = "RCP_SIGNAL_TOKEN"
"""This attempt's secret; every job-side call to the signals actor presents it."""
ENV_CHECKPOINT_URI = "RCP_CHECKPOINT_URI"
"""The job's checkpoint location (``s3://bucket/prefix``); also the prefix the actor checks."""
ENV_STORAGE_ENDPOINT_URL = "RCP_STORAGE_ENDPOINT_URL"
"""The S3 endpoint (unset: AWS's own). Credentials come from the node's usual AWS sources."""
ENV_STORAGE_REGION = "RCP_STORAGE_REGION"
ENV_STORAGE_CREDENTIALS = "RCP_STORAGE_CREDENTIALS"
"""`STORAGE_CREDENTIALS_FROM_SIGNALS` when the job's S3 credentials come from this actor
(``storage.job_credentials=scoped``: `_JobSignals.credentials`); unset: the node's own."""
STORAGE_CREDENTIALS_FROM_SIGNALS = "signals"
ENV_CHECKPOINT_ENABLED = "RCP_CHECKPOINT_ENABLED"
"""``"0"`` when the spec's checkpoint.enabled is false."""
ENV_CHECKPOINT_INTERVAL_S = "RCP_CHECKPOINT_INTERVAL_S"
"""The spec's checkpoint.interval_s; unset: Young/Daly from the measured stall and the MTBF."""
ENV_CHECKPOINT_KEEP_LAST = "RCP_CHECKPOINT_KEEP_LAST"
ENV_MTBF_S = "RCP_MTBF_S"
"""The gang's mean time between failures the controller computed from the fleet's record."""
ENV_STEP_REPORT_S = "RCP_STEP_REPORT_S"
"""How often rank 0 reports the step (`_JobSignals.progress`): jobs.step_report_interval_s."""
ProgressKey = Literal["stall_s", "wall_s", "saves", "committed_step"]
PROGRESS_KEYS: tuple[ProgressKey, ...] = ("stall_s", "wall_s", "saves", "committed_step")
"""What a job may report with its step (`_JobSignals.progress`), each a finite number >= 0:
the attempt's checkpoint stall and wall seconds so far, saves taken, the step it last saw
committed (a hint: the controller reads committed steps from storage)."""
MAX_RANKS = 65536
"""Ranks the actor records per attempt (`worker_started`); a larger rank is refused."""


def token_sha256(token: str) -> str:
    """The hex SHA-256 of a signal token: what the store and the actor keep instead of it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


ADMIN_NONCE_WINDOW_S = 300.0
"""How far (either way) an admin call's nonce (nanoseconds since the epoch) may be from the
actor's clock. With "each nonce larger than the last", a recorded call can be replayed only to
an actor that restarted in the last few minutes, and only once."""


def derive_admin_secret(admin_key: str, salt: str) -> str:
    """The secret one signals actor is created with: HMAC-SHA256 of `salt` (fresh for each
    actor the controller creates) under the controller's admin key, which stays with it."""
    return hmac.new(
        admin_key.encode("utf-8"), f"rcp-job-signals:{salt}".encode(), hashlib.sha256
    ).hexdigest()


AdminAuth = tuple[int, str]
"""``(nonce, mac)``: what an admin call presents (`admin_auth`)."""


def admin_auth(secret: str, nonce: int, method: str, args: tuple[object, ...]) -> AdminAuth:
    """``(nonce, mac)`` for an admin call: HMAC-SHA256 of ``[method, nonce, args]`` (JSON)
    under the actor's secret, so the MAC names this call and no other."""
    msg = json.dumps([method, int(nonce), list(args)], separators=(",", ":"), sort_keys=True)
    mac = hmac.new(secret.encode("utf-8"), msg.encode("utf-8"), hashlib.sha256).hexdigest()
    return int(nonce), mac


def checkpoint_prefix(storage_path: str | os.PathLike[str], job_id: str) -> str:
    """Where a job's checkpoints live: ``<storage_path>/<job_id>`` (the Ray Train run's name
    is the job id, see `jobs.launcher.run_gang`). A job id that is not one path segment is
    refused, so no id can name another job's prefix or a parent directory."""
    if not job_id or job_id in (".", "..") or "/" in job_id or "\\" in job_id:
        raise ValueError(f"job id {job_id!r} cannot name a checkpoint prefix")
    base = os.fspath(storage_path)
    if "://" in base:
        return base.rstrip("/") + "/" + job_id
    return os.path.join(base, job_id)


def _local(path: str) -> str | None:
    """A local path (``file://`` stripped) made absolute with every symlink resolved."""
    if "://" in path:
        parts = urlsplit(path)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            return None
        path = parts.path
    return os.path.realpath(os.path.expanduser(path))


def under_prefix(path: str, prefix: str) -> bool:
    """Whether `path` lies strictly below `prefix` (a job's checkpoint prefix).

    Local paths are compared after resolving ``..`` and symlinks (a link inside the prefix
    that points elsewhere is outside). URIs (``s3://bucket/key``) must have the prefix's
    scheme and bucket, a key below the prefix's and no ``.``/``..`` segment, query or
    fragment. Anything else (empty, a different scheme, a relative path mixed with a URI)
    is outside::

        under_prefix("/t/j-1/step-00000007", "/t/j-1")      -> True
        under_prefix("/t/j-1/../j-2/step-00000007", "/t/j-1") -> False
        under_prefix("/t/j-10/step-00000007", "/t/j-1")      -> False
        under_prefix("s3://b/t/j-1/step-7", "s3://other/t/j-1") -> False
    """
    if not isinstance(path, str) or not isinstance(prefix, str) or not path or not prefix:
        return False
    local_path, local_prefix = _local(path), _local(prefix)
    if local_path is not None and local_prefix is not None:
        return local_path != local_prefix and (
            os.path.commonpath([local_path, local_prefix]) == local_prefix
        )
    if local_path is not None or local_prefix is not None:
        return False
    p, q = urlsplit(path), urlsplit(prefix)
    if (p.scheme, p.netloc) != (q.scheme, q.netloc) or not p.netloc:
        return False
    if p.query or p.fragment:
        return False
    segments = p.path.split("/")
    if any(s in (".", "..") for s in segments):
        return False
    base = q.path.rstrip("/") + "/"
    return p.path.startswith(base) and len(p.path.rstrip("/")) > len(base)


class Rejection(str, Enum):
    """Why the signals actor refused a call (counted per reason in `status`)."""

    UNKNOWN_JOB = "unknown-job"
    STALE_ATTEMPT = "stale-attempt"
    BAD_TOKEN = "bad-token"
    PATH_OUTSIDE_PREFIX = "path-outside-prefix"
    BAD_ADMIN_KEY = "bad-admin-key"
    BAD_VALUE = "bad-value"
    REPLAYED_NONCE = "replayed-or-stale-nonce"


class WorkerReport(TypedDict, total=False):
    """A started worker's process, as far as it named it (`_JobSignals.worker_started`)."""

    pid: int
    node_id: str
    """Hex Ray node id."""


class _ProgressReportRequired(TypedDict):
    step: int
    at_s: float
    """When the actor took the report (its clock)."""
    step_at_s: float
    """When `step` last grew (the actor's clock): what the hang watchdog reads."""


class ProgressReport(_ProgressReportRequired, total=False):
    """The job's latest step report (`_JobSignals.progress`); the `PROGRESS_KEYS` it sent."""

    stall_s: float
    wall_s: float
    saves: float
    committed_step: float


class CheckpointReport(TypedDict):
    """The latest checkpoint a job reported (`_JobSignals.checkpointed`)."""

    attempt: int
    step: int
    path: str
    at_s: float
    answers_request: bool
    """Taken while a checkpoint-now request was pending."""


class JobStatus(TypedDict):
    """What `_JobSignals.status` returns for a registered job."""

    attempt: int
    checkpoint_prefix: str
    started_ranks: list[int]
    workers: dict[int, WorkerReport]
    progress: ProgressReport | None
    checkpoint: CheckpointReport | None
    requested_at_s: float | None
    rejected_calls: int
    credentials_expire_unix_s: float | None
    """When the storage credentials the actor holds for this attempt expire (None: none)."""


class NotRegistered(TypedDict):
    """`_JobSignals.status` of a job it does not hold: ``{}``."""


class _JobRecord(JobStatus):
    """What the actor keeps per job: `JobStatus` plus the token's hash and the attempt's
    storage credentials."""

    token_sha256: str
    credentials: StorageCredentials | None


class _JobSignals:
    """Per-job mailbox between the control plane and training loops (see the module doc).

    Two kinds of callers, both checked:

    * the control plane (`register`, `put_credentials`, `status`, `request_checkpoint`,
      `clear_request`, `forget`, `forget_many`, `rejections`) presents
      ``auth=admin_auth(secret, nonce, method, args)``; a wrong MAC, or a nonce not larger
      than the last accepted one or outside `ADMIN_NONCE_WINDOW_S` of the actor's clock,
      raises `PermissionError`;
    * a job (`worker_started`, `progress`, `checkpointed`, `poll`, `credentials`) presents
      its attempt's signal token (``RCP_SIGNAL_TOKEN``); a call for a job that is not
      registered, for another attempt, with a wrong token, or (`checkpointed`) with a path
      outside the job's checkpoint prefix is refused: it changes nothing, returns False (or
      None) and is counted.

    Nothing is kept for a job the control plane did not register, so calls naming made-up
    jobs cannot grow the actor.
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


def get_signals() -> ActorHandle[_JobSignals] | None:
    """The running signals actor, or None (e.g. a script run outside the control plane)."""
    try:
        return ray.get_actor(SIGNALS_ACTOR_NAME, namespace=SIGNALS_NAMESPACE)
    except ValueError:
        return None


SIGNALS_RESOLVE_INTERVAL_S = 5.0
"""How often a job looks the signals actor up by name again while it has none (the actor it
held died: the controller replaces a killed or impostor actor on its next tick)."""


class SignalsHandle:
    """A job's handle on the signals actor: found by name, and found again after it died.

    The controller may replace the actor (killed, an impostor, a lost pin); a job holding the
    old handle would talk to a dead actor forever. A call that fails because the actor is dead
    (``RayActorError``: died, or unavailable) drops the handle; the next call looks the name
    up again, at most every `resolve_interval_s`. Other errors (a timeout) keep it.
    """

    def __init__(
        self,
        resolve_interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resolve_interval_s = (
            SIGNALS_RESOLVE_INTERVAL_S if resolve_interval_s is None else resolve_interval_s
        )
        self._clock = clock
        self._handle: ActorHandle[_JobSignals] | None = None
        self._next_resolve_s: float | None = None

    def get(self) -> ActorHandle[_JobSignals] | None:
        """The actor's handle, or None (none under the name, or looked up too recently)."""
        now = self._clock()
        if self._handle is None and (self._next_resolve_s is None or now >= self._next_resolve_s):
            self._next_resolve_s = now + self.resolve_interval_s
            self._handle = get_signals()
        return self._handle

    def call(self, method: str, *args: object, timeout_s: float) -> object:
        """``ray.get(actor.method.remote(*args))``; LookupError when there is no actor."""
        handle = self.get()
        if handle is None:
            raise LookupError(f"no {SIGNALS_ACTOR_NAME} actor (looked up by name)")
        try:
            return ray.get(getattr(handle, method).remote(*args), timeout=timeout_s)
        except ray.exceptions.RayActorError:
            self._handle = None  # dead: look the name up again (the controller replaced it)
            raise


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)
