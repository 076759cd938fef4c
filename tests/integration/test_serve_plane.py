"""The serving plane on a real local Ray cluster with a real Serve HTTP endpoint on loopback.

One cluster for the module: a head (pool_head), one `cluster` node (4 GPUs) and one
`external` node (2 GPUs), all logical. Load is a few client threads, bounded in count and
time, only to 127.0.0.1. Besides the ingress's endpoint, the backends' own route (the edge
router's path, ``/_rcp/<model>/<pool>/v1/models/<model>/predict``) is called directly: it
answers as the ingress does, with ``X-Rcp-Pool``, and its requests reach the demand signal.

The last test (issue 16, latency-aware scaling) runs the control loop on this cluster with a
real Prometheus on loopback scraping Ray's metrics agents: a slow backend (the sample model's
``extra_latency_ms``, set at run time through ``user_config``) puts its p99 over
``slo_p99_ms`` and the model scales up; once the latency falls it scales down only after the
downscale delay, and never flaps in between.

Marked ``full`` (``bash infra/local/test.sh --full``): the default run plays moves under load
with zero failed requests on a whole `rcp up` cluster (test_node_health's first test: the
claim, the hot node's replicas leaving, the return), and the serving logic here is unit-tested
on fakes (test_serve_ingress, test_serve_routing, test_loop_moves, test_loop_latency).
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray  # noqa: E402
import requests  # noqa: E402
from ray import serve  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from controlplane.adapters.latency import PrometheusLatency  # noqa: E402
from controlplane.adapters.nodes import RayNodes  # noqa: E402
from controlplane.adapters.serve import RayServe  # noqa: E402
from controlplane.config import load_config  # noqa: E402
from controlplane.local.prometheus import LocalPrometheus  # noqa: E402
from controlplane.loop.act.operations import MoveOutcome, advance, start  # noqa: E402
from controlplane.loop.decide import policies_of  # noqa: E402
from controlplane.loop.tick import Adapters, Loop  # noqa: E402
from controlplane.observability import write_file_sd  # noqa: E402
from controlplane.store import Store  # noqa: E402
from policies.attempts import JobsView  # noqa: E402
from policies.plan import MoveServeReplicas  # noqa: E402
from policies.snapshot import Pool  # noqa: E402
from serve.app.load import read_ingress_traffic, read_load  # noqa: E402
from serve.config import IngressConfig, ModelConfig, ServingConfig  # noqa: E402
from serve.control import operations as ops  # noqa: E402
from serve.control.status import format_status_table, serve_status  # noqa: E402
from serve.spec import backend_route_prefix  # noqa: E402
from tests.integration.conftest import GOOD, MODEL, Load, predict_url, wait_for  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.full, pytest.mark.timeout(300)]

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
        # Metrics reach each node's agent every second (default 10 s): the latency test's p99.
        _system_config={"metrics_report_interval_ms": 1000},
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
class InBackground:
    """Runs `_run` in a daemon thread for the length of a ``with`` block (`_stop` ends it)."""

    _stop: threading.Event = field(default_factory=threading.Event, kw_only=True)
    _thread: threading.Thread | None = field(default=None, kw_only=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=60)


@dataclass
class Timeline(InBackground):
    """`serve_status()` sampled in the background: (running, weight) per pool per sample."""

    period_s: float = 0.2
    samples: list[dict[str, tuple[int, float]]] = field(default_factory=list)

    def _run(self) -> None:
        while not self._stop.is_set():
            pools = serve_status()["models"][MODEL]["pools"]
            self.samples.append({p: (v["running"], v["weight"]) for p, v in pools.items()})
            time.sleep(self.period_s)


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


def test_the_backend_route_answers_as_the_ingress_with_its_pool(url: str) -> None:
    """The edge router's path around the ingress: the model's own answers (success or error)
    carry X-Rcp-Pool and the ingress's codes; Serve's own (no app for that pool) do not.
    Load on that path alone reaches the demand signal (the backends report it)."""
    backend = f"{url}{backend_route_prefix(MODEL, 'cluster')}"
    ok = requests.post(predict_url(backend), json=GOOD, timeout=30)
    assert (ok.status_code, ok.headers["X-Rcp-Pool"]) == (200, "cluster"), ok.text
    assert ok.json() == requests.post(predict_url(url), json=GOOD, timeout=30).json()
    for data, content_type, status, code in [
        (b'{"inputs": []}', "text/plain", 415, "unsupported_media_type"),
        (b"{not json", "application/json", 400, "malformed_json"),
    ]:
        r = requests.post(
            predict_url(backend), data=data, headers={"Content-Type": content_type}, timeout=30
        )
        assert (r.status_code, r.headers.get("X-Rcp-Pool")) == (status, "cluster"), r.text
        assert r.json()["error"]["code"] == code
        assert r.json()["error"]["request_id"] == r.headers["X-Request-Id"]
    r = requests.get(f"{backend}/v1/models", timeout=30)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    # No external replicas yet, so no app on that prefix: Serve's 404, without the header.
    external = f"{url}{backend_route_prefix(MODEL, 'external')}"
    gone = requests.post(predict_url(external), json=GOOD, timeout=30)
    assert gone.status_code == 404 and "X-Rcp-Pool" not in gone.headers
    # The ingress's table tells an edge where the backends are and how long to trust it.
    routing = requests.get(f"{url}/v1/models", timeout=30).json()["routing"]
    assert (
        routing["backend_root"] == "/_rcp"
        and routing["table_max_age_s"] == IngressConfig().edge_table_max_age_s
    )
    heavy = f"{url}{backend_route_prefix(HEAVY, 'cluster')}"
    # Back to back (no pace): the backends must have requests in flight when they report.
    with Load(heavy, model=HEAVY, body=HEAVY_BODY, threads=6, pace_s=0) as load:
        load.wait_for(20)
        wait_for(
            "the backends to report the heavy model's requests in flight",
            lambda: read_load().get(HEAVY, 0) > 0 or None,
            timeout_s=30,
        )
    assert load.errors == [] and set(load.pools) == {"cluster"}


def move(model: str, from_pool: str, to_pool: str, n: int, timeout_s: float = 120.0) -> int:
    """The control loop's make-before-break move (`controlplane.loop.act.operations`), a tick
    every 0.5 s through the Serve adapter, to its end: the replicas moved."""
    plane = RayServe({model: 1.0})
    action = MoveServeReplicas(model, Pool(from_pool), Pool(to_pool), n, (), reason="test")
    op = start(action, plane.view(), time.time())
    assert op is not None, f"nothing to move from {from_pool}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        op, outcome = advance(op, plane, time.time(), timeout_s)
        if outcome is MoveOutcome.DONE:
            return op.num_replicas
        assert outcome is not MoveOutcome.UNWOUND, op
        time.sleep(0.5)
    raise AssertionError(f"the move did not finish in {timeout_s:g}s: {op}")


def test_move_all_to_external_and_back_under_load(url: str) -> None:
    with Timeline() as timeline, Load(url) as load:
        load.wait_for(20)
        assert move(MODEL, "cluster", "external", TARGET) == TARGET
        mid = serve_status()["models"][MODEL]["pools"]
        assert (mid["external"]["running"], mid["cluster"]["target"]) == (TARGET, 0)
        assert {r["node_pool"] for r in mid["external"]["replicas"]} == {"external"}
        seen = load.total
        load.wait_for(seen + 20)
        assert move(MODEL, "external", "cluster", TARGET) == TARGET
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

    def replaced() -> set[str] | None:
        replicas = backend_replicas("cluster", model)
        ids = {r["replica_id"] for r in replicas if r["state"] == "RUNNING"}
        return ids if len(ids) == TARGET and victim["replica_id"] not in ids else None

    wait_for(f"Serve to replace replica {victim['replica_id']}", replaced, 120)
    return str(victim["replica_id"])


def test_killed_replica_mid_load_clients_see_no_error(url: str) -> None:
    killed: list[str] = []
    # 8 clients keep both replicas busy, so a killed replica has requests inside it; the
    # kill is repeated until the ingress has had to retry at least once (a kill between two
    # requests retries nothing), at most 8 times.
    with Load(url, model=HEAVY, body=HEAVY_BODY, threads=8, pace_s=0, max_duration_s=280) as load:
        load.wait_for(30)
        while load.retried == 0:
            assert len(killed) < 8, f"{len(killed)} kills and no request was retried"
            killed.append(kill_and_wait_for_replacement(HEAVY))
            seen = load.total
            load.wait_for(seen + 20)
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
            timeout_s=60,
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


SLO_P99_MS = 100.0
SLOW_MS = 250
UPSCALE_DELAY_S = 2.0
DOWNSCALE_DELAY_S = 8.0
TICK_S = 0.5


def latency_config(extra_latency_ms: int) -> ServingConfig:
    """The module's models, the sample one with a p99 goal, short delays and a backend that
    takes `extra_latency_ms` longer per request (set on the running replicas)."""
    serving = serving_config()
    serving.latency_window_s = 5.0
    m = serving.models[0]
    m.slo_p99_ms = SLO_P99_MS
    m.upscale_delay_s = UPSCALE_DELAY_S
    m.downscale_delay_s = DOWNSCALE_DELAY_S
    m.user_config = {"extra_latency_ms": extra_latency_ms}
    return serving


class Gauges:
    """The loop's metric sink: the last value of every gauge (the loop's `MetricSink`)."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def set(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self.values[(name, tuple(sorted((tags or {}).items())))] = value

    def inc(self, name: str, tags: Mapping[str, str] | None = None) -> None:
        pass

    def get(self, name: str, **tags: str) -> float | None:
        return self.values.get((name, tuple(sorted(tags.items()))))


