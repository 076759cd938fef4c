"""The runner: the act phase for training jobs. The only code that starts and stops Ray Jobs.

Owns:

* `RayJobs` - the Ray side: Ray Job submission, status, stop and logs through the dashboard
  (``JobSubmissionClient``, so every gang shows in the dashboard's Jobs tab), a worker's
  Python stacks through the dashboard (py-spy, `fetch_worker_stack`), the memory-tier holder
  actors of a job (``<job id>/...`` in ``rcp-checkpoints``), and the ``rcp-job-signals``
  actor (`jobs.signals.JobSignals`) that training loops talk to.
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
    ``preempting`` with a deadline (``checkpoint.preempt_deadline_s``); a preemption with no
    job to make room for is the health remediation moving the gang off a bad node.
  - `reconcile` every tick:

    * committed checkpoints come from object storage, never from the loop's word
      (`checkpoints.CheckpointReader`, on worker threads; the tick waits `TICK_WAIT_S` at
      most, all jobs together): a RUNNING job's newest committed step is read every
      ``jobs.checkpoint_scan_interval_s``, sooner when its hint (a ``checkpointed`` report,
      or the committed step in its progress) names a newer one, and every tick while it is
      preempted; a storage error is logged and read again later, never fails the job;
    * ADMITTED -> RUNNING once every worker has started; a gang not running within
      ``jobs.gang_start_timeout_s`` is stopped and re-queued with exponential backoff
      (``not_before_s``), FAILED after ``jobs.max_start_attempts``;
    * a preempting gang is stopped once the manifest of a step taken for the request is in
      storage (the step the job reported for it, verified there, or any step committed after
      the request), or at the deadline; then PREEMPTED -> QUEUED in one store transaction
      (`Store.requeue`); no restart is spent, even when it failed meanwhile;
    * a RUNNING gang whose Ray Job FAILED (a worker raised or was killed, a node died)
      crashed; one whose step has not grown for its ``stall_timeout_s`` (armed once it
      reported a step) hung: every rank's stacks are fetched through Ray into the attempt's
      log (`Store.put_attempt_note`, shown by `read_logs`), event ``job.hung``, the gang is
      stopped. Either goes RUNNING -> QUEUED (one transaction) after a backoff
      (``jobs.restart_backoff_*``), to resume from the newest committed step, or FAILED, as
      `policies.restarts` decides (``max_restarts``; the same failure twice before any
      progress gives up at once); both count in the fleet's failure record
      (`reliability.record_failure`: a crash once the gang reported a step);
    * a RUNNING gang whose Ray Job vanished (the cluster restarted) is re-queued (no restart
      spent); a job found PREEMPTED (a crash of an older version mid-preemption) is re-queued
      once its Ray Job has ended; a Ray Job that ended sets SUCCEEDED/FAILED; a job past its
      ``max_runtime_s`` is stopped and FAILED; a CANCELLED job's Ray Job is stopped.

    A job that has ended and whose Ray Job has ended is settled: the signals actor forgets it
    (`forget`, as every job retention prunes) and its memory-tier actors are killed (and, every
    `ORPHAN_SWEEP_INTERVAL_S`, those of any ended or pruned job: `sweep_memory_tiers`).

What the job's info records (the API, CLI and metrics read exactly these keys,
`job_info`): ``checkpoint_uri`` (its prefix); ``checkpoint`` = ``{"step", "uri",
"committed_unix_s", "read_s"}``, the newest committed step as read from storage;
``progress`` = the running attempt's ``{"step", "step_at_s", "stall_s", "wall_s"}`` from the
signals actor (present only while an attempt runs); ``stall_s_total``/``wall_s_total`` over
ended attempts; ``restarts`` (crash and hang restarts used); ``hangs``; ``attempts`` (newest
last, at most `MAX_ATTEMPTS_KEPT`) = ``{"attempt", "admitted_s", "ended_s", "kind",
"reason", "step"}`` with ``kind`` an `AttemptEnd` and ``step`` the last step the attempt
reported (None: none). A give-up's attempt has kind ``failed``.

What a gang runs (``JobSpec.entrypoint``, turned into the Ray Job's entrypoint by
`entrypoint_command`): ``module:function`` runs ``python -m jobs.launcher module:function``
(the function is every worker's Ray Train loop); anything else is a command, run as
``python -m jobs.launcher --command -- CMD...`` (a leading ``python``/``python3`` becomes this
interpreter), which starts the command on every worker of the gang with the environment
torchrun gives (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``...),
so the Ray Job's driver is always the launcher and a plain ``torch.distributed`` script runs
unchanged. Either way each worker reports that it started (with its pid and node). The
environment carries ``RCP_JOB_ID``, ``RCP_ATTEMPT``,
``RCP_NUM_WORKERS``, ``RCP_GPUS_PER_WORKER``, ``RCP_CPUS_PER_WORKER``, ``RCP_STORAGE_PATH``,
``RCP_NODE_IDS``, the job's checkpoint settings for `jobs.checkpointing`
(``RCP_CHECKPOINT_URI``: its prefix, ``checkpoint.uri`` or ``<storage.uri>/jobs/<job id>``,
where it restores the newest committed step from; ``RCP_STORAGE_ENDPOINT_URL`` (unset for
AWS's own), ``RCP_STORAGE_REGION``, ``RCP_CHECKPOINT_ENABLED``, ``RCP_CHECKPOINT_INTERVAL_S``
(only when set), ``RCP_CHECKPOINT_KEEP_LAST``, ``RCP_MTBF_S``: the gang's MTBF from the
fleet's record, `reliability.job_mtbf_s`), ``RCP_STEP_REPORT_S``, ``RCP_SIGNAL_POLL_S`` and
``RCP_SIGNAL_TOKEN``: a fresh secret per attempt, kept in the job's info (never in events,
logs or the API's view), and registered with the signals actor (as its hash, with the
prefix) before the gang is submitted, so signals from other jobs or older attempts are
refused. No storage credential is in it (the Jobs tab shows it): workers find theirs in the
node's usual AWS sources.

Must not: decide who runs (that is `policies.admission`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import math
import re
import secrets
import shlex
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import Enum
from typing import Any, Protocol

import requests

from controlplane.config import Config
from controlplane.pools import JOB_DRIVER_RESOURCE, Pool, pool_resource
from controlplane.service import reliability
from controlplane.service.checkpoints import CheckpointReader, CommittedStep
from controlplane.service.tokens import ensure_token
from controlplane.store import (
    TERMINAL_STATES,
    IllegalTransition,
    InvalidJob,
    JobRecord,
    JobState,
    StaleState,
    Store,
    UnknownJob,
)
from jobs import launcher, signals
from jobs.checkpoint.memory_tiers import DEFAULT_NAMESPACE
from jobs.signals import token_sha256
from jobs.spec import JOBS_AREA
from policies.plan import AdmitJob, PreemptJob
from policies.restarts import (
    AttemptFailure,
    FailureKind,
    Restart,
    RestartLimits,
    RestartRecord,
    decide_restart,
    failure_signature,
)

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

TICK_WAIT_S = 2.0
"""The most one `JobRunner.reconcile` waits for checkpoint reads and stack fetches, all jobs
together (they run on worker threads; one still running is picked up by a later tick)."""
MAX_ATTEMPTS_KEPT = 100
"""Attempt ends kept in a job's info (``attempts``, newest last)."""
ATTEMPT_REASON_CHARS = 400
"""The most of a log tail kept as an attempt's end reason (its last characters)."""
SIGNATURE_TAIL_CHARS = 4000
"""The log tail a failure's signature is taken from (`policies.restarts.failure_signature`)."""
STACK_MAX_CHARS = 64 << 10
"""The most of one worker's stacks kept (the start: the stacks of its threads, main first)."""
STACK_MAX_RANKS = 64
"""Ranks whose stacks a hang fetches (lowest first); more are named, not fetched."""
STACK_FETCH_THREADS = 8
STACKS_DEADLINE_S = 20.0
"""The most all stack fetches of one hang take; a rank not answered by then shows why."""
STACK_REQUEST_TIMEOUT_S = (2.0, 15.0)
"""(connect, read) timeout of one ``/worker/traceback`` request (py-spy runs in between)."""
HANG_HEADER = "=== attempt {attempt}: hang: stacks of the workers (py-spy via Ray) ==="
MEMORY_TIER_NAMESPACE = DEFAULT_NAMESPACE
"""Where `jobs.checkpoint.RayMemoryTier` names a job's holder actors ``<job id>/...``: the
runner lists them by that prefix, so every holder of the job goes, whatever its rank."""
MEMORY_TIER_SWEEP_JOBS = 100
"""Jobs whose leftover holder actors one sweep checks (`JobRunner.sweep_memory_tiers`)."""

