"""The edge router's pure decisions (serve.edge): reading the ingress's route table, which
requests the edge routes, the backend it picks, and whose answer an answer is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from serve.edge import (
    EdgeHealth,
    EdgeRouting,
    EdgeScrape,
    EdgeTable,
    EdgeTableError,
    Forward,
    PredictTarget,
    Refuse,
    choose_backend,
    classify,
    is_model_answer,
    newer_table,
    table_from_answer,
)
from serve.inputs import ErrorCode
from serve.spec import BACKEND_ROUTE_ROOT


def answer(**overrides: Any) -> bytes:
    doc: dict[str, Any] = {
        "models": [{"name": "sample", "weights": {"cluster": 2.0, "external": 0.0}}],
        "generation": 7,
        "routing": {"max_attempts": 4, "table_max_age_s": 0.5, "backend_root": "/_rcp"},
    }
    doc.update(overrides)
    return json.dumps(doc).encode()


def test_a_table_is_read_with_its_routing_and_defaults() -> None:
    table = table_from_answer(answer(), fetched_s=100.0)
    assert table.generation == 7
    assert table.weights == {"sample": {"cluster": 2.0, "external": 0.0}}
    assert table.routing == EdgeRouting(max_attempts=4, table_max_age_s=0.5)
    assert table.routing.backend_root == BACKEND_ROUTE_ROOT
    assert (table.fresh(100.0), table.fresh(100.49), table.fresh(100.5)) == (True, True, False)
    assert not table.fresh(99.0)  # a clock that went back: not trusted
    newer = table_from_answer(answer(routing={"a_key_from_a_newer_ingress": 1}), 0.0)
    assert newer.routing == EdgeRouting()


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"[1, 2]", "not a JSON object"),
        (b"{", "route table: "),
        (b'{"generation": NaN, "models": []}', "route table: "),
        (answer(generation=-1), "generation must be an integer >= 0"),
        (answer(generation=True), "generation must be an integer >= 0"),
        (answer(models={}), "models must be a list"),
        (answer(models=[{"name": "Bad Name", "weights": {}}]), "models[0].name"),
        (answer(models=[{"name": "m", "weights": {"moon": 1}}]), "unknown pool 'moon'"),
        (answer(models=[{"name": "m", "weights": {"cluster": -1}}]), "weights.cluster"),
        (answer(models=[{"name": "m", "weights": {"cluster": 1e300}}]), "weights.cluster"),
        (answer(models=[{"name": "m", "weights": {"cluster": "1"}}]), "weights.cluster"),
        (answer(routing={"max_attempts": 0}), "routing.max_attempts"),
        (answer(routing={"table_max_age_s": 1e9}), "routing.table_max_age_s"),
        (answer(routing={"request_timeout_s": None}), "routing.request_timeout_s"),
        (answer(routing={"backend_root": "/../x"}), "routing.backend_root"),
        (answer(routing=[]), "routing must be an object"),
        (b" " * 1_048_577, "exceeds"),
    ],
)
def test_a_table_the_edge_cannot_route_by_is_refused_with_a_reason(
    raw: bytes, message: str
) -> None:
    with pytest.raises(EdgeTableError) as err:
        table_from_answer(raw, 0.0)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("method", "target", "prefix", "expected"),
    [
        ("POST", "/v1/models/sample/predict", "/", PredictTarget("sample")),
        ("POST", "/v1/models/sample/predict?debug=1", "/", PredictTarget("sample", "debug=1")),
        ("POST", "/api/v1/models/sample/predict", "/api", PredictTarget("sample")),
        ("POST", "/api/v1/models/sample/predict", "/api/", PredictTarget("sample")),
        ("POST", "/v1/models/sample/predict", "/api", None),
        ("GET", "/v1/models/sample/predict", "/", None),  # the ingress answers 405
        ("GET", "/v1/models", "/", None),
        ("GET", "/healthz", "/", None),
        ("POST", "/v1/models/Sample/predict", "/", None),  # not a model name: the ingress says so
        ("POST", "/v1/models/sample/predict/", "/", None),
        ("POST", "//v1/models/sample/predict", "/", None),
        ("POST", "/v1/models/%73ample/predict", "/", None),  # encoded: the ingress decodes it
    ],
)
def test_which_requests_the_edge_routes(
    method: str, target: str, prefix: str, expected: PredictTarget | None
) -> None:
    assert classify(method, target, prefix, "/_rcp") == expected


@pytest.mark.parametrize("target", ["/_rcp", "/_rcp/sample/cluster/v1/models/sample/predict"])
def test_a_client_cannot_address_a_backend_app_through_the_edge(target: str) -> None:
    refused = classify("POST", target, "/", "/_rcp")
    assert isinstance(refused, Refuse)
    assert (refused.status, refused.code) == (404, ErrorCode.NOT_FOUND)
    assert classify("POST", "/_rcpx/y", "/", "/_rcp") is None


TABLE = EdgeTable(
    generation=3,
    weights={"sample": {"cluster": 1.0, "external": 3.0}, "idle": {"cluster": 0.0}},
    routing=EdgeRouting(table_max_age_s=1.0),
    fetched_s=10.0,
)
PATH = "/_rcp/sample/{}/v1/models/sample/predict"


@pytest.mark.parametrize(
    ("target", "table", "now_s", "u", "tried", "expected"),
    [
        (PredictTarget("sample"), TABLE, 10.5, 0.1, (), Forward("sample", "cluster", PATH.format("cluster"))),
        (PredictTarget("sample"), TABLE, 10.5, 0.5, (), Forward("sample", "external", PATH.format("external"))),
        (PredictTarget("sample"), TABLE, 10.5, 0.1, ("cluster",), Forward("sample", "external", PATH.format("external"))),
        (PredictTarget("sample", "a=1"), TABLE, 10.5, 0.9, (), Forward("sample", "external", PATH.format("external") + "?a=1")),
        (PredictTarget("sample"), TABLE, 11.0, 0.1, (), None),  # stale: through the ingress
        (PredictTarget("sample"), None, 0.0, 0.1, (), None),  # no table yet
        (PredictTarget("other"), TABLE, 10.5, 0.1, (), None),  # unknown model
        (PredictTarget("idle"), TABLE, 10.5, 0.1, (), None),  # no pool with weight
    ],
)  # fmt: skip
def test_the_backend_a_try_goes_to(
    target: PredictTarget,
    table: EdgeTable | None,
    now_s: float,
    u: float,
    tried: tuple[str, ...],
    expected: Forward | None,
) -> None:
    assert choose_backend(target, table, now_s, u, tried) == expected


def test_whose_answer_it_is() -> None:
    assert is_model_answer([(b"Content-Type", b"x"), (b"X-Rcp-Pool", b"cluster")])
    assert is_model_answer([(b"x-rcp-pool", b"external")])
    assert not is_model_answer([(b"content-type", b"text/plain")])  # Serve's own 404/500


@pytest.mark.parametrize(
    ("method", "target", "prefix", "expected"),
    [
        ("GET", "/-/edge/healthz", "/", EdgeHealth()),
        ("HEAD", "/-/edge/healthz", "/", EdgeHealth()),
        ("GET", "/-/edge/healthz?probe=1", "/", EdgeHealth()),
        ("GET", "/-/edge/healthz?probe=live", "/", EdgeHealth(live=True)),  # liveness
        ("HEAD", "/-/edge/healthz?x=1&probe=live", "/", EdgeHealth(live=True)),
        ("GET", "/-/edge/healthz", "/api", EdgeHealth()),  # outside the route prefix
        ("GET", "/api/-/edge/healthz", "/api", None),
        ("GET", "/-/healthz", "/", None),  # Serve's own: the ingress's proxy answers it
        ("GET", "/-/edge/healthz/", "/", None),
        ("GET", "/-/edge/metrics", "/", EdgeScrape()),
        ("HEAD", "/-/edge/metrics", "/api", EdgeScrape()),
        ("GET", "/api/-/edge/metrics", "/api", None),
    ],
)
def test_the_edge_answers_its_own_health_and_metrics(
    method: str, target: str, prefix: str, expected: EdgeHealth | EdgeScrape | None
) -> None:
    assert classify(method, target, prefix, "/_rcp") == expected


@pytest.mark.parametrize("path", ["/-/edge/healthz", "/-/edge/metrics"])
@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_the_edge_health_and_metrics_take_no_other_method(method: str, path: str) -> None:
    refused = classify(method, path, "/", "/_rcp")
    assert isinstance(refused, Refuse)
    assert (refused.status, refused.code) == (405, ErrorCode.METHOD_NOT_ALLOWED)


@pytest.mark.parametrize(
    ("current", "fetched", "now_s", "kept"),
    [
        (None, 3, 1.0, 3),
        (4, 3, 0.5, 4),  # a replica that has not applied 4 yet: routing does not go back
        (4, 5, 0.5, 5),
        (4, 4, 0.5, 4),
        (4, 3, 1.0, 3),  # 4 aged out: take what the ingress says now (a fresh deploy)
    ],
)
def test_routing_goes_forward_only_while_the_newer_table_is_fresh(
    current: int | None, fetched: int, now_s: float, kept: int
) -> None:
    routing = EdgeRouting(table_max_age_s=1.0)
    now_table = None if current is None else EdgeTable(current, {}, routing, fetched_s=0.0)
    got = newer_table(now_table, EdgeTable(fetched, {}, routing, fetched_s=now_s), now_s)
    assert got.generation == kept
    if kept == current != fetched:
        assert got.fetched_s == 0.0  # the kept table ages from its own fetch
    else:
        assert got.fetched_s == now_s  # the same generation again: fresh from this fetch
