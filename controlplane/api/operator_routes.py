"""The API's operator routes: nodes, health, the breaker, serving, faults, the policy actor.

Owns: `add_operations_routes(app, operations)`, which registers these routes (each through
`access.add_route` with the action it needs), and their request parsing. Path names and bodies
are untrusted: bounded, checked, and a bad one is a 400 naming the field that changes nothing.
Each handler then calls `controlplane.api.operations.Operations` on a small thread pool of
its own (the calls may wait on Ray or the store; never on the event loop). A handler's
response carries what it changed (and the reason given), so the audit and the caller see it.

=======  ===================================  ===========================================
GET      /v1/nodes                            nodes (READ); ``?limit=n&after=node_id``:
                                              a page, ``next`` the cursor or null
GET      /v1/health                           verdicts per node (READ), paged the same way
POST     /v1/health/{node}/clear              forget a lemon record (OPERATE)
POST     /v1/nodes/{node}/cordon              ``{"reason"}``: cordon by hand (OPERATE)
POST     /v1/nodes/{node}/uncordon            ``{"reason"?}``: give it back (OPERATE)
GET      /v1/health/breaker                   the removal breaker (READ)
POST     /v1/health/breaker/reset             ``{"reason"?}``: close it (OPERATE)
GET      /v1/serve                            serving per model and pool + guards (READ)
POST     /v1/faults                           ``{"node", "kind"}`` (OPERATE; simulated
                                              telemetry only, else 409)
GET      /v1/policy                           pause, pins, hand cordons (READ)
POST     /v1/policy/pause                     ``{"reason"}`` (OPERATE)
POST     /v1/policy/resume                    ``{"reason"?}`` (OPERATE)
POST     /v1/serve/models/{model}/pin         ``{"pool": "cluster"|"external"}`` (OPERATE)
DELETE   /v1/serve/models/{model}/pin         unpin (OPERATE)
=======  ===================================  ===========================================

Must not: hold operator logic (that is `Operations`) or touch Ray.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web

from controlplane.api.access import Action, add_route, principal_of
from controlplane.api.jobs import ApiError, body_json
from controlplane.api.operations import OperationRefused, Operations

__all__ = [
    "DEFAULT_PAGE",
    "MAX_NAME_CHARS",
    "MAX_PAGE",
    "MAX_REASON_CHARS",
    "add_operations_routes",
]

MAX_REASON_CHARS = 500
MAX_NAME_CHARS = 128
DEFAULT_PAGE = 500
MAX_PAGE = 5000
OPERATION_THREADS = 4
"""Operator calls in flight at once; more wait for a thread (they are short)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_OPERATIONS = web.AppKey("operations", Operations)
_THREADS = web.AppKey("operation_threads", ThreadPoolExecutor)

T = TypeVar("T")


