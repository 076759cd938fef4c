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

It also answers plain HTTP (``POST`` with a JSON body) when deployed with a route prefix;
the benchmark uses that to measure the bare backend against the ingress.

Must not: choose pools or weights; its placement comes from ``ray_actor_options`` set by
`serve.spec`.
"""

from __future__ import annotations

import importlib
import json
import logging
from typing import Any, Protocol, TypedDict

from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from serve.config import IngressConfig
from serve.inputs import (
    ErrorCode,
    JsonBodyError,
    error_body,
    error_dict,
    loads_json,
    read_body,
    request_id,
)
from serve.spec import BACKEND_DEPLOYMENT

__all__ = ["Backend", "BackendReplica", "Model", "PredictEnvelope", "load_model_class"]

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
"""The plain-HTTP route's body limit: the ingress's default (this route has no config)."""


class BackendReplica:
    """One replica of a model's backend in one pool (the `Backend` deployment runs it)."""

    def __init__(self, name: str, import_path: str, init_kwargs: dict[str, Any], pool: str) -> None:
        self.name = name
        self.pool = pool
        self._model: Model = load_model_class(import_path)(**dict(init_kwargs))

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
        """Plain HTTP (benchmarks): the same strict JSON and size limit as the ingress."""
        given = request.headers.get("x-request-id")
        rid = request_id(given)
        headers = {"X-Rcp-Pool": self.pool}
        if given != rid:
            headers["X-Request-Id"] = rid
        raw = await read_body(request, _MAX_BODY_BYTES)
        if raw is None:
            message = f"body exceeds {_MAX_BODY_BYTES} bytes"
            return _error(413, ErrorCode.BODY_TOO_LARGE, message, rid, headers)
        try:
            payload = loads_json(raw)
        except JsonBodyError as exc:
            code = ErrorCode.MALFORMED_JSON if exc.malformed else ErrorCode.INVALID_BODY
            return _error(400, code, exc.message, rid, headers)
        if not isinstance(payload, dict):
            return _error(400, ErrorCode.INVALID_BODY, "body must be a JSON object", rid, headers)
        env = self.predict(payload, rid)
        return Response(
            json.dumps(env["body"]).encode(),
            status_code=int(env["status"]),
            media_type="application/json",
            headers=headers,
        )


Backend = serve.deployment(name=BACKEND_DEPLOYMENT)(BackendReplica)
"""The deployment (`serve.app.build_backend` binds it per model and pool)."""


def _error(
    status: int, code: ErrorCode, message: str, rid: str, headers: dict[str, str]
) -> Response:
    return Response(
        error_body(code, message, rid),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )
