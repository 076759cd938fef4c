"""The ingress's request path with fake backend handles: retry on a dead or hung replica,
503 + Retry-After when nothing can serve, 4xx for bad input (never 5xx), and error bodies with
a request id and no exception text; the backend's envelopes likewise, and its HTTP route (the
edge router's) answering as the ingress does, with ``X-Rcp-Pool`` on every answer. The load
reports: backends count their requests in flight, the ingress only its traffic. No Ray is
started."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
from ray.exceptions import ActorDiedError
from starlette.requests import Request

import serve.app.backend
import serve.app.ingress
from serve.app.backend import Backend
from serve.app.ingress import Ingress

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
    for pool, handle in handles.items():
        ing._handles[("sample", pool)] = handle
    ing.reconfigure(
        {
            "generation": 3,
            "weights": {"sample": weights},
            "settings": {"max_body_bytes": 64, **settings},
        }
    )
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
    root_path: str = "",
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
        "root_path": root_path,
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
    backend = BackendImpl("sample", f"{__name__}:ExplodingModel", {}, "cluster")
    resp = asyncio.run(backend(backend_request(body, chunked=True, request_id=None)))
    out = json.loads(resp.body)
    assert (resp.status_code, out["error"]["code"]) == (status, code)
    assert out["error"]["request_id"] == resp.headers["x-request-id"]
    assert resp.headers["x-rcp-pool"] == "cluster"


# --- the backend's HTTP route (the edge router's path) ------------------------------------

PREFIX = "/_rcp/sample/external"
"""`serve.spec.backend_route_prefix("sample", "external")`: Serve's proxy puts it in
``root_path`` and leaves the full path in ``path``."""


def backend_request(body: bytes, rel: str = "v1/models/sample/predict", **kwargs: Any) -> Request:
    kwargs.setdefault("request_id", "rid-1")
    return http_request(body, path=f"{PREFIX}/{rel}", root_path=PREFIX, **kwargs)


class EchoModel:
    """Echoes the payload as the fake handle does; ``bad`` -> ValueError, ``boom`` -> a bug."""

    def predict(self, payload: dict[str, Any]) -> dict[str, Any]:
        if payload.get("bad"):
            raise ValueError("inputs must be 16 numbers")
        if payload.get("boom"):
            raise RuntimeError("password=hunter2")
        return {"echo": payload}


def make_backend(model: str = "EchoModel", pool: str = "external") -> Any:
    return BackendImpl("sample", f"{__name__}:{model}", {}, pool)


BIG = 1_048_576 + 1


@pytest.mark.parametrize(
    ("kwargs", "status", "code"),
    [
        pytest.param({"body": b'{"inputs": [1]}'}, 200, None, id="ok"),
        pytest.param({"body": b"{oops"}, 400, "malformed_json", id="malformed-json"),
        pytest.param({"body": b"[1]"}, 400, "invalid_body", id="not-an-object"),
        pytest.param(
            {"body": b"{}", "content_type": "text/plain"},
            415,
            "unsupported_media_type",
            id="content-type",
        ),
        pytest.param({"body": b"x" * BIG}, 413, "body_too_large", id="declared-too-large"),
        pytest.param(
            {"body": b"x" * BIG, "chunked": True}, 413, "body_too_large", id="streamed-too-large"
        ),
        pytest.param(
            {"body": b"{}", "rel": "v1/models/other/predict"},
            404,
            "unknown_model",
            id="other-model",
        ),
        pytest.param({"body": b"", "method": "GET"}, 405, "method_not_allowed", id="get-predict"),
        pytest.param({"body": b"", "rel": "nope"}, 404, "not_found", id="no-route"),
    ],
)
def test_the_backend_route_answers_as_the_ingress_does(
    kwargs: dict[str, Any], status: int, code: str | None
) -> None:
    """Same status, same body (the request id included) as the ingress on the same request;
    the backend's carries ``X-Rcp-Pool`` whatever the answer, the edge's sign that the
    model's replica answered."""
    rel = kwargs.pop("rel", "v1/models/sample/predict")
    ing = make_ingress({"external": 1}, {"external": FakeHandle("ok")}, max_body_bytes=BIG - 1)
    want_status, _, want = call(ing, http_request(path=f"/{rel}", request_id="rid-1", **kwargs))
    got = asyncio.run(make_backend()(backend_request(rel=rel, **kwargs)))
    assert (got.status_code, want_status) == (status, status)
    assert json.loads(got.body) == want
    assert got.headers["x-rcp-pool"] == "external"
    assert "x-rcp-attempts" not in got.headers
    if code is not None:
        assert want["error"]["code"] == code


@pytest.mark.parametrize(
    ("rel", "method"),
    [
        pytest.param("healthz", "GET", id="healthz"),
        pytest.param("v1/models", "GET", id="list-models"),
    ],
)
def test_the_ingress_only_routes_are_not_found_on_a_backend(rel: str, method: str) -> None:
    got = asyncio.run(make_backend()(backend_request(b"", rel=rel, method=method)))
    out = json.loads(got.body)
    assert (got.status_code, out["error"]["code"]) == (404, "not_found")
    assert got.headers["x-rcp-pool"] == "external"


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        pytest.param({"bad": True}, 422, "invalid_input", id="model-value-error"),
        pytest.param({"boom": True}, 500, "model_error", id="model-bug"),
    ],
)
def test_model_errors_on_the_backend_route_carry_the_pool_and_no_internals(
    payload: dict[str, Any], status: int, code: str
) -> None:
    got = asyncio.run(make_backend()(backend_request(json.dumps(payload).encode())))
    out = json.loads(got.body)
    assert (got.status_code, out["error"]["code"], out["error"]["request_id"]) == (
        status,
        code,
        "rid-1",
    )
    assert got.headers["x-rcp-pool"] == "external"
    assert "hunter2" not in got.body.decode()


def test_the_backend_route_request_id_is_the_clients_if_safe_else_fresh() -> None:
    backend = make_backend()
    got = asyncio.run(backend(backend_request(b"{}", request_id="client-7")))
    assert "x-request-id" not in got.headers  # the proxy echoes the id it sent
    got = asyncio.run(backend(backend_request(b"{oops", request_id="bad id; drop table")))
    out = json.loads(got.body)
    assert out["error"]["request_id"] == got.headers["x-request-id"] != "bad id; drop table"


