"""The SDK's client: the control plane's API routes as methods, following the API's pages and
quoting names into one path segment each.

Must not: import Ray or the store; send a request but through `Connection._call`/`_once`.
"""

from __future__ import annotations

import builtins
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from controlplane.sdk.connection import Connection
from controlplane.sdk.errors import WaitTimeout
from controlplane.sdk.records import Job, JobList, User
from jobs.spec import JobSpec

__all__ = ["LIST_PAGE", "OPERATIONS_PAGE", "Client"]

LIST_PAGE = 1000
"""Jobs asked for per request when `Client.list` follows the API's pages."""
OPERATIONS_PAGE = 500
"""Nodes (or health rows) asked for per request when the SDK follows the API's pages."""


def _segment(name: str) -> str:
    """`name` as one URL path segment (a ``/`` in it cannot reach another route)."""
    return urllib.parse.quote(name, safe="")


class Client(Connection):
    """A client of the control plane's HTTP API (see `controlplane.sdk.connection` for where
    it looks)."""

    # -- jobs -------------------------------------------------------------------------------

    def submit(self, spec: JobSpec | Mapping[str, Any], idempotency_key: str | None = None) -> Job:
        """Queue a job; with `idempotency_key` a retried call returns the same job."""
        payload = spec.to_dict() if isinstance(spec, JobSpec) else dict(spec)
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        return Job.from_json(self._call("POST", "/v1/jobs", body=payload, headers=headers))

    def dry_run(self, spec: JobSpec | Mapping[str, Any]) -> dict[str, Any]:
        """What the control loop would do with the job were it submitted now: ``admitted``,
        ``code``, ``reason``, ``start_by_s`` (estimated start, or None), ``ahead`` (jobs before
        it in queue order), ``makes_room`` (moves and preemptions it would cause). Nothing is
        queued."""
        payload = spec.to_dict() if isinstance(spec, JobSpec) else dict(spec)
        return dict(self._call("POST", "/v1/jobs/dry-run", body=payload))

    def status(self, job_id: str) -> Job:
        return Job.from_json(self._call("GET", f"/v1/jobs/{urllib.parse.quote(job_id)}"))

    def list(
        self, *, state: str | None = None, queue: str | None = None, limit: int | None = None
    ) -> JobList:
        """Jobs, oldest in the queue first; `state` may list several: ``"QUEUED,RUNNING"``.
        Rows the control plane skips because they no longer validate are in ``.invalid``.
        Follows the API's pages until `limit` jobs (all of them when None) have come."""
        query = {"state": state, "queue": queue}
        pages = builtins.list(self._pages("/v1/jobs", "jobs", limit, LIST_PAGE, query))
        jobs = (Job.from_json(j) for p in pages for j in p["jobs"])
        return JobList(jobs, [r for p in pages for r in p.get("invalid") or ()])

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
        pages = self._pages("/v1/users", "users", None, 1000)
        return [User.from_json(u) for p in pages for u in p["users"]]

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

    def _pages(
        self,
        path: str,
        key: str,
        limit: int | None,
        page_size: int = OPERATIONS_PAGE,
        query: Mapping[str, Any] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """The answers of a paged listing (``?limit=&after=`` -> ``next``), following the
        pages until `limit` rows of `key` (all of them when None) have come."""
        seen, after = 0, None
        while limit is None or seen < limit:
            page = page_size if limit is None else min(page_size, limit - seen)
            data = self._call("GET", path, query={**(query or {}), "limit": page, "after": after})
            seen += len(data[key])
            yield data
            after = data.get("next")
            if not after:
                return

    def nodes(self, limit: int | None = None) -> builtins.list[dict[str, Any]]:
        """Every node: pool, state, GPUs, labels, health, and whether an operator cordoned it
        (``cordon``) or health took it out (``taken_out_s``)."""
        return [row for p in self._pages("/v1/nodes", "nodes", limit) for row in p["nodes"]]

    def health(self) -> dict[str, Any]:
        """``{"nodes": [verdict rows], "taken_out": {...}, "replaced": {...}}``."""
        pages = builtins.list(self._pages("/v1/health", "nodes", None))
        return {**pages[0], "nodes": [row for p in pages for row in p["nodes"]], "next": None}

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
