"""The researcher's SDK: submit, watch and cancel training jobs through the control plane's API.

Owns: finding the API and its token, the HTTP calls, and typed errors carrying the server's
message. Nothing else (no Ray, no store)::

    from controlplane import Client, JobSpec

    client = Client()                      # RCP_API_URL/RCP_API_TOKEN, else ~/.rcp's files
    job = client.submit(JobSpec(name="ft", entrypoint="python train.py", num_workers=2))
    job = client.wait(job.id, timeout_s=3600)
    print(job.state, client.logs(job.id))

Where the URL and token come from, first found wins: the arguments; ``RCP_API_URL`` and
``RCP_API_TOKEN``; the files ``api-url`` and ``api-token`` in the state dir (``RCP_STATE_DIR``,
default ``~/.rcp``), which `rcp up` writes.
"""

from __future__ import annotations

import builtins
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.spec import JobSpec

__all__ = [
    "ApiError",
    "Attempt",
    "AuthError",
    "Client",
    "ConflictError",
    "Forbidden",
    "Job",
    "JobList",
    "JobNotFound",
    "NotConfigured",
    "SpecRejected",
    "TERMINAL_STATES",
    "User",
    "WaitTimeout",
]

TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})
ENV_URL = "RCP_API_URL"
ENV_TOKEN = "RCP_API_TOKEN"
ENV_STATE_DIR = "RCP_STATE_DIR"


class ApiError(Exception):
    """The API refused a request or could not be reached. `status` 0 means unreachable."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message if field is None else f"{message} (field: {field})")
        self.status = status
        self.message = message
        self.field = field
        self.retry_after_s: float | None = None
        """A 429's ``Retry-After``: how long the server asked the client to wait."""


class NotConfigured(ApiError):
    """No API URL or token could be found."""


class AuthError(ApiError):
    """401: missing, wrong, expired, rotated or removed token (and, as `Forbidden`, 403)."""


class Forbidden(AuthError):
    """403: the token is fine but its user may not do this (the message says what is missing:
    a role, a queue binding, or ownership of the job)."""


class SpecRejected(ApiError):
    """400/422: the spec (or a parameter) is invalid; `field` names it."""


class JobNotFound(ApiError):
    """404: no such job."""


class ConflictError(ApiError):
    """409: e.g. cancelling a finished job, or an idempotency key reused for another spec."""


