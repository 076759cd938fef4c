"""Integration fixtures: a real embedded cluster (`rcp up`) on free loopback ports.

One cluster per test module (module scope); each gets its own state dir, so modules never
share or stop each other's processes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests

from controlplane.config import Config, load_config
from controlplane.local.cluster import LocalCluster, free_loopback_ports, isolated_overrides
from controlplane.ray_connection import ray_token_path

T = TypeVar("T")

MODEL = "sample"
"""The sample model every serving module deploys."""
GOOD = {"inputs": [[0.1 * i for i in range(16)]]}
"""A well-formed request body for the sample model."""
REGION = "us-east-1"
"""The region of the moto S3 server (`MotoS3`)."""


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float = 120.0) -> T:
    """`check()`'s first truthy answer, polled every 0.5 s; fails naming `what` and the last
    answer after `timeout_s`. Every integration wait goes through here: bounded, never timed."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}; last: {last!r}")


def ray_auth_headers(cfg: Config) -> dict[str, str]:
    """Headers for a request to the cluster's dashboard (it runs with Ray token auth; Ray's own
    clients in this process already send them once `connect` ran)."""
    return {"Authorization": "Bearer " + ray_token_path(cfg).read_text().strip()}


free_ports = free_loopback_ports
local_overrides = isolated_overrides


def start_local_cluster(
    tmp_path_factory: pytest.TempPathFactory, *extra: str, config_file: Path | None = None
) -> tuple[Config, LocalCluster]:
    state_dir = tmp_path_factory.mktemp("rcp-state")
    cfg = load_config(config_file, local_overrides(state_dir, *extra))
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


def pools_of(model: str = MODEL) -> dict[str, dict[str, Any]]:
    """Serve's view of `model` by pool (running, target, weight...), as `rcp serve status` reads it."""
    from serve.status import serve_status

    return dict(serve_status()["models"][model]["pools"])


def predict_url(url: str, model: str = MODEL) -> str:
    return f"{url}/v1/models/{model}/predict"


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
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _workers: list[threading.Thread] = field(default_factory=list)

    def _run(self) -> None:
        deadline = time.monotonic() + self.max_duration_s
        with requests.Session() as session:
            for _ in range(self.max_requests_per_thread):
                if self._stop.is_set() or time.monotonic() > deadline:
                    return
                try:
                    r = session.post(predict_url(self.url, self.model), json=self.body, timeout=30)
                except requests.RequestException as exc:
                    with self._lock:
                        self.errors.append(repr(exc))
                    continue
                with self._lock:
                    self.statuses[r.status_code] += 1
                    self.pools[r.headers.get("x-rcp-pool", "?")] += 1
                    self.retried += int(r.headers.get("x-rcp-attempts", "1")) > 1
                    if r.status_code >= 300:
                        self.errors.append(f"{r.status_code}: {r.text[:200]}")

    def __enter__(self) -> Load:
        self._workers = [
            threading.Thread(target=self._run, daemon=True) for _ in range(self.threads)
        ]
        for t in self._workers:
            t.start()
        return self

    def wait_for(self, num_responses: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.total < num_responses and time.monotonic() < deadline:
            time.sleep(0.05)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.statuses.values()) + len(self.errors)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(timeout=60)


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
