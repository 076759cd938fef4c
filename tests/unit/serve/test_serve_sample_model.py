"""The sample torch model: deterministic answers and clear errors for bad input."""

from __future__ import annotations

from typing import Any

import pytest

from serve.app.backend import BackendReplica
from serve.sample_model import SampleModel


@pytest.fixture(scope="module")
def model() -> SampleModel:
    return SampleModel(num_features=4, hidden=8, num_classes=3, max_batch=2)


def test_answers_probabilities_per_row(model: SampleModel) -> None:
    out = model.predict({"inputs": [[0.1, 0.2, 0.3, 0.4], [1, 0, -1, 2]]})
    assert len(out["outputs"]) == 2 and len(out["labels"]) == 2
    for row, label in zip(out["outputs"], out["labels"], strict=True):
        assert len(row) == 3
        assert sum(row) == pytest.approx(1.0, abs=1e-4)
        assert row[label] == max(row)


def test_same_seed_same_answer_in_every_replica(model: SampleModel) -> None:
    other = SampleModel(num_features=4, hidden=8, num_classes=3, max_batch=2)
    payload = {"inputs": [[0.5, -0.5, 0.25, 1.0]]}
    assert other.predict(payload) == model.predict(payload)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        pytest.param({}, "non-empty list", id="missing-inputs"),
        pytest.param({"inputs": []}, "non-empty list", id="empty-inputs"),
        pytest.param({"inputs": [[1, 2]]}, "list of 4 numbers", id="wrong-width"),
        pytest.param({"inputs": [[1, 2, 3, "x"]]}, "not a finite number", id="string-value"),
        pytest.param({"inputs": [[1, 2, 3, float("nan")]]}, "not a finite number", id="nan"),
        pytest.param({"inputs": [[1, 2, 3, True]]}, "not a finite number", id="bool"),
        pytest.param({"inputs": [[0, 0, 0, 0]] * 3}, "at most 2", id="batch-too-big"),
    ],
)
def test_bad_input_raises_value_error(
    model: SampleModel, payload: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        model.predict(payload)


@pytest.mark.parametrize(
    ("extra_latency_ms", "slept"),
    [
        pytest.param(250, [0.25], id="slow-backend-sleeps"),
        pytest.param(0, [], id="default-no-sleep"),
    ],
)
def test_the_slow_backend_knob(
    monkeypatch: pytest.MonkeyPatch, extra_latency_ms: float, slept: list[float]
) -> None:
    calls: list[float] = []
    monkeypatch.setattr("serve.sample_model.time.sleep", calls.append)
    slow = SampleModel(num_features=4, hidden=8, num_classes=3, extra_latency_ms=extra_latency_ms)
    assert len(slow.predict({"inputs": [[1, 2, 3, 4]]})["labels"]) == 1
    assert calls == slept
    with pytest.raises(ValueError, match="non-empty list"):
        slow.predict({"inputs": []})
    assert calls == slept  # a bad request is refused at once


@pytest.mark.parametrize("extra_latency_ms", [-1, 60_001])
def test_the_slow_backend_knob_is_bounded(extra_latency_ms: float) -> None:
    with pytest.raises(ValueError, match="init_kwargs.extra_latency_ms"):
        SampleModel(num_features=4, extra_latency_ms=extra_latency_ms)


def test_the_slow_backend_knob_changes_at_run_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """``user_config`` (Serve's reconfigure) slows a running model down and speeds it up."""
    calls: list[float] = []
    monkeypatch.setattr("serve.sample_model.time.sleep", calls.append)
    m = SampleModel(num_features=4, hidden=8, num_classes=3)
    m.reconfigure({"extra_latency_ms": 120})
    m.predict({"inputs": [[1, 2, 3, 4]]})
    m.reconfigure({})  # nothing said: unchanged
    m.predict({"inputs": [[1, 2, 3, 4]]})
    m.reconfigure({"extra_latency_ms": 0})
    m.predict({"inputs": [[1, 2, 3, 4]]})
    assert calls == [0.12, 0.12]


@pytest.mark.parametrize(
    ("user_config", "message"),
    [
        pytest.param({"extra_latency_ms": -5}, "user_config.extra_latency_ms", id="negative"),
        pytest.param({"extra_latency_ms": float("nan")}, "user_config.extra_latency_ms", id="nan"),
        pytest.param({"extra_latency_ms": "slow"}, "user_config.extra_latency_ms", id="string"),
        pytest.param({"latency": 5}, "user_config.latency: unknown key", id="unknown-key"),
    ],
)
def test_the_run_time_knob_rejects_bad_values(
    model: SampleModel, user_config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        model.reconfigure(user_config)


class PlainModel:
    """A model class without ``reconfigure``."""

    def predict(self, payload: dict[str, Any]) -> dict[str, Any]:
        return {}


def test_the_backend_hands_user_config_to_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    monkeypatch.setattr("serve.sample_model.time.sleep", calls.append)
    backend = BackendReplica("sample", "serve.sample_model:SampleModel", {}, "cluster")
    backend.reconfigure({"extra_latency_ms": 50})
    assert backend.predict({"inputs": [[0.0] * 16]})["status"] == 200
    assert calls == [0.05]
    plain = BackendReplica("plain", f"{__name__}:PlainModel", {}, "cluster")
    plain.reconfigure({})  # what Serve hands a model with no user_config: accepted
    with pytest.raises(ValueError, match="'plain': user_config \\['k'\\] given, but its class"):
        plain.reconfigure({"k": 1})


def test_the_http_route_answers_requests_side_by_side_and_counts_each_in_flight() -> None:
    """The backend's HTTP route runs the model off the replica's event loop: two slow requests
    (200 ms each) overlap, and the in-flight count (the demand signal) sees both. A model
    run on the loop would answer them one after the other and count 1."""
    import asyncio
    import json

    from starlette.requests import Request

    backend = BackendReplica("sample", "serve.sample_model:SampleModel", {}, "cluster")
    backend.reconfigure({"extra_latency_ms": 200})
    backend._reporter_started = True  # no load board here
    body = json.dumps({"inputs": [[0.1 * i for i in range(16)]]}).encode()
    seen: list[int] = []

    def request() -> Request:
        sent = False

        async def receive() -> dict[str, object]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/models/sample/predict",
            "headers": [(b"content-type", b"application/json")],
            "query_string": b"",
        }
        return Request(scope, receive)

    async def watch() -> None:
        for _ in range(15):
            seen.append(backend._inflight.counts().get("sample", 0))
            await asyncio.sleep(0.02)

    async def both() -> list[int]:
        answers = await asyncio.gather(backend(request()), backend(request()), watch())
        return [a.status_code for a in answers[:2]]

    assert asyncio.run(both()) == [200, 200]
    assert max(seen) == 2  # both in the model at once