def test_a_failing_backend_route_answers_500_with_the_pool(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = make_backend()

    async def broken(*_args: Any) -> Any:
        raise KeyError("secret-internal-detail")

    backend._answer = broken
    with caplog.at_level("ERROR", logger="ray.serve"):
        got = asyncio.run(backend(backend_request(b"{}")))
    out = json.loads(got.body)
    assert (got.status_code, out["error"]["code"]) == (500, "internal_error")
    assert got.headers["x-rcp-pool"] == "external"
    assert "secret-internal-detail" not in got.body.decode()


# --- the load reports -----------------------------------------------------------------------


class Probe:
    """A model that waits until `parties` requests are inside the replica at once and notes
    the replica's in-flight counts at that moment."""

    def __init__(self, backend: Any, parties: int) -> None:
        self.seen: dict[str, int] = {}
        self.barrier = threading.Barrier(
            parties, action=lambda: self.seen.update(backend._inflight.counts()), timeout=10
        )

    def predict(self, payload: dict[str, Any]) -> dict[str, Any]:
        self.barrier.wait()
        return {}


def test_a_backend_counts_its_requests_in_flight_on_both_routes_and_threads() -> None:
    backend = make_backend()
    backend._model = probe = Probe(backend, parties=4)
    with ThreadPoolExecutor(4) as pool:
        handle_calls = [pool.submit(backend.predict, {}, f"r{i}") for i in range(3)]
        http_call = pool.submit(lambda: asyncio.run(backend(backend_request(b"{}"))))
        statuses = [f.result()["status"] for f in handle_calls] + [http_call.result().status_code]
    assert statuses == [200] * 4
    # All four were inside at once (the barrier let them through together), each counted once.
    assert probe.seen == {"sample": 4}
    assert backend._inflight.counts() == {"sample": 0}
    backend._model = EchoModel()
    env = backend.predict({"boom": True}, "r9")  # a model that raises is uncounted too
    assert env["status"] == 500 and backend._inflight.counts() == {"sample": 0}


class FakeBoard:
    def __init__(self) -> None:
        self.reports: list[tuple[Any, ...]] = []
        self.report = self

    def remote(self, *args: Any) -> None:
        self.reports.append(args)


def test_a_backend_reports_its_counts_alone_and_survives_a_lost_board(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend = make_backend()
    board = FakeBoard()
    monkeypatch.setattr(serve.app.backend, "board", lambda: board)
    assert backend.report_load("replica-1", None) is board
    backend.predict({}, "r1")
    assert backend.report_load("replica-1", board) is board
    # No answered/cpu/interval: those are the ingress's (`serve.app.load`: interval 0 = a backend).
    # The second report is the mean in flight over its window, which the request took part of.
    (first, second) = board.reports
    assert first == ("replica-1", {})
    assert second[0] == "replica-1" and set(second[1]) == {"sample"}
    assert 0.0 < second[1]["sample"] < 1.0

    def restarting() -> Any:
        raise ActorDiedError()

    monkeypatch.setattr(serve.app.backend, "board", restarting)
    assert backend.report_load("replica-1", None) is None  # logged, looked up again next time
    assert backend.predict({}, "r2")["status"] == 200


def test_outside_a_replica_no_reporter_starts() -> None:
    backend = make_backend()
    before = {t.name for t in threading.enumerate()}
    assert backend.predict({}, "r1")["status"] == 200
    assert backend._reporter_started
    assert "rcp-load-report" not in {t.name for t in threading.enumerate()} - before


def test_the_ingress_reports_its_traffic_without_per_model_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    board = FakeBoard()
    monkeypatch.setattr(serve.app.ingress, "board", lambda: board)
    context = SimpleNamespace(replica_id=SimpleNamespace(unique_id="ingress-1"))
    monkeypatch.setattr("ray.serve.get_replica_context", lambda: context)
    ing = make_ingress({"cluster": 1}, {"cluster": FakeHandle("ok")})

    async def one_report() -> None:
        await ing(http_request(b'{"inputs": [1]}'))  # the first predict starts the reporter
        await asyncio.sleep(0.05)
        ing._reporter.cancel()

    asyncio.run(one_report())
    (me, counts, answered, cpu_s, interval_s), *_ = board.reports
    assert (me, counts) == ("ingress-1", {})
    assert answered >= 0 and cpu_s >= 0 and interval_s >= 0


def test_a_replica_makes_its_backend_handles_when_the_table_arrives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside Serve, reconfigure (which Serve's controller calls, so it is up) makes a handle to
    every backend the table names, unchecked against the controller: a first predict after
    the head is lost finds its handle made and its router fed, instead of waiting on the
    head. A backend the next table adds gets one too; one made before is kept."""
    made: list[tuple[str, str, bool]] = []

    class Made:
        def options(self, **_: Any) -> str:
            return f"handle-{len(made)}"

    def get_deployment_handle(name: str, app: str, _check_exists: bool = True) -> Made:
        made.append((name, app, _check_exists))
        return Made()

    monkeypatch.setattr(serve.app.ingress.serve, "get_deployment_handle", get_deployment_handle)
    context = SimpleNamespace(replica_id=SimpleNamespace(unique_id="ingress-1"))
    monkeypatch.setattr("ray.serve.get_replica_context", lambda: context)
    ing = IngressImpl()
    ing.reconfigure({"generation": 1, "weights": {"sample": {"cluster": 1, "external": 0}}})
    assert made == [
        ("Backend", "rcp-sample-cluster", False),
        ("Backend", "rcp-sample-external", False),
    ]
    first = dict(ing._handles)
    ing.reconfigure(
        {"generation": 2, "weights": {"sample": {"cluster": 1, "external": 0}, "b": {"cluster": 1}}}
    )
    assert made[2:] == [("Backend", "rcp-b-cluster", False)]
    assert all(ing._handles[k] == v for k, v in first.items())


def test_list_models_is_the_edges_route_table() -> None:
    ing = make_ingress(
        {"cluster": 2, "external": 1},
        {},
        max_attempts=4,
        attempt_timeout_s=2.5,
        request_timeout_s=9.0,
        retry_after_s=3,
        edge_table_max_age_s=0.5,
    )
    status, _, body = call(ing, http_request(b"", path="/v1/models", method="GET"))
    assert status == 200
    assert body == {
        "models": [{"name": "sample", "weights": {"cluster": 2.0, "external": 1.0}}],
        "generation": 3,
        "routing": {
            "max_attempts": 4,
            "attempt_timeout_s": 2.5,
            "request_timeout_s": 9.0,
            "retry_after_s": 3,
            "max_body_bytes": 64,
            "table_max_age_s": 0.5,
            "backend_root": "/_rcp",
        },
    }
