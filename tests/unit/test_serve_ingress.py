"""The ingress's request path with fake backend handles: retry on a dead or hung replica,
503 + Retry-After when nothing can serve, 4xx for bad input (never 5xx), and error bodies with
a request id and no exception text; the backend's envelopes likewise. No Ray is started."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from ray.exceptions import ActorDiedError
from starlette.requests import Request

from serve.backend import Backend
from serve.ingress import Ingress

IngressImpl: Any = Ingress.func_or_class
BackendImpl: Any = Backend.func_or_class


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
        self.request_ids: list[str] = []

    def remote(self, payload: dict[str, Any], request_id: str) -> FakeResponse:
        behavior = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        self.request_ids.append(request_id)
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
    chunked: bool = False,
    request_id: str | None = None,
) -> Request:
    headers = [(b"content-type", content_type.encode())]
    if not chunked:
        headers.append((b"content-length", str(len(body)).encode()))
    if request_id is not None:
        headers.append((b"x-request-id", request_id.encode()))
    parts = [body[i : i + 16] for i in range(0, len(body), 16)] or [b""]

    async def receive() -> dict[str, Any]:
        if not parts:
            return {"type": "http.disconnect"}
        chunk = parts.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(parts)}

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


def deep(depth: int) -> bytes:
    return b'{"x": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize(
    ("body", "code", "hint"),
    [
        pytest.param(b'{"inputs": [NaN]}', "malformed_json", "NaN", id="nan"),
        pytest.param(b'{"inputs": Infinity}', "malformed_json", "Infinity", id="infinity"),
        pytest.param(b'{"inputs": [1e999]}', "invalid_body", "overflows", id="float-overflow"),
        pytest.param(deep(64), "invalid_body", "deeper than 64", id="too-deep"),
        pytest.param(b"[" * 50_000, "invalid_body", "deeper than 64", id="recursion-bomb"),
        pytest.param(b'{"n": ' + b"7" * 5000 + b"}", "invalid_body", "4300 digits", id="huge-int"),
    ],
)
def test_hostile_json_is_400_with_a_request_id_never_500(body: bytes, code: str, hint: str) -> None:
    handle = FakeHandle("ok")
    ing = make_ingress({"cluster": 1}, {"cluster": handle}, max_body_bytes=1 << 20)
    status, headers, out = call(ing, http_request(body))
    assert (status, out["error"]["code"]) == (400, code)
    assert hint in out["error"]["message"]
    assert out["error"]["request_id"] == headers["x-request-id"]
    assert handle.calls == 0


def test_a_streamed_body_past_the_limit_is_413() -> None:
    ing = make_ingress({"cluster": 1}, {"cluster": FakeHandle("ok")})
    status, headers, out = call(ing, http_request(b'{"x": "' + b"a" * 200 + b'"}', chunked=True))
    assert (status, out["error"]["code"]) == (413, "body_too_large")
    assert out["error"]["request_id"] == headers["x-request-id"]


def test_the_proxy_request_id_is_used_and_reaches_the_backend() -> None:
    handle = FakeHandle("ok")
    ing = make_ingress({"cluster": 1}, {"cluster": handle})
    status, headers, _ = call(ing, http_request(b'{"inputs": [1]}', request_id="proxy-42"))
    assert status == 200
    assert handle.request_ids == ["proxy-42"]
    assert "x-request-id" not in headers  # the proxy adds it to the response itself
    status, headers, out = call(ing, http_request(b"{oops", request_id="proxy-43"))
    assert (status, out["error"]["request_id"]) == (400, "proxy-43")


def test_a_failing_ingress_answers_500_without_internals(caplog: pytest.LogCaptureFixture) -> None:
    ing = make_ingress({"cluster": 1}, {"cluster": FakeHandle("ok")})

    async def broken(*_args: Any) -> Any:
        raise KeyError("secret-internal-detail")

    ing._predict = broken
    with caplog.at_level("ERROR", logger="ray.serve"):
        status, headers, out = call(ing, http_request(b'{"inputs": [1]}'))
    rid = headers["x-request-id"]
    assert (status, out["error"]["code"], out["error"]["request_id"]) == (
        500,
        "internal_error",
        rid,
    )
    assert "secret-internal-detail" not in json.dumps(out)
    assert any(rid in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_dead_replica_503_names_no_exception() -> None:
    ing = make_ingress({"cluster": 1}, {"cluster": FakeHandle("die")}, max_attempts=1)
    status, _headers, out = call(ing, http_request(b'{"inputs": [1]}'))
    assert status == 503
    assert "ActorDiedError" not in out["error"]["message"]


class ExplodingModel:
    def predict(self, payload: dict[str, Any]) -> dict[str, Any]:
        if payload.get("bad"):
            raise ValueError("inputs must be 16 numbers")
        raise RuntimeError("password=hunter2 in /etc/secret")


def test_backend_500_carries_the_request_id_not_the_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = BackendImpl("m", f"{__name__}:ExplodingModel", {}, "cluster")
    with caplog.at_level("ERROR", logger="ray.serve"):
        env = backend.predict({}, "rid-7")
    assert env["status"] == 500
    err = env["body"]["error"]
    assert (err["code"], err["request_id"]) == ("model_error", "rid-7")
    assert "hunter2" not in json.dumps(env)
    assert any("rid-7" in r.getMessage() and r.exc_info for r in caplog.records)
    env = backend.predict({"bad": True}, "rid-8")
    assert env["status"] == 422
    assert env["body"]["error"] == {
        "code": "invalid_input",
        "message": "inputs must be 16 numbers",
        "request_id": "rid-8",
    }


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        pytest.param(b'{"x": NaN}', 400, "malformed_json", id="nan"),
        pytest.param(deep(80), 400, "invalid_body", id="too-deep"),
        pytest.param(b"x" * (1_048_576 + 1), 413, "body_too_large", id="too-large"),
    ],
)
def test_backend_plain_http_applies_the_same_limits(body: bytes, status: int, code: str) -> None:
    backend = BackendImpl("m", f"{__name__}:ExplodingModel", {}, "cluster")
    resp = asyncio.run(backend(http_request(body, chunked=True)))
    out = json.loads(resp.body)
    assert (resp.status_code, out["error"]["code"]) == (status, code)
    assert out["error"]["request_id"] == resp.headers["x-request-id"]