_REQUEUE_INFO: Mapping[str, Any] = {
    "preempting": None,
    "preempt_checkpoint": None,
    "preempt_kind": None,
    "stopping": None,
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
    GANG_FAILED = "gang-failed"
    GANG_HUNG = "gang-hung"
    PREEMPT_ENDED = "gang-ended-while-preempting"


class AttemptEnd(str, Enum):
    """How an attempt ended: the ``kind`` of each entry of a job's ``attempts`` info."""

    CRASH = "crash"
    HANG = "hang"
    PREEMPTED = "preempted"
    HEALTH = "health"
    START_FAILED = "start-failed"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    MAX_RUNTIME = "max-runtime"
    LOST = "lost"


def entrypoint_command(entrypoint: str, python: str = sys.executable) -> str:
    """The Ray Job entrypoint for a spec's entrypoint (see the module doc), with `python` the
    cluster's interpreter::

        "pkg.train:loop"            -> "<python> -m jobs.launcher pkg.train:loop"
        "python train.py --lr 3e-4" -> "<python> -m jobs.launcher --command -- <python> train.py --lr 3e-4"
        "bash run.sh 'a b'"         -> "<python> -m jobs.launcher --command -- bash run.sh 'a b'"

    A command is split into words as a POSIX shell splits them (quotes honoured, nothing
    expanded or chained: for pipes, ``&&`` or ``$VAR`` run ``bash -c '...'``) and each word is
    quoted again. ValueError for an empty command or an unbalanced quote."""
    ep = entrypoint.strip()
    run_launcher = f"{shlex.quote(python)} -m jobs.launcher"
    if _FUNCTION_RE.match(ep):
        return f"{run_launcher} {ep}"
    try:
        argv = shlex.split(ep)
    except ValueError as exc:
        raise ValueError(f"entrypoint {entrypoint!r} cannot be split into words: {exc}") from None
    if not argv:
        raise ValueError("the entrypoint is empty: give a command or module:function")
    if argv[0] in ("python", "python3"):
        argv[0] = python
    return f"{run_launcher} {launcher.COMMAND_FLAG} -- {shlex.join(argv)}"


class Signals(Protocol):
    def register_signals(self, job_id: str, attempt: int, token_hash: str, prefix: str) -> None: ...
    def signal_status(self, job_id: str) -> dict[str, Any]: ...
    def request_checkpoint(self, job_id: str, at_s: float) -> None: ...
    def clear_request(self, job_id: str) -> None: ...
    def forget_signals(self, job_id: str) -> None: ...
    def worker_stack(self, pid: int, node_id: str) -> str: ...
    def memory_tier_jobs(self) -> set[str]: ...
    def kill_memory_tier(self, job_id: str) -> int: ...


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

    def worker_stack(self, pid: int, node_id: str) -> str:
        """The Python stacks of worker process `pid` on node `node_id` (hex) and of its child
        processes, as py-spy dumps them through Ray's dashboard (`fetch_worker_stack`), with
        the dashboard client's own auth headers. The head must run with
        ``RAY_DASHBOARD_ENABLE_PROFILING=1`` (local mode sets it); else Ray answers 403."""
        headers = dict(getattr(self.client, "_headers", None) or {})
        return fetch_worker_stack(self.dashboard_url, pid, node_id, headers=headers)

    def memory_tier_jobs(self) -> set[str]:
        """Job ids that hold memory-tier actors (``<job id>/...`` in `MEMORY_TIER_NAMESPACE`)."""
        return {name.partition("/")[0] for name in self._memory_tier_names()}

    def kill_memory_tier(self, job_id: str) -> int:
        """Kill every memory-tier actor of `job_id` (`clear_job_memory_tier`); how many."""
        from jobs.checkpoint.memory_tiers import clear_job_memory_tier

        return clear_job_memory_tier(job_id, namespace=MEMORY_TIER_NAMESPACE)

    def _memory_tier_names(self) -> list[str]:
        import ray

        names = []
        for actor in ray.util.list_named_actors(all_namespaces=True):
            name = str(actor.get("name", ""))
            if actor.get("namespace") == MEMORY_TIER_NAMESPACE and "/" in name.strip("/"):
                names.append(name)
        return names


def fetch_worker_stack(
    dashboard_url: str,
    pid: int,
    node_id: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: tuple[float, float] = STACK_REQUEST_TIMEOUT_S,
    max_chars: int = STACK_MAX_CHARS,
) -> str:
    """``GET <dashboard>/worker/traceback?pid=&node_id=&subprocesses=1``: Ray's dashboard has
    the node's agent run ``py-spy dump`` on the process and its children. At most `max_chars`
    of the answer are read (a line then says the rest was cut); every request has a (connect,
    read) timeout. RuntimeError naming the HTTP status and the start of the body when Ray
    answers anything but 200 (403: profiling is off on the head)."""
    params = {"pid": str(int(pid)), "node_id": node_id, "subprocesses": "1"}
    with requests.get(
        f"{dashboard_url}/worker/traceback",
        params=params,
        headers=dict(headers or {}),
        timeout=timeout_s,
        stream=True,
    ) as resp:
        raw: bytes = resp.raw.read(4 * max_chars + 1, decode_content=True)
        text = raw.decode("utf-8", errors="replace")
        if resp.status_code != 200:
            raise RuntimeError(f"the dashboard answered {resp.status_code}: {text[:300].strip()}")
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[rcp: cut here: the first {max_chars} characters are kept]"
    return text


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


class _Background:
    """Work the tick must not wait on for long (checkpoint reads from storage, stack fetches
    through Ray's dashboard) on worker threads, keyed by what it is for. The tick starts it,
    waits a bounded time (`wait`) and takes what finished (`take`); work still running is
    taken by a later tick and never started twice. Results are plain data: every decision
    stays on the tick thread."""

    def __init__(self, max_workers: int = 4) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers, thread_name_prefix="rcp-runner-io"
        )
        self._pending: dict[tuple[str, ...], concurrent.futures.Future[Any]] = {}

    def start(self, key: tuple[str, ...], fn: Callable[..., Any], *args: Any) -> None:
        if key not in self._pending:
            self._pending[key] = self._pool.submit(fn, *args)

    def pending(self, key: tuple[str, ...]) -> bool:
        return key in self._pending

    def wait(self, keys: Iterable[tuple[str, ...]], deadline_s: float) -> None:
        """Until every future of `keys` is done or `deadline_s` (``time.monotonic``) passed."""
        futures = [self._pending[k] for k in keys if k in self._pending]
        if futures:
            concurrent.futures.wait(futures, timeout=max(0.0, deadline_s - time.monotonic()))

    def take(self, key: tuple[str, ...]) -> tuple[bool, Any, BaseException | None]:
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


