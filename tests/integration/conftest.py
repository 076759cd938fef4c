"""Integration fixtures: a real embedded cluster (`rcp up`) on free loopback ports.

One cluster per test module (module scope); each gets its own state dir, so modules never
share or stop each other's processes.

Test speed: the settings in which a test cluster differs from production for speed alone are
named here, once (`TEST_SPEED`, and Ray's metrics report interval below); a module that tests
one of those values sets it back in its own overrides, which come later and win.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
import requests

from controlplane.config import Config, load_config
from controlplane.local.cluster import LocalCluster
from controlplane.local.ports import isolated_overrides, quiet_loopback_ports
from controlplane.ray_connection import ray_token_path

T = TypeVar("T")


def report_ray_metrics_fast() -> None:
    """Every Ray process of the test clusters this process starts (they inherit its
    environment) reports its metrics every 2 s rather than Ray's 10 s, so each check of a
    ``ray_*`` series waits that long at most. Only the modules that read ``ray_*`` series call
    it (at import, before their cluster starts): the reports cost a cluster about 0.15 of a
    core when idle (0.77 cores against 0.62 at 10 s, measured on test_head_loss's cluster)."""
    os.environ.setdefault("RAY_metrics_report_interval_ms", "2000")


TEST_SPEED = (
    # The control loop ticks twice a second (production: 1 s).
    "policy.tick_s=0.5",
    # The runner reads gangs' signals (started ranks, steps, checkpoints) every 0.2 s (1 s).
    "jobs.job_signal_poll_s=0.2",
    # A move waits this long after every ingress replica applied a new route table before it
    # lowers the pool it leaves (an edge may route by a table this old): 2 s rather than 5 s.
    # test_head_loss keeps 5 s: it loads the machine so much that fetches take over a second.
    "serving.ingress.edge_table_max_age_s=2",
)
"""Overrides every `start_local_cluster` cluster gets before the module's own."""

MODEL = "sample"
"""The sample model every serving module deploys."""
GOOD = {"inputs": [[0.1 * i for i in range(16)]]}
"""A well-formed request body for the sample model."""
REGION = "us-east-1"
"""The region of the moto S3 server (`MotoS3`)."""


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float = 120.0) -> T:
    """`check()`'s first truthy answer, polled every 0.5 s; fails naming `what` and the last
    answer after `timeout_s`. Every integration wait goes through here: bounded, never timed
    (it prints how long it waited, so ``-s`` shows where a scenario's time goes)."""
    start = time.monotonic()
    deadline = start + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            # Where a scenario's time goes (shown with -s, or with a failure's captured output).
            print(f"[{time.strftime('%H:%M:%S')}] waited {time.monotonic() - start:5.1f} s: {what}")
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {last!r}")


def ray_auth_headers(cfg: Config) -> dict[str, str]:
    """Headers for a request to the cluster's dashboard (it runs with Ray token auth; Ray's own
    clients in this process already send them once `connect` ran)."""
    return {"Authorization": "Bearer " + ray_token_path(cfg).read_text().strip()}


free_ports = quiet_loopback_ports
local_overrides = isolated_overrides


def start_local_cluster(
    tmp_path_factory: pytest.TempPathFactory, *extra: str, config_file: Path | None = None
) -> tuple[Config, LocalCluster]:
    state_dir = tmp_path_factory.mktemp("rcp-state")
    cfg = load_config(config_file, local_overrides(state_dir, *TEST_SPEED, *extra))
    cluster = LocalCluster(cfg)
    cluster.up(echo=lambda _line: None)
    return cfg, cluster


def two_replica_sample_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config file serving the sample model as exactly 2 one-GPU replicas (the modules
    that watch replicas move between pools)."""
    conf = tmp_path_factory.mktemp("serving-conf") / "rcp.yaml"
    conf.write_text(
        "serving:\n"
        "  models:\n"
        "    - name: sample\n"
        "      min_replicas: 2\n"
        "      max_replicas: 2\n"
        "      num_gpus: 1\n"
        "      num_cpus: 0.5\n"
        "      graceful_shutdown_timeout_s: 5\n"
    )
    return conf


@pytest.fixture(scope="module")
def local_cluster(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Config, LocalCluster]]:
    """A running embedded cluster with default pools; stopped after the module."""
    cfg, cluster = start_local_cluster(tmp_path_factory)
    try:
        yield cfg, cluster
    finally:
        cluster.down(echo=lambda _line: None)


def node_proxy_port(state: dict[str, Any], node_id: str) -> int:
    """The loopback port of node `node_id`'s Serve proxy, in the cluster whose state file is
    `state`: its raylet's environment names it (``controlplane.local.provider``)."""
    from controlplane.local.processes import node_processes

    for proc in node_processes(state["cluster_id"], [state["temp_dir"]], node_id):
        try:
            if proc.name() == "raylet":
                return int(proc.environ()["RAY_SERVE_WORKER_PROXY_HTTP_PORT"])
        except psutil.NoSuchProcess:  # a worker of the node that exited meanwhile
            continue
    raise AssertionError(f"no raylet of node {node_id} is alive")


