"""The ingress's request path with fake backend handles: retry on a dead or hung replica,
503 + Retry-After when nothing can serve, and 4xx for bad input. No Ray is started."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from ray.exceptions import ActorDiedError
from starlette.requests import Request

from serve.ingress import Ingress

IngressImpl: Any = Ingress.func_or_class


class FakeResponse:
    def __init__(self, behavior: str, payload: dict[str, Any]) -> None:
        self.behavior = behavior
        self.payload = payload
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True

    def __await__(self) -> Iterator[Any]:
        return self._run().__await__()

    async def _run(self) -> dict[str, Any]:
        if self.behavior == "die":
            raise ActorDiedError()
        if self.behavior == "hang":
            await asyncio.sleep(3600)
        return {"status": 200, "body": {"echo": self.payload}}


class FakeHandle:
    """Answers with the next behavior in `script` ("ok", "die", "hang"); the last repeats."""

    def __init__(self, *script: str) -> None:
        self.script = list(script)
        self.calls = 0

    def remote(self, payload: dict[str, Any]) -> FakeResponse:
        behavior = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        return FakeResponse(behavior, payload)


def make_ingress(weights: dict[str, float], handles: dict[str, FakeHandle], **settings: Any) -> Any:
    ing = IngressImpl()
    ing.reconfigure(
        {
            "generation": 3,
            "weights": {"sample": weights},
            "settings": {"max_body_bytes": 64, **settings},
        }
    )
    for pool, handle in handles.items():
        ing._handles[("sample", pool)] = handle
    ing._rng = FixedDraw()  # u = 0: the first pool still to try, in pool order
    return ing


class FixedDraw:
    def random(self) -> float:
        return 0.0


def http_request(
    body: bytes,
    path: str = "/v1/models/sample/predict",
    method: str = "POST",
    content_type: str = "application/json",
) -> Request:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "query_string": b"",
        "headers": headers,
    }
    return Request(scope, receive)


def call(ing: Any, request: Request) -> tuple[int, dict[str, str], dict[str, Any]]:
    resp = asyncio.run(ing(request))
    return resp.status_code, dict(resp.headers), json.loads(resp.body)


@pytest.mark.parametrize(
    ("weights", "handles", "pool", "attempts"),
    [
        pytest.param({"cluster": 1}, {"cluster": FakeHandle("ok")}, "cluster", "1", id="first-try"),
        pytest.param(
            {"cluster": 1, "external": 1},
            {"cluster": FakeHandle("die"), "external": FakeHandle("ok")},
            "external",
            "2",
            id="dead-replica-retried-in-other-pool",
        ),
        pytest.param(
            {"cluster": 1},
            {"cluster": FakeHandle("die", "ok")},
            "cluster",
            "2",
            id="dead-replica-retried-in-same-pool",
        ),
        pytest.param(
            {"cluster": 1},
            {"cluster": FakeHandle("hang", "ok")},
            "cluster",
            "2",
            id="hung-try-times-out-and-retried",
        ),
    ],
)
def test_request_is_answered_despite_failed_tries(
    weights: dict[str, float], handles: dict[str, FakeHandle], pool: str, attempts: str
) -> None:
    ing = make_ingress(weights, handles, attempt_timeout_s=0.05)
    status, headers, body = call(ing, http_request(b'{"inputs": [1]}'))
    assert status == 200
    assert body == {"echo": {"inputs": [1]}}
    assert headers["x-rcp-attempts"] == attempts
    assert headers["x-rcp-pool"] == pool


@pytest.mark.parametrize(
    ("weights", "handles", "settings", "why"),
    [
        pytest.param(
            {"cluster": 0, "external": 0},
            {},
            {},
            "no pool has ready replicas",
            id="all-weights-zero",
        ),
        pytest.param(
            {"cluster": 1},
            {"cluster": FakeHandle("die")},
            {"max_attempts": 3},
            "used all 3 attempts",
            id="every-try-dies",
        ),
        pytest.param(
            {"cluster": 1},
            {"cluster": FakeHandle("hang")},
            {"attempt_timeout_s": 0.02, "request_timeout_s": 0.05, "max_attempts": 100},
            "deadline",
            id="hangs-bounded-by-deadline",
        ),
    ],
)
def test_no_capacity_is_503_with_retry_after(
    weights: dict[str, float], handles: dict[str, FakeHandle], settings: dict[str, Any], why: str
) -> None:
    ing = make_ingress(weights, handles, retry_after_s=2, **settings)
    status, headers, body = call(ing, http_request(b'{"inputs": [1]}'))
    assert status == 503
    assert headers["retry-after"] == "2"
    assert body["error"]["code"] == "no_capacity"
    assert why in body["error"]["message"]


@pytest.mark.parametrize(
    ("request_kwargs", "status", "code"),
    [
        pytest.param({"body": b"{oops"}, 400, "malformed_json", id="malformed-json"),
        pytest.param(
            {"body": b"{}", "content_type": "text/plain"},
            415,
            "unsupported_media_type",
            id="content-type",
        ),
        pytest.param(
            {"body": b'{"x": "' + b"a" * 100 + b'"}'}, 413, "body_too_large", id="oversized"
        ),
        pytest.param(
            {"body": b"{}", "path": "/v1/models/other/predict"},
            404,
            "unknown_model",
            id="unknown-model",
        ),
    ],
)
def test_bad_input_never_reaches_a_backend(
    request_kwargs: dict[str, Any], status: int, code: str
) -> None:
    handle = FakeHandle("ok")
    ing = make_ingress({"cluster": 1}, {"cluster": handle})
    got_status, _, body = call(ing, http_request(**request_kwargs))
    assert (got_status, body["error"]["code"]) == (status, code)
    assert handle.calls == 0


def test_health_reports_route_table_generation() -> None:
    ing = make_ingress({"cluster": 1}, {})
    status, _, body = call(ing, http_request(b"", path="/healthz", method="GET"))
    assert (status, body) == (200, {"status": "ok", "generation": 3})