class JobRunner:
    """A job's life after admission (see the module doc). Every method is idempotent."""

    def __init__(
        self,
        store: Store,
        cfg: Config,
        ray_jobs: Any,
        clock: Callable[[], float] = time.time,
        checkpoints: CheckpointReader | None = None,
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.ray = ray_jobs
        if isinstance(ray_jobs, RayJobs) and ray_jobs.store is None:
            ray_jobs.store = store  # where the signals actor's id is pinned
        self.clock = clock
        self.checkpoints = checkpoints or CheckpointReader(cfg)
        self._submissions = _Submissions()
        self._work = _Background()
        self._next_scan_s: dict[str, float] = {}
        """When each running job's committed steps are read again (`_read_checkpoints`)."""
        self._hint_scanned: dict[str, int] = {}
        """The step a job's hint named when it last triggered an early read."""
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
                "checkpoint_uri": self.checkpoint_uri(job),
                # The committed step this attempt starts from (progress is measured from it).
                "start_step": _info_step(job.info.get("checkpoint")),
                "progress": None,
                "preempting": None,
                "preempt_checkpoint": None,
                "preempt_kind": None,
                "stopping": None,
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

    def checkpoint_uri(self, job: JobRecord) -> str:
        """The job's checkpoint prefix: ``checkpoint.uri``, else ``<storage.uri>/jobs/<job
        id>``. The signals actor refuses checkpoint hints outside it; the controller reads
        committed steps there; the job writes and restores only there."""
        if job.spec.checkpoint.uri:
            return job.spec.checkpoint.uri.rstrip("/")
        area = f"{self.cfg.storage.uri.rstrip('/')}/{JOBS_AREA}"
        return signals.checkpoint_prefix(area, job.job_id)

    def _uri_of(self, job: JobRecord) -> str:
        """The prefix recorded at admission (a job admitted before it was recorded: now)."""
        uri = job.info.get("checkpoint_uri")
        return uri if isinstance(uri, str) and uri else self.checkpoint_uri(job)

    def _register_signals(self, job: JobRecord) -> None:
        """Tell the signals actor this attempt's token (as its hash) and checkpoint prefix."""
        self.ray.register_signals(
            job.job_id,
            int(job.info["attempt"]),
            token_sha256(str(job.info[SIGNAL_TOKEN_INFO])),
            self._uri_of(job),
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
        c = s.checkpoint
        env: dict[str, str] = {
            str(k): str(v) for k, v in dict(s.runtime_env.get("env_vars") or {}).items()
        }
        mtbf_s = reliability.job_mtbf_s(self.store, self.cfg, s.gpus_total, self.clock())
        env.update(
            {
                signals.ENV_JOB_ID: job.job_id,
                signals.ENV_ATTEMPT: str(job.info["attempt"]),
                signals.ENV_SIGNAL_POLL_S: f"{self.cfg.jobs.job_signal_poll_s:g}",
                signals.ENV_CHECKPOINT_URI: self._uri_of(job),
                signals.ENV_STORAGE_REGION: self.cfg.storage.region,
                signals.ENV_CHECKPOINT_ENABLED: "1" if c.enabled else "0",
                signals.ENV_CHECKPOINT_KEEP_LAST: str(c.keep_last),
                signals.ENV_MTBF_S: f"{mtbf_s:.1f}",
                signals.ENV_STEP_REPORT_S: f"{self.cfg.jobs.step_report_interval_s:g}",
                launcher.ENV_NUM_WORKERS: str(s.num_workers),
                launcher.ENV_GPUS_PER_WORKER: str(s.gpus_per_worker),
                launcher.ENV_CPUS_PER_WORKER: f"{s.cpus_per_worker:g}",
                launcher.ENV_STORAGE_PATH: str(self.cfg.train_storage_path),
                launcher.ENV_NODE_IDS: ",".join(sorted(job.info.get("placement") or {})),
                **ray_connection_env(),
            }
        )
        endpoint = self.cfg.storage_endpoint_url
        if endpoint:
            env[signals.ENV_STORAGE_ENDPOINT_URL] = endpoint
        if c.interval_s is not None:
            env[signals.ENV_CHECKPOINT_INTERVAL_S] = f"{c.interval_s:g}"
        if job.info.get(SIGNAL_TOKEN_INFO):
            env[signals.ENV_SIGNAL_TOKEN] = str(job.info[SIGNAL_TOKEN_INFO])
        runtime_env = {k: v for k, v in s.runtime_env.items() if k != "env_vars"}
        runtime_env["env_vars"] = env
        if s.working_dir:
            runtime_env["working_dir"] = s.working_dir
        return entrypoint_command(s.entrypoint), runtime_env

    def preempt(self, action: PreemptJob) -> None:
        job = self.store.get(action.job_id)
        if job.state not in (JobState.ADMITTED, JobState.RUNNING) or job.info.get("preempting"):
            return
        if job.info.get("stopping"):
            return  # a hung gang is being stopped already; it re-queues once stopped
        now = self.clock()
        ask = (
            action.checkpoint_first
            and job.spec.checkpoint.enabled
            and job.state is JobState.RUNNING
        )
        deadline = now + (job.spec.checkpoint.preempt_deadline_s if ask else 0.0)
        # Admission names the job it frees GPUs for; the health remediation (the only other
        # source of PreemptJob) names none: it moves the gang off a bad node.
        kind = AttemptEnd.PREEMPTED if action.for_job_id else AttemptEnd.HEALTH
        self.store.update_info(
            job.job_id,
            {
                "preempting": True,
                "preempt_requested_s": now,
                "preempt_deadline_s": deadline,
                "preempt_for": action.for_job_id,
                "preempt_reason": action.reason,
                "preempt_kind": kind.value,
                "preempt_checkpoint": None,
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
        """Move every job that holds (or held) a gang along, from what Ray, the signals actor
        and object storage say.

        Reads active jobs only (by index): ADMITTED, RUNNING, PREEMPTED, and finished jobs
        whose Ray Job may still run. Never the finished jobs of the past. Waits at most
        `TICK_WAIT_S` for storage reads and stack fetches, all jobs together. One job's error
        is logged and never stops the others.
        """
        deadline_s = time.monotonic() + TICK_WAIT_S
        jobs = self.store.list_jobs(states=[JobState.ADMITTED, JobState.RUNNING])
        sigs = {job.job_id: self._signals(job) for job in jobs}
        jobs = self._read_checkpoints(jobs, sigs, deadline_s)
        for job in jobs:
            try:
                self._reconcile_one(job, sigs[job.job_id], deadline_s)
            except (StaleState, IllegalTransition):
                continue  # someone (a cancel) moved it meanwhile; next tick sees it
            except Exception:
                log.exception("reconciling job %s failed; retried next tick", job.job_id)
        live = {job.job_id for job in jobs}
        self._work.drop(lambda key: key[1] in live)
        for table in (self._next_scan_s, self._hint_scanned):
            for job_id in set(table) - live:
                del table[job_id]
        for job in self.store.list_jobs(states=[JobState.PREEMPTED]):
            try:
                self._requeue_stranded(job)
            except (StaleState, IllegalTransition):
                continue
        scan = self.store.scan_jobs(
            states=[JobState.CANCELLED, JobState.FAILED], unsettled_only=True
        )
        for job in scan.jobs:
            try:
                self._stop_ended(job)
            except Exception:
                log.exception("stopping the Ray Job of ended job %s failed", job.job_id)
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
            try:
                self.sweep_memory_tiers()
            except Exception as exc:
                log.warning("memory tier sweep failed: %s", exc)

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

    def sweep_memory_tiers(self) -> list[str]:
        """Kill the memory-tier actors of jobs that have ended (SUCCEEDED, FAILED, CANCELLED)
        or that the store no longer holds (pruned): those a job left when it was cancelled
        while queued between attempts, or when the controller stopped before cleaning up at
        the job's end. At most `MEMORY_TIER_SWEEP_JOBS` jobs per sweep. Returns their ids."""
        cleaned = []
        for job_id in sorted(self.ray.memory_tier_jobs())[:MEMORY_TIER_SWEEP_JOBS]:
            try:
                ended = self.store.get(job_id).state in TERMINAL_STATES
            except UnknownJob:
                ended = True
            except InvalidJob:
                continue  # its state is unreadable: leave it to an operator
            if ended:
                self._clear_memory_tier(job_id)
                cleaned.append(job_id)
        return cleaned

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

    def _clear_memory_tier(self, job_id: str) -> None:
        """Kill the job's memory-tier actors (best effort: a failure is logged; the periodic
        sweep tries again)."""
        try:
            killed = self.ray.kill_memory_tier(job_id)
        except Exception as exc:
            log.warning("memory tier of %s: cleanup failed: %s", job_id, exc)
            return
        if killed:
            log.info("memory tier of %s: %d holder actor(s) killed", job_id, killed)

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
            return sig if isinstance(sig, dict) else {}
        except Exception as exc:
            log.warning("job signals unavailable for %s: %s", job.job_id, exc)
            return {}

    # -- committed checkpoints, read from storage -------------------------------------------

    def _read_checkpoints(
        self, jobs: list[JobRecord], sigs: Mapping[str, Mapping[str, Any]], deadline_s: float
    ) -> list[JobRecord]:
        """Start the storage reads that are due (see `_read_wanted`), wait for them until
        `deadline_s`, and record what came back; returns `jobs` as they are now."""
        now = self.clock()
        keys = []
        for job in jobs:
            key = ("scan", job.job_id)
            if self._work.pending(key):
                keys.append(key)
                continue
            wanted = self._read_wanted(job, sigs.get(job.job_id) or {}, now)
            if wanted is None:
                continue
            after, hint = wanted
            self._work.start(key, self._read, self._uri_of(job), after, hint)
            self._next_scan_s[job.job_id] = now + self.cfg.jobs.checkpoint_scan_interval_s
            keys.append(key)
        self._work.wait(keys, deadline_s)
        out = []
        for job in jobs:
            done, result, error = self._work.take(("scan", job.job_id))
            if done:
                job = self._record_read(job, result, error, self.clock())
            out.append(job)
        return out

    def _read_wanted(
        self, job: JobRecord, sig: Mapping[str, Any], now: float
    ) -> tuple[int | None, int | None] | None:
        """``(known step, hinted step to check)`` when a read is due, else None: every tick
        while preempting (until a committed answer is found), every
        ``jobs.checkpoint_scan_interval_s`` for a RUNNING job, and sooner when the job's hint
        (its checkpoint report or its progress' committed step) names a step newer than the
        one recorded (once per hinted step: a job that keeps lying costs one read per lie)."""
        known = _info_step(job.info.get("checkpoint"))
        attempt = job.info.get("attempt")
        if job.info.get("preempting"):
            if job.info.get("stop_sent") or job.info.get("preempt_checkpoint") is not None:
                return None
            return known, self._answering_hint(job, sig)
        if job.state is not JobState.RUNNING:
            return None
        if now >= self._next_scan_s.get(job.job_id, 0.0):
            return known, None
        hinted = [_hint_step(sig.get("checkpoint"), attempt)]
        progress = _progress_of(sig, attempt)
        hinted.append(progress.get("committed_step") if progress else None)
        newest = max((h for h in hinted if h is not None), default=None)
        fresh = newest is not None and (known is None or newest > known)
        if fresh and newest is not None and self._hint_scanned.get(job.job_id) != newest:
            self._hint_scanned[job.job_id] = newest
            return known, None
        return None

    def _answering_hint(self, job: JobRecord, sig: Mapping[str, Any]) -> int | None:
        """The step of a checkpoint this attempt reported for the pending request (under its
        prefix), to verify in storage; None when it reported none."""
        ckpt = sig.get("checkpoint")
        if not isinstance(ckpt, Mapping) or not ckpt.get("answers_request"):
            return None
        if not signals.under_prefix(str(ckpt.get("path")), self._uri_of(job)):
            log.warning("job %s: ignoring checkpoint hint outside its prefix", job.job_id)
            return None
        return _hint_step(ckpt, job.info.get("attempt"))

    def _read(
        self, prefix: str, after: int | None, hint: int | None
    ) -> tuple[CommittedStep | None, CommittedStep | None]:
        """(worker thread) The newest step committed after `after`, and `hint`'s commit."""
        newest = self.checkpoints.newest(prefix, after)
        hinted = None
        if hint is not None:
            hinted = newest if newest is not None and newest.step == hint else None
            hinted = hinted or self.checkpoints.committed(prefix, hint)
        return newest, hinted

    def _record_read(
        self, job: JobRecord, result: Any, error: BaseException | None, now: float
    ) -> JobRecord:
        """Record a read's newest committed step (``checkpoint``) and, while preempting, the
        step that answers the request (``preempt_checkpoint``): one the job reported for it
        whose manifest is in storage, or any committed after the request."""
        if error is not None:
            log.warning(
                "job %s: reading committed checkpoints from %s failed (read again later): %s",
                job.job_id,
                self._uri_of(job),
                error,
            )
            return job
        newest, hinted = result
        found = [c for c in (newest, hinted) if c is not None]
        updates: dict[str, Any] = {}
        best = max(found, key=lambda c: c.step, default=None)
        known = _info_step(job.info.get("checkpoint"))
        if best is not None and (known is None or best.step > known):
            updates["checkpoint"] = best.to_info(now)
        if job.info.get("preempting") and job.info.get("preempt_checkpoint") is None:
            asked_s = _finite(job.info.get("preempt_requested_s"))
            if hinted is not None:
                updates["preempt_checkpoint"] = hinted.step
            elif newest is not None and asked_s is not None and newest.committed_unix_s >= asked_s:
                updates["preempt_checkpoint"] = newest.step
        if not updates:
            return job
        try:
            return self.store.update_info(job.job_id, updates)
        except UnknownJob:
            return job

    # -- one job's tick -------------------------------------------------------------------

    def _reconcile_one(self, job: JobRecord, sig: Mapping[str, Any], deadline_s: float) -> None:
        now = self.clock()
        sid = job.info["submission_id"]
        attempt = int(job.info["attempt"])
        progress = _progress_of(sig, attempt)
        if progress is not None:
            shown = {k: progress[k] for k in PROGRESS_INFO_KEYS}
            if shown != job.info.get("progress"):
                job = self.store.update_info(job.job_id, {"progress": shown})
        status = self.ray.status(sid)

        if job.info.get("preempting"):
            self._preempting(job, status, now)
            return
        if job.info.get("stopping"):
            self._stopping(job, status, now)
            return
        if status is RayJobStatus.SUCCEEDED:
            if job.state is JobState.ADMITTED:
                self.store.transition(job.job_id, JobState.RUNNING, Reason.GANG_RUNNING.value)
            self._finish(
                job, JobState.SUCCEEDED, Reason.RAY_JOB_SUCCEEDED.value, AttemptEnd.SUCCEEDED
            )
            return
        if status in (RayJobStatus.FAILED, RayJobStatus.STOPPED):
            text = self._log_text(sid)
            message = _tail_of(text, ATTEMPT_REASON_CHARS)
            if job.state is JobState.ADMITTED:
                why = (
                    Reason.RAY_JOB_FAILED
                    if status is RayJobStatus.FAILED
                    else Reason.RAY_JOB_STOPPED
                )
                self._start_failed(job, f"{why.value}: {message}")
            elif status is RayJobStatus.STOPPED:
                reason = f"{Reason.RAY_JOB_STOPPED.value}: {message}"
                self._finish(job, JobState.FAILED, reason, AttemptEnd.FAILED, {"message": message})
            else:
                signature = failure_signature(
                    _tail_of(text, SIGNATURE_TAIL_CHARS), (sid, job.job_id)
                )
                self._gang_failed(job, FailureKind.CRASH, message, signature, now)
            return
        limit = job.spec.max_runtime_s
        if limit is not None and now - float(job.info["admitted_s"]) > limit:
            # Backfill relied on this bound: enforce it. The stop completes in the background.
            self.ray.stop(sid)
            reason = f"{Reason.MAX_RUNTIME.value} ({limit:g}s)"
            info = {"stop_sent": now, "placement": None}
            info.update(self._attempt_end(job, AttemptEnd.MAX_RUNTIME, reason, now))
            self.store.transition(job.job_id, JobState.FAILED, reason, info=info)
            return
        if job.state is JobState.RUNNING and status is RayJobStatus.MISSING:
            # The cluster lost the Ray Job (e.g. `rcp down` then `up`): run it again from its
            # latest checkpoint rather than leave it RUNNING forever. The cluster's doing, not
            # the job's: no restart is spent.
            info = {**_REQUEUE_INFO}
            info.update(self._attempt_end(job, AttemptEnd.LOST, Reason.GANG_LOST.value, now))
            self.store.transition(
                job.job_id,
                JobState.QUEUED,
                Reason.GANG_LOST.value,
                expected=JobState.RUNNING,
                info=info,
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
            return
        self._watch(job, sig, progress, now, deadline_s)

    # -- the hang watchdog ----------------------------------------------------------------

    def _watch(
        self,
        job: JobRecord,
        sig: Mapping[str, Any],
        progress: Mapping[str, Any] | None,
        now: float,
        deadline_s: float,
    ) -> None:
        """A RUNNING gang whose step has not grown for its stall timeout is hung: fetch every
        rank's stacks (worker threads, `STACKS_DEADLINE_S` in all; the tick waits for them at
        most until `deadline_s` and takes them on a later tick otherwise), then `_hung`.
        Armed once the attempt reported a step."""
        if progress is None:
            return
        timeout_s = job.spec.stall_timeout_s or self.cfg.jobs.stall_timeout_s
        stalled_s = now - float(progress["step_at_s"])
        key = ("stacks", job.job_id, str(job.info["attempt"]))
        if stalled_s <= timeout_s:
            return
        if not self._work.pending(key):
            log.warning(
                "job %s: no new step for %.0fs (stall_timeout_s=%g); fetching its stacks",
                job.job_id,
                stalled_s,
                timeout_s,
            )
            workers = sig.get("workers")
            workers = dict(workers) if isinstance(workers, Mapping) else {}
            self._work.start(key, self._fetch_stacks, workers)
        self._work.wait([key], deadline_s)
        done, stacks, error = self._work.take(key)
        if not done:
            return  # still fetching: a later tick finishes the job
        if error is not None:
            stacks = f"(fetching the stacks failed: {error})\n"
        self._hung(job, int(progress["step"]), stalled_s, timeout_s, str(stacks), now)

    def _fetch_stacks(self, workers: Mapping[Any, Any]) -> str:
        """(worker thread) Every rank's stacks through Ray (`RayJobs.worker_stack`), in
        parallel, `STACKS_DEADLINE_S` in all; one block per rank, lowest rank first."""
        ranks: list[tuple[int, Mapping[str, Any]]] = []
        for rank, worker in workers.items():
            try:
                number = int(rank)
            except (TypeError, ValueError):
                continue
            ranks.append((number, worker if isinstance(worker, Mapping) else {}))
        ranks.sort(key=lambda rw: rw[0])
        fetched, skipped = ranks[:STACK_MAX_RANKS], ranks[STACK_MAX_RANKS:]
        pool = concurrent.futures.ThreadPoolExecutor(
            max(1, min(STACK_FETCH_THREADS, len(fetched))), thread_name_prefix="rcp-stacks"
        )
        futures: dict[int, concurrent.futures.Future[str]] = {}
        for rank, worker in fetched:
            pid, node_id = worker.get("pid"), worker.get("node_id")
            if isinstance(pid, int) and not isinstance(pid, bool) and isinstance(node_id, str):
                futures[rank] = pool.submit(self.ray.worker_stack, pid, node_id)
        concurrent.futures.wait(futures.values(), timeout=STACKS_DEADLINE_S)
        pool.shutdown(wait=False, cancel_futures=True)
        blocks = []
        for rank, worker in fetched:
            future = futures.get(rank)
            if future is None:
                text = "(no stack: the worker reported no pid and node)"
            elif not future.done():
                text = f"(no stack: no answer within {STACKS_DEADLINE_S:g}s)"
            elif future.exception() is not None:
                text = f"(no stack: {future.exception()})"
            else:
                text = future.result()[:STACK_MAX_CHARS]
            where = f"pid {worker.get('pid')}, node {worker.get('node_id')}"
            blocks.append(f"--- rank {rank} ({where}) ---\n{text.rstrip()}\n")
        if not ranks:
            blocks.append("(no stacks: no worker reported its pid)\n")
        if skipped:
            blocks.append(f"({len(skipped)} more ranks not fetched: at most {STACK_MAX_RANKS})\n")
        return "".join(blocks)

    def _hung(
        self,
        job: JobRecord,
        step: int,
        stalled_s: float,
        timeout_s: float,
        stacks: str,
        now: float,
    ) -> None:
        """Keep the stacks with the attempt's log, count the hang, and stop the gang; it is
        re-queued as a restart (or FAILED) once Ray says it ended (`_stopping`). Written in
        that order, so a restarted controller neither loses the stop nor counts it twice."""
        attempt = int(job.info["attempt"])
        reason = f"no new step for {stalled_s:.0f}s at step {step} (stall_timeout_s={timeout_s:g})"
        note = HANG_HEADER.format(attempt=attempt) + "\n" + stacks
        self.store.put_attempt_note(job.job_id, attempt, note)
        hangs = (_count(job.info.get("hangs")) or 0) + 1
        stopping = {"kind": AttemptEnd.HANG.value, "reason": reason, "at_s": now}
        job = self.store.update_info(job.job_id, {"stopping": stopping, "hangs": hangs})
        self.store.record_event(
            "job.hung",
            f"job {job.job_id}: hung: {reason}; the workers' stacks are in its log (attempt "
            f"{attempt}); stopping it to restart from its last committed checkpoint",
            job_id=job.job_id,
            data={
                "attempt": attempt,
                "step": step,
                "stalled_s": round(stalled_s, 3),
                "stall_timeout_s": timeout_s,
            },
        )
        try:
            reliability.record_failure(self.store, "gang-hang", now)
        except Exception as exc:
            log.warning("recording the hang of %s in the fleet record failed: %s", job.job_id, exc)
        self.ray.stop(job.info["submission_id"])
        self.store.update_info(job.job_id, {"stop_sent": now})

    def _stopping(self, job: JobRecord, status: RayJobStatus, now: float) -> None:
        """A hung gang being stopped: once Ray says it ended, a restart (or FAILED)."""
        stopping = job.info.get("stopping")
        reason = str(stopping.get("reason")) if isinstance(stopping, Mapping) else "hung"
        if status is RayJobStatus.SUCCEEDED:
            self._finish(
                job, JobState.SUCCEEDED, Reason.RAY_JOB_SUCCEEDED.value, AttemptEnd.SUCCEEDED
            )
        elif status in _ENDED or status is RayJobStatus.MISSING:
            self._gang_failed(job, FailureKind.HANG, reason, "hang without progress", now)
        elif not job.info.get("stop_sent"):
            self.ray.stop(job.info["submission_id"])
            self.store.update_info(job.job_id, {"stop_sent": now})

    # -- ends of attempts ---------------------------------------------------------------------

    def _gang_failed(
        self, job: JobRecord, kind: FailureKind, message: str, signature: str, now: float
    ) -> None:
        """A RUNNING gang crashed or hung: restart it after a backoff (RUNNING -> QUEUED, one
        transaction with its info) or FAIL the job, as `policies.restarts` decides."""
        progress = job.info.get("progress") if isinstance(job.info.get("progress"), Mapping) else {}
        failure = AttemptFailure(
            kind=kind,
            message=message,
            signature=signature,
            committed_step=_info_step(job.info.get("checkpoint")),
            start_step=_count(job.info.get("start_step")),
            reported_step=_count((progress or {}).get("step")),
        )
        last = job.info.get("last_failure")
        last = last if isinstance(last, Mapping) else {}
        record = RestartRecord(
            restarts=_count(job.info.get("restarts")) or 0,
            last_signature=last.get("signature")
            if isinstance(last.get("signature"), str)
            else None,
            committed_at_last_failure=_count(last.get("committed_step")),
        )
        j = self.cfg.jobs
        limits = RestartLimits(
            job.spec.max_restarts, j.restart_backoff_initial_s, j.restart_backoff_max_s
        )
        decision, record = decide_restart(failure, record, limits)
        if kind is FailureKind.CRASH and failure.reported_step is not None:
            # Counted for the fleet's MTBF only once the gang trained: a script that fails
            # before its first step is the script's fault, not the cluster's.
            try:
                reliability.record_failure(self.store, "gang-crash", now)
            except Exception as exc:
                log.warning("recording the crash of %s failed: %s", job.job_id, exc)
        info: dict[str, Any] = {
            "restarts": record.restarts,
            "last_failure": {
                "signature": record.last_signature,
                "committed_step": record.committed_at_last_failure,
            },
            "message": message,
        }
        why = Reason.GANG_HUNG if kind is FailureKind.HANG else Reason.GANG_FAILED
        if isinstance(decision, Restart):
            end = AttemptEnd.HANG if kind is FailureKind.HANG else AttemptEnd.CRASH
            info.update(_REQUEUE_INFO)
            info.update(self._attempt_end(job, end, f"{kind.value}: {message}", now))
            info["not_before_s"] = now + decision.after_s
            self.store.transition(
                job.job_id,
                JobState.QUEUED,
                f"{why.value}: {decision.reason}",
                expected=JobState.RUNNING,
                info=info,
            )
            return
        self._finish(
            job, JobState.FAILED, f"{why.value}: {decision.reason}", AttemptEnd.FAILED, info
        )

    def _preempting(self, job: JobRecord, status: RayJobStatus, now: float) -> None:
        """Stop the gang once the checkpoint answering the request is committed in storage
        (``preempt_checkpoint``, `_record_read`) or the deadline passed; once Ray says it
        ended, PREEMPTED -> QUEUED in one transaction. No restart is spent, even when the gang
        failed meanwhile (a node lost under a health move)."""
        sid = job.info["submission_id"]
        verified = _count(job.info.get("preempt_checkpoint"))
        if status is RayJobStatus.SUCCEEDED:
            self._clear_request(job.job_id)
            if job.state is JobState.ADMITTED:
                self.store.transition(job.job_id, JobState.RUNNING, Reason.GANG_RUNNING.value)
            self._finish(
                job,
                JobState.SUCCEEDED,
                f"{Reason.RAY_JOB_SUCCEEDED.value} while preempting",
                AttemptEnd.SUCCEEDED,
            )
            return
        if status in _ENDED or status is RayJobStatus.MISSING:
            if verified is not None:
                why = (
                    f"{Reason.CHECKPOINTED_FOR_PREEMPTION.value} at step {verified} "
                    "(its manifest is in storage)"
                )
            elif job.info.get("stop_sent"):
                why = f"{Reason.PREEMPT_DEADLINE.value}: stopped without a new committed checkpoint"
            else:
                why = f"{Reason.PREEMPT_ENDED.value} ({status.value}), before a new checkpoint"
            reason = f"{why}; {job.info.get('preempt_reason') or 'preempted'}"
            self._clear_request(job.job_id)
            kind = (
                AttemptEnd.HEALTH
                if job.info.get("preempt_kind") == "health"
                else AttemptEnd.PREEMPTED
            )
            info = {**_REQUEUE_INFO, **self._attempt_end(job, kind, reason, now)}
            self.store.requeue(
                job.job_id, reason, Reason.REQUEUED.value, info=info, expected=[job.state]
            )
            return
        deadline = _finite(job.info.get("preempt_deadline_s")) or 0.0
        if not job.info.get("stop_sent") and (verified is not None or now >= deadline):
            self.ray.stop(sid)
            self.store.update_info(job.job_id, {"stop_sent": now})

    def _clear_request(self, job_id: str) -> None:
        try:
            self.ray.clear_request(job_id)
        except Exception as exc:
            log.warning("job signals: clearing the request of %s failed: %s", job_id, exc)

    def _start_failed(self, job: JobRecord, reason: str) -> None:
        failures = int(job.info.get("start_failures", 0)) + 1
        j = self.cfg.jobs
        now = self.clock()
        end = self._attempt_end(job, AttemptEnd.START_FAILED, reason, now)
        if failures >= j.max_start_attempts:
            info = {"start_failures": failures, "message": reason, **end}
            self._finish(
                job, JobState.FAILED, f"{reason}; gave up after {failures} attempts", None, info
            )
            return
        backoff = min(j.backoff_max_s, j.backoff_initial_s * 2 ** (failures - 1))
        self.store.transition(
            job.job_id,
            JobState.QUEUED,
            f"{reason}; retry in {backoff:g}s",
            expected=JobState.ADMITTED,
            info={
                "start_failures": failures,
                "not_before_s": now + backoff,
                "placement": None,
                "message": reason,
                "ray_done": True,
                "progress": None,
                **end,
            },
        )

    def _attempt_end(
        self, job: JobRecord, kind: AttemptEnd, reason: str, now: float
    ) -> dict[str, Any]:
        """The info that records how the current attempt ended: its entry in ``attempts``
        (newest last, at most `MAX_ATTEMPTS_KEPT`), its checkpoint stall and wall seconds
        added to the totals, its ``progress`` cleared. {} once recorded (idempotent)."""
        attempt = _count(job.info.get("attempt"))
        if not attempt:
            return {}
        raw = job.info.get("attempts")
        attempts = [a for a in raw if isinstance(a, Mapping)] if isinstance(raw, list) else []
        if attempts and attempts[-1].get("attempt") == attempt:
            return {}
        progress = job.info.get("progress")
        progress = progress if isinstance(progress, Mapping) else {}
        attempts.append(
            {
                "attempt": attempt,
                "admitted_s": _finite(job.info.get("admitted_s")),
                "ended_s": now,
                "kind": kind.value,
                "reason": reason[-ATTEMPT_REASON_CHARS:],
                "step": _count(progress.get("step")),
            }
        )
        totals = {}
        for key in ("stall_s", "wall_s"):
            before = _finite(job.info.get(f"{key}_total")) or 0.0
            totals[f"{key}_total"] = before + (_finite(progress.get(key)) or 0.0)
        return {"attempts": attempts[-MAX_ATTEMPTS_KEPT:], "progress": None, **totals}

    def _finish(
        self,
        job: JobRecord,
        state: JobState,
        reason: str,
        kind: AttemptEnd | None,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        """The job ends with its Ray Job: `state`, the attempt's end (`kind`), the signals
        actor forgets it and its memory tier goes."""
        merged: dict[str, Any] = {**(info or {}), "ray_done": True, "placement": None}
        if kind is not None:
            merged.update(self._attempt_end(job, kind, reason, self.clock()))
        self.store.transition(job.job_id, state, reason, info=merged)
        self.forget(job.job_id)
        self._clear_memory_tier(job.job_id)

    def _stop_ended(self, job: JobRecord) -> None:
        """Stop the Ray Job of a job that ended without it (cancelled, over its runtime);
        once Ray says it ended, the job is settled: the attempt's end recorded (cancelled),
        the signals actor told to forget it, its memory tier killed."""
        sid = job.info["submission_id"]
        status = self.ray.status(sid)
        if status in _ENDED or status is RayJobStatus.MISSING:
            info: dict[str, Any] = {"ray_done": True, "placement": None}
            if job.state is JobState.CANCELLED:
                info.update(self._attempt_end(job, AttemptEnd.CANCELLED, "cancelled", self.clock()))
            self.store.update_info(job.job_id, info)
            self.forget(job.job_id)
            self._clear_memory_tier(job.job_id)
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
            self._clear_memory_tier(job_id)
        elif not info.get("stop_sent"):
            self.ray.stop(sid)
            self.store.merge_raw_info(job_id, {"stop_sent": self.clock()})

    def _log_text(self, sid: str) -> str:
        try:
            return str(self.ray.logs(sid))
        except Exception:
            return ""

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
        """One attempt's part of the log: a header line, then its (capped) log, then what the
        control plane kept with the attempt (a hung gang's stacks, `Store.put_attempt_note`,
        written before the attempt ends, so an ended attempt's part never changes)."""
        sid = f"{job.job_id}-{attempt}"
        ended = self._ended(job, attempt)
        part = f"=== attempt {attempt} (Ray job {sid}) ===\n{self._attempt_log(sid, ended)}"
        note = self.store.attempt_note(job.job_id, attempt)
        if note:
            part += ("" if part.endswith("\n") else "\n") + note
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


PROGRESS_INFO_KEYS = ("step", "step_at_s", "stall_s", "wall_s")
"""What ``info["progress"]`` keeps of the signals actor's progress record."""
MAX_STEP = 10**12
"""Steps at or above this are not believed (the checkpoint layout's step width)."""


def _count(value: Any) -> int | None:
    """An int in [0, `MAX_STEP`), else None (bools, floats and strings are not counts)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_STEP:
        return None
    return value


def _finite(value: Any) -> float | None:
    """A finite number >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _reported_step(value: Any) -> int | None:
    """A step the signals actor passed on as a number: its progress stats are floats
    (``committed_step`` 99 arrives as 99.0); an integral finite one in range, else None."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return _count(value)


def _info_step(value: Any) -> int | None:
    """The step of ``info["checkpoint"]`` when it is one the controller read from storage
    (an older runner stored the loop's word there, without ``read_s``: not believed)."""
    if not isinstance(value, Mapping) or "read_s" not in value:
        return None
    return _count(value.get("step"))


def _hint_step(value: Any, attempt: Any) -> int | None:
    """The step of the signals actor's checkpoint hint, when it is this attempt's."""
    if not isinstance(value, Mapping) or value.get("attempt") != attempt:
        return None
    return _count(value.get("step"))


def _progress_of(sig: Mapping[str, Any], attempt: Any) -> dict[str, Any] | None:
    """This attempt's progress from the signals actor, checked: ``step`` a count,
    ``step_at_s`` a finite time, ``stall_s``/``wall_s`` finite (else 0), ``committed_step`` a
    count or None. None (the watchdog stays unarmed) for anything else: another attempt's, no
    step yet, a malformed record."""
    raw = sig.get("progress") if isinstance(sig, Mapping) else None
    if sig.get("attempt") != attempt or not isinstance(raw, Mapping):
        return None
    step, step_at_s = _count(raw.get("step")), _finite(raw.get("step_at_s"))
    if step is None or step_at_s is None:
        return None
    return {
        "step": step,
        "step_at_s": step_at_s,
        "stall_s": _finite(raw.get("stall_s")) or 0.0,
        "wall_s": _finite(raw.get("wall_s")) or 0.0,
        "committed_step": _reported_step(raw.get("committed_step")),
    }


def _tail_of(text: str, chars: int) -> str:
    """The last `chars` of a failed attempt's log; when the launcher named what failed the
    gang (its `launcher.GANG_FAILED_PREFIX` line: the rank, its node and exit code or
    exception), that line instead: the tail is then the other ranks being stopped."""
    text = text.strip()
    if not text:
        return "no logs"
    at = text.rfind(launcher.GANG_FAILED_PREFIX)
    if at >= 0:
        line = text[at + len(launcher.GANG_FAILED_PREFIX) :].split("\n", 1)[0].strip()
        if line:
            return line[-chars:]
    return text[-chars:]


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
