"""The backend deployment: one per (model, pool), wrapping the user's model class.

Owns: loading the model class from its import path inside a replica, calling ``predict``,
and turning the model's answer into an envelope the ingress forwards unchanged::

    {"status": 200, "body": {...}}                                 # success
    {"status": 422, "body": {"error": {"code": "invalid_input", ...}}}  # model's ValueError
    {"status": 500, "body": {"error": {"code": "model_error", ...}}}    # any other exception

so a bad request never kills the replica and the ingress never mistakes a model error for a
dead replica (only a replica that died or stopped is retried elsewhere). Error bodies carry
the request id the ingress passes in; a 500 says only that the model failed (the exception
and its traceback go to the replica's log under that id). A 422 carries the ValueError's
message: by the model contract that message is written for the client.

It also answers HTTP on its app's internal route prefix (`serve.spec.backend_route_prefix`):
``POST /_rcp/<model>/<pool>/v1/models/<model>/predict``, the edge's path around the
ingress. That route validates exactly as the ingress does (`serve.inputs.parse_request`, the
default ``max_body_bytes``), answers the same status and JSON body (the envelope's), and puts
``X-Rcp-Pool: <pool>`` on every answer, errors included: an answer with it is the model's own
and is never retried, one without it is Serve's (app gone, replica dead) and the edge retries
it elsewhere. Any other path under the prefix (``healthz``, ``v1/models``) is 404 not_found.

Each replica counts its requests in flight (both routes) and reports ``{model: count}`` to
the load board (`serve.app.load`) about once a second, from a daemon thread started on its first
request inside a Serve replica: the demand policy's input, counted where the work is, so a
request through the edge is counted like one through the ingress.

Must not: choose pools or weights; its placement comes from ``ray_actor_options`` set by
`serve.spec`.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import threading
import time
from typing import Any, Protocol, TypedDict

from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from serve.app.load import REPORT_INTERVAL_S, InFlight, board, in_replica
from serve.config import IngressConfig
from serve.inputs import (
    ErrorCode,
    Predict,
    RequestError,
    error_body,
    error_dict,
    read_body,
    request_id,
    request_parser,
)
from serve.spec import BACKEND_DEPLOYMENT

__all__ = [
    "POOL_HEADER",
    "Backend",
    "BackendReplica",
    "Model",
    "PredictEnvelope",
    "load_model_class",
]

logger = logging.getLogger("ray.serve")


class Model(Protocol):
    """What a model class's instances must have (``ModelConfig.import_path`` names the class)."""

    def predict(self, payload: dict[str, Any]) -> object:
        """The answer (JSON-able) for one request's JSON object; ValueError for bad input."""
        ...


class PredictEnvelope(TypedDict):
    """`Backend.predict`'s answer to the ingress: the HTTP status and the JSON body."""

    status: int
    body: object


def load_model_class(import_path: str) -> Any:
    """The object at ``module:attr``; raises ImportError naming the path when it is missing."""
    module_name, _, attr = import_path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"model import_path {import_path!r}: cannot import module {module_name!r}: {exc}"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ImportError(
            f"model import_path {import_path!r}: module {module_name!r} has no {attr!r}"
        ) from exc


_MAX_BODY_BYTES = IngressConfig().max_body_bytes
"""The HTTP route's body limit: the ingress's default (this route has no config)."""
POOL_HEADER = "X-Rcp-Pool"
"""On every answer of the HTTP route: the pool whose replica answered (see the module doc)."""


class BackendReplica:
    """One replica of a model's backend in one pool (the `Backend` deployment runs it)."""

    def __init__(self, name: str, import_path: str, init_kwargs: dict[str, Any], pool: str) -> None:
        self.name = name
        self.pool = pool
        self._model: Model = load_model_class(import_path)(**dict(init_kwargs))
        self._inflight = InFlight()
        self._reporter_lock = threading.Lock()
        self._reporter_started = False

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve calls this at start and on every change of `ModelConfig.user_config`; the
        model's own ``reconfigure`` gets it (a model without one accepts only ``{}``)."""
        settings = dict(user_config or {})
        reconfigure = getattr(self._model, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(settings)
        elif settings:
            raise ValueError(
                f"model {self.name!r}: user_config {sorted(settings)} given, but its class has "
                "no reconfigure(user_config) method"
            )

    def predict(self, payload: dict[str, Any], request_id: str = "") -> PredictEnvelope:
        """The ingress's handle call: one request's payload, answered as an envelope."""
        self._start_reporter()
        with self._inflight.track(self.name):
            return self._predict(payload, request_id)

    def _predict(self, payload: dict[str, Any], request_id: str) -> PredictEnvelope:
        rid = request_id or "unknown"
        try:
            body = self._model.predict(payload)
        except ValueError as exc:
            return {
                "status": 422,
                "body": error_dict(ErrorCode.INVALID_INPUT, str(exc), rid),
            }
        except Exception:  # a model bug must not take the replica down
            logger.exception("request %s: model %s raised", rid, self.name)
            message = f"model {self.name!r} failed; its log has the details under the request id"
            return {
                "status": 500,
                "body": error_dict(ErrorCode.MODEL_ERROR, message, rid),
            }
        return {"status": 200, "body": body}

    async def __call__(self, request: Request) -> Response:
        """The HTTP route (the edge's, see the module doc): validated as the ingress
        validates, answered with the ingress's status and body, always with `POOL_HEADER`."""
        self._start_reporter()
        given = request.headers.get("x-request-id")
        rid = request_id(given)
        with self._inflight.track(self.name):
            try:
                response = await self._answer(request, rid)
            except Exception:  # a bug here must answer like any error: id, no internals
                logger.exception("request %s: the backend's HTTP route failed", rid)
                message = "internal error in the backend; quote the id"
                response = _error(500, ErrorCode.INTERNAL, message, rid)
        response.headers[POOL_HEADER] = self.pool
        if given != rid:
            # The Serve proxy adds X-Request-Id to the response itself when it sent one.
            response.headers["X-Request-Id"] = rid
        return response

    async def _answer(self, request: Request, rid: str) -> Response:
        parse = request_parser(request, max_body_bytes=_MAX_BODY_BYTES, known_models=(self.name,))
        head = parse(None)
        if isinstance(head, RequestError):
            return _error(head.status, head.code, head.message, rid)
        if not isinstance(head, Predict):  # healthz, v1/models: the ingress's routes only
            message = f"a backend route answers only POST .../v1/models/{self.name}/predict"
            return _error(404, ErrorCode.NOT_FOUND, message, rid)
        raw = await read_body(request, _MAX_BODY_BYTES)
        if raw is None:
            message = f"body exceeds the limit of {_MAX_BODY_BYTES} bytes"
            return _error(413, ErrorCode.BODY_TOO_LARGE, message, rid)
        parsed = parse(raw)
        if isinstance(parsed, RequestError):
            return _error(parsed.status, parsed.code, parsed.message, rid)
        assert isinstance(parsed, Predict)
        # Off the event loop: a model's predict blocks (it computes, or sleeps), and run here it
        # would hold every other request out of this replica until it returned; they would
        # queue unseen by the in-flight count, so demand would read 1 however many waited.
        env = await asyncio.to_thread(self._predict, parsed.payload, rid)
        return Response(
            json.dumps(env["body"]).encode(),
            status_code=int(env["status"]),
            media_type="application/json",
        )

    # --- the demand signal ------------------------------------------------------------------

    def _start_reporter(self) -> None:
        """Start the load reporter once, and only inside a Serve replica (a test that builds
        the class directly reports nothing)."""
        if self._reporter_started:
            return
        with self._reporter_lock:
            if self._reporter_started:
                return
            self._reporter_started = True
            if in_replica():
                me = serve.get_replica_context().replica_id.unique_id
                threading.Thread(
                    target=self._report_forever, args=(me,), name="rcp-load-report", daemon=True
                ).start()

    def _report_forever(self, me: str) -> None:
        handle: Any = None
        while True:
            handle = self.report_load(me, handle)
            time.sleep(REPORT_INTERVAL_S)

    def report_load(self, me: str, handle: Any) -> Any:
        """Send one report (``{model: mean in flight since the last}``, no traffic figures)
        to the load board; return the handle to reuse, or None after a failure (the board
        restarting must not hurt serving: the next report looks it up again). Any: Ray's
        actor handle."""
        try:
            handle = handle if handle is not None else board()
            handle.report.remote(me, self._inflight.mean_counts())
        except Exception as exc:
            logger.debug("load report failed: %r", exc)
            return None
        return handle


Backend = serve.deployment(name=BACKEND_DEPLOYMENT)(BackendReplica)
"""The deployment (`serve.app.build_backend` binds it per model and pool)."""


def _error(status: int, code: ErrorCode, message: str, rid: str) -> Response:
    return Response(
        error_body(code, message, rid), status_code=status, media_type="application/json"
    )
