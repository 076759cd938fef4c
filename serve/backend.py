"""The backend deployment: one per (model, pool), wrapping the user's model class.

Owns: loading the model class from its import path inside a replica, calling ``predict``,
and turning the model's answer into an envelope the ingress forwards unchanged::

    {"status": 200, "body": {...}}                                 # success
    {"status": 422, "body": {"error": {"code": "invalid_input", ...}}}  # model's ValueError
    {"status": 500, "body": {"error": {"code": "model_error", ...}}}    # any other exception

so a bad request never kills the replica and the ingress never mistakes a model error for a
dead replica (only a replica that died or stopped is retried elsewhere).

It also answers plain HTTP (``POST`` with a JSON body) when deployed with a route prefix;
the benchmark uses that to measure the bare backend against the ingress.

Must not: choose pools or weights; its placement comes from ``ray_actor_options`` set by
`serve.spec`.
"""

from __future__ import annotations

import importlib
import json
import logging
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from serve.inputs import ErrorCode, error_body
from serve.spec import BACKEND_DEPLOYMENT

__all__ = ["Backend", "load_model_class"]

logger = logging.getLogger("ray.serve")


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


@serve.deployment(name=BACKEND_DEPLOYMENT)
class Backend:
    def __init__(self, name: str, import_path: str, init_kwargs: dict[str, Any], pool: str) -> None:
        self.name = name
        self.pool = pool
        self._model = load_model_class(import_path)(**dict(init_kwargs))

    def predict(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            body = self._model.predict(payload)
        except ValueError as exc:
            return {
                "status": 422,
                "body": {"error": {"code": ErrorCode.INVALID_INPUT.value, "message": str(exc)}},
            }
        except Exception as exc:  # a model bug must not take the replica down
            logger.exception("model %s raised", self.name)
            return {
                "status": 500,
                "body": {
                    "error": {
                        "code": ErrorCode.MODEL_ERROR.value,
                        "message": f"model {self.name!r} failed: {type(exc).__name__}: {exc}",
                    }
                },
            }
        return {"status": 200, "body": body}

    async def __call__(self, request: Request) -> Response:
        raw = await request.body()
        try:
            payload = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return Response(
                error_body(ErrorCode.MALFORMED_JSON, f"body is not valid JSON: {exc}"),
                status_code=400,
                media_type="application/json",
            )
        if not isinstance(payload, dict):
            return Response(
                error_body(ErrorCode.INVALID_BODY, "body must be a JSON object"),
                status_code=400,
                media_type="application/json",
            )
        env = self.predict(payload)
        return Response(
            json.dumps(env["body"]).encode(),
            status_code=int(env["status"]),
            media_type="application/json",
            headers={"X-Rcp-Pool": self.pool},
        )