class WaitTimeout(ApiError):
    """`wait` gave up before the job finished."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: SpecRejected,
    401: AuthError,
    403: Forbidden,
    404: JobNotFound,
    409: ConflictError,
    422: SpecRejected,
}


@dataclass(frozen=True)
class Attempt:
    """How one attempt of a job ended (`Job.attempts`, newest last)."""

    attempt: int | None
    kind: str
    """crash, hang, preempted, health, start-failed, succeeded, failed, cancelled,
    max-runtime or lost; crash and hang spend one of the job's ``max_restarts``."""
    reason: str
    ended_s: float | None = None
    admitted_s: float | None = None
    step: int | None = None
    """The last step the attempt reported (None: none)."""
    checkpoint_step: int | None = None
    """The committed step the next attempt resumes from, as the control plane read it from
    object storage when this attempt ended (for a preemption: the step that answered it)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Attempt:
        return cls(
            attempt=data.get("attempt"),
            kind=str(data.get("kind", "")),
            reason=str(data.get("reason", "")),
            ended_s=data.get("ended_s"),
            admitted_s=data.get("admitted_s"),
            step=data.get("step"),
            checkpoint_step=data.get("checkpoint_step"),
        )


@dataclass(frozen=True)
class Job:
    """A job as the API reports it.

    Checkpoints and restarts: `last_checkpoint` is the newest committed step as the control
    plane read it from object storage (``{"step", "uri", "committed_unix_s", "age_s"}``, the
    age as of the request; None: no checkpoint committed yet). `checkpoint_overhead_pct` is the
    training time spent stalled on checkpoints over wall time, in percent (None before any
    wall time). `restarts` of `max_restarts` have been used (crashes and hangs; a preemption
    or a move by node health spends none). `attempts` (only from `Client.status`) say how each
    attempt ended. `progress` is the running attempt's ``{"step", "step_at_s", "step_age_s",
    "stall_s", "wall_s"}``: its step and when the step last grew."""

    id: str
    state: str
    name: str
    queue: str
    priority_class: str
    num_workers: int
    gpus_per_worker: int
    submitted_s: float
    owner: str | None = None
    """The user who submitted it (None: a job from before users)."""
    num_preemptions: int = 0
    attempt: int = 0
    ray_job_id: str | None = None
    last_checkpoint: Mapping[str, Any] | None = None
    checkpoint_uri: str | None = None
    checkpoint_overhead_pct: float | None = None
    restarts: int = 0
    max_restarts: int | None = None
    hangs: int = 0
    progress: Mapping[str, Any] | None = None
    attempts: tuple[Attempt, ...] = ()
    message: str | None = None
    history: tuple[Mapping[str, Any], ...] = ()
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def last_committed_step(self) -> int | None:
        """The newest committed checkpoint step (None: none committed yet)."""
        return None if not self.last_checkpoint else self.last_checkpoint.get("step")

    @property
    def checkpoint_age_s(self) -> float | None:
        """Seconds since the newest checkpoint committed, as of the request."""
        return None if not self.last_checkpoint else self.last_checkpoint.get("age_s")

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        return cls(
            id=data["id"],
            state=data["state"],
            name=data["name"],
            queue=data["queue"],
            priority_class=data["priority_class"],
            num_workers=data["num_workers"],
            gpus_per_worker=data["gpus_per_worker"],
            submitted_s=data["submitted_s"],
            owner=data.get("owner"),
            num_preemptions=data.get("num_preemptions", 0),
            attempt=data.get("attempt", 0),
            ray_job_id=data.get("ray_job_id"),
            last_checkpoint=data.get("last_checkpoint"),
            checkpoint_uri=data.get("checkpoint_uri"),
            checkpoint_overhead_pct=data.get("checkpoint_overhead_pct"),
            restarts=data.get("restarts", 0),
            max_restarts=data.get("max_restarts"),
            hangs=data.get("hangs", 0),
            progress=data.get("progress"),
            attempts=tuple(Attempt.from_json(a) for a in data.get("attempts") or ()),
            message=data.get("message"),
            history=tuple(data.get("history", ())),
            raw=dict(data),
        )


LIST_PAGE = 1000
"""Jobs asked for per request when `Client.list` follows the API's pages."""
OPERATIONS_PAGE = 500
"""Nodes (or health rows) asked for per request when the SDK follows the API's pages."""


def _segment(name: str) -> str:
    """`name` as one URL path segment (a ``/`` in it cannot reach another route)."""
    return urllib.parse.quote(name, safe="")


