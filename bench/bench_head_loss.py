"""Head loss under traffic, against today's behaviour measured in the same run.

Failed requests (with and without one client retry), seconds until the API answers again,
seconds until a queued job is admitted.

Two local clusters, one after the other, each under steady traffic from the retry-once load
client of the integration tests (a new connection per request, one retry of a refused or
reset connection), with a gang running and a second job queued behind it:

- ``ha`` (issue 18): GCS fault tolerance on (Redis on loopback), Serve proxies on every node
  with a replica (``serve.proxy_location=EveryNode``), ingress replicas off the head. The
  head's Ray processes are SIGKILLed; `rcp up` starts the head again (`LocalCluster.restart_head`).
- ``baseline`` (before issue 18): ``ray.gcs_fault_tolerance=false``,
  ``serve.proxy_location=HeadOnly``. The same kill; a head without fault tolerance cannot
  rejoin its workers, so recovery is ``rcp down`` + ``rcp up`` on the same state dir (the job
  store survives on disk).

Reported for each: requests answered, failed with one retry and without, seconds from the
kill until the API answers, and seconds from the kill until the queued job is admitted (the
gang is cancelled as soon as the API answers, freeing its GPUs), and the ratios
baseline / ha. No goal is asserted (benchmarks are not tests).

Before the kill, the ``ha`` cluster also measures what the edge in front of the proxies
costs (HAProxy configured by ``serve.edge``): the same sequential requests, each on a new
connection, sent straight to the head's proxy and through the balancer; reported are the
median latency of each and the CPU seconds the balancer's process and the head proxy's
process spend per request (``balancer_*``; the proxy's is the baseline).

    flock /tmp/rcp-integration.lock .venv/bin/python bench/bench_head_loss.py [--json]
    # the balancer's cost alone (one cluster, no kill):
    flock /tmp/rcp-integration.lock .venv/bin/python bench/bench_head_loss.py --cost-only

Starts Ray, so it holds the integration lock like the integration tests.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402

from controlplane.config import load_config  # noqa: E402
from controlplane.local.cluster import LocalCluster  # noqa: E402
from controlplane.local.ports import isolated_overrides  # noqa: E402
from controlplane.local.processes import kill_now, node_processes  # noqa: E402
from controlplane.local.state_file import head_node_id  # noqa: E402
from controlplane.sdk import Client  # noqa: E402
from tests.integration.conftest import (  # noqa: E402
    HEAD_LOSS_CLUSTER,
    RetryOnceLoad,
    mnistlike_job,
)

SCENARIOS: dict[str, tuple[str, ...]] = {
    "ha": ("ray.gcs_fault_tolerance=true", "serve.proxy_location=EveryNode"),
    "baseline": ("ray.gcs_fault_tolerance=false", "serve.proxy_location=HeadOnly"),
}


def _until(what: str, check: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception:  # the API is down: keep asking
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def _listener(port: int) -> psutil.Process:
    """The process listening on 127.0.0.1:`port`."""
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid:
            return psutil.Process(c.pid)
    raise RuntimeError(f"nothing listens on port {port}")


def _balancer_cost(cluster: LocalCluster, num_requests: int) -> dict[str, float]:
    """Median latency straight to the head's proxy and through the balancer, and CPU seconds
    per request of the balancer and of that proxy (sequential, a new connection each)."""
    import requests  # deferred: only this measurement needs it

    state = cluster.read_state()
    assert state is not None
    host = cluster.cfg.ray.node_ip
    head_port = int(state["serve_proxies"]["head"])
    balancer, proxy = _listener(cluster.cfg.serve.http_port), _listener(head_port)
    body = {"inputs": [[0.1 * i for i in range(16)]]}

    def run(port: int) -> tuple[float, float, float]:
        url = f"http://{host}:{port}/v1/models/sample/predict"
        cpu_b, cpu_p = _cpu_s(balancer), _cpu_s(proxy)
        lat = []
        for _ in range(num_requests):
            t = time.perf_counter()
            r = requests.post(url, json=body, timeout=30, headers={"Connection": "close"})
            lat.append(time.perf_counter() - t)
            assert r.status_code == 200, r.text[:200]
        lat.sort()
        return (
            lat[len(lat) // 2],
            (_cpu_s(balancer) - cpu_b) / num_requests,
            (_cpu_s(proxy) - cpu_p) / num_requests,
        )

    run(head_port)  # warm up
    direct_s, idle_b_s, proxy_s = run(head_port)
    via_s, balancer_s, via_proxy_s = run(cluster.cfg.serve.http_port)
    return {
        "balancer_direct_median_ms": round(direct_s * 1e3, 2),
        "balancer_via_median_ms": round(via_s * 1e3, 2),
        # What the balancer spends per request beyond its health checks (measured while
        # requests went straight to the proxy).
        "balancer_cpu_us_per_request": round((balancer_s - idle_b_s) * 1e6, 1),
        "balancer_proxy_cpu_us_per_request": round(proxy_s * 1e6, 1),
    }


def _scenario(
    name: str, overrides: tuple[str, ...], traffic_s: float, cost_requests: int
) -> dict[str, float]:
    import ray  # deferred: ray is heavy

    state_dir = Path(tempfile.mkdtemp(prefix=f"rcp-bench-head-{name}-"))
    cfg = load_config(None, isolated_overrides(state_dir, *HEAD_LOSS_CLUSTER, *overrides))
    cluster = LocalCluster(cfg)
    cluster.up(echo=lambda _line: None)
    try:
        client = Client(state_dir=cfg.state_path)
        serve_url = next(
            e["url"] for e in cluster.read_state()["endpoints"] if e["name"] == "serve"
        )
        cost = _balancer_cost(cluster, cost_requests) if name == "ha" and cost_requests else {}
        gang = client.submit(mnistlike_job("gang", steps=100_000, gpus_per_worker=2)).id
        _until("the gang running", lambda: client.status(gang).state == "RUNNING", 300)
        queued = client.submit(mnistlike_job("queued", steps=2, gpus_per_worker=2)).id
        time.sleep(2.0)
        assert client.status(queued).state == "QUEUED"
        state = cluster.read_state()
        head_id = head_node_id(state)
        head = node_processes(state["cluster_id"], [state["temp_dir"]], head_id)
        with RetryOnceLoad(serve_url) as load:
            load.answered_since(0, 30)
            ray.shutdown()
            killed_at = time.monotonic()
            kill_now(head)
            psutil.wait_procs(head, timeout=10)
            time.sleep(traffic_s)  # traffic while the head is down
            if not cfg.ray.gcs_fault_tolerance:
                cluster.down(echo=lambda _line: None)
            # With fault tolerance `up` finds the head gone and restarts it (restart_head);
            # without, it starts a new cluster on the same state dir.
            cluster.up(echo=lambda _line: None)
            _until("the API", lambda: client.status(queued), 300)
            api_s = time.monotonic() - killed_at
            client.cancel(gang)
            _until(
                "the queued job admitted",
                lambda: client.status(queued).state not in ("QUEUED", "PENDING"),
                300,
            )
            admitted_s = time.monotonic() - killed_at
            load.answered_since(load.answered, 30, timeout_s=60)
        return {
            "answered": float(load.answered),
            "failed_with_one_retry": float(load.failed),
            "failed_without_retry": float(load.unretried_failed),
            "wrong_answers": float(load.wrong),
            "api_answers_after_s": round(api_s, 1),
            "queued_job_admitted_after_s": round(admitted_s, 1),
            **cost,
        }
    finally:
        cluster.down(echo=lambda _line: None)


def _cost_only(num_requests: int, as_json: bool) -> int:
    """The ``ha`` cluster up, the balancer's cost measured, down: no kill."""
    state_dir = Path(tempfile.mkdtemp(prefix="rcp-bench-head-cost-"))
    overrides = isolated_overrides(state_dir, *HEAD_LOSS_CLUSTER, *SCENARIOS["ha"])
    cluster = LocalCluster(load_config(None, overrides))
    cluster.up(echo=lambda _line: None)
    try:
        cost = _balancer_cost(cluster, num_requests)
    finally:
        cluster.down(echo=lambda _line: None)
    for k, v in cost.items():
        print(f"{k:36} {v:>10g}")
    ratios = {
        "latency_via_over_direct": round(
            cost["balancer_via_median_ms"] / cost["balancer_direct_median_ms"], 2
        ),
        "balancer_cpu_over_proxy_cpu": round(
            cost["balancer_cpu_us_per_request"] / cost["balancer_proxy_cpu_us_per_request"], 3
        ),
    }
    for k, r in ratios.items():
        print(f"{k}: {r:g}")
    if as_json:
        print(json.dumps({"results": cost, "ratios": ratios}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--down-s", type=float, default=10.0, help="traffic while the head is down")
    parser.add_argument(
        "--cost-requests", type=int, default=300, help="requests per balancer-cost run (0: skip)"
    )
    parser.add_argument(
        "--cost-only", action="store_true", help="only the balancer's cost, on the ha cluster"
    )
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args(argv)
    # A timeout's SIGTERM still runs each scenario's `finally` (rcp down): no cluster is left.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.cost_only:
        return _cost_only(max(args.cost_requests, 1), args.json)
    results = {
        name: _scenario(name, o, args.down_s, args.cost_requests) for name, o in SCENARIOS.items()
    }
    ratios = {
        k: round(results["baseline"][k] / results["ha"][k], 2)
        for k in ("api_answers_after_s", "queued_job_admitted_after_s")
        if results["ha"][k]
    }
    keys = list(results["ha"])
    print(f"{'figure':36} {'ha':>10} {'baseline':>10}")
    for k in keys:
        base = results["baseline"].get(k)
        print(f"{k:36} {results['ha'][k]:>10g} {'' if base is None else f'{base:g}':>10}")
    for k, r in ratios.items():
        print(f"baseline / ha, {k}: {r:g}x")
    if args.json:
        print(json.dumps({"results": results, "ratios_baseline_over_ha": ratios}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
