"""The HTTP ingress: a CPU-only deployment on the head that routes each request to the
backend of its model in one pool, chosen by route weight.

Owns: request validation (via `serve.inputs`), the route table applied from ``user_config``
(so every ingress replica applies the same weights and a redeploy keeps them), the retry of
a request whose replica died or is stopping on another ready replica within a bounded budget
(`serve.routing.retry_decision`), and the 503 + Retry-After answer when no pool can serve.
Every request has an id (the Serve proxy's ``x-request-id``, or a fresh one): error bodies
carry it with a message of their own, never exception text; details go to the replica's log
under the same id, and the backend gets it with the payload. Each replica reports to the load
board (`serve.app.load`) about once a second the requests it answered and its process's CPU time
since the last report (the ingress scaling policy, `policies.ingress`), with no per-model
counts: the backend replicas report those (the demand policy), so a request is counted once,
where it is worked on, whether it came through the ingress or straight from the edge.

``GET <prefix>v1/models`` is also the edge's route table: the models with their
weights, the table's ``generation``, and a ``routing`` block (the retry and timeout settings
the edge applies, how long it may use the table, ``table_max_age_s``, and the backends' route
root, ``backend_root``; docs/serving.md, "HTTP API").

Must not: change Serve's state (the control plane does that through `serve.control.operations`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

from serve.app.load import REPORT_INTERVAL_S, board, in_replica
from serve.config import IngressConfig
from serve.inputs import (
    ErrorCode,
    Health,
    ListModels,
    Predict,
    RequestError,
    error_body,
    read_body,
    request_id,
    request_parser,
)
from serve.routing import choose_pool, retry_decision
from serve.spec import BACKEND_DEPLOYMENT, BACKEND_ROUTE_ROOT, INGRESS_DEPLOYMENT, app_name

if TYPE_CHECKING:
    from serve.app.backend import BackendReplica, PredictEnvelope

__all__ = ["Ingress", "IngressReplica", "RouteTable", "list_models"]

logger = logging.getLogger("ray.serve")

_JSON = "application/json"
_RETRY_BACKOFF_S = 0.02


@dataclass(frozen=True)
class RouteTable:
    """What one ingress replica routes by; replaced whole on every reconfigure."""

    generation: int = -1
    weights: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    settings: IngressConfig = field(default_factory=IngressConfig)

    @classmethod
    def from_user_config(cls, user_config: Mapping[str, Any]) -> RouteTable:
        return cls(
            generation=int(user_config.get("generation", 0)),
            weights={
                m: {p: float(w) for p, w in ws.items()}
                for m, ws in (user_config.get("weights") or {}).items()
            },
            settings=IngressConfig(**(user_config.get("settings") or {})),
        )


_REQUEST_ID_HEADER = "x-request-id"


def _json(status: int, body: bytes, headers: dict[str, str] | None = None) -> Response:
    return Response(body, status_code=status, media_type=_JSON, headers=headers)


def _error(
    status: int, code: ErrorCode, message: str, rid: str, headers: dict[str, str] | None = None
) -> Response:
    return _json(status, error_body(code, message, rid), headers)


class IngressReplica:
    """One ingress replica (the `Ingress` deployment runs it)."""

    def __init__(self) -> None:
        self._table = RouteTable()
        self._handles: dict[tuple[str, str], DeploymentHandle[BackendReplica]] = {}
        self._rng = random.Random()
        self._answered = 0
        """Predict requests answered (any status), for the ingress's request rate."""
        self._reporter: asyncio.Task[None] | None = None

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self._table = RouteTable.from_user_config(user_config)
        logger.info(
            "route table generation %d: %s", self._table.generation, dict(self._table.weights)
        )
        # A handle to every backend the table names, made now, while Serve's controller is
        # surely up (it is the one calling): a handle looks the controller up and its router
        # learns the backend's replicas from it, so one made on a first predict while the head
        # is lost would wait for the head (and block this replica's event loop meanwhile).
        if not in_replica():
            return  # a test building the class directly hands in its own handles
        for model, pools in self._table.weights.items():
            for pool in pools:
                self._handle(model, pool)

    def _handle(self, model: str, pool: str) -> DeploymentHandle[BackendReplica]:
        key = (model, pool)
        handle = self._handles.get(key)
        if handle is None:
            # One handle per backend, bound to `predict`, results passed by value (no object
            # store round trip for small JSON answers).
            # Not checked against the controller's deployments: a table may name a backend
            # the same deploy is still creating, and the check is a blocking controller call.
            handle = serve.get_deployment_handle(
                BACKEND_DEPLOYMENT, app_name(model, pool), _check_exists=False
            ).options(method_name="predict", _by_reference=False)
            self._handles[key] = handle
        return handle

    async def __call__(self, request: Request) -> Response:
        given = request.headers.get(_REQUEST_ID_HEADER)
        rid = request_id(given)
        try:
            response = await self._answer(request, rid)
        except Exception:  # a bug here must answer like any error: id, no internals
            logger.exception("request %s: the ingress failed", rid)
            response = _error(
                500, ErrorCode.INTERNAL, "internal error in the ingress; quote the id", rid
            )
        if given != rid:
            # The Serve proxy adds X-Request-Id to the response itself when it sent one.
            response.headers["X-Request-Id"] = rid
        return response

    async def _answer(self, request: Request, rid: str) -> Response:
        table = self._table
        s = table.settings
        content_length = request.headers.get("content-length")
        parse = request_parser(
            request, max_body_bytes=s.max_body_bytes, known_models=table.weights.keys()
        )
        head = parse(None)
        if isinstance(head, RequestError):
            return _error(head.status, head.code, head.message, rid)
        if isinstance(head, Health):
            return _json(200, json.dumps({"status": "ok", "generation": table.generation}).encode())
        if isinstance(head, ListModels):
            if request.query_params.get("format") == "edge":
                return Response(edge_table_text(table), 200, media_type="text/plain")
            return _json(200, json.dumps(list_models(table)).encode())
        if head_declares_length(content_length):
            body: bytes | None = await request.body()  # length already checked
        else:
            body = await read_body(request, s.max_body_bytes)
        if body is None:
            too_large = f"body exceeds the limit of {s.max_body_bytes} bytes"
            return _error(413, ErrorCode.BODY_TOO_LARGE, too_large, rid)
        parsed = parse(body)
        if isinstance(parsed, RequestError):
            return _error(parsed.status, parsed.code, parsed.message, rid)
        assert isinstance(parsed, Predict)
        return await self._predict(parsed.model, parsed.payload, rid)

    async def _report_load(self) -> None:
        """Every `REPORT_INTERVAL_S`: the requests answered and the CPU this process spent
        since the last report (the ingress scaling policy); no per-model counts (`{}`): the
        backends report those."""
        me = serve.get_replica_context().replica_id.unique_id
        handle: Any = None  # the board's actor handle (Ray does not type its methods)
        last_s, last_cpu_s, last_answered = time.monotonic(), time.process_time(), 0
        while True:
            now_s, cpu_s, answered = time.monotonic(), time.process_time(), self._answered
            try:
                # In a thread: looking the board up is a blocking GCS call, which waits out
                # a lost head; this replica's event loop must go on answering meanwhile.
                handle = handle or await asyncio.to_thread(board)
                handle.report.remote(
                    me, {}, answered - last_answered, cpu_s - last_cpu_s, now_s - last_s
                )
            except Exception as exc:  # the board restarting must not hurt serving
                logger.debug("load report failed: %r", exc)
                handle = None
            last_s, last_cpu_s, last_answered = now_s, cpu_s, answered
            await asyncio.sleep(REPORT_INTERVAL_S)

    async def _predict(self, model: str, payload: dict[str, Any], rid: str) -> Response:
        if self._reporter is None and in_replica():
            self._reporter = asyncio.get_running_loop().create_task(self._report_load())
        try:
            return await self._predict_once(model, payload, rid)
        finally:
            self._answered += 1

    async def _predict_once(self, model: str, payload: dict[str, Any], rid: str) -> Response:
        started = time.monotonic()
        tried: set[str] = set()
        attempts = 0
        last_error = "no pool has ready replicas"
        while True:
            table = self._table  # re-read: weights may change between attempts
            s = table.settings
            pool = choose_pool(table.weights.get(model, {}), self._rng.random(), tried)
            if pool is None:
                return self._unavailable(model, "no pool has ready replicas", s, rid)
            attempts += 1
            tried.add(pool)
            remaining_s = s.request_timeout_s - (time.monotonic() - started)
            response = self._handle(model, pool).remote(payload, rid)
            try:
                envelope: PredictEnvelope = await asyncio.wait_for(
                    _await(response), timeout=max(0.001, min(s.attempt_timeout_s, remaining_s))
                )
            except asyncio.TimeoutError:
                # Ray Serve leaves DeploymentResponse.cancel unannotated.
                response.cancel()  # type: ignore[no-untyped-call]
                last_error = f"{pool} replica did not answer within {s.attempt_timeout_s:g}s"
            except Exception as exc:  # replica died, is stopping or is unreachable
                last_error = f"a {pool} replica failed"
                logger.warning(
                    "request %s: %s/%s attempt %d failed: %r", rid, model, pool, attempts, exc
                )
            else:
                return _json(
                    int(envelope["status"]),
                    json.dumps(envelope["body"]).encode(),
                    {"X-Rcp-Pool": pool, "X-Rcp-Attempts": str(attempts)},
                )
            decision = retry_decision(
                attempts, s.max_attempts, time.monotonic() - started, s.request_timeout_s
            )
            if not decision.retry:
                return self._unavailable(model, f"{last_error}; {decision.reason}", s, rid)
            await asyncio.sleep(_RETRY_BACKOFF_S * attempts)

    @staticmethod
    def _unavailable(model: str, why: str, s: IngressConfig, rid: str) -> Response:
        logger.warning("request %s: 503 for %s: %s", rid, model, why)
        message = (
            f"model {model!r} cannot be served right now ({why}); retry after {s.retry_after_s}s"
        )
        return _error(
            503, ErrorCode.NO_CAPACITY, message, rid, {"Retry-After": str(s.retry_after_s)}
        )


