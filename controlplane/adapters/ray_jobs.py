"""The Ray Jobs adapter: the only runner code that calls Ray's Job Submission API and dashboard.

Owns `RayJobs`, the Ray side of a job's life:

* Ray Job submission, status and stop through the dashboard (``JobSubmissionClient``,
  so every gang shows in the dashboard's Jobs tab), every request with a timeout
  (`dashboard_client`);
* a job driver's log by byte range, from the dashboard agent of the node that writes it
  (`log_slice`, `log_tail`; `driver_logs`): never the whole log;
* a worker's Python stacks through the dashboard (py-spy, `fetch_worker_stack`);
* the memory-tier holder actors of a job (``<job id>/...`` in `MEMORY_TIER_NAMESPACE`);
* the ``rcp-job-signals`` actor (`jobs.signals.mailbox.JobSignals`) that training loops talk to,
  trusted by the actor id pinned in the store (`SIGNALS_ACTOR_KEY`), never by its name.

Must not: decide anything about a job or write a job's record (that is the runner,
`controlplane.loop.act.jobs`, and the modules it drives). It is the runner's one module that
imports ``ray``.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

import ray
import requests
from ray.actor import ActorHandle

from controlplane.adapters.driver_logs import LogSlice, read_driver_log
from controlplane.config import Config
from controlplane.pools import JOB_DRIVER_RESOURCE, Pool, pool_resource
from controlplane.store import Store
from controlplane.tokens import ensure_token
from jobs.checkpoint.memory_tiers import DEFAULT_NAMESPACE, clear_job_memory_tier
from jobs.signals import mailbox, trust
from jobs.storage_credentials import StorageCredentials
from policies.attempts import ENDED, GangStatus

__all__ = [
    "MEMORY_TIER_NAMESPACE",
    "SIGNALS_ACTOR_KEY",
    "SIGNALS_KEY_FILE",
    "LogSlice",
    "RayJobStatus",
    "RayJobs",
    "RayJobsApi",
    "dashboard_client",
    "fetch_worker_stack",
]

if TYPE_CHECKING:  # the SDK itself is imported where a client is made (`dashboard_client`)
    from ray.job_submission import JobSubmissionClient

    from jobs.signals.mailbox import _JobSignals

log = logging.getLogger(__name__)

DASHBOARD_CONNECT_TIMEOUT_S = 5.0
DASHBOARD_READ_TIMEOUT_S = 30.0
"""Every HTTP request to the Ray dashboard (submit, status, stop, list) and to a driver
node's dashboard agent (a log range) gives up after this long without a byte
(`dashboard_client`): a dashboard that accepts a connection and never answers
raises instead of hanging the tick thread, or a submission thread, forever."""
DRIVER_AGENTS_KEPT = 10_000
"""Attempts whose driver's dashboard agent `RayJobs` remembers (oldest out)."""
STACK_MAX_CHARS = 64 << 10
"""The most of one worker's stacks kept (the start: the stacks of its threads, main first)."""
STACK_REQUEST_TIMEOUT_S = (2.0, 15.0)
"""(connect, read) timeout of one ``/worker/traceback`` request (py-spy runs in between)."""


RayJobStatus = GangStatus
"""A Ray Job's status as this adapter reports it: the vocabulary `policies.attempts` decides
on (MISSING: no Ray Job with that submission id)."""

MEMORY_TIER_NAMESPACE = DEFAULT_NAMESPACE
"""Where `jobs.checkpoint.RayMemoryTier` names a job's holder actors ``<job id>/...``: the
runner lists them by that prefix, so every holder of the job goes, whatever its rank."""