def pools_of(model: str = MODEL) -> dict[str, dict[str, Any]]:
    """Serve's view of `model` by pool (running, target, weight...), as `rcp serve status` reads it."""
    from serve.control.status import serve_status

    return dict(serve_status()["models"][model]["pools"])


def alive_cluster_nodes() -> set[str]:
    """Node ids of the cluster pool's nodes Ray lists alive (a connected driver)."""
    from controlplane.inventory import list_nodes

    return {r.node_id for r in list_nodes() if r.pool == "cluster"}


def replica_nodes(model: str = MODEL) -> dict[str, set[str]]:
    """Node ids of the model's RUNNING replicas, by pool."""
    return {
        pool: {r["node_id"] for r in p["replicas"] if r["state"] == "RUNNING"}
        for pool, p in pools_of(model).items()
    }


def predict_url(url: str, model: str = MODEL) -> str:
    return f"{url}/v1/models/{model}/predict"


LOAD_PACE_S = 0.025
"""A test client sends at most 40 requests a second: enough to see any failure during a move
or a kill, while a client sending back to back took most of the 2 cores the cluster under
test needs (its node starts, moves and training all ran slower)."""


def pace(stop: threading.Event, started: float, pace_s: float) -> None:
    """Wait until `pace_s` after `started` (monotonic), or until `stop` is set."""
    left = started + pace_s - time.monotonic()
    if left > 0:
        stop.wait(left)


@dataclass
class Load:
    """Steady concurrent clients; every answer's status and serving pool is recorded."""

    url: str
    model: str = MODEL
    body: dict[str, Any] = field(default_factory=lambda: dict(GOOD))
    threads: int = 4
    max_requests_per_thread: int = 4000
    max_duration_s: float = 150.0
    statuses: Counter[int] = field(default_factory=Counter)
    pools: Counter[str] = field(default_factory=Counter)
    retried: int = 0
    retry_broken_connection: bool = False
    """Send a request once more, on a new connection, when its connection was refused or
    reset before an answer (what a client with a connection pool does; issue 18's bar while
    the node whose proxy it entered goes away). Counted in `connection_retries`."""
    connection_retries: int = 0
    keep_alive: bool = True
    """False: every request asks for ``Connection: close``, so each one opens a new
    connection to the endpoint."""
    pace_s: float = LOAD_PACE_S
    """Least time from one request's start to the next one's, per client (0: none)."""
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _workers: list[threading.Thread] = field(default_factory=list)

    def _post(self, session: requests.Session) -> requests.Response:
        url = predict_url(self.url, self.model)
        headers = None if self.keep_alive else {"Connection": "close"}
        try:
            return session.post(url, json=self.body, headers=headers, timeout=30)
        except requests.ConnectionError:
            if not self.retry_broken_connection:
                raise
            with self._lock:
                self.connection_retries += 1
            session.close()  # drop the pooled connection to the proxy that went away
            return session.post(url, json=self.body, headers=headers, timeout=30)

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_duration_s
        with requests.Session() as session:
            for _ in range(self.max_requests_per_thread):
                started = time.monotonic()
                if self._stop.is_set() or started > deadline:
                    return
                try:
                    r = self._post(session)
                except requests.RequestException as exc:
                    with self._lock:
                        self.errors.append(repr(exc))
                    pace(self._stop, started, self.pace_s)
                    continue
                with self._lock:
                    self.statuses[r.status_code] += 1
                    self.pools[r.headers.get("x-rcp-pool", "?")] += 1
                    self.retried += int(r.headers.get("x-rcp-attempts", "1")) > 1
                    if r.status_code >= 300:
                        self.errors.append(f"{r.status_code}: {r.text[:200]}")
                pace(self._stop, started, self.pace_s)

    def __enter__(self) -> Load:
        self._workers = [
            threading.Thread(target=self._run, daemon=True) for _ in range(self.threads)
        ]
        for t in self._workers:
            t.start()
        return self

    def wait_for(self, num_responses: int, timeout_s: float = 60.0) -> None:
        """Until the clients have `num_responses` answers and errors in all; after `timeout_s`
        it fails with what they got (the clients stop at `max_duration_s`, so a wait past that
        fails too)."""
        deadline = time.monotonic() + timeout_s
        while self.total < num_responses:
            if time.monotonic() >= deadline:
                with self._lock:
                    seen = f"statuses {dict(self.statuses)}, errors {self.errors[:5]}"
                raise AssertionError(
                    f"timed out after {timeout_s:.0f}s waiting for {num_responses} responses; "
                    f"{self.total} so far: {seen}"
                )
            time.sleep(0.05)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.statuses.values()) + len(self.errors)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(timeout=60)