Ingress = serve.deployment(name=INGRESS_DEPLOYMENT)(IngressReplica)
"""The deployment (`serve.app.build_ingress` binds it)."""


def list_models(table: RouteTable) -> dict[str, Any]:
    """The ``GET v1/models`` answer: each model's weights per pool, the table's generation,
    and the ``routing`` block the edge routes by (see the module doc)."""
    s = table.settings
    return {
        "models": [{"name": m, "weights": dict(ws)} for m, ws in table.weights.items()],
        "generation": table.generation,
        "routing": {
            "max_attempts": s.max_attempts,
            "attempt_timeout_s": s.attempt_timeout_s,
            "request_timeout_s": s.request_timeout_s,
            "retry_after_s": s.retry_after_s,
            "max_body_bytes": s.max_body_bytes,
            "table_max_age_s": s.edge_table_max_age_s,
            "backend_root": BACKEND_ROUTE_ROOT,
        },
    }


def edge_table_text(table: RouteTable) -> str:
    """``GET v1/models?format=edge``: the route table as the edge's Lua task reads it
    (`serve/edge/rcp_edge.lua`): each model whose weights are not all zero with its
    `cluster` pool's share in thousandths, which the edge compares a draw of 0-999 with.

    >>> t = RouteTable(3, {"sample": {"cluster": 2.0, "external": 1.0}, "idle": {}})
    >>> print(edge_table_text(t), end="")
    rcp-edge-table 1 generation 3 max_age_s 5 model sample 667
    """
    lines = [
        "rcp-edge-table 1",
        f"generation {table.generation}",
        f"max_age_s {table.settings.edge_table_max_age_s:g}",
    ]
    for model, weights in table.weights.items():
        cluster, external = weights.get("cluster", 0.0), weights.get("external", 0.0)
        if cluster + external > 0:
            lines.append(f"model {model} {round(1000 * cluster / (cluster + external))}")
    return "\n".join(lines) + "\n"


def head_declares_length(content_length: str | None) -> bool:
    return content_length is not None and content_length.isdigit()


async def _await(response: Any) -> Any:
    """Await a Ray Serve response (a coroutine for `asyncio.wait_for`); Any: Ray types a
    handle's ``remote()`` as a response or a stream, and this one is never a stream."""
    return await response
