"""The control plane's HTTP API (JSON, bearer-token auth), served by aiohttp.

Owns: routes, authentication (`controlplane.api.identity`), authorization (every route
registered with the action it needs, `access.add_route`: 403 before the handler runs), per-user
rate limits (429 with ``Retry-After``, `controlplane.api.ratelimit`), the audit (every
authenticated request but GET/HEAD on a named route records one ``audit.<route>`` event,
whatever the outcome), request parsing and the JSON error shape: ``{"error": "<what to fix>",
"field": "<the field or header at fault, or null>", "request_id": "<id>"}``, the id also in
``X-Request-Id``. A handler that raises anything else answers 500 with the same shape and a
message of its own (the exception goes to the log under the request id).

Bodies are untrusted: larger than ``api.max_body_bytes`` is 413; they are read with the Serve
endpoint's strict reader (`serve.inputs.loads_json`), so NaN/Infinity, nesting deeper than
`serve.inputs.MAX_JSON_DEPTH` and integers past Python's digit limit are 400, never 500.

Routes (all but /healthz need ``Authorization: Bearer <token>``; the action each needs in
brackets, `access.ROLE_ACTIONS` says which roles have it):

=======  ===========================  ===========================================================
POST     /v1/jobs                     [submit] a job spec (JSON), owned by the caller, to a queue
                                      they are bound to (else 403); ``Idempotency-Key`` header
                                      optional, one caller's own. 201 new, 200 when the key
                                      matched an earlier job of the caller's.
POST     /v1/jobs/dry-run             [submit] a job spec: what admission would do with it now
                                      (``admitted``, ``code``, ``reason``, ``start_by_s``,
                                      ``ahead``, ``makes_room``); nothing is stored
GET      /v1/jobs                     [read] list; ``?state=QUEUED,RUNNING&queue=q&limit=n&after=c``:
                                      a page of at most n (default 1000) jobs, ``next`` the
                                      cursor of the next page (``after``), null at the end
GET      /v1/jobs/{id}                [read] one job with its state history
POST     /v1/jobs/{id}/cancel         [cancel] a researcher only their own job (else 403 naming
                                      the owner); operators and admins any job
GET      /v1/jobs/{id}/logs           [read] driver logs: ``?offset=n&limit=m`` returns at most m
                                      (and 1 MiB) bytes from n, ``next_offset``, ``size``.
                                      At most `MAX_CONCURRENT_LOG_READS` at once, on their own
                                      threads; past that 429 with ``Retry-After``.
GET      /v1/events                   [read] events; ``?after=seq&job_id=id&limit=n``; of
                                      the ``audit.*`` events a researcher gets only their own
GET      /v1/whoami                   [read] ``{"name", "role", "queues", "shares"}`` of the
                                      caller: ``shares`` per queue it may submit to, the
                                      share, nominal GPUs, GPUs held, jobs running and
                                      queued, all and the caller's own (``mine``)
GET      /v1/users                    [manage-users] ``?limit=n&after=name``: a page of users
                                      by name (default 100), ``next``; never a token or hash
POST     /v1/users                    [manage-users] ``{"name", "role", "queues",
                                      "expires_in_s"?}``: 201 with the user and its ``token``,
                                      shown this once; 409 if the name is taken
DELETE   /v1/users/{name}             [manage-users] remove; the token stops at once. 409 for
                                      the last admin who can sign in, or whose token never
                                      expires (`controlplane.store.users`)
POST     /v1/users/{name}/rotate-token
                                      [manage-users] ``{"expires_in_s"?}`` or no body: a new
                                      ``token``, shown this once; the old one stops at once.
                                      409 for an expiry on the last admin whose token never
                                      expires
GET      /healthz                     liveness, no auth: 200 ``{"ok": true}``, or 503
                                      ``{"ok": false, "reason": ...}`` when the liveness
                                      callable names a problem (a stalled control loop)
=======  ===========================  ===========================================================

With `make_app(..., operations=...)` the operator routes (nodes, health, the breaker, serving,
faults, the policy actor) are registered too: `controlplane.api.operator_routes`.

Must not: hold job logic (that is `JobService`) or touch Ray.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from controlplane.api.access import (
    PRINCIPAL,
    Action,
    add_route,
    principal_of,
    route_action,
)
from controlplane.api.identity import Identity, user_to_json
from controlplane.api.job_views import event_to_json, invalid_to_json, job_to_json
from controlplane.api.jobs import ApiError, JobService, body_json
from controlplane.api.operations import Operations
from controlplane.api.operator_routes import add_operations_routes
from controlplane.api.ratelimit import TokenBuckets
from controlplane.background_http import BackgroundHttpServer
from serve.inputs import request_id

__all__ = ["ApiServer", "make_app"]

log = logging.getLogger(__name__)

MAX_CONCURRENT_LOG_READS = 4
"""Log reads in flight at once (each reads at most its window from Ray, by byte range); one more
is refused with 429 rather than queued, so followers cannot pile up memory or threads."""
LOG_RETRY_AFTER_S = 2
_SERVICE = web.AppKey("service", JobService)
_IDENTITY = web.AppKey("identity", Identity)
_USER_LIMITS = web.AppKey("user_limits", TokenBuckets)
_FAILED_AUTH_LIMITS = web.AppKey("failed_auth_limits", TokenBuckets)
_MAX_BODY = web.AppKey("max_body_bytes", int)
_REQUEST_ID = web.RequestKey("request_id", str)
_LOG_SLOTS = web.AppKey("log_slots", asyncio.Semaphore)
_LOG_THREADS = web.AppKey("log_threads", ThreadPoolExecutor)
Liveness = Callable[[], "str | None"]
"""Returns None while the process is live, else why not (e.g. `Controller.liveness`)."""
_LIVENESS: web.AppKey[Liveness] = web.AppKey("liveness")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(
    request: web.Request, status: int, message: str, field: str | None = None
) -> web.Response:
    body = {"error": message, "field": field, "request_id": request.get(_REQUEST_ID)}
    return web.json_response(body, status=status)


@web.middleware
async def _request_ids(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost: the request's id (a safe ``X-Request-Id`` from the client, else a fresh
    one), for error bodies and log lines, and echoed in the response's header."""
    rid = request_id(request.headers.get("X-Request-Id"))
    request[_REQUEST_ID] = rid
    response = await handler(request)
    response.headers["X-Request-Id"] = rid
    return response