class NoJobs:
    """No training in this module: the job runner has nothing to do."""

    def observe(self) -> JobsView:
        return JobsView()

    def apply(self, plan: object, failed: object) -> None:
        assert not plan, plan

    def admit(self, action: object) -> None:
        raise AssertionError(f"no job is submitted here: {action}")

    preempt = admit


class NoTelemetry:
    """No telemetry agents in this module (``health.act`` is off)."""

    def ensure_agents(self, exclude: object, trusted: object) -> list[Any]:
        return []

    def collect_samples(self, *args: object) -> dict[str, list[Any]]:
        return {}

    def stop_agent(self, node_id: str) -> bool:
        return True


def p99_now(gauges: Gauges) -> float | None:
    """The sample model's p99 gauge this tick; None while it has no reading (NaN)."""
    p99 = gauges.get("rcp_model_p99_ms", model=MODEL)
    return None if p99 is None or math.isnan(p99) else p99


@dataclass
class Tick:
    now_s: float
    p99_ms: float | None
    total: int | None
    """The sample model's replica target over both pools this tick (None: no serving plan)."""


@dataclass
class Ticking(InBackground):
    """Drives `loop` one tick every `TICK_S` (as `Loop.start` does) and records every tick."""

    loop: Loop
    gauges: Gauges
    ticks: list[Tick] = field(default_factory=list)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.loop.tick()
            last = self.loop.last
            mine = [t for t in (last.targets if last else ()) if t.model == MODEL]
            total = mine[0].cluster + mine[0].external if mine else None
            now = self.loop.tick_starts[-1]
            self.ticks.append(Tick(now, p99_now(self.gauges), total))
            self._stop.wait(TICK_S)

    def totals(self) -> list[int]:
        """The targets the loop planned, each change once (2, 4, 2: up once, down once)."""
        out: list[int] = []
        for t in self.ticks:
            if t.total is not None and (not out or out[-1] != t.total):
                out.append(t.total)
        return out

    def first(self, since_s: float, check: Any) -> Tick:
        return next(t for t in self.ticks if t.now_s >= since_s and check(t))