async def _call(request: web.Request, fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` on the operations threads; a refusal becomes the API's JSON error."""
    loop = asyncio.get_running_loop()
    try:
        return await loop.run_in_executor(request.app[_THREADS], fn, *args)
    except OperationRefused as exc:
        raise ApiError(exc.status, exc.message, exc.field) from None


def _name(request: web.Request, key: str) -> str:
    """A path parameter naming a node or model: bounded, of safe characters."""
    value = request.match_info[key]
    if len(value) > MAX_NAME_CHARS or not _NAME.fullmatch(value):
        raise ApiError(
            400,
            f"{key} must be 1-{MAX_NAME_CHARS} characters of letters, digits, '.', '_', ':' "
            "and '-', starting with a letter or digit",
            key,
        )
    return value


async def _body(request: web.Request, fields: Sequence[str]) -> dict[str, Any]:
    """The JSON object sent (an empty body is ``{}``); a field not in `fields` is a 400."""
    raw = await request.read()  # aiohttp stops at client_max_size (413 in the middleware)
    if not raw.strip():
        return {}
    data = body_json(raw)
    if not isinstance(data, Mapping):
        raise ApiError(400, "the request body must be a JSON object", "<body>")
    for key in data:
        if key not in fields:
            allowed = ", ".join(fields) or "none"
            raise ApiError(400, f"unknown field {str(key)[:64]!r}; allowed: {allowed}", str(key))
    return dict(data)


def _text(body: Mapping[str, Any], key: str, *, required: bool, limit: int) -> str:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"{key} must be a string", key)
    value = (value or "").strip()
    if len(value) > limit:
        raise ApiError(400, f"{key} is longer than {limit} characters", key)
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ApiError(400, f"{key} must be one line of printable text", key)
    if required and not value:
        raise ApiError(400, f"{key} is required: say why, in at most {limit} characters", key)
    return value


def _reason(body: Mapping[str, Any], *, required: bool) -> str:
    return _text(body, "reason", required=required, limit=MAX_REASON_CHARS)


def _page(request: web.Request, rows: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """``?limit=n&after=id``: at most n rows (default `DEFAULT_PAGE`) whose `key` sorts after
    `after`; ``next`` is the last row's key when more follow, else None."""
    q = request.query
    raw_limit = q.get("limit")
    limit = DEFAULT_PAGE
    if raw_limit is not None:
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_PAGE:
            raise ApiError(400, f"limit must be an integer from 1 to {MAX_PAGE}", "limit")
        limit = int(raw_limit)
    after = q.get("after")
    if after is not None and len(after) > MAX_NAME_CHARS:
        raise ApiError(400, f"after is longer than {MAX_NAME_CHARS} characters", "after")
    ordered = sorted(rows, key=lambda r: str(r[key]))
    if after:
        ordered = [r for r in ordered if str(r[key]) > after]
    page = ordered[:limit]
    return {"items": page, "next": str(page[-1][key]) if len(ordered) > limit else None}


def _ops(request: web.Request) -> Operations:
    return request.app[_OPERATIONS]


def _by(request: web.Request) -> str:
    return principal_of(request).name


async def _nodes(request: web.Request) -> web.Response:
    rows = await _call(request, _ops(request).nodes)
    page = _page(request, rows, "node_id")
    return web.json_response({"nodes": page["items"], "next": page["next"]})


async def _health(request: web.Request) -> web.Response:
    data = await _call(request, _ops(request).health)
    page = _page(request, data["nodes"], "node_id")
    return web.json_response({**data, "nodes": page["items"], "next": page["next"]})


async def _clear(request: web.Request) -> web.Response:
    node = _name(request, "node")
    await _body(request, ())
    return web.json_response(await _call(request, _ops(request).clear_node, node, _by(request)))


async def _cordon(request: web.Request) -> web.Response:
    node = _name(request, "node")
    reason = _reason(await _body(request, ("reason",)), required=True)
    ops = _ops(request)
    return web.json_response(await _call(request, ops.cordon, node, _by(request), reason))


async def _uncordon(request: web.Request) -> web.Response:
    node = _name(request, "node")
    reason = _reason(await _body(request, ("reason",)), required=False)
    ops = _ops(request)
    return web.json_response(await _call(request, ops.uncordon, node, _by(request), reason))


async def _breaker(request: web.Request) -> web.Response:
    return web.json_response(await _call(request, _ops(request).breaker))


async def _breaker_reset(request: web.Request) -> web.Response:
    reason = _reason(await _body(request, ("reason",)), required=False)
    ops = _ops(request)
    return web.json_response(await _call(request, ops.reset_breaker, _by(request), reason))


async def _serve(request: web.Request) -> web.Response:
    return web.json_response(await _call(request, _ops(request).serve_status))


async def _fault(request: web.Request) -> web.Response:
    body = await _body(request, ("node", "kind"))
    node = _text(body, "node", required=True, limit=MAX_NAME_CHARS)
    if not _NAME.fullmatch(node):
        raise ApiError(400, "node must be a node id, or a unique prefix or suffix of one", "node")
    kind = _text(body, "kind", required=True, limit=32)
    ops = _ops(request)
    return web.json_response(await _call(request, ops.inject_fault, node, kind, _by(request)))


async def _policy(request: web.Request) -> web.Response:
    return web.json_response(await _call(request, _ops(request).policy))


async def _pause(request: web.Request) -> web.Response:
    reason = _reason(await _body(request, ("reason",)), required=True)
    return web.json_response(await _call(request, _ops(request).pause, _by(request), reason))


async def _resume(request: web.Request) -> web.Response:
    reason = _reason(await _body(request, ("reason",)), required=False)
    return web.json_response(await _call(request, _ops(request).resume, _by(request), reason))


async def _pin(request: web.Request) -> web.Response:
    model = _name(request, "model")
    pool = _text(await _body(request, ("pool",)), "pool", required=True, limit=16)
    ops = _ops(request)
    return web.json_response(await _call(request, ops.pin, model, pool, _by(request)))


async def _unpin(request: web.Request) -> web.Response:
    model = _name(request, "model")
    return web.json_response(await _call(request, _ops(request).unpin, model, _by(request)))


def add_operations_routes(app: web.Application, operations: Operations) -> None:
    """Register the operator routes (the module doc's table) on `app`."""
    app[_OPERATIONS] = operations
    app[_THREADS] = ThreadPoolExecutor(OPERATION_THREADS, thread_name_prefix="rcp-ops")

    async def _stop_threads(app: web.Application) -> None:
        app[_THREADS].shutdown(wait=False)

    app.on_cleanup.append(_stop_threads)
    read, operate = Action.READ, Action.OPERATE
    for method, path, handler, name, action in (
        ("GET", "/v1/nodes", _nodes, "nodes.list", read),
        ("POST", "/v1/nodes/{node}/cordon", _cordon, "nodes.cordon", operate),
        ("POST", "/v1/nodes/{node}/uncordon", _uncordon, "nodes.uncordon", operate),
        ("GET", "/v1/health", _health, "health.get", read),
        ("GET", "/v1/health/breaker", _breaker, "health.breaker", read),
        ("POST", "/v1/health/breaker/reset", _breaker_reset, "health.breaker_reset", operate),
        ("POST", "/v1/health/{node}/clear", _clear, "health.clear", operate),
        ("GET", "/v1/serve", _serve, "serve.control.status", read),
        ("POST", "/v1/serve/models/{model}/pin", _pin, "serve.pin", operate),
        ("DELETE", "/v1/serve/models/{model}/pin", _unpin, "serve.unpin", operate),
        ("POST", "/v1/faults", _fault, "faults.inject", operate),
        ("GET", "/v1/policy", _policy, "policy.get", read),
        ("POST", "/v1/policy/pause", _pause, "policy.pause", operate),
        ("POST", "/v1/policy/resume", _resume, "policy.resume", operate),
    ):
        add_route(app, method, path, handler, name=name, action=action)