_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Auth, the rate limit and the role check, then the handler; every failure becomes a
    JSON error, never a crash. Then the audit of a state-changing request (`_audit`)."""
    response = await _guarded(request, handler)
    if (
        request.method not in _READ_METHODS
        and PRINCIPAL in request
        and request.get(_AUDITED, True)
        and request.match_info.route.name is not None
    ):
        _audit(request, response.status)
    return response


_AUDITED = web.RequestKey("audited", bool)
_AUDIT_SUBJECT = web.RequestKey("audit_subject", dict)
"""What a handler adds to its audit event: what it made or changed (a new job's id, a new
user's name), which the path parameters do not name."""


def _audit_subject(request: web.Request, **subject: str) -> None:
    request[_AUDIT_SUBJECT] = {**request.get(_AUDIT_SUBJECT, {}), **subject}


async def _guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        action = route_action(request)
        if action is not Action.PUBLIC:
            _authenticate(request)
            principal = request[PRINCIPAL]
            if action is not None and not principal.may(action):
                return _error(
                    request,
                    403,
                    f"{principal.name} ({principal.role}) may not {action}: that needs a role "
                    f"that allows it",
                )
        return await handler(request)
    except ApiError as exc:
        body = {**exc.to_json(), "request_id": request.get(_REQUEST_ID)}
        response = web.json_response(body, status=exc.status)
        if exc.retry_after_s is not None:
            response.headers["Retry-After"] = str(exc.retry_after_s)
        return response
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[_MAX_BODY]
        return _error(request, 413, f"the request body is larger than {limit} bytes", "<body>")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(request, exc.status, exc.reason or "request refused")
        raise
    except Exception:  # the server keeps serving whatever one request does
        rid = request.get(_REQUEST_ID, "-")
        log.exception("request %s: API handler failed: %s %s", rid, request.method, request.path)
        return _error(request, 500, "internal error; quote the request id when you report it")


def _authenticate(request: web.Request) -> None:
    """Set the request's Principal, or raise a 401 (`Identity.authenticate`), or a 429.

    A request that fails authentication spends a token of its client address's bucket (past
    it, 429 instead of 401: guessing tokens is slowed); an authenticated one spends its
    user's (past it, 429, not audited: a flood would flood the log)."""
    try:
        principal = request.app[_IDENTITY].authenticate(request.headers.get("Authorization"))
    except ApiError:
        wait_s = request.app[_FAILED_AUTH_LIMITS].take(request.remote or "-")
        if wait_s is not None:
            raise _too_many(wait_s, "requests that fail authentication from this address") from None
        raise
    request[PRINCIPAL] = principal
    wait_s = request.app[_USER_LIMITS].take(principal.name)
    if wait_s is not None:
        request[_AUDITED] = False
        raise _too_many(wait_s, f"requests from {principal.name}")


def _too_many(wait_s: int, what: str) -> ApiError:
    return ApiError(429, f"too many {what}; retry in {wait_s}s", None, retry_after_s=wait_s)


def _audit(request: web.Request, status: int) -> None:
    """One ``audit.<route name>`` event: who, what, on which path parameters (and what the
    handler made: `_audit_subject`), and the status; a job's id also goes in the event's
    ``job_id``. A failed write is logged, never the request's failure."""
    principal = request[PRINCIPAL]
    route = str(request.match_info.route.name)
    params = {k: v[:200] for k, v in request.match_info.items()}
    subject = {str(k): str(v) for k, v in request.get(_AUDIT_SUBJECT, {}).items()}
    rid = request.get(_REQUEST_ID)
    shown = " ".join(f"{k}={v}" for k, v in {**params, **subject}.items())
    try:
        request.app[_SERVICE].store.record_event(
            f"audit.{route}",
            f"{principal.name} ({principal.role}) {route} {shown} -> {status}".replace("  ", " "),
            data={
                "user": principal.name,
                "user_id": principal.user_id,
                "role": principal.role.value,
                "route": route,
                "method": request.method,
                "params": params,
                "subject": subject,
                "status": status,
                "request_id": rid,
            },
            job_id=subject.get("job_id"),
        )
    except Exception:  # the audit must not turn a made change into an error
        log.exception("request %s: recording the audit event of %s failed", rid, route)


async def _json_body(request: web.Request, *, allow_empty: bool = False) -> Any:
    """The body's JSON (None for an empty body where `allow_empty`), else 400 naming it."""
    raw = await request.read()  # aiohttp stops at client_max_size (413 above)
    if allow_empty and not raw.strip():
        return None
    if not raw:
        raise ApiError(400, "the request body is empty; send a JSON job spec", "<body>")
    return body_json(raw)


async def _dry_run(request: web.Request) -> web.Response:
    payload = await _json_body(request)
    service, principal = request.app[_SERVICE], principal_of(request)
    # A whole decide pass (about as long as a tick's): off the event loop.
    answer = await asyncio.get_running_loop().run_in_executor(
        None, service.dry_run, payload, principal
    )
    return web.json_response(answer)


async def _submit(request: web.Request) -> web.Response:
    payload = await _json_body(request)
    key = request.headers.get("Idempotency-Key")
    job, created = request.app[_SERVICE].submit(
        payload, idempotency_key=key, principal=principal_of(request)
    )
    _audit_subject(request, job_id=job.job_id, queue=job.spec.queue)
    return web.json_response(job_to_json(job), status=201 if created else 200)


async def _list(request: web.Request) -> web.Response:
    q = request.query
    scan = request.app[_SERVICE].scan_jobs(
        state=q.get("state"), queue=q.get("queue"), limit=q.get("limit"), after=q.get("after")
    )
    estimates = request.app[_SERVICE].estimated_starts()
    # Rows that no longer validate are listed apart, never fatal to the listing.
    return web.json_response(
        {
            "jobs": [_with_estimate(job_to_json(j), estimates) for j in scan.jobs],
            "invalid": [invalid_to_json(r) for r in scan.invalid],
            "next": scan.next_after,
        }
    )


async def _get(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    job_id = request.match_info["id"]
    job = service.get(job_id)
    view = job_to_json(job, service.history(job_id))
    return web.json_response(_with_estimate(view, service.estimated_starts()))


def _with_estimate(view: dict[str, Any], estimates: Mapping[str, float | None]) -> dict[str, Any]:
    """A queued job's ``estimated_start_s``: its reservation's time when it heads the queue."""
    if view["state"] == "QUEUED":
        view["estimated_start_s"] = estimates.get(view["id"])
    return view


async def _cancel(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    job = service.cancel(request.match_info["id"], principal_of(request))
    _audit_subject(request, job_id=str(job["id"]))
    return web.json_response(job)


async def _logs(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    job_id = request.match_info["id"]
    offset, limit = request.query.get("offset"), request.query.get("limit")
    slots = request.app[_LOG_SLOTS]
    if slots.locked():
        in_flight = f"log reads in flight (at most {MAX_CONCURRENT_LOG_READS})"
        raise _too_many(LOG_RETRY_AFTER_S, in_flight)
    async with slots:
        # Reading logs may call out to Ray: on the log threads, never the event loop's.
        body = await asyncio.get_running_loop().run_in_executor(
            request.app[_LOG_THREADS], service.logs, job_id, offset, limit
        )
    return web.json_response(body)


async def _events(request: web.Request) -> web.Response:
    q = request.query
    events = request.app[_SERVICE].events(
        after=q.get("after"),
        job_id=q.get("job_id"),
        limit=q.get("limit"),
        principal=principal_of(request),
    )
    return web.json_response({"events": [event_to_json(e) for e in events]})


async def _whoami(request: web.Request) -> web.Response:
    p = principal_of(request)
    shares = request.app[_SERVICE].queue_usage(p)
    return web.json_response(
        {"name": p.name, "role": p.role.value, "queues": sorted(p.queues), "shares": shares}
    )


async def _users_list(request: web.Request) -> web.Response:
    q = request.query
    users, next_after = request.app[_IDENTITY].list_users(q.get("limit"), q.get("after"))
    return web.json_response({"users": [user_to_json(u) for u in users], "next": next_after})


async def _users_add(request: web.Request) -> web.Response:
    user, token = request.app[_IDENTITY].add(await _json_body(request))
    _audit_subject(request, name=user.name, role=user.role)
    return web.json_response({**user_to_json(user), "token": token}, status=201)


async def _users_remove(request: web.Request) -> web.Response:
    user = request.app[_IDENTITY].remove(request.match_info["name"])
    return web.json_response({**user_to_json(user), "removed": True})


async def _users_rotate(request: web.Request) -> web.Response:
    payload = await _json_body(request, allow_empty=True)
    user, token = request.app[_IDENTITY].rotate(request.match_info["name"], payload)
    return web.json_response({**user_to_json(user), "token": token})


async def _healthz(request: web.Request) -> web.Response:
    try:
        problem = request.app[_LIVENESS]()
    except Exception as exc:  # a liveness check that breaks is itself a failed check
        log.exception("liveness check failed")
        problem = f"liveness-check-failed: {type(exc).__name__}"
    if problem:
        return web.json_response({"ok": False, "reason": problem}, status=503)
    return web.json_response({"ok": True})


async def _not_found(_request: web.Request) -> web.Response:
    raise ApiError(404, "no such route; see /v1/jobs, /v1/events, /v1/users, /healthz", None)


def make_app(
    service: JobService,
    token: str,
    max_body_bytes: int | None = None,
    liveness: Liveness | None = None,
    clock: Callable[[], float] = time.monotonic,
    operations: Operations | None = None,
) -> web.Application:
    """The aiohttp application. `token` becomes the first admin's (``admin``) when the store
    has no user yet (`Identity.bootstrap`). /healthz answers 503 while `liveness` (called
    on the event loop: keep it cheap) names a problem. `clock` paces the rate limits."""
    if not token:
        raise ValueError("token: the API needs a non-empty token")
    limit = service.cfg.api.max_body_bytes if max_body_bytes is None else max_body_bytes
    app = web.Application(middlewares=[_request_ids, _guard], client_max_size=limit)
    app[_SERVICE] = service
    identity = Identity(service.store, lambda: list(service.cfg.jobs.queues))
    identity.bootstrap(token)
    app[_IDENTITY] = identity
    rate, burst = service.cfg.api.rate_limit_per_s, service.cfg.api.rate_burst
    app[_USER_LIMITS] = TokenBuckets(rate, burst, clock=clock)
    app[_FAILED_AUTH_LIMITS] = TokenBuckets(rate, burst, clock=clock)
    app[_MAX_BODY] = limit
    app[_LIVENESS] = liveness if liveness is not None else lambda: None
    app[_LOG_SLOTS] = asyncio.Semaphore(MAX_CONCURRENT_LOG_READS)
    app[_LOG_THREADS] = ThreadPoolExecutor(MAX_CONCURRENT_LOG_READS, thread_name_prefix="rcp-logs")

    async def _stop_log_threads(app: web.Application) -> None:
        app[_LOG_THREADS].shutdown(wait=False)

    app.on_cleanup.append(_stop_log_threads)
    manage = Action.MANAGE_USERS
    for method, path, handler, name, action in (
        ("POST", "/v1/jobs", _submit, "jobs.submit", Action.SUBMIT),
        ("POST", "/v1/jobs/dry-run", _dry_run, "jobs.dry-run", Action.SUBMIT),
        ("GET", "/v1/jobs", _list, "jobs.list", Action.READ),
        ("GET", "/v1/jobs/{id}", _get, "jobs.get", Action.READ),
        ("POST", "/v1/jobs/{id}/cancel", _cancel, "jobs.cancel", Action.CANCEL),
        ("GET", "/v1/jobs/{id}/logs", _logs, "jobs.logs", Action.READ),
        ("GET", "/v1/events", _events, "events.list", Action.READ),
        ("GET", "/v1/whoami", _whoami, "whoami", Action.READ),
        ("GET", "/v1/users", _users_list, "users.list", manage),
        ("POST", "/v1/users", _users_add, "users.add", manage),
        ("DELETE", "/v1/users/{name}", _users_remove, "users.remove", manage),
        ("POST", "/v1/users/{name}/rotate-token", _users_rotate, "users.rotate-token", manage),
        ("GET", "/healthz", _healthz, "healthz", Action.PUBLIC),
    ):
        add_route(app, method, path, handler, name=name, action=action)
    if operations is not None:  # the operator routes: controlplane.api.operator_routes
        add_operations_routes(app, operations)
    app.router.add_route("*", "/{tail:.*}", _not_found)
    return app


class ApiServer(BackgroundHttpServer):
    """Serves `make_app(...)` on host:port from a daemon thread with its own event loop."""

    def __init__(
        self,
        service: JobService,
        token: str,
        host: str,
        port: int,
        liveness: Liveness | None = None,
        clock: Callable[[], float] = time.monotonic,
        operations: Operations | None = None,
    ) -> None:
        super().__init__(
            make_app(service, token, liveness=liveness, clock=clock, operations=operations),
            host,
            port,
            thread_name="rcp-api",
        )

    def start(self, timeout_s: float = 30.0) -> ApiServer:
        """Start serving; raises if the port cannot be bound."""
        self._start(timeout_s)
        return self
