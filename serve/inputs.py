"""Pure parsing and validation of requests arriving at the ingress.

Owns: the ingress's URL routes, the checks on method, content type, body size and JSON, and
the JSON error body every 4xx/5xx carries::

    {"error": {"code": "unsupported_media_type", "message": "...what to change..."}}

Must not: import Ray or do I/O; the ingress hands in the method, path, headers and body.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = [
    "ErrorCode",
    "Health",
    "ListModels",
    "Predict",
    "RequestError",
    "error_body",
    "parse_request",
]


class ErrorCode(str, Enum):
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    BODY_TOO_LARGE = "body_too_large"
    MALFORMED_JSON = "malformed_json"
    INVALID_BODY = "invalid_body"
    UNKNOWN_MODEL = "unknown_model"
    INVALID_INPUT = "invalid_input"
    NO_CAPACITY = "no_capacity"
    MODEL_ERROR = "model_error"


@dataclass(frozen=True)
class RequestError:
    status: int
    code: ErrorCode
    message: str


@dataclass(frozen=True)
class Predict:
    model: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class ListModels:
    pass


@dataclass(frozen=True)
class Health:
    pass


Parsed = Predict | ListModels | Health | RequestError


def error_body(code: ErrorCode, message: str) -> bytes:
    return json.dumps({"error": {"code": code.value, "message": message}}).encode()


def _relative(path: str, root_path: str) -> str:
    if root_path and root_path != "/" and path.startswith(root_path):
        path = path[len(root_path) :]
    return "/" + path.strip("/")


def parse_request(
    *,
    method: str,
    path: str,
    root_path: str,
    content_type: str | None,
    content_length: str | None,
    body: bytes | None,
    max_body_bytes: int,
    known_models: Collection[str],
) -> Parsed:
    """Classify one HTTP request. `body` may be None when only the headers were read; then a
    too-large Content-Length is still refused before the body is read.

    Routes (relative to the ingress's route prefix): ``GET /healthz``, ``GET /v1/models``,
    ``POST /v1/models/<name>/predict`` with a JSON object body.
    """
    rel = _relative(path, root_path)
    parts = [p for p in rel.split("/") if p]
    if parts == ["healthz"]:
        if method not in ("GET", "HEAD"):
            return RequestError(405, ErrorCode.METHOD_NOT_ALLOWED, "use GET /healthz")
        return Health()
    if parts == ["v1", "models"]:
        if method not in ("GET", "HEAD"):
            return RequestError(405, ErrorCode.METHOD_NOT_ALLOWED, "use GET /v1/models")
        return ListModels()
    if len(parts) != 4 or parts[:2] != ["v1", "models"] or parts[3] != "predict":
        return RequestError(
            404,
            ErrorCode.NOT_FOUND,
            f"no route {rel!r}; use POST /v1/models/<model>/predict or GET /v1/models",
        )
    model = parts[2]
    if method != "POST":
        return RequestError(
            405, ErrorCode.METHOD_NOT_ALLOWED, f"use POST /v1/models/{model}/predict"
        )
    if model not in known_models:
        known = ", ".join(sorted(known_models)) or "(none)"
        return RequestError(
            404, ErrorCode.UNKNOWN_MODEL, f"unknown model {model!r}; served models: {known}"
        )
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json":
        return RequestError(
            415,
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            f"Content-Type must be application/json, got {content_type or 'none'!r}",
        )
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            return RequestError(400, ErrorCode.INVALID_BODY, "Content-Length is not a number")
        if declared > max_body_bytes:
            return RequestError(
                413,
                ErrorCode.BODY_TOO_LARGE,
                f"body of {declared} bytes exceeds the limit of {max_body_bytes} bytes",
            )
    if body is None:
        return Predict(model=model, payload={})
    if len(body) > max_body_bytes:
        return RequestError(
            413,
            ErrorCode.BODY_TOO_LARGE,
            f"body of {len(body)} bytes exceeds the limit of {max_body_bytes} bytes",
        )
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return RequestError(400, ErrorCode.MALFORMED_JSON, f"body is not valid JSON: {exc}")
    if not isinstance(payload, dict):
        return RequestError(
            400,
            ErrorCode.INVALID_BODY,
            f"body must be a JSON object, got {type(payload).__name__}",
        )
    return Predict(model=model, payload=payload)