HEAD_LOSS_CLUSTER = (
    "serve.deploy_app=true",
    "pools.cluster.num_nodes=2",
    "pools.cluster.gpus_per_node=2",
    # No GPUs to move replicas to: admission never claims the serving GPU.
    "pools.external.providers=[{name: rent-a, gpus_per_node: 0}]",
    # An ingress replica beside every proxy (the head and both cluster nodes): a request
    # stays on the node whose proxy it entered (docs/serving.md).
    "serving.ingress.num_replicas=3",
    # The production value: the Redis kill loads the 2 cores so much that route table fetches
    # take over a second (`TEST_SPEED`'s 2 s would let tables go stale under it).
    "serving.ingress.edge_table_max_age_s=5",
    "policy.tick_s=0.5",
    "jobs.gang_start_timeout_s=300",
    "jobs.job_signal_poll_s=0.2",
    "ray.gcs_reconnect_timeout_s=120",
)
"""The cluster test_head_loss.py and bench/bench_head_loss.py kill parts of: a 2-GPU gang
fits one cluster node, the sample model's replica holds a GPU of the other."""

MNISTLIKE = "jobs.examples.train_mnistlike:train_loop"
"""The example training loop the job modules submit."""


def mnistlike_job(
    name: str, *, steps: int, gpus_per_worker: int, log: Path | None = None, sleep_s: float = 0.5
) -> dict[str, Any]:
    """A one-worker job spec running the example loop for `steps` steps of `sleep_s`, rank 0
    appending a line per step to `log` (if given)."""
    train_config: dict[str, Any] = {
        "num_steps": steps,
        "checkpoint_every": 1000,
        "step_sleep_s": sleep_s,
    }
    if log is not None:
        train_config["log_path"] = str(log)
    return {
        "name": name,
        "entrypoint": MNISTLIKE,
        "num_workers": 1,
        "gpus_per_worker": gpus_per_worker,
        "runtime_env": {"env_vars": {"RCP_TRAIN_CONFIG": json.dumps(train_config)}},
    }


@dataclass
class RetryOnceLoad:
    """Steady clients, a new connection per request (so the balancer spreads them over every
    proxy), retrying once a request whose connection was refused or reset before an answer.
    Counts first tries that failed (`unretried_failed`), requests that still failed after the
    retry (`failed`), and answers that differ from the first one (`wrong`)."""

    url: str
    threads: int = 3
    answered: int = 0
    unretried_failed: int = 0
    failed: int = 0
    wrong: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    expected: Any = None
    pace_s: float = LOAD_PACE_S
    """Least time from one request's start to the next one's, per client."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _workers: list[threading.Thread] = field(default_factory=list)

    def _once(self) -> requests.Response:
        return requests.post(
            predict_url(self.url), json=GOOD, timeout=30, headers={"Connection": "close"}
        )

    def _note(self, error: str) -> None:
        """Keep the first 200 errors (caller holds the lock, or is the only writer)."""
        if len(self.errors) < 200:
            self.errors.append(error[:300])

    def _run(self) -> None:
        started = time.monotonic() - self.pace_s
        while not self._stop.is_set():
            # (also paces a client whose every try is refused at once)
            pace(self._stop, started, max(self.pace_s, 0.01))
            if self._stop.is_set():
                return
            started = time.monotonic()
            first_failed = False
            try:
                try:
                    r = self._once()
                except requests.ConnectionError as exc:  # refused, or reset before an answer
                    first_failed = True
                    with self._lock:
                        self._note(f"first try: {exc!r}")
                    r = self._once()
            except requests.RequestException as exc:
                with self._lock:
                    self.unretried_failed += 1
                    self.failed += 1
                    self._note(f"after retry: {exc!r}")
                continue
            with self._lock:
                self.unretried_failed += int(first_failed or r.status_code != 200)
                self.statuses[r.status_code] += 1
                if r.status_code != 200:
                    self.failed += 1
                    self._note(f"{r.status_code}: {r.text[:200]}")
                    continue
                self.answered += 1
                body = r.json()
                outputs = body.get("outputs", body)
                if self.expected is None:
                    self.expected = outputs
                elif outputs != self.expected:
                    self.wrong += 1
                    self._note(f"wrong answer: {str(outputs)[:200]}")

    def __enter__(self) -> RetryOnceLoad:
        self._workers = [
            threading.Thread(target=self._run, daemon=True) for _ in range(self.threads)
        ]
        for t in self._workers:
            t.start()
        return self

    def answered_since(self, before: int, at_least: int, timeout_s: float = 60.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self.answered - before >= at_least:
                    return self.answered - before
            time.sleep(0.1)
        return self.answered - before

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(timeout=60)

    def check(self, what: str, note: str = "") -> None:
        """Print the counts under `what` (the test's figures), then fail on any wrong answer
        or any request that failed after its one retry."""
        print(
            f"\n{what}: {self.answered} answered, {self.failed} failed after one retry, "
            f"{self.unretried_failed} failed without a retry{note}"
        )
        assert self.wrong == 0, self.errors[:5]
        assert self.failed == 0, self.errors[:10]


class MotoS3:
    """moto's S3 server on 127.0.0.1, port chosen by the OS."""

    def __init__(self) -> None:
        import boto3
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        self.client = boto3.client("s3", endpoint_url=self.endpoint_url, region_name=REGION)

    def create_bucket(self, name: str) -> str:
        self.client.create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        self._server.stop()