class RayJobsApi(Protocol):
    """What the runner asks of Ray (`RayJobs`; the unit tests hand in a fake)."""

    def submit(
        self, submission_id: str, entrypoint: str, runtime_env: Mapping[str, Any]
    ) -> None: ...
    def status(self, submission_id: str) -> RayJobStatus: ...
    def stop(self, submission_id: str) -> None: ...
    def log_slice(self, submission_id: str, start: int, max_bytes: int) -> LogSlice: ...
    def log_tail(self, submission_id: str, max_bytes: int) -> LogSlice: ...
    def rcp_submissions(self) -> dict[str, RayJobStatus]: ...
    def register_signals(self, job_id: str, attempt: int, token_hash: str, prefix: str) -> None: ...
    def put_storage_credentials(
        self, job_id: str, attempt: int, credentials: StorageCredentials
    ) -> bool: ...
    def signal_status(self, job_id: str) -> dict[str, Any]: ...
    def request_checkpoint(self, job_id: str, at_s: float) -> None: ...
    def clear_request(self, job_id: str) -> None: ...
    def forget_signals(self, job_id: str) -> None: ...
    def forget_signals_many(self, job_ids: list[str]) -> None: ...
    def worker_stack(self, pid: int, node_id: str) -> str: ...
    def memory_tier_jobs(self) -> set[str]: ...
    def kill_memory_tier(self, job_id: str) -> int: ...


SIGNALS_KEY_FILE = "job-signals.key"
"""Under state_dir: the signals actor's admin key (0600)."""
SIGNALS_ACTOR_KEY = "jobs.signals_actor"
"""Store key: ``{"actor_id", "salt"}`` of the signals actor this controller created."""


