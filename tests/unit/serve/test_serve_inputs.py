"""Request validation at the ingress: every bad input gets a 4xx with a clear JSON message."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from serve.inputs import (
    MAX_JSON_DEPTH,
    ErrorCode,
    Health,
    JsonBodyError,
    ListModels,
    Predict,
    RequestError,
    error_body,
    loads_json,
    parse_request,
    request_id,
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


def test_error_body_is_json_with_code_message_and_request_id() -> None:
    body = json.loads(error_body(ErrorCode.BODY_TOO_LARGE, "too big", "r-1"))
    assert body == {"error": {"code": "body_too_large", "message": "too big", "request_id": "r-1"}}


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(
    ("raw", "malformed", "hint"),
    [
        pytest.param(b'{"x": NaN}', True, "NaN is not a JSON number", id="nan"),
        pytest.param(b'{"x": [Infinity]}', True, "Infinity is not a JSON number", id="inf"),
        pytest.param(b'{"x": -Infinity}', True, "-Infinity", id="neg-inf"),
        pytest.param(b'{"x": 1e400}', False, "overflows", id="float-overflow"),
        pytest.param(nested(MAX_JSON_DEPTH + 1), False, "deeper than 64", id="too-deep"),
        pytest.param(b"[" * 200_000, False, "deeper than 64", id="recursion-bomb"),
        pytest.param(b'{"x": ' + b"9" * 5000 + b"}", False, "4300 digits", id="huge-int"),
        pytest.param(b"\xff{}", True, "not UTF-8", id="not-utf8"),
        pytest.param(b"{bad", True, "line 1, column 2", id="syntax"),
    ],
)
def test_loads_json_refuses_with_a_message_of_its_own(
    raw: bytes, malformed: bool, hint: str
) -> None:
    with pytest.raises(JsonBodyError) as info:
        loads_json(raw)
    assert info.value.malformed is malformed
    assert hint in info.value.message
    assert "Traceback" not in info.value.message and "Exceeds the limit" not in info.value.message


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(nested(MAX_JSON_DEPTH), None, id="at-the-depth-limit"),
        pytest.param(b'{"s": "' + b"[" * 500 + b'"}', {"s": "[" * 500}, id="brackets-in-a-string"),
        pytest.param(b'{"s": "\\"[[[["}', {"s": '"[[[['}, id="escaped-quote"),
        pytest.param(b'{"x": 1.5e300, "n": -0.0}', {"x": 1.5e300, "n": -0.0}, id="big-finite"),
    ],
)
def test_loads_json_accepts_what_is_within_the_limits(raw: bytes, expected: Any) -> None:
    value = loads_json(raw)
    if expected is not None:
        assert value == expected


MIB = 1 << 20


def fill(head: bytes, unit: bytes, tail: bytes = b"", size: int = MIB) -> bytes:
    """`head`, then `unit` repeated, then `tail`: a body of about `size` bytes."""
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


# Hostile 1 MiB bodies (the Serve ingress's limit) for the depth guard. On the old regex guard
# the first took about 30 minutes (a string that never closes was re-scanned from every escaped
# quote), and brackets inside an unclosed string were counted as nesting. The guard is now a
# fixed number of whole-body passes; bench/bench_json_guard.py times it against json.loads.
@pytest.mark.parametrize(
    ("raw", "malformed"),
    [
        pytest.param(fill(b"[" * 65 + b'"', b'\\"'), False, id="reviewer-escaped-quotes"),
        pytest.param(fill(b'{"s": "', b"["), True, id="brackets-in-an-unclosed-string"),
        pytest.param(fill(b"[" * 64 + b'"', b'\\\\\\"['), True, id="alternating-escapes-unclosed"),
        pytest.param(fill(b'["', b'[\\"'), True, id="escaped-quotes-one-unclosed-string"),
        pytest.param(fill(b"[" * 65, b"\\"), False, id="backslashes-outside-strings"),
        pytest.param(
            fill(b'["', b"[" * 7 + b'", "', b'"]' + nested(65)), False, id="deep-after-strings"
        ),
        pytest.param(fill(b"", b"["), False, id="all-openers"),
    ],
)
def test_loads_json_refuses_hostile_megabyte_bodies(raw: bytes, malformed: bool) -> None:
    with pytest.raises(JsonBodyError) as info:
        loads_json(raw)
    assert info.value.malformed is malformed
    if not malformed:
        assert "deeper than 64" in info.value.message


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(fill(b'["', b"[", b'"]'), id="deep-nesting-inside-a-string"),
        pytest.param(
            nested(64)[:64] + fill(b'"', b'\\\\\\"[', b'"') + nested(64)[64:],
            id="alternating-escapes-closed",
        ),
        pytest.param(fill(b"[", b'"[", ', b'""]'), id="many-short-strings-of-brackets"),
        pytest.param(fill(b"[", b'"", ', b'""]'), id="many-empty-strings"),
        pytest.param(b'{"s": "\\\\", "d": ' + nested(63) + b"}", id="escaped-backslash-closes"),
    ],
)
def test_loads_json_accepts_hostile_looking_megabyte_bodies(raw: bytes) -> None:
    assert loads_json(raw) is not None


def random_string(rng: random.Random) -> str:
    return "".join(rng.choice('ab"\\[]{}\n/é') for _ in range(rng.randrange(8)))


def random_value(rng: random.Random, depth: int) -> Any:
    """A JSON value `depth` deep (one deep branch among string siblings) whose strings are full
    of quotes, brackets and escapes."""
    if depth == 0:
        return random_string(rng)
    items = [random_string(rng) for _ in range(rng.randrange(3))]
    items.insert(rng.randrange(len(items) + 1), random_value(rng, depth - 1))
    if rng.random() < 0.5:
        return items
    return {f"{random_string(rng)}#{i}": item for i, item in enumerate(items)}


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


def test_loads_json_depth_guard_is_exact_on_valid_json() -> None:
    rng = random.Random(12)
    for _ in range(400):
        value = random_value(rng, rng.randrange(60, 70))
        raw = json.dumps(value, ensure_ascii=rng.random() < 0.5).encode()
        if depth_of(value) > MAX_JSON_DEPTH:
            with pytest.raises(JsonBodyError, match="deeper than 64"):
                loads_json(raw)
        else:
            assert loads_json(raw) == value


@pytest.mark.parametrize(
    ("body", "code"),
    [
        pytest.param(b'{"inputs": [NaN]}', ErrorCode.MALFORMED_JSON, id="nan"),
        pytest.param(nested(65), ErrorCode.INVALID_BODY, id="too-deep"),
        pytest.param(b'{"n": ' + b"1" * 4301 + b"}", ErrorCode.INVALID_BODY, id="huge-int"),
    ],
)
def test_parse_request_answers_400_for_refused_json(body: bytes, code: ErrorCode) -> None:
    out = parse_request(
        method="POST",
        path="/v1/models/sample/predict",
        root_path="",
        content_type="application/json",
        content_length=None,
        body=body,
        max_body_bytes=1 << 20,
        known_models=("sample",),
    )
    assert isinstance(out, RequestError)
    assert (out.status, out.code) == (400, code)


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        pytest.param("a1b2-c3", True, id="proxy-id"),
        pytest.param(None, False, id="none"),
        pytest.param("x\nFAKE LOG LINE", False, id="log-injection"),
        pytest.param("x" * 200, False, id="too-long"),
    ],
)
def test_request_id_keeps_only_safe_ids(given: str | None, kept: bool) -> None:
    rid = request_id(given)
    assert (rid == given) is kept
    assert rid and len(rid) <= 128 and "\n" not in rid
