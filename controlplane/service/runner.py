"""The runner: the act phase for training jobs. The only code that starts and stops Ray Jobs.

Owns:

* `RayJobs` - the Ray side: Ray Job submission, status, stop and logs through the dashboard
  (``JobSubmissionClient``, so every gang shows in the dashboard's Jobs tab), and the
  ``rcp-job-signals`` actor (`jobs.signals.JobSignals`) that training loops talk to.
* `JobRunner` - a job's life after admission, idempotently and from the store alone, so a
  restarted controller carries on where the last one stopped:

  - `admit` (AdmitJob): QUEUED -> ADMITTED, record the attempt and its Ray submission id
    ``<job_id>-<attempt>`` *before* submitting (Ray refuses a second submission with the
    same id, so a crash between the two never runs a gang twice), then submit the launcher.
    The submission runs on a worker thread: the tick waits at most ``jobs.submit_timeout_s``
    for Ray to accept it; past that the start counts as failed (re-queued with backoff), and a
    timed-out submission that Ray accepts late is stopped, so the gang never runs twice. While
    an earlier submission still hangs nothing is submitted and nothing counts as failed: the
    job stays QUEUED (event ``job.submit_deferred``) and is admitted again later. Every HTTP
    request to the dashboard has a timeout (`dashboard_client`), so none hangs for good. Every entrypoint asks for one
    ``JOB_DRIVER_RESOURCE``, which the head does not offer: user drivers never run beside the
    control plane's credentials.
  - `preempt` (PreemptJob): ask the gang to checkpoint now (signals actor), mark it
    ``preempting`` with a deadline (``checkpoint.preempt_deadline_s``).
  - `reconcile` every tick: ADMITTED -> RUNNING once every worker has started; a gang not
    running within ``jobs.gang_start_timeout_s`` is stopped and re-queued with exponential
    backoff (``not_before_s``), FAILED after ``jobs.max_start_attempts``; a preempting gang
    is stopped once it reported a checkpoint taken for the request (or at the deadline), then
    PREEMPTED -> QUEUED in one store transaction (`Store.requeue`), to resume from its latest
    checkpoint; a job found PREEMPTED (a crash of an older version between those steps) is
    re-queued the same way once its Ray Job has ended; a Ray Job that ended sets
    SUCCEEDED/FAILED; a job past its ``max_runtime_s`` is stopped and FAILED; a CANCELLED
    job's Ray Job is stopped. A job that has ended and whose Ray Job has ended is forgotten by
    the signals actor (`forget`), as is every job retention prunes.

What a gang runs (``JobSpec.entrypoint``): ``module:function`` runs
``python -m jobs.launcher module:function``; anything else is run as a command (a leading
``python``/``python3`` becomes this interpreter), and the script calls
``jobs.launcher.run_gang``. The environment carries ``RCP_JOB_ID``, ``RCP_ATTEMPT``,
``RCP_NUM_WORKERS``, ``RCP_GPUS_PER_WORKER``, ``RCP_CPUS_PER_WORKER``, ``RCP_STORAGE_PATH``,
``RCP_RESUME_FROM`` (the latest checkpoint, only when it lies under the job's checkpoint
prefix ``RCP_CHECKPOINT_PREFIX``), ``RCP_SIGNAL_POLL_S`` and ``RCP_SIGNAL_TOKEN``: a fresh
secret per attempt, kept in the job's info (never in events, logs or the API's view), and
registered with the signals actor (as its hash, with the prefix) before the gang is
submitted, so signals from other jobs or older attempts are refused.

Must not: decide who runs (that is `policies.admission`).
"""

from __future__ import annotations

import collections
import logging
import re
import secrets
import shlex
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any, Protocol

from controlplane.config import Config
from controlplane.pools import JOB_DRIVER_RESOURCE, Pool, pool_resource
from controlplane.service.tokens import ensure_token
from controlplane.store import IllegalTransition, JobRecord, JobState, StaleState, Store
from jobs import launcher, signals
from jobs.signals import token_sha256
from policies.plan import AdmitJob, PreemptJob

__all__ = ["JobRunner", "RayJobs", "RayJobStatus", "Reason", "entrypoint_command"]

log = logging.getLogger(__name__)