def dashboard_client(
    address: str,
    connect_timeout_s: float = DASHBOARD_CONNECT_TIMEOUT_S,
    read_timeout_s: float = DASHBOARD_READ_TIMEOUT_S,
) -> JobSubmissionClient:
    """A ``JobSubmissionClient`` for `address` whose every HTTP request has a timeout.

    Ray's client sends each request with ``requests.request(...)`` and no timeout; its
    ``_do_request`` hands extra keyword arguments to ``requests.request``, so a subclass adds
    ``timeout=(connect, read)`` there (a caller's own ``timeout`` wins). Construction (Ray's
    version check) goes through it too. A timeout raises ``requests.exceptions.Timeout``."""
    # Deferred: the Job Submission SDK adds ~0.6 s to an import on top of ray, and only a live
    # controller makes a client (the unit tests' fakes never do).
    from ray.job_submission import JobSubmissionClient

    class DashboardClient(JobSubmissionClient):
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
    fresh nonce and the call (`jobs.signals.trust.admin_auth`): the admin key stays here.
    """

    def __init__(self, cfg: Config, store: Store | None = None) -> None:
        self.cfg = cfg
        self.store = store
        self.dashboard_url = f"http://{cfg.ray.node_ip}:{cfg.ray.dashboard_port}"
        self._client: JobSubmissionClient | None = None
        self.http_timeout_s = (DASHBOARD_CONNECT_TIMEOUT_S, DASHBOARD_READ_TIMEOUT_S)
        """(connect, read) timeouts of every dashboard request (`dashboard_client`)."""
        self._signals: ActorHandle[_JobSignals] | None = None
        self._signals_key: str | None = None
        self._secret: str | None = None
        self._call_lock = threading.Lock()
        self._last_nonce = 0
        self._agents_lock = threading.Lock()
        self._driver_agents: dict[str, str] = {}
        """Submission id -> its driver's dashboard agent (`_driver_agent`), oldest first."""

    @property
    def client(self) -> JobSubmissionClient:
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

    def signals_actor(self) -> ActorHandle[_JobSignals]:
        """The ``rcp-job-signals`` actor this controller created (see the class doc). A new
        one has a fresh salt; the runner then registers every admitted job again
        (`controlplane.loop.act.jobs.runner.JobRunner._signals`)."""
        if self._signals is not None:
            return self._signals
        pin = self._pinned()
        try:
            found: ActorHandle[_JobSignals] | None = ray.get_actor(
                mailbox.SIGNALS_ACTOR_NAME, namespace=mailbox.SIGNALS_NAMESPACE
            )
        except ValueError:
            found = None
        if found is not None and pin.get("actor_id") == found._actor_id.hex() and pin.get("salt"):
            self._secret = trust.derive_admin_secret(self.signals_key(), pin["salt"])
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
        secret = trust.derive_admin_secret(self.signals_key(), salt)
        options = {
            "name": mailbox.SIGNALS_ACTOR_NAME,
            "namespace": mailbox.SIGNALS_NAMESPACE,
            "lifetime": "detached",
            "resources": {pool_resource(Pool.HEAD): 1},
        }
        deadline_s = time.monotonic() + 10
        handle: ActorHandle[_JobSignals]
        while True:
            try:
                # Ray's stubs type this as a handle or the class itself; it is the handle.
                handle = cast(
                    "ActorHandle[_JobSignals]", mailbox.JobSignals.options(**options).remote(secret)
                )
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
        try:
            handle = self.signals_actor()
            assert self._secret is not None  # set with the handle
            with self._call_lock:  # nonces reach the actor in the order they were made
                self._last_nonce = max(self._last_nonce + 1, time.time_ns())
                auth = trust.admin_auth(self._secret, self._last_nonce, method, args)
                ref = getattr(handle, method).remote(*args, auth=auth)
            return ray.get(ref, timeout=10)
        except (ray.exceptions.RayActorError, PermissionError):
            # Killed, or not the actor's secret (it restarted with another's args?): find (and
            # check) or make it again on the next call.
            self._signals = None
            raise

    def register_signals(self, job_id: str, attempt: int, token_hash: str, prefix: str) -> None:
        self._signals_call("register", job_id, attempt, token_hash, prefix)

    def put_storage_credentials(
        self, job_id: str, attempt: int, credentials: StorageCredentials
    ) -> bool:
        """Hand the signals actor `attempt`'s scoped storage credentials (signed like every
        admin call); False: the actor holds another attempt or none."""
        return bool(self._signals_call("put_credentials", job_id, attempt, credentials))

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
            # Only Ray's own answer for a job it does not hold ("Job <id> does not exist",
            # 404). Any other 404 (a dashboard coming back with the head, a proxy in front)
            # says nothing about the job: taking it for MISSING would re-queue a live gang.
            if "does not exist" in str(exc):
                return RayJobStatus.MISSING
            raise

    def stop(self, submission_id: str) -> None:
        try:
            self.client.stop_job(submission_id)
        except RuntimeError as exc:
            if "does not exist" not in str(exc):
                raise

    def log_tail(self, submission_id: str, max_bytes: int) -> LogSlice:
        """The last `max_bytes` of the job driver's log, with its size (as `log_slice`)."""
        return self.log_slice(submission_id, None, max_bytes)

    def log_slice(self, submission_id: str, start: int | None, max_bytes: int) -> LogSlice:
        """At most `max_bytes` of the job driver's log from byte `start` (None: its last
        bytes; `read_driver_log`), with the log's size. No such job, or no driver yet: an
        empty slice of size 0."""
        agent = self._driver_agent(submission_id)
        if agent is None:
            return LogSlice(b"", start or 0, 0)
        headers = dict(getattr(self.client, "_headers", None) or {})
        return read_driver_log(
            agent,
            submission_id,
            start=start,
            max_bytes=max_bytes,
            headers=headers,
            timeout_s=self.http_timeout_s,
        )

    def _driver_agent(self, submission_id: str) -> str | None:
        """The dashboard agent (``http://ip:port``) of the node whose job supervisor writes
        the driver's log: Ray records it once the driver starts, and it never changes, so it
        is asked once per attempt (kept for `DRIVER_AGENTS_KEPT` attempts)."""
        with self._agents_lock:
            known = self._driver_agents.get(submission_id)
        if known is not None:
            return known
        try:
            info = self.client.get_job_info(submission_id)
        except RuntimeError:  # no such job
            return None
        agent = getattr(info, "driver_agent_http_address", None)
        if not agent:
            return None
        with self._agents_lock:
            self._driver_agents[submission_id] = str(agent)
            while len(self._driver_agents) > DRIVER_AGENTS_KEPT:
                self._driver_agents.pop(next(iter(self._driver_agents)))
        return str(agent)

    def rcp_submissions(self) -> dict[str, RayJobStatus]:
        """Every Ray Job this control plane submitted (metadata ``rcp_job``) that has not
        ended, by submission id."""
        out: dict[str, RayJobStatus] = {}
        for details in self.client.list_jobs():
            if "rcp_job" not in dict(getattr(details, "metadata", None) or {}):
                continue
            sid = getattr(details, "submission_id", None)
            status = RayJobStatus(str(getattr(details, "status", "")).split(".")[-1])
            if sid and status not in ENDED:
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
        return clear_job_memory_tier(job_id, namespace=MEMORY_TIER_NAMESPACE)

    def _memory_tier_names(self) -> list[str]:
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