def metrics_agents() -> list[str]:
    """Every live node's Ray metrics agent, host:port (what Prometheus scrapes)."""
    return [
        f"{n['NodeManagerAddress']}:{n['MetricsExportPort']}" for n in ray.nodes() if n["Alive"]
    ]


def test_slow_backend_scales_up_on_p99_then_down_after_the_delay_without_flapping(
    url: str, tmp_path: Path
) -> None:
    """Issue 16 part 2 end to end: Serve's latency histogram -> Prometheus -> the loop's
    observe (p99 per model) -> demand (p99 over ``slo_p99_ms``) -> placement (the cluster
    pool is full: the new replicas go to the external pool) -> Serve."""
    assert backend_replicas("external") == [] and len(backend_replicas("cluster")) == TARGET
    ops.deploy(latency_config(SLOW_MS))  # user_config: the running replicas slow down
    cfg = load_config(
        overrides=[
            f"state_dir={tmp_path}",
            "serve.deploy_app=true",
            "health.act=false",
            f"policy.tick_s={TICK_S}",
            "observability.prometheus=false",
        ]
    )
    cfg.serving = latency_config(SLOW_MS)
    ray_sd = tmp_path / "ray-targets.json"
    write_file_sd(ray_sd, [{"targets": metrics_agents(), "labels": {}}])
    prom = LocalPrometheus(
        work_dir=tmp_path / "prometheus",
        ray_sd_file=ray_sd,
        port=free_port(),
        scrape_interval_s=1.0,
        rule_files=(),
    )
    gauges = Gauges()
    nodes = RayNodes()
    adapters = Adapters(
        jobs=NoJobs(),
        nodes=nodes,
        node_actions=nodes,
        telemetry=NoTelemetry(),
        metrics=gauges,
        serve=RayServe({m.name: m.num_gpus for m in cfg.serving.models}),
        latency=PrometheusLatency(prom.url, cfg.serving.latency_window_s).read,
    )
    loop = Loop(cfg, Store(cfg.jobs_db_path), adapters, policies_of(cfg))
    with prom, Load(url, threads=2, max_duration_s=200) as load, Ticking(loop, gauges) as ticks:
        wait_for("the p99 of the slow backend", lambda: p99_now(gauges))
        assert gauges.get("rcp_model_slo_p99_ms", model=MODEL) == SLO_P99_MS
        wait_for("the scale-up on p99", lambda: max(ticks.totals()) == 4, timeout_s=90)
        wait_for(
            "the new replicas RUNNING on the external pool",
            lambda: sum(r["state"] == "RUNNING" for r in backend_replicas("external")) == 2,
            timeout_s=90,
        )
        slow_seen = ticks.first(0, lambda t: (t.p99_ms or 0) > SLO_P99_MS)
        up = ticks.first(0, lambda t: (t.total or 0) > TARGET)
        # Demand waited for the upscale delay on the loop's own clock, not a tick less.
        assert up.now_s - slow_seen.now_s >= UPSCALE_DELAY_S, (slow_seen, up)
        fast_from_s = loop.clock()
        ops.deploy(latency_config(0))  # the backend is fast again
        wait_for("the scale-down", lambda: ticks.totals()[-1] == TARGET, timeout_s=180)
        down = ticks.first(fast_from_s, lambda t: t.total == TARGET)
        steady = len(ticks.ticks)
        wait_for("a few more ticks", lambda: len(ticks.ticks) >= steady + 4, timeout_s=120)
    # Up once, down once: no flapping while the latency fell or after.
    assert ticks.totals() == [TARGET, 4, TARGET], ticks.totals()
    # Down only after the p99 left the band and ongoing requests alone asked for fewer for the
    # whole downscale delay (the first tick that let go of the replicas starts the timer).
    fast = ticks.first(fast_from_s, lambda t: t.p99_ms is None or t.p99_ms < SLO_P99_MS / 2)
    assert down.now_s - fast.now_s >= DOWNSCALE_DELAY_S, (fast, down)
    assert load.errors == [] and set(load.statuses) == {200}
    assert load.pools["external"] > 0, "no request reached the replicas the p99 added"
    ops.deploy(serving_config())