@dataclass(frozen=True)
class User:
    """A user of the API (`Client.users_list`). `token` is set only in the answer of
    `Client.users_add` and `Client.users_rotate_token`: the one time it is shown."""

    name: str
    role: str
    queues: tuple[str, ...]
    created_s: float
    rotated_s: float
    expires_s: float | None = None
    token: str | None = field(default=None, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> User:
        return cls(
            name=str(data["name"]),
            role=str(data["role"]),
            queues=tuple(data.get("queues") or ()),
            created_s=float(data["created_s"]),
            rotated_s=float(data["rotated_s"]),
            expires_s=data.get("expires_s"),
            token=data.get("token"),
        )


class JobList(list[Job]):
    """The jobs of a listing, plus `invalid`: stored rows the control plane skips because they
    no longer validate, each ``{"id", "state", "error"}`` (see `rcp status`)."""

    def __init__(self, jobs: Iterator[Job] | builtins.list[Job], invalid: Any = ()) -> None:
        super().__init__(jobs)
        self.invalid: builtins.list[dict[str, Any]] = [dict(r) for r in invalid]


def _state_dir() -> Path:
    return Path(os.environ.get(ENV_STATE_DIR, "~/.rcp")).expanduser()


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def _seconds(header: str | None) -> float | None:
    """A ``Retry-After`` of whole seconds (an HTTP date or anything odd: None)."""
    value = (header or "").strip()
    return float(value) if value.isascii() and value.isdigit() else None


class Client:
    """A client of the control plane's HTTP API (see the module doc for where it looks)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        state_dir: str | Path | None = None,
        timeout_s: float = 30.0,
        retries: int = 5,
    ) -> None:
        sdir = Path(state_dir).expanduser() if state_dir is not None else _state_dir()
        found_url = url or os.environ.get(ENV_URL) or _read(sdir / "api-url")
        found_token = token or os.environ.get(ENV_TOKEN) or _read(sdir / "api-token")
        if not found_url:
            raise NotConfigured(
                0,
                f"no control-plane API URL: pass url=, set {ENV_URL}, or start one with "
                f"`rcp up` (looked in {sdir / 'api-url'})",
            )
        if not found_token:
            raise NotConfigured(
                0,
                f"no API token: pass token=, set {ENV_TOKEN}, or read it from "
                f"{sdir / 'api-token'} (written by `rcp up`)",
            )
        self.url = found_url.rstrip("/")
        self._token = found_token
        self.timeout_s = timeout_s
        self.retries = retries
        """Retries of a request that could not reach the server, only where repeating it is
        safe: reads, and submissions with an idempotency key."""

    def __repr__(self) -> str:  # never show the token
        return f"Client(url={self.url!r})"

    # -- plumbing ---------------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        url = self.url + path
        if query:
            clean = {k: v for k, v in query.items() if v is not None}
            if clean:
                url += "?" + urllib.parse.urlencode(clean)
        data = None if body is None else json.dumps(body).encode()
        safe = method == "GET" or bool(headers and headers.get("Idempotency-Key"))
        for attempt in range(1 + self.retries):
            try:
                return self._once(method, url, data, headers)
            except ApiError as exc:
                # 429 (the user's rate limit, too many log reads at once) is refused before
                # anything happens, so any request may be sent again, after Retry-After; 0
                # (unreachable: the server may be restarting) only a request that is safe to.
                retry = exc.status == 429 or (exc.status == 0 and safe)
                if not retry or attempt == self.retries:
                    raise
                wait_s = exc.retry_after_s if exc.retry_after_s is not None else 0.25 * 2**attempt
                time.sleep(min(4.0, wait_s))
        raise AssertionError("unreachable")

    def _once(
        self, method: str, url: str, data: bytes | None, headers: Mapping[str, str] | None
    ) -> Any:
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self._token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                payload = json.loads(raw)
                message, fld = str(payload.get("error", raw)), payload.get("field")
            except (ValueError, AttributeError):
                message, fld = raw.decode(errors="replace") or str(exc), None
            error = _BY_STATUS.get(exc.code, ApiError)(exc.code, message, fld)
            error.retry_after_s = _seconds(exc.headers.get("Retry-After"))
            raise error from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ApiError(
                0, f"cannot reach the control plane at {self.url}: {reason}; is it up (`rcp up`)?"
            ) from exc

    # -- jobs -------------------------------------------------------------------------------

    def submit(self, spec: JobSpec | Mapping[str, Any], idempotency_key: str | None = None) -> Job:
        """Queue a job; with `idempotency_key` a retried call returns the same job."""
        payload = spec.to_dict() if isinstance(spec, JobSpec) else dict(spec)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return Job.from_json(self._call("POST", "/v1/jobs", body=payload, headers=headers))

    def status(self, job_id: str) -> Job:
        return Job.from_json(self._call("GET", f"/v1/jobs/{urllib.parse.quote(job_id)}"))

    def list(
        self, *, state: str | None = None, queue: str | None = None, limit: int | None = None
    ) -> JobList:
        """Jobs, oldest in the queue first; `state` may list several: ``"QUEUED,RUNNING"``.
        Rows the control plane skips because they no longer validate are in ``.invalid``.

        The API answers in pages (`LIST_PAGE` jobs each); this follows them until `limit` jobs
        (all of them when None) have come."""
        jobs: builtins.list[Job] = []
        invalid: builtins.list[Any] = []
        after: str | None = None
        while limit is None or len(jobs) < limit:
            page = LIST_PAGE if limit is None else min(LIST_PAGE, limit - len(jobs))
            query = {"state": state, "queue": queue, "limit": page, "after": after}
            data = self._call("GET", "/v1/jobs", query=query)
            jobs += (Job.from_json(j) for j in data["jobs"])
            invalid += data.get("invalid") or ()
            after = data.get("next")
            if not after:
                break
        return JobList(jobs, invalid)

    def cancel(self, job_id: str) -> Job:
        return Job.from_json(self._call("POST", f"/v1/jobs/{urllib.parse.quote(job_id)}/cancel"))

    def wait(self, job_id: str, timeout_s: float = 3600.0, poll_s: float = 1.0) -> Job:
        """Poll until the job is SUCCEEDED, FAILED or CANCELLED; WaitTimeout after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.status(job_id)
            if job.done:
                return job
            if time.monotonic() >= deadline:
                raise WaitTimeout(
                    0, f"job {job_id} is still {job.state} after {timeout_s:g}s", None
                )
            time.sleep(poll_s)

    def logs(self, job_id: str, follow: bool = False, poll_s: float = 1.0) -> str | Iterator[str]:
        """The job's logs so far; with ``follow=True`` an iterator of new chunks until it ends.

        Both read from an offset, one bounded chunk a request: a follower asks only for what
        it has not seen, and a long log comes in several requests rather than one huge one.
        """
        if follow:
            return self._follow(job_id, poll_s)
        parts = []
        offset = 0
        while True:
            data = self._log_chunk(job_id, offset)
            parts.append(str(data["logs"]))
            offset = int(data["next_offset"])
            if not data["logs"] or offset >= int(data.get("size", offset)):
                return "".join(parts)

    def _log_chunk(self, job_id: str, offset: int) -> dict[str, Any]:
        path = f"/v1/jobs/{urllib.parse.quote(job_id)}/logs"
        return dict(self._call("GET", path, query={"offset": offset}))

    def _follow(self, job_id: str, poll_s: float) -> Iterator[str]:
        offset = 0
        while True:
            data = self._log_chunk(job_id, offset)
            if data["logs"]:
                yield str(data["logs"])
            offset = int(data["next_offset"])
            if data["done"]:
                return
            if offset >= int(data.get("size", offset)):
                time.sleep(poll_s)  # caught up: wait for more; behind: read on at once

    def events(
        self, *, after: int = 0, job_id: str | None = None, limit: int | None = None
    ) -> builtins.list[dict[str, Any]]:
        data = self._call(
            "GET", "/v1/events", query={"after": after, "job_id": job_id, "limit": limit}
        )
        return list(data["events"])

    # -- users ------------------------------------------------------------------------------

    def whoami(self) -> dict[str, Any]:
        """``{"name", "role", "queues"}`` of the token this client sends."""
        return dict(self._call("GET", "/v1/whoami"))

    def users_list(self) -> builtins.list[User]:
        """Every user, by name (follows the API's pages). Admins only."""
        users: builtins.list[User] = []
        after: str | None = None
        while True:
            data = self._call("GET", "/v1/users", query={"limit": 1000, "after": after})
            users += (User.from_json(u) for u in data["users"])
            after = data.get("next")
            if not after:
                return users

    def users_add(
        self,
        name: str,
        role: str,
        queues: Iterable[str] = (),
        *,
        expires_in_s: float | None = None,
    ) -> User:
        """A new user bound to `queues`; the answer's `token` is shown this once. Admins only."""
        body: dict[str, Any] = {"name": name, "role": role, "queues": list(queues)}
        if expires_in_s is not None:
            body["expires_in_s"] = expires_in_s
        return User.from_json(self._call("POST", "/v1/users", body=body))

    def users_remove(self, name: str) -> User:
        """Remove the user: their token stops at once. Admins only; not the last admin."""
        return User.from_json(self._call("DELETE", f"/v1/users/{urllib.parse.quote(name)}"))

    def users_rotate_token(self, name: str, *, expires_in_s: float | None = None) -> User:
        """A new token for the user (in the answer's `token`); the old one stops at once."""
        body = {} if expires_in_s is None else {"expires_in_s": expires_in_s}
        path = f"/v1/users/{urllib.parse.quote(name)}/rotate-token"
        return User.from_json(self._call("POST", path, body=body))

    # -- operations: nodes, health, serving, the policy actor ------------------------------
    # Reads need READ; everything that changes something needs an operator (403 otherwise).

    def _pages(self, path: str, key: str, limit: int | None) -> builtins.list[dict[str, Any]]:
        """Rows of a paged listing (``?limit=&after=`` -> ``next``), following the pages."""
        rows: builtins.list[dict[str, Any]] = []
        after: str | None = None
        while limit is None or len(rows) < limit:
            page = OPERATIONS_PAGE if limit is None else min(OPERATIONS_PAGE, limit - len(rows))
            data = self._call("GET", path, query={"limit": page, "after": after})
            rows += data[key]
            after = data.get("next")
            if not after:
                break
        return rows

    def nodes(self, limit: int | None = None) -> builtins.list[dict[str, Any]]:
        """Every node: pool, state, GPUs, labels, health, and whether an operator cordoned it
        (``cordon``) or health took it out (``taken_out_s``)."""
        return self._pages("/v1/nodes", "nodes", limit)

    def health(self) -> dict[str, Any]:
        """``{"nodes": [verdict rows], "taken_out": {...}, "replaced": {...}}``."""
        data = dict(self._call("GET", "/v1/health", query={"limit": OPERATIONS_PAGE}))
        rows = list(data["nodes"])
        after = data.get("next")
        while after:
            more = self._call("GET", "/v1/health", query={"limit": OPERATIONS_PAGE, "after": after})
            rows += more["nodes"]
            after = more.get("next")
        data["nodes"], data["next"] = rows, None
        return data

    def clear_node(self, node: str) -> dict[str, Any]:
        """Forget NODE's lemon record (id, or a unique prefix or suffix)."""
        return dict(self._call("POST", f"/v1/health/{_segment(node)}/clear"))

    def cordon(self, node: str, reason: str) -> dict[str, Any]:
        """Cordon NODE by hand: nothing new lands there; serving moves off it."""
        path = f"/v1/nodes/{_segment(node)}/cordon"
        return dict(self._call("POST", path, body={"reason": reason}))

    def uncordon(self, node: str, reason: str | None = None) -> dict[str, Any]:
        body = {} if not reason else {"reason": reason}
        return dict(self._call("POST", f"/v1/nodes/{_segment(node)}/uncordon", body=body))

    def breaker(self) -> dict[str, Any]:
        """The removal breaker: open, since, window, removals in it, held nodes, budget."""
        return dict(self._call("GET", "/v1/health/breaker"))

    def reset_breaker(self, reason: str | None = None) -> dict[str, Any]:
        """Close the breaker; ``was`` is its state before."""
        body = {} if not reason else {"reason": reason}
        return dict(self._call("POST", "/v1/health/breaker/reset", body=body))

    def serve_status(self) -> dict[str, Any]:
        """The serving plane per model and pool, with the policy actor's pause and pins."""
        return dict(self._call("GET", "/v1/serve"))

    def inject_fault(self, node: str, kind: str) -> dict[str, Any]:
        """Simulated telemetry only: NODE reports KIND from its next sample on."""
        return dict(self._call("POST", "/v1/faults", body={"node": node, "kind": kind}))

    def policy(self) -> dict[str, Any]:
        """``{"paused", "pause", "pins", "cordons"}``."""
        return dict(self._call("GET", "/v1/policy"))

    def pause(self, reason: str) -> dict[str, Any]:
        """Pause the policy actor: no new moves, admissions or removals until `resume`."""
        return dict(self._call("POST", "/v1/policy/pause", body={"reason": reason}))

    def resume(self, reason: str | None = None) -> dict[str, Any]:
        body = {} if not reason else {"reason": reason}
        return dict(self._call("POST", "/v1/policy/resume", body=body))

    def pin(self, model: str, pool: str) -> dict[str, Any]:
        """Keep MODEL's replicas in POOL (``cluster`` or ``external``) until `unpin`."""
        path = f"/v1/serve/models/{_segment(model)}/pin"
        return dict(self._call("POST", path, body={"pool": pool}))

    def unpin(self, model: str) -> dict[str, Any]:
        return dict(self._call("DELETE", f"/v1/serve/models/{_segment(model)}/pin"))

    def healthy(self) -> bool:
        """One quick look at /healthz (no retries)."""
        try:
            return bool(self._once("GET", self.url + "/healthz", None, None).get("ok"))
        except ApiError:
            return False
