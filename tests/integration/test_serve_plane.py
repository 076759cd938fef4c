"""The serving plane on a real local Ray cluster with a real Serve HTTP endpoint on loopback.

One cluster for the module: a head (pool_head), one `cluster` node (4 GPUs) and one
`external` node (2 GPUs), all logical. Load is a few client threads, bounded in count and
time, only to 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray  # noqa: E402
import requests  # noqa: E402
from ray import serve  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from serve import operations as ops  # noqa: E402
from serve.config import IngressConfig, ModelConfig, ServingConfig  # noqa: E402
from serve.load import read_ingress_traffic  # noqa: E402
from serve.status import format_status_table, serve_status  # noqa: E402
from tests.integration.conftest import GOOD, MODEL, Load, predict_url, wait_for  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TARGET = 2
# A heavier variant of the sample model (about 10 ms per request here), so that when a replica
# is killed some requests are certainly inside it.
HEAVY = "heavy"
HEAVY_BODY = {"inputs": [[0.1 * i for i in range(16)]] * 32}
MAX_BODY_BYTES = 32768


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving_config() -> ServingConfig:
    return ServingConfig(
        ready_timeout_s=90.0,
        ingress=IngressConfig(num_replicas=2, num_cpus=0.25, max_body_bytes=MAX_BODY_BYTES),
        models=[
            ModelConfig(
                name=MODEL,
                num_cpus=0.5,
                num_gpus=1.0,
                min_replicas=TARGET,
                max_replicas=4,
                graceful_shutdown_timeout_s=5.0,
            ),
            ModelConfig(
                name=HEAVY,
                init_kwargs={"hidden": 3072},
                num_cpus=0.5,
                num_gpus=1.0,
                min_replicas=TARGET,
                max_replicas=2,
            ),
        ],
    )


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    cluster = Cluster()
    cluster.add_node(
        num_cpus=4,
        resources={"pool_head": 1000},
        labels={"pool": "head"},
        include_dashboard=False,
    )
    cluster.add_node(
        num_cpus=4, num_gpus=4, resources={"pool_cluster": 1000}, labels={"pool": "cluster"}
    )
    cluster.add_node(
        num_cpus=4, num_gpus=2, resources={"pool_external": 1000}, labels={"pool": "external"}
    )
    ray.init(address=cluster.address)
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        ops.deploy(serving_config())
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


@dataclass
class Timeline:
    """`serve_status()` sampled in the background: (running, weight) per pool per sample."""

    period_s: float = 0.2
    samples: list[dict[str, tuple[int, float]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            pools = serve_status()["models"][MODEL]["pools"]
            self.samples.append({p: (v["running"], v["weight"]) for p, v in pools.items()})
            time.sleep(self.period_s)

    def __enter__(self) -> Timeline:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)


def backend_replicas(pool: str, model: str = MODEL) -> list[dict[str, Any]]:
    return list(serve_status()["models"][model]["pools"][pool]["replicas"])


def test_deployed_with_targets_weights_and_nodes(url: str) -> None:
    data = serve_status()
    cluster = data["models"][MODEL]["pools"]["cluster"]
    assert (cluster["target"], cluster["running"], cluster["weight"]) == (TARGET, TARGET, TARGET)
    assert {r["node_pool"] for r in cluster["replicas"]} == {"cluster"}
    assert data["models"][MODEL]["pools"]["external"]["target"] == 0
    assert data["ingress"]["running"] == 2
    assert "sample  cluster" in format_status_table(data)
    r = requests.get(f"{url}/healthz", timeout=10)
    assert r.status_code == 200 and r.json()["generation"] == data["generation"]


@pytest.mark.parametrize(
    ("kwargs", "status", "code"),
    [
        pytest.param(
            {"data": b"{not json", "headers": {"Content-Type": "application/json"}},
            400,
            "malformed_json",
            id="malformed-json",
        ),
        pytest.param(
            {"data": b'{"inputs": []}', "headers": {"Content-Type": "text/plain"}},
            415,
            "unsupported_media_type",
            id="wrong-content-type",
        ),
        pytest.param(
            {"json": {"inputs": [[0.0] * 16] * 40, "pad": "x" * MAX_BODY_BYTES}},
            413,
            "body_too_large",
            id="oversized-body",
        ),
        pytest.param({"json": {"inputs": [[1, 2]]}}, 422, "invalid_input", id="wrong-input-shape"),
        pytest.param({"json": GOOD, "model": "nope"}, 404, "unknown_model", id="unknown-model"),
        pytest.param({"json": [1, 2]}, 400, "invalid_body", id="json-not-object"),
        pytest.param(
            {"data": b'{"inputs": [[NaN]]}', "headers": {"Content-Type": "application/json"}},
            400,
            "malformed_json",
            id="nan",
        ),
        pytest.param(
            {"data": b"[" * 20_000, "headers": {"Content-Type": "application/json"}},
            400,
            "invalid_body",
            id="deep-nesting",
        ),
        pytest.param(
            {
                "data": b'{"n": ' + b"1" * 5000 + b"}",
                "headers": {"Content-Type": "application/json"},
            },
            400,
            "invalid_body",
            id="huge-int",
        ),
    ],
)
def test_bad_input_gets_4xx_and_serving_continues(
    url: str, kwargs: dict[str, Any], status: int, code: str
) -> None:
    model = kwargs.pop("model", MODEL)
    r = requests.post(predict_url(url, model), timeout=30, **kwargs)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code
    assert r.json()["error"]["message"]
    # One request id, in the header (from Serve's proxy) and the body alike.
    assert r.json()["error"]["request_id"] == r.headers["X-Request-Id"]
    ok = requests.post(predict_url(url), json=GOOD, timeout=30)
    assert ok.status_code == 200 and len(ok.json()["outputs"][0]) == 4


def test_move_all_to_external_and_back_under_load(url: str) -> None:
    with Timeline() as timeline, Load(url) as load:
        load.wait_for(20)
        out = ops.move(MODEL, "cluster", "external", TARGET)
        assert out.num_replicas == TARGET
        mid = serve_status()["models"][MODEL]["pools"]
        assert (mid["external"]["running"], mid["cluster"]["target"]) == (TARGET, 0)
        assert {r["node_pool"] for r in mid["external"]["replicas"]} == {"external"}
        seen = load.total
        load.wait_for(seen + 20)
        back = ops.move(MODEL, "external", "cluster", TARGET)
        assert back.num_replicas == TARGET
        seen = load.total
        load.wait_for(seen + 20)
    assert load.errors == []
    assert set(load.statuses) == {200}
    assert load.pools["external"] > 0 and load.pools["cluster"] > 0
    assert timeline.samples, "the status timeline recorded nothing"
    # make-before-break, from the status timeline: never fewer ready replicas than the target,
    # neither in total nor among the pools that receive traffic.
    for sample in timeline.samples:
        assert sum(running for running, _ in sample.values()) >= TARGET, sample
        assert sum(running for running, w in sample.values() if w > 0) >= TARGET, sample
    assert any(all(running > 0 for running, _ in s.values()) for s in timeline.samples), (
        "no sample saw both pools running: the move was not observed"
    )
    final = serve_status()["models"][MODEL]["pools"]
    assert (final["cluster"]["running"], final["external"]["target"]) == (TARGET, 0)


def kill_and_wait_for_replacement(model: str) -> str:
    """Kill one RUNNING backend replica's actor; return its id once Serve replaced it."""
    victim = next(r for r in backend_replicas("cluster", model) if r["state"] == "RUNNING")
    ray.kill(ray.get_actor(victim["actor_name"], namespace="serve"), no_restart=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        replicas = backend_replicas("cluster", model)
        ids = {r["replica_id"] for r in replicas if r["state"] == "RUNNING"}
        if len(ids) == TARGET and victim["replica_id"] not in ids:
            break
        time.sleep(0.2)
    return str(victim["replica_id"])


def test_killed_replica_mid_load_clients_see_no_error(url: str) -> None:
    killed: list[str] = []
    # 8 clients keep both replicas busy, so a killed replica has requests inside it; the
    # kill is repeated (at most 3 times) until the ingress has had to retry at least once.
    with Load(url, model=HEAVY, body=HEAVY_BODY, threads=8) as load:
        load.wait_for(30)
        for _ in range(3):
            killed.append(kill_and_wait_for_replacement(HEAVY))
            seen = load.total
            load.wait_for(seen + 20)
            if load.retried > 0:
                break
    running = {r["replica_id"] for r in backend_replicas("cluster", HEAVY)}
    assert not running & set(killed)
    assert load.errors == []
    assert set(load.statuses) == {200}
    # requests that were inside a killed replica were answered by a retry elsewhere
    assert load.retried > 0


def ingress_running(n: int) -> bool:
    ing = serve_status()["ingress"]
    return bool(ing["target"] == n and ing["running"] == n and ing["status"] == "HEALTHY")


def test_the_ingress_reports_its_traffic_and_scales_under_load_without_a_failed_request(
    url: str,
) -> None:
    """The ingress scaling policy's inputs (requests/s and CPU ms per request from every
    ingress replica's reports) and its write (`scale_ingress`, up and back down) on the real
    ingress, under load."""
    with Load(url) as load:
        load.wait_for(30)
        rate_rps, cpu_ms = wait_for(
            "the ingress replicas to report their traffic",
            lambda: t if (t := read_ingress_traffic())[0] > 0 else None,
            timeout_s=10,
        )
        assert cpu_ms > 0, (rate_rps, cpu_ms)
        ops.scale_ingress(3)
        wait_for("3 ingress replicas RUNNING", lambda: ingress_running(3) or None)
        seen = load.total
        load.wait_for(seen + 20)
        ops.scale_ingress(2)
        wait_for("the ingress back at 2 replicas", lambda: ingress_running(2) or None)
        seen = load.total
        load.wait_for(seen + 20)
    assert load.errors == []
    assert set(load.statuses) == {200}
    state = ops.read_state()
    assert state is not None and state.ingress_target == 2


def test_pool_to_zero_and_back_keeps_other_pool_replicas(url: str) -> None:
    before = {r["replica_id"] for r in backend_replicas("cluster")}
    ops.scale_pool(MODEL, "external", 1)
    pools = serve_status()["models"][MODEL]["pools"]
    assert (pools["external"]["running"], pools["external"]["weight"]) == (1, 1.0)
    ops.scale_pool(MODEL, "external", 0)
    pools = serve_status()["models"][MODEL]["pools"]
    assert (pools["external"]["target"], pools["external"]["running"]) == (0, 0)
    ops.scale_pool(MODEL, "external", 1)
    assert serve_status()["models"][MODEL]["pools"]["external"]["running"] == 1
    after = {r["replica_id"] for r in backend_replicas("cluster")}
    assert after == before, "the cluster pool's replicas were restarted"


def test_redeploy_keeps_targets_and_weights(url: str) -> None:
    before = ops.read_state()
    assert before is not None and before.target(MODEL, "external") == 1
    ids_before = {r["replica_id"] for p in ("cluster", "external") for r in backend_replicas(p)}
    ops.deploy(serving_config())
    after = ops.read_state()
    assert after is not None
    assert after.targets == before.targets
    assert after.weights == before.weights
    ids_after = {r["replica_id"] for p in ("cluster", "external") for r in backend_replicas(p)}
    assert ids_after == ids_before
    ops.scale_pool(MODEL, "external", 0)


def test_no_ready_pool_answers_503_with_retry_after(url: str) -> None:
    ops.set_route_weights(MODEL, {})
    try:
        r = requests.post(predict_url(url), json=GOOD, timeout=30)
        assert r.status_code == 503
        assert r.headers["Retry-After"] == "1"
        assert r.json()["error"]["code"] == "no_capacity"
    finally:
        ops.set_route_weights_from_readiness(MODEL)
    assert requests.post(predict_url(url), json=GOOD, timeout=30).status_code == 200
