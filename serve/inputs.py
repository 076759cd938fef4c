"""Pure parsing and validation of requests arriving at the ingress.

Owns: the ingress's URL routes, the checks on method, content type, body size and JSON, the
JSON error body every 4xx/5xx carries::

    {"error": {"code": "unsupported_media_type", "message": "...what to change...",
               "request_id": "3f2c..."}}

and `loads_json`, the one strict JSON reader for untrusted bodies (this endpoint, the backend's
plain HTTP route and the control plane's API): UTF-8 only, no NaN/Infinity (nor a float that
overflows to one), nesting at most `MAX_JSON_DEPTH`, integers within Python's digit limit.
Each refusal is a `JsonBodyError` whose message says what to change, never parser internals.

Must not: import Ray or do I/O; the ingress hands in the method, path, headers and body.
"""

from __future__ import annotations

import json
import math
import re
import sys
import uuid
from array import array
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass
from enum import Enum
from itertools import accumulate
from typing import Any, NoReturn, Protocol, TypedDict

__all__ = [
    "MAX_JSON_DEPTH",
    "BodyStream",
    "ErrorCode",
    "ErrorDetail",
    "ErrorObject",
    "Health",
    "JsonBodyError",
    "ListModels",
    "RequestHead",
    "Predict",
    "RequestError",
    "error_body",
    "error_dict",
    "loads_json",
    "parse_request",
    "read_body",
    "request_id",
    "request_parser",
]

MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects a body may have (a model input needs a handful)."""


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
    INTERNAL = "internal_error"
    BAD_REQUEST = "bad_request"
    """Not an HTTP request the endpoint can read (the edge's answer)."""
    REQUEST_TIMEOUT = "request_timeout"
    """The request's head did not arrive within the edge's deadline (the edge's answer)."""
    LENGTH_REQUIRED = "length_required"
    """A body sent without a Content-Length (the edge's answer)."""


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


class ErrorDetail(TypedDict):
    code: str
    """An `ErrorCode` value."""
    message: str
    request_id: str


class ErrorObject(TypedDict):
    """The JSON body of every 4xx/5xx answer (see the module doc)."""

    error: ErrorDetail


def error_dict(code: ErrorCode, message: str, request_id: str) -> ErrorObject:
    """The error object; `request_id` is the one in the X-Request-Id header and the logs."""
    return {"error": {"code": code.value, "message": message, "request_id": request_id}}


def error_body(code: ErrorCode, message: str, request_id: str) -> bytes:
    """`error_dict` as the JSON bytes of a response."""
    return json.dumps(error_dict(code, message, request_id)).encode()


class BodyStream(Protocol):
    """What `read_body` needs of a request: a Starlette ``Request`` has it."""

    def stream(self) -> AsyncIterator[bytes]: ...


async def read_body(request: BodyStream, limit_bytes: int) -> bytes | None:
    """A Starlette request's body, or None as soon as it grows past `limit_bytes` (chunked
    uploads too: reading stops there, the rest is never buffered)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id(given: str | None) -> str:
    """The id of one request: the proxy's (``x-request-id``) when it is a safe token, else a
    fresh one (a client-chosen id goes into log lines, so nothing else is echoed)."""
    if given and _REQUEST_ID_RE.fullmatch(given):
        return given
    return uuid.uuid4().hex


class JsonBodyError(ValueError):
    """An untrusted body that `loads_json` refuses. `malformed` is True when it is not JSON at
    all (syntax, encoding, NaN/Infinity), False when it is JSON past a limit."""

    def __init__(self, message: str, *, malformed: bool) -> None:
        super().__init__(message)
        self.message = message
        self.malformed = malformed


_STRUCTURAL = b'"[]{}'
_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in _STRUCTURAL)
_BRACKET_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")
"""Openers to +1 and closers to -1 once read as signed bytes (`array("b")`)."""


def _too_deep(raw: bytes, max_depth: int) -> bool:
    """Whether arrays/objects nest deeper than `max_depth`, outside strings. Checked before
    parsing: the C parser recurses, and a deep body would end in RecursionError.

    Linear in ``len(raw)`` whatever the bytes: a fixed number of whole-body passes in C (count,
    replace, translate, split), no regex and no per-byte Python loop, so a string that never
    closes or a run of escaped quotes costs one pass, not one pass per quote. Exact for valid
    JSON; for invalid JSON it may say either way, and the parser then refuses the body. Works on
    the UTF-8 bytes: no byte of a multi-byte character is a quote, bracket or backslash.
    """
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return False  # the common case: too few brackets to nest that deep
    # Drop escapes: `\\` pairs first (left to right, as a JSON reader pairs them), then `\"`.
    # What is left of a string is its quotes and any brackets inside it.
    kept = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURAL)
    # Quotes now alternate open/close: even pieces are outside strings (an unclosed string's
    # tail is an odd piece). `""` is an empty string or two strings side by side: either way
    # dropping it keeps every bracket on its side, and it makes many short strings cheap.
    outside = b"".join(kept.replace(b'""', b"").split(b'"')[::2])
    if outside.count(b"[") + outside.count(b"{") <= max_depth:
        return False
    return max(accumulate(array("b", outside.translate(_BRACKET_STEP))), default=0) > max_depth


def _no_constant(name: str) -> NoReturn:
    raise JsonBodyError(f"{name} is not a JSON number; send finite numbers only", malformed=True)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonBodyError(
            f"the number {text[:40]} overflows a 64-bit float; send finite numbers only",
            malformed=False,
        )
    return value


def loads_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> object:
    """Parse an untrusted body (see the module doc); raises JsonBodyError. The value is
    whatever JSON the body held: check its type before use."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JsonBodyError(
            f"the body is not UTF-8 (bad byte at offset {exc.start})", malformed=True
        ) from None
    if _too_deep(raw, max_depth):
        raise JsonBodyError(
            f"the body nests arrays/objects deeper than {max_depth} levels", malformed=False
        )
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except JsonBodyError:
        raise
    except json.JSONDecodeError as exc:
        raise JsonBodyError(
            f"not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
            malformed=True,
        ) from None
    except ValueError:  # int() refuses a literal past sys.get_int_max_str_digits()
        raise JsonBodyError(
            f"an integer in the body has more than {sys.get_int_max_str_digits()} digits",
            malformed=False,
        ) from None
    except RecursionError:  # belt and braces: `_too_deep` should have refused it
        raise JsonBodyError(
            f"the body nests arrays/objects deeper than {max_depth} levels", malformed=False
        ) from None


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
        payload = loads_json(body)
    except JsonBodyError as exc:
        if exc.malformed:
            return RequestError(400, ErrorCode.MALFORMED_JSON, f"not valid JSON: {exc.message}")
        return RequestError(400, ErrorCode.INVALID_BODY, f"body refused: {exc.message}")
    if not isinstance(payload, dict):
        return RequestError(
            400,
            ErrorCode.INVALID_BODY,
            f"body must be a JSON object, got {type(payload).__name__}",
        )
    return Predict(model=model, payload=payload)


class _Url(Protocol):
    @property
    def path(self) -> str: ...


class RequestHead(Protocol):
    """What `request_parser` reads of a request: a Starlette ``Request`` has it."""

    @property
    def method(self) -> str: ...

    @property
    def url(self) -> _Url: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def scope(self) -> Mapping[str, Any]: ...


def request_parser(
    request: RequestHead, *, max_body_bytes: int, known_models: Collection[str]
) -> Callable[[bytes | None], Parsed]:
    """`parse_request` bound to one HTTP request's method, path (relative to the ``root_path``
    Serve's proxy sets to the app's route prefix) and headers: call it with None for the head
    alone, then with the body."""

    def parse(body: bytes | None) -> Parsed:
        return parse_request(
            method=request.method,
            path=request.url.path,
            root_path=str(request.scope.get("root_path", "")),
            content_type=request.headers.get("content-type"),
            content_length=request.headers.get("content-length"),
            body=body,
            max_body_bytes=max_body_bytes,
            known_models=known_models,
        )

    return parse