_FUNCTION_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class RayJobStatus(str, Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    MISSING = "MISSING"
    """No Ray Job with that submission id (never submitted, or the cluster forgot it)."""


_ENDED = {RayJobStatus.STOPPED, RayJobStatus.SUCCEEDED, RayJobStatus.FAILED}

MAX_ATTEMPT_LOG_CHARS = 32 << 20
"""The most of one attempt's log the runner keeps (and serves): the rest is dropped, and a
marker line (`LOG_TRUNCATED_MARKER`) says so. The head is kept, so read offsets stay valid."""
LOG_TRUNCATED_MARKER = "\n[rcp: log truncated here: the control plane keeps the first {n} characters of an attempt's log; read the rest with `ray job logs {sid}`]\n"
ENDED_LOGS_CACHE_CHARS = 64 << 20
"""Characters of ended attempts' logs the runner keeps, all jobs together."""
LOG_SIZE_INDEX_ENTRIES = 100_000
"""Ended attempts whose log size `JobRunner.read_logs` remembers (least recently used out)."""
ORPHAN_SWEEP_INTERVAL_S = 300.0
"""How often `JobRunner.sweep_orphans` lists Ray's jobs (and once at start)."""
LIVE_LOG_CACHE_S = 2.0
"""How long a live attempt's fetched log is served again before Ray is asked anew: N clients
following one job cost one fetch per this many seconds, not N per poll."""
DASHBOARD_CONNECT_TIMEOUT_S = 5.0
DASHBOARD_READ_TIMEOUT_S = 30.0
"""Every HTTP request to the Ray dashboard (submit, status, stop, logs, list) gives up after
this long without a byte (`dashboard_client`): a dashboard that accepts a connection and never
answers raises instead of hanging the tick thread, or a submission thread, forever."""

_REQUEUE_INFO: Mapping[str, Any] = {
    "preempting": None,
    "stop_sent": None,
    "placement": None,
    "ray_done": True,
}
"""What a re-queued job's info forgets (its gang is gone) and records (its Ray Job ended)."""


class Reason(str, Enum):
    """Codes that start the reasons the runner writes to the state history."""

    GANG_RUNNING = "gang-running"
    GANG_START_TIMEOUT = "gang-start-timeout"
    START_FAILED = "start-failed"
    SUBMIT_DEFERRED = "submit-deferred"
    CHECKPOINTED_FOR_PREEMPTION = "checkpointed-for-preemption"
    PREEMPT_DEADLINE = "preempt-deadline-passed"
    REQUEUED = "requeued-after-preemption"
    STRANDED = "requeued-stranded-preempted: found PREEMPTED (a controller crash mid-preemption?)"
    RAY_JOB_SUCCEEDED = "ray-job-succeeded"
    RAY_JOB_FAILED = "ray-job-failed"
    RAY_JOB_STOPPED = "ray-job-stopped-outside-control-plane"
    MAX_RUNTIME = "max-runtime-exceeded"
    GANG_LOST = "gang-lost: Ray no longer knows its job (cluster restarted?)"


def entrypoint_command(entrypoint: str, python: str = sys.executable) -> str:
    """The Ray Job entrypoint for a spec's entrypoint (see the module doc)."""
    ep = entrypoint.strip()
    if _FUNCTION_RE.match(ep):
        return f"{shlex.quote(python)} -m jobs.launcher {ep}"
    head, _, rest = ep.partition(" ")
    if head in ("python", "python3"):
        return f"{shlex.quote(python)} {rest}".rstrip()
    return ep


class Signals(Protocol):
    def register_signals(self, job_id: str, attempt: int, token_hash: str, prefix: str) -> None: ...
    def signal_status(self, job_id: str) -> dict[str, Any]: ...
    def request_checkpoint(self, job_id: str, at_s: float) -> None: ...
    def clear_request(self, job_id: str) -> None: ...
    def forget_signals(self, job_id: str) -> None: ...


SIGNALS_KEY_FILE = "job-signals.key"
"""Under state_dir: the signals actor's admin key (0600)."""
SIGNAL_TOKEN_INFO = "signal_token"
"""The job-info key of the current attempt's signal token."""
SIGNALS_ACTOR_KEY = "jobs.signals_actor"
"""Store key: ``{"actor_id", "salt"}`` of the signals actor this controller created."""


def dashboard_client(
    address: str,
    connect_timeout_s: float = DASHBOARD_CONNECT_TIMEOUT_S,
    read_timeout_s: float = DASHBOARD_READ_TIMEOUT_S,
) -> Any:
    """A ``JobSubmissionClient`` for `address` whose every HTTP request has a timeout.

    Ray's client sends each request with ``requests.request(...)`` and no timeout; its
    ``_do_request`` hands extra keyword arguments to ``requests.request``, so a subclass adds
    ``timeout=(connect, read)`` there (a caller's own ``timeout`` wins). Construction (Ray's
    version check) goes through it too. A timeout raises ``requests.exceptions.Timeout``."""
    from ray.job_submission import JobSubmissionClient

    class DashboardClient(JobSubmissionClient):  # type: ignore[misc]
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", (connect_timeout_s, read_timeout_s))
            return super()._do_request(method, endpoint, **kwargs)

    return DashboardClient(address)


class RayJobs:
    """Ray Jobs and the job signals actor (the process must be a connected Ray driver).

    The signals actor is trusted by its Ray actor id, never by its name: any job can kill the
    actor and register its own under ``rcp-job-signals``. The id of the actor this class
    created, and the salt its secret was derived from, are pinned in the store
    (`SIGNALS_ACTOR_KEY`); an actor under the name with another id is killed, never called,
    and replaced (event ``jobs.signals_impostor``). Admin calls carry only an HMAC over a
    fresh nonce and the call (`signals.admin_auth`): the admin key stays here.
    """

    def __init__(self, cfg: Config, store: Store | None = None) -> None:
        self.cfg = cfg
        self.store = store
        self.dashboard_url = f"http://{cfg.ray.node_ip}:{cfg.ray.dashboard_port}"
        self._client: Any = None
        self.http_timeout_s = (DASHBOARD_CONNECT_TIMEOUT_S, DASHBOARD_READ_TIMEOUT_S)
        """(connect, read) timeouts of every dashboard request (`dashboard_client`)."""
        self._signals: Any = None
        self._signals_key: str | None = None
        self._secret: str | None = None
        self._call_lock = threading.Lock()
        self._last_nonce = 0

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = dashboard_client(self.dashboard_url, *self.http_timeout_s)
        return self._client

    def signals_key(self) -> str:
        """The controller's admin key for the signals actor. Kept 0600 in state_dir
        (`SIGNALS_KEY_FILE`), so a restarted controller can still speak to the actor it made;
        never sent anywhere (the actor gets a secret derived from it)."""
        if self._signals_key is None:
            self._signals_key = ensure_token(self.cfg.state_path, SIGNALS_KEY_FILE)
        return self._signals_key

    def _pinned(self) -> dict[str, str]:
        if self.store is None:
            return {}
        rec = self.store.get_value(SIGNALS_ACTOR_KEY, {}) or {}
        return dict(rec) if isinstance(rec, Mapping) else {}

    def signals_actor(self) -> Any:
        """The ``rcp-job-signals`` actor this controller created (see the class doc).

        Found under the name with the pinned actor id: used as is. Any other actor under the
        name (a user's job's, or one whose pin was lost) is killed without a single call and
        replaced by a new actor with a fresh salt; the runner then registers every admitted
        job again (`JobRunner._signals`)."""
        if self._signals is not None:
            return self._signals
        import ray

        pin = self._pinned()
        try:
            found: Any = ray.get_actor(
                signals.SIGNALS_ACTOR_NAME, namespace=signals.SIGNALS_NAMESPACE
            )
        except ValueError:
            found = None
        if found is not None and pin.get("actor_id") == found._actor_id.hex() and pin.get("salt"):
            self._secret = signals.derive_admin_secret(self.signals_key(), pin["salt"])
            self._signals = found
            return found
        if found is not None:
            impostor = found._actor_id.hex()
            log.warning("job signals: actor %s under the name is not ours; replacing it", impostor)
            ray.kill(found, no_restart=True)
            if self.store is not None:
                self.store.record_event(
                    "jobs.signals_impostor",
                    f"actor {impostor} held the job signals actor's name but is not the one "
                    "this controller created (a user's job, or an actor from before actor ids "
                    "were pinned); killed without being called, a new one replaces it",
                    data={"actor_id": impostor, "pinned": pin.get("actor_id")},
                )
        salt = secrets.token_hex(16)
        secret = signals.derive_admin_secret(self.signals_key(), salt)
        options = {
            "name": signals.SIGNALS_ACTOR_NAME,
            "namespace": signals.SIGNALS_NAMESPACE,
            "lifetime": "detached",
            "resources": {pool_resource(Pool.HEAD): 1},
        }
        deadline_s = time.monotonic() + 10
        handle: Any = None
        while True:
            try:
                handle = signals.JobSignals.options(**options).remote(secret)
                break
            except ValueError:  # the killed actor still holds the name
                if time.monotonic() > deadline_s:
                    raise
                time.sleep(0.2)
        if self.store is not None:
            self.store.put(SIGNALS_ACTOR_KEY, {"actor_id": handle._actor_id.hex(), "salt": salt})
        self._secret, self._signals = secret, handle
        return handle

    def _signals_call(self, method: str, *args: Any) -> Any:
        import ray

        try:
            handle = self.signals_actor()
            assert self._secret is not None  # set with the handle
            with self._call_lock:  # nonces reach the actor in the order they were made
                self._last_nonce = max(self._last_nonce + 1, time.time_ns())
                auth = signals.admin_auth(self._secret, self._last_nonce, method, args)
                ref = getattr(handle, method).remote(*args, auth=auth)
            return ray.get(ref, timeout=10)
        except ray.exceptions.RayActorError:
            self._signals = None  # killed: find (and check) or make it again on the next call
            raise
        except PermissionError:
            # Not the actor's secret (it restarted with another's args?): check it again.
            self._signals = None
            raise

    def register_signals(self, job_id: str, attempt: int, token_hash: str, prefix: str) -> None:
        self._signals_call("register", job_id, attempt, token_hash, prefix)

    def signal_status(self, job_id: str) -> dict[str, Any]:
        return dict(self._signals_call("status", job_id))

    def request_checkpoint(self, job_id: str, at_s: float) -> None:
        self._signals_call("request_checkpoint", job_id, at_s)

    def clear_request(self, job_id: str) -> None:
        self._signals_call("clear_request", job_id)

    def forget_signals(self, job_id: str) -> None:
        """Drop the signals actor's record of `job_id` (call it once the job has ended)."""
        self._signals_call("forget", job_id)

    def forget_signals_many(self, job_ids: list[str]) -> None:
        """`forget_signals` for many jobs in one signed actor call (one timeout in all)."""
        self._signals_call("forget_many", list(job_ids))

    def submit(self, submission_id: str, entrypoint: str, runtime_env: Mapping[str, Any]) -> None:
        """Submit; a submission id that already exists counts as done (idempotent)."""
        try:
            self.client.submit_job(
                entrypoint=entrypoint,
                submission_id=submission_id,
                runtime_env=dict(runtime_env),
                metadata={"rcp_job": submission_id.rsplit("-", 1)[0]},
                # Only cluster-pool workers offer this resource: the driver (user code) never
                # runs on the head, where the control plane's credentials are.
                entrypoint_resources={JOB_DRIVER_RESOURCE: 1},
            )
        except Exception as exc:
            if self.status(submission_id) is RayJobStatus.MISSING:
                raise
            log.info("Ray Job %s already submitted (%s)", submission_id, exc)

    def status(self, submission_id: str) -> RayJobStatus:
        try:
            return RayJobStatus(str(self.client.get_job_status(submission_id)).split(".")[-1])
        except RuntimeError as exc:
            if "does not exist" in str(exc) or "404" in str(exc):
                return RayJobStatus.MISSING
            raise

    def stop(self, submission_id: str) -> None:
        try:
            self.client.stop_job(submission_id)
        except RuntimeError as exc:
            if "does not exist" not in str(exc):
                raise

    def logs(self, submission_id: str) -> str:
        try:
            return str(self.client.get_job_logs(submission_id))
        except RuntimeError:
            return ""

    def rcp_submissions(self) -> dict[str, RayJobStatus]:
        """Every Ray Job this control plane submitted (metadata ``rcp_job``) that has not
        ended, by submission id."""
        out: dict[str, RayJobStatus] = {}
        for details in self.client.list_jobs():
            if "rcp_job" not in dict(getattr(details, "metadata", None) or {}):
                continue
            sid = getattr(details, "submission_id", None)
            status = RayJobStatus(str(getattr(details, "status", "")).split(".")[-1])
            if sid and status not in _ENDED:
                out[str(sid)] = status
        return out


class SubmitTimeout(RuntimeError):
    """Ray did not accept a submission in time (or an earlier one still hangs)."""


class SubmitBusy(SubmitTimeout):
    """Not submitted at all: an earlier submission still hangs. Not the job's failure."""


class _Submissions:
    """Runs Ray Job submissions on daemon threads, so the tick waits at most `timeout_s`.

    A submission still hanging when its wait ends is abandoned: if Ray accepts it later,
    `on_late_accept` runs on its thread (the runner stops that Ray Job). While an abandoned
    submission hangs, new ones fail at once instead of waiting too: Ray is not answering, and
    one tick must not wait once per admitted job.
    """

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
        with self._lock:
            self._hanging = {k: t for k, t in self._hanging.items() if t.is_alive()}
            if self._hanging:
                raise SubmitBusy(
                    f"Ray has not answered the submission of {min(self._hanging)} yet; "
                    "not submitting more until it does"
                )
        state: dict[str, Any] = {"finished": False, "abandoned": False, "error": None}

        def work() -> None:
            error: BaseException | None = None
            try:
                submit()
            except BaseException as exc:  # handed to the waiting tick (or logged if late)
                error = exc
            with self._lock:
                state["finished"], state["error"] = True, error
                late = state["abandoned"]
            if late and error is None:
                on_late_accept()
            elif late:
                log.info("abandoned submission %s failed late: %s", submission_id, error)

        thread = threading.Thread(target=work, name=f"rcp-submit-{submission_id}", daemon=True)
        thread.start()
        thread.join(timeout_s)
        with self._lock:
            if not state["finished"]:
                state["abandoned"] = True
                self._hanging[submission_id] = thread
                raise SubmitTimeout(f"Ray did not accept the submission within {timeout_s:g}s")
        if state["error"] is not None:
            raise state["error"]


class JobRunner:
    """A job's life after admission (see the module doc). Every method is idempotent."""

    def __init__(
        self, store: Store, cfg: Config, ray_jobs: Any, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.ray = ray_jobs
        if isinstance(ray_jobs, RayJobs) and ray_jobs.store is None:
            ray_jobs.store = store  # where the signals actor's id is pinned
        self.clock = clock
        self._submissions = _Submissions()
        self._ended_logs: collections.OrderedDict[str, str] = collections.OrderedDict()
        """Logs of attempts whose Ray Job ended, by submission id (see `read_logs`)."""
        self._live_logs: dict[str, tuple[float, str]] = {}
        """(fetched at, log) of live attempts, by submission id (see `LIVE_LOG_CACHE_S`)."""
        self._logs_lock = threading.Lock()
        self._fetch_locks: dict[str, threading.Lock] = {}
        self._log_sizes: collections.OrderedDict[str, int] = collections.OrderedDict()
        """Lengths of ended attempts' parts of the log, by submission id (see `read_logs`)."""
        self._last_sweep_s: float | None = None

    # -- act ---------------------------------------------------------------------------------

    def admit(self, action: AdmitJob) -> None:
        job = self.store.get(action.job_id)
        if job.state is not JobState.QUEUED:
            return  # already acted on (level-triggered plans repeat)
        hanging = self._submissions.hanging()
        if hanging is not None:
            # Ray's dashboard is not answering: not this job's failure. It stays QUEUED, no
            # attempt is used up, and a later tick admits it again.
            self._defer(
                job,
                f"{Reason.SUBMIT_DEFERRED.value}: Ray has not answered the submission of "
                f"{hanging} yet; admitting again once it does",
            )
            return
        now = self.clock()
        attempt = int(job.info.get("attempt", 0)) + 1
        submission_id = f"{job.job_id}-{attempt}"
        placement: dict[str, int] = {}
        for p in action.placement:
            placement[p.node_id] = (
                placement.get(p.node_id, 0) + p.num_workers * action.gpus_per_worker
            )
        self.store.update_info(
            job.job_id,
            {
                "attempt": attempt,
                "submission_id": submission_id,
                "admitted_s": now,
                "placement": placement,
                "preempting": None,
                "stop_sent": None,
                "ray_done": None,
                "not_before_s": None,
                # This attempt's secret for the signals actor (RCP_SIGNAL_TOKEN). Kept only
                # here: never in events, logs or the API's job view (`job_to_json`).
                SIGNAL_TOKEN_INFO: secrets.token_urlsafe(32),
            },
        )
        self.store.transition(
            job.job_id, JobState.ADMITTED, action.reason, expected=JobState.QUEUED
        )
        job = self.store.get(job.job_id)
        try:
            self._register_signals(job)
        except Exception as exc:
            log.warning("registering %s with the job signals actor failed: %s", job.job_id, exc)
            self._start_failed(job, f"{Reason.START_FAILED.value}: job signals unavailable")
            return
        self._submit(job)

    def checkpoint_prefix(self, job_id: str) -> str:
        """Where `job_id`'s checkpoints live; nothing outside it is recorded or resumed from."""
        return signals.checkpoint_prefix(self.cfg.train_storage_path, job_id)

    def _register_signals(self, job: JobRecord) -> None:
        """Tell the signals actor this attempt's token (as its hash) and checkpoint prefix."""
        self.ray.register_signals(
            job.job_id,
            int(job.info["attempt"]),
            token_sha256(str(job.info[SIGNAL_TOKEN_INFO])),
            self.checkpoint_prefix(job.job_id),
        )

    def _defer(self, job: JobRecord, reason: str) -> None:
        """Record why `job` was not submitted this time (once per distinct reason: the plan
        repeats every tick) without charging it a start failure."""
        log.info("job %s: %s", job.job_id, reason)
        if job.info.get("message") == reason:
            return
        self.store.update_info(job.job_id, {"message": reason})
        self.store.record_event(
            "job.submit_deferred", f"job {job.job_id}: {reason}", job_id=job.job_id
        )

    def _submit(self, job: JobRecord) -> None:
        """Submit off the tick thread, waiting at most ``jobs.submit_timeout_s``. Refused
        because an earlier submission still hangs (`SubmitBusy`) is no start failure: the job
        goes back to QUEUED (its Ray Job does not exist) with the reason in its history and a
        ``job.submit_deferred`` event, and is admitted again later."""
        sid = str(job.info["submission_id"])
        try:
            entrypoint, runtime_env = self._ray_job(job)
            self._submissions.run(
                sid,
                lambda: self.ray.submit(sid, entrypoint, runtime_env),
                lambda: self._stop_late_submission(sid),
                self.cfg.jobs.submit_timeout_s,
            )
        except SubmitBusy as exc:
            reason = f"{Reason.SUBMIT_DEFERRED.value}: {exc}"
            if self.ray.status(sid) is RayJobStatus.MISSING and job.state is JobState.ADMITTED:
                self.store.update_info(
                    job.job_id, {"placement": None, "ray_done": True, "message": reason}
                )
                self.store.transition(
                    job.job_id, JobState.QUEUED, reason, expected=JobState.ADMITTED
                )
                self.store.record_event(
                    "job.submit_deferred", f"job {job.job_id}: {reason}", job_id=job.job_id
                )
            else:
                self._defer(job, reason)
        except Exception as exc:
            log.warning("submitting %s failed: %s", job.job_id, exc)
            self._start_failed(job, f"{Reason.START_FAILED.value}: {exc}")

    def _stop_late_submission(self, sid: str) -> None:
        """Ray accepted a submission after the runner gave up on it: stop that gang (the job
        was re-queued and its next attempt has a new submission id)."""
        log.warning("Ray accepted %s after its submission timed out; stopping it", sid)
        try:
            self.ray.stop(sid)
        except Exception as exc:
            log.error("could not stop late submission %s: %s", sid, exc)

    def _ray_job(self, job: JobRecord) -> tuple[str, dict[str, Any]]:
        from controlplane.service.controller import ray_connection_env

        s = job.spec
        env: dict[str, str] = {
            str(k): str(v) for k, v in dict(s.runtime_env.get("env_vars") or {}).items()
        }
        env.update(
            {
                signals.ENV_JOB_ID: job.job_id,
                signals.ENV_ATTEMPT: str(job.info["attempt"]),
                signals.ENV_SIGNAL_POLL_S: f"{self.cfg.jobs.job_signal_poll_s:g}",
                launcher.ENV_NUM_WORKERS: str(s.num_workers),
                launcher.ENV_GPUS_PER_WORKER: str(s.gpus_per_worker),
                launcher.ENV_CPUS_PER_WORKER: f"{s.cpus_per_worker:g}",
                launcher.ENV_STORAGE_PATH: str(self.cfg.train_storage_path),
                launcher.ENV_NODE_IDS: ",".join(sorted(job.info.get("placement") or {})),
                **ray_connection_env(),
            }
        )
        prefix = self.checkpoint_prefix(job.job_id)
        env[signals.ENV_CHECKPOINT_PREFIX] = prefix
        if job.info.get(SIGNAL_TOKEN_INFO):
            env[signals.ENV_SIGNAL_TOKEN] = str(job.info[SIGNAL_TOKEN_INFO])
        ckpt = job.info.get("checkpoint") or {}
        if ckpt.get("path") and signals.under_prefix(str(ckpt["path"]), prefix):
            env[signals.ENV_RESUME_FROM] = str(ckpt["path"])
        elif ckpt.get("path"):
            self.store.record_event(
                "job.resume_refused",
                f"job {job.job_id}: not resuming from {ckpt['path']}: outside its checkpoint "
                f"prefix {prefix}; starting fresh",
                job_id=job.job_id,
                data={"path": str(ckpt["path"]), "prefix": prefix},
            )
        runtime_env = {k: v for k, v in s.runtime_env.items() if k != "env_vars"}
        runtime_env["env_vars"] = env
        if s.working_dir:
            runtime_env["working_dir"] = s.working_dir
        return entrypoint_command(s.entrypoint), runtime_env

    def preempt(self, action: PreemptJob) -> None:
        job = self.store.get(action.job_id)
        if job.state not in (JobState.ADMITTED, JobState.RUNNING) or job.info.get("preempting"):
            return
        now = self.clock()
        ask = (
            action.checkpoint_first
            and job.spec.checkpoint.enabled
            and job.state is JobState.RUNNING
        )
        deadline = now + (job.spec.checkpoint.preempt_deadline_s if ask else 0.0)
        self.store.update_info(
            job.job_id,
            {
                "preempting": True,
                "preempt_requested_s": now,
                "preempt_deadline_s": deadline,
                "preempt_for": action.for_job_id,
                "preempt_reason": action.reason,
            },
        )
        if ask:
            self.ray.request_checkpoint(job.job_id, now)
        self.store.record_event(
            "job.preempt",
            f"job {job.job_id}: preempting ({'checkpoint first' if ask else 'no checkpoint'}): "
            f"{action.reason}",
            job_id=job.job_id,
            data={"for_job_id": action.for_job_id, "checkpoint_first": ask},
        )

    # -- reconcile ----------------------------------------------------------------------------

    def reconcile(self) -> None:
        """Move every job that holds (or held) a gang along, from what Ray and the signals say.

        Reads active jobs only (by index): ADMITTED, RUNNING, PREEMPTED, and finished jobs
        whose Ray Job may still run. Never the finished jobs of the past.
        """
        for job in self.store.list_jobs(states=[JobState.ADMITTED, JobState.RUNNING]):
            try:
                self._reconcile_one(job)
            except (StaleState, IllegalTransition):
                continue  # someone (a cancel) moved it meanwhile; next tick sees it
        for job in self.store.list_jobs(states=[JobState.PREEMPTED]):
            try:
                self._requeue_stranded(job)
            except (StaleState, IllegalTransition):
                continue
        scan = self.store.scan_jobs(
            states=[JobState.CANCELLED, JobState.FAILED], unsettled_only=True
        )
        for job in scan.jobs:
            self._stop_ended(job)
        for bad in scan.invalid:  # e.g. cancelled by id (`Store.cancel_invalid`)
            try:
                self._stop_invalid(bad.job_id)
            except Exception as exc:  # one bad row must not stop the others
                log.warning("stopping the Ray Job of invalid job %s failed: %s", bad.job_id, exc)
        now = self.clock()
        if self._last_sweep_s is None or now - self._last_sweep_s >= ORPHAN_SWEEP_INTERVAL_S:
            self._last_sweep_s = now
            try:
                self.sweep_orphans()
            except Exception as exc:  # retried at the next interval
                log.warning("orphan sweep failed: %s", exc)

    def sweep_orphans(self) -> list[str]:
        """Stop every live Ray Job of ours (metadata ``rcp_job``) that is not the current
        attempt of an ADMITTED or RUNNING job (preempting ones included) in the store: e.g. a
        submission Ray accepted after the runner gave up on it while the controller restarted,
        so nothing was left to stop it. Rows that no longer validate keep their gang (their
        attempt is read from the raw info); cancel them to stop it. Returns the ids stopped."""
        scan = self.store.scan_jobs(states=[JobState.ADMITTED, JobState.RUNNING])
        keep = {_submission_id(j.job_id, j.info) for j in scan.jobs}
        keep |= {_submission_id(b.job_id, self.store.raw_info(b.job_id)) for b in scan.invalid}
        stopped = []
        for sid, status in sorted(self.ray.rcp_submissions().items()):
            if sid in keep:
                continue
            log.warning(
                "Ray Job %s (%s) belongs to no active job attempt; stopping it", sid, status
            )
            self.ray.stop(sid)
            stopped.append(sid)
            self.store.record_event(
                "job.orphan_stopped",
                f"Ray Job {sid} ({status.value}) was not the current attempt of any admitted or "
                "running job (a submission abandoned across a controller restart?); stopped",
                data={"submission_id": sid},
            )
        return stopped

    def forget(self, job_id: str) -> None:
        """Tell the signals actor to drop the job (best effort: a failure is logged)."""
        try:
            self.ray.forget_signals(job_id)
        except Exception as exc:
            log.warning("job signals: forgetting %s failed: %s", job_id, exc)

    def forget_many(self, job_ids: Sequence[str]) -> None:
        """`forget` for many jobs in one actor call, e.g. every job retention pruned (most
        were forgotten when they ended already; one call bounds what the rest costs). Best
        effort: a failure is logged, never raised."""
        if not job_ids:
            return
        try:
            self.ray.forget_signals_many(list(job_ids))
        except Exception as exc:
            log.warning("job signals: forgetting %d pruned jobs failed: %s", len(job_ids), exc)

    def _requeue_stranded(self, job: JobRecord) -> None:
        """A job left PREEMPTED (the crash of a version that re-queued in three steps): once
        its Ray Job has ended, back to the queue, with why in its history."""
        sid = job.info.get("submission_id")
        if sid and not job.info.get("ray_done"):
            status = self.ray.status(sid)
            if status not in _ENDED and status is not RayJobStatus.MISSING:
                if not job.info.get("stop_sent"):
                    self.ray.stop(sid)
                    self.store.update_info(job.job_id, {"stop_sent": self.clock()})
                return  # re-queue once Ray says it ended
        try:
            self.ray.clear_request(job.job_id)
        except Exception as exc:
            log.warning("job signals: clearing %s failed: %s", job.job_id, exc)
        self.store.requeue(
            job.job_id,
            Reason.STRANDED.value,
            Reason.STRANDED.value,
            info=_REQUEUE_INFO,
            expected=[JobState.PREEMPTED],
        )

    def _signals(self, job: JobRecord) -> dict[str, Any]:
        """What the signals actor holds for this attempt. An actor that does not know the
        attempt (it restarted, or was replaced) is told it again from the store first."""
        try:
            sig: dict[str, Any] = self.ray.signal_status(job.job_id)
            if sig.get("attempt") != job.info.get("attempt") and job.info.get(SIGNAL_TOKEN_INFO):
                self._register_signals(job)
                sig = self.ray.signal_status(job.job_id)
            return sig
        except Exception as exc:
            log.warning("job signals unavailable for %s: %s", job.job_id, exc)
            return {}

    def _reconcile_one(self, job: JobRecord) -> None:
        now = self.clock()
        sid = job.info["submission_id"]
        attempt = int(job.info["attempt"])
        sig = self._signals(job)
        ckpt = sig.get("checkpoint")
        if ckpt and not signals.under_prefix(
            str(ckpt.get("path")), self.checkpoint_prefix(job.job_id)
        ):
            # The actor refuses these; one that did not is not ours. Never record it.
            log.warning("job %s: ignoring checkpoint %s outside its prefix", job.job_id, ckpt)
            ckpt = None
        if ckpt and ckpt != job.info.get("checkpoint"):
            job = self.store.update_info(job.job_id, {"checkpoint": ckpt})
        status = self.ray.status(sid)

        if job.info.get("preempting"):
            self._preempting(job, status, ckpt, now)
            return
        if status is RayJobStatus.SUCCEEDED:
            if job.state is JobState.ADMITTED:
                self.store.transition(job.job_id, JobState.RUNNING, Reason.GANG_RUNNING.value)
            self._finish(job, JobState.SUCCEEDED, Reason.RAY_JOB_SUCCEEDED.value)
            return
        if status in (RayJobStatus.FAILED, RayJobStatus.STOPPED):
            why = Reason.RAY_JOB_FAILED if status is RayJobStatus.FAILED else Reason.RAY_JOB_STOPPED
            message = self._tail(sid)
            if job.state is JobState.ADMITTED:
                self._start_failed(job, f"{why.value}: {message}")
            else:
                self.store.update_info(job.job_id, {"message": message})
                self._finish(job, JobState.FAILED, f"{why.value}: {message}")
            return
        limit = job.spec.max_runtime_s
        if limit is not None and now - float(job.info["admitted_s"]) > limit:
            # Backfill relied on this bound: enforce it. The stop completes in the background.
            self.ray.stop(sid)
            self.store.transition(
                job.job_id,
                JobState.FAILED,
                f"{Reason.MAX_RUNTIME.value} ({limit:g}s)",
                info={"stop_sent": now, "placement": None},
            )
            return
        if job.state is JobState.RUNNING and status is RayJobStatus.MISSING:
            # The cluster lost the Ray Job (e.g. `rcp down` then `up`): run it again from its
            # latest checkpoint rather than leave it RUNNING forever.
            self.store.requeue(
                job.job_id,
                Reason.GANG_LOST.value,
                Reason.REQUEUED.value,
                info={"placement": None, "ray_done": True},
                expected=[JobState.RUNNING],
            )
            return
        if job.state is JobState.ADMITTED:
            started = sig.get("started_ranks") or []
            if sig.get("attempt") == attempt and len(started) >= job.spec.num_workers:
                self.store.transition(
                    job.job_id,
                    JobState.RUNNING,
                    f"{Reason.GANG_RUNNING.value}: all {job.spec.num_workers} workers started",
                    expected=JobState.ADMITTED,
                )
            elif status is RayJobStatus.MISSING:
                self._submit(job)  # admitted but the submission was lost (crash); resubmit
            elif now - float(job.info["admitted_s"]) > self.cfg.jobs.gang_start_timeout_s:
                self.ray.stop(sid)
                self._start_failed(
                    job,
                    f"{Reason.GANG_START_TIMEOUT.value}: {len(started)} of "
                    f"{job.spec.num_workers} workers running after "
                    f"{self.cfg.jobs.gang_start_timeout_s:g}s",
                )

    def _preempting(
        self, job: JobRecord, status: RayJobStatus, ckpt: Mapping[str, Any] | None, now: float
    ) -> None:
        sid = job.info["submission_id"]
        answered = bool(
            ckpt and ckpt.get("answers_request") and ckpt.get("attempt") == job.info["attempt"]
        )
        if status is RayJobStatus.SUCCEEDED:
            self.ray.clear_request(job.job_id)
            if job.state is JobState.ADMITTED:
                self.store.transition(job.job_id, JobState.RUNNING, Reason.GANG_RUNNING.value)
            self._finish(
                job, JobState.SUCCEEDED, f"{Reason.RAY_JOB_SUCCEEDED.value} while preempting"
            )
            return
        if status in _ENDED or status is RayJobStatus.MISSING:
            why = (
                f"{Reason.CHECKPOINTED_FOR_PREEMPTION.value} at step {ckpt['step']}"
                if answered and ckpt
                else f"{Reason.PREEMPT_DEADLINE.value}: stopped without a new checkpoint"
            )
            reason = job.info.get("preempt_reason") or "preempted"
            self.ray.clear_request(job.job_id)
            self.store.requeue(
                job.job_id,
                f"{why}; {reason}",
                Reason.REQUEUED.value,
                info=_REQUEUE_INFO,
                expected=[job.state],
            )
            return
        if not job.info.get("stop_sent") and (
            answered or now >= float(job.info.get("preempt_deadline_s", 0.0))
        ):
            self.ray.stop(sid)
            self.store.update_info(job.job_id, {"stop_sent": now})

    def _start_failed(self, job: JobRecord, reason: str) -> None:
        failures = int(job.info.get("start_failures", 0)) + 1
        j = self.cfg.jobs
        if failures >= j.max_start_attempts:
            self.store.update_info(job.job_id, {"start_failures": failures, "message": reason})
            self._finish(job, JobState.FAILED, f"{reason}; gave up after {failures} attempts")
            return
        backoff = min(j.backoff_max_s, j.backoff_initial_s * 2 ** (failures - 1))
        self.store.update_info(
            job.job_id,
            {
                "start_failures": failures,
                "not_before_s": self.clock() + backoff,
                "placement": None,
                "message": reason,
                "ray_done": True,
            },
        )
        self.store.transition(
            job.job_id,
            JobState.QUEUED,
            f"{reason}; retry in {backoff:g}s",
            expected=JobState.ADMITTED,
        )

    def _finish(self, job: JobRecord, state: JobState, reason: str) -> None:
        self.store.transition(job.job_id, state, reason, info={"ray_done": True, "placement": None})
        self.forget(job.job_id)

    def _stop_ended(self, job: JobRecord) -> None:
        """Stop the Ray Job of a job that ended without it (cancelled, over its runtime)."""
        sid = job.info["submission_id"]
        status = self.ray.status(sid)
        if status in _ENDED or status is RayJobStatus.MISSING:
            self.store.update_info(job.job_id, {"ray_done": True, "placement": None})
            self.forget(job.job_id)
        elif not job.info.get("stop_sent"):
            self.ray.stop(sid)
            self.store.update_info(job.job_id, {"stop_sent": self.clock()})

    def _stop_invalid(self, job_id: str) -> None:
        """`_stop_ended` for a row that no longer validates: ``<id>-<attempt>`` from its info
        alone, no spec needed."""
        info = self.store.raw_info(job_id)
        sid = _submission_id(job_id, info)
        if sid is None:
            self.store.merge_raw_info(job_id, {"ray_done": True})
            return
        status = self.ray.status(sid)
        if status in _ENDED or status is RayJobStatus.MISSING:
            self.store.merge_raw_info(job_id, {"ray_done": True, "placement": None})
            self.forget(job_id)
        elif not info.get("stop_sent"):
            self.ray.stop(sid)
            self.store.merge_raw_info(job_id, {"stop_sent": self.clock()})

    def _tail(self, sid: str, chars: int = 400) -> str:
        try:
            text = self.ray.logs(sid).strip()
        except Exception:
            return "no logs"
        return text[-chars:] if text else "no logs"

    def read_logs(self, job: JobRecord, offset: int, limit: int) -> tuple[str, int]:
        """``(text, size)``: `limit` characters from `offset` of the driver logs of every
        attempt, oldest first, each under a header line, and their length, fetching only the
        attempts that window touches.

        An attempt whose Ray Job has ended never changes: its log is fetched from Ray once and
        kept (`ENDED_LOGS_CACHE_CHARS` in all, least recently used out first). The live
        attempt's log is fetched at most once per `LIVE_LOG_CACHE_S` however many clients
        follow it (concurrent readers wait for one fetch). Each attempt's log is cut at
        `MAX_ATTEMPT_LOG_CHARS` with a marker line. Thread-safe (the API calls it from its
        log-read threads).

        Where each attempt starts needs the sizes of those before it: an ended attempt's size
        never changes and is kept (`_log_sizes`, a few bytes per attempt) once it was fetched;
        the live attempt is the last, so it is fetched (within `LIVE_LOG_CACHE_S`) for its
        size. A read thus holds at most the window's attempts and the live one; only the first
        read of a job after a controller start fetches its older attempts, one at a time, to
        learn their sizes.
        """
        attempts = int(job.info.get("attempt", 0))
        end = offset + max(0, limit)
        pieces: list[str] = []
        pos = 0
        for a in range(1, attempts + 1):
            sep = "\n" if a < attempts else ""
            size = self._known_size(job, a)
            part = None
            if size is None:
                part = self._part(job, a)
                size = len(part)
            lo, hi = max(offset, pos), min(end, pos + size + len(sep))
            if lo < hi:
                if part is None:
                    part = self._part(job, a)
                    size = len(part)
                    hi = min(end, pos + size + len(sep))
                pieces.append((part + sep)[lo - pos : hi - pos])
            pos += size + len(sep)
        return "".join(pieces), pos

    def _ended(self, job: JobRecord, attempt: int) -> bool:
        return attempt < int(job.info.get("attempt", 0)) or bool(job.info.get("ray_done"))

    def _known_size(self, job: JobRecord, attempt: int) -> int | None:
        """The length of an ended attempt's part of the log, if known (None: fetch it)."""
        if not self._ended(job, attempt):
            return None
        with self._logs_lock:
            return self._log_sizes.get(f"{job.job_id}-{attempt}")

    def _part(self, job: JobRecord, attempt: int) -> str:
        """One attempt's part of the log: a header line, then its (capped) log."""
        sid = f"{job.job_id}-{attempt}"
        ended = self._ended(job, attempt)
        part = f"=== attempt {attempt} (Ray job {sid}) ===\n{self._attempt_log(sid, ended)}"
        if ended:
            with self._logs_lock:
                self._log_sizes[sid] = len(part)
                self._log_sizes.move_to_end(sid)
                while len(self._log_sizes) > LOG_SIZE_INDEX_ENTRIES:
                    self._log_sizes.popitem(last=False)
        return part

    def _cached_log(self, sid: str, ended: bool) -> str | None:
        with self._logs_lock:
            if sid in self._ended_logs:
                self._ended_logs.move_to_end(sid)
                return self._ended_logs[sid]
            live = self._live_logs.get(sid)
            if not ended and live is not None and self.clock() - live[0] < LIVE_LOG_CACHE_S:
                return live[1]
            return None

    def _attempt_log(self, sid: str, ended: bool) -> str:
        text = self._cached_log(sid, ended)
        if text is not None:
            return text
        with self._logs_lock:
            fetching = self._fetch_locks.setdefault(sid, threading.Lock())
        with fetching:  # one fetch per attempt at a time; the others then read the cache
            text = self._cached_log(sid, ended)
            if text is not None:
                return text
            text = _cap_log(str(self.ray.logs(sid)), sid)
            now = self.clock()
            with self._logs_lock:
                self._live_logs = {
                    k: v for k, v in self._live_logs.items() if now - v[0] < LIVE_LOG_CACHE_S
                }
                if ended:
                    self._live_logs.pop(sid, None)
                    if len(text) <= ENDED_LOGS_CACHE_CHARS:
                        cache = self._ended_logs
                        cache[sid] = text
                        while sum(len(t) for t in cache.values()) > ENDED_LOGS_CACHE_CHARS:
                            cache.popitem(last=False)
                else:
                    self._live_logs[sid] = (now, text)
                self._fetch_locks.pop(sid, None)
        return text


def _submission_id(job_id: str, info: Mapping[str, Any]) -> str | None:
    """The current attempt's Ray submission id from a job's info, trusting no type."""
    sid = info.get("submission_id")
    if isinstance(sid, str) and sid:
        return sid
    attempt = info.get("attempt")
    if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt > 0:
        return f"{job_id}-{attempt}"
    return None


def _cap_log(text: str, sid: str) -> str:
    """`text` cut at `MAX_ATTEMPT_LOG_CHARS`, with the marker line when anything was cut."""
    if len(text) <= MAX_ATTEMPT_LOG_CHARS:
        return text
    return text[:MAX_ATTEMPT_LOG_CHARS] + LOG_TRUNCATED_MARKER.format(
        n=MAX_ATTEMPT_LOG_CHARS, sid=sid
    )
