"""Request validation at the ingress: every bad input gets a 4xx with a clear JSON message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from serve.inputs import (
    ErrorCode,
    Health,
    ListModels,
    Predict,
    RequestError,
    error_body,
    parse_request,
)

LIMIT = 100


def request(
    method: str = "POST",
    path: str = "/v1/models/sample/predict",
    body: bytes | None = b'{"inputs": [[1, 2]]}',
    content_type: str | None = "application/json",
    content_length: str | None = None,
    root_path: str = "",
) -> Any:
    return parse_request(
        method=method,
        path=path,
        root_path=root_path,
        content_type=content_type,
        content_length=content_length,
        body=body,
        max_body_bytes=LIMIT,
        known_models=("sample", "other"),
    )


@pytest.mark.parametrize(
    ("kwargs", "status", "code", "hint"),
    [
        pytest.param(
            {"body": b"{bad"}, 400, ErrorCode.MALFORMED_JSON, "not valid JSON", id="malformed-json"
        ),
        pytest.param(
            {"body": b"\xff\xfe"}, 400, ErrorCode.MALFORMED_JSON, "not valid JSON", id="not-utf8"
        ),
        pytest.param(
            {"body": b"[1, 2]"},
            400,
            ErrorCode.INVALID_BODY,
            "JSON object",
            id="json-array-not-object",
        ),
        pytest.param(
            {"content_type": "text/plain"},
            415,
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            "application/json",
            id="wrong-content-type",
        ),
        pytest.param(
            {"content_type": None},
            415,
            ErrorCode.UNSUPPORTED_MEDIA_TYPE,
            "none",
            id="missing-content-type",
        ),
        pytest.param(
            {"body": b"{" + b" " * LIMIT + b"}"},
            413,
            ErrorCode.BODY_TOO_LARGE,
            "limit of 100",
            id="body-over-limit",
        ),
        pytest.param(
            {"body": None, "content_length": "5000"},
            413,
            ErrorCode.BODY_TOO_LARGE,
            "5000",
            id="declared-length-over-limit",
        ),
        pytest.param(
            {"content_length": "abc"},
            400,
            ErrorCode.INVALID_BODY,
            "Content-Length",
            id="bad-content-length",
        ),
        pytest.param(
            {"path": "/v1/models/nope/predict"},
            404,
            ErrorCode.UNKNOWN_MODEL,
            "other, sample",
            id="unknown-model-lists-known",
        ),
        pytest.param(
            {"path": "/v2/thing"},
            404,
            ErrorCode.NOT_FOUND,
            "/v1/models/<model>/predict",
            id="unknown-route",
        ),
        pytest.param(
            {"method": "GET"}, 405, ErrorCode.METHOD_NOT_ALLOWED, "POST", id="get-on-predict"
        ),
        pytest.param(
            {"method": "POST", "path": "/healthz"},
            405,
            ErrorCode.METHOD_NOT_ALLOWED,
            "GET",
            id="post-on-healthz",
        ),
    ],
)
def test_bad_requests_get_4xx_with_message(
    kwargs: dict[str, Any], status: int, code: ErrorCode, hint: str
) -> None:
    out = request(**kwargs)
    assert isinstance(out, RequestError)
    assert (out.status, out.code) == (status, code)
    assert hint in out.message


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({}, Predict("sample", {"inputs": [[1, 2]]}), id="predict"),
        pytest.param(
            {"content_type": "Application/JSON; charset=utf-8"},
            Predict("sample", {"inputs": [[1, 2]]}),
            id="content-type-params-and-case",
        ),
        pytest.param(
            {"path": "/api/v1/models/other/predict/", "root_path": "/api"},
            Predict("other", {"inputs": [[1, 2]]}),
            id="under-route-prefix",
        ),
        pytest.param({"body": None}, Predict("sample", {}), id="headers-only-pass"),
        pytest.param({"method": "GET", "path": "/healthz"}, Health(), id="health"),
        pytest.param({"method": "GET", "path": "/v1/models"}, ListModels(), id="list-models"),
    ],
)
def test_good_requests(kwargs: dict[str, Any], expected: object) -> None:
    assert request(**kwargs) == expected


def test_error_body_is_json_with_code_and_message() -> None:
    body = json.loads(error_body(ErrorCode.BODY_TOO_LARGE, "too big"))
    assert body == {"error": {"code": "body_too_large", "message": "too big"}}
