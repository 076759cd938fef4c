"""Spike (issue 27): the serving plane behind Serve's own HAProxy mode, measured and probed.

Serve 2.60 can run HAProxy on every proxy node with direct ingress
(``RAY_SERVE_ENABLE_HA_PROXY=1``): HAProxy sends each request straight to a replica of an
application's ingress deployment, on the replica's own HTTP port, from a configuration Serve
renders. This script deploys the product's serving apps (`serve.control.operations.deploy`: the ingress
app on the route prefix, one backend app per (model, pool) on ``/_rcp/<model>/<pool>``) on a
one-node local Ray cluster in that mode and reports, for docs/serving.md "Ingress: what we
chose":

* the cost of the two paths HAProxy mode offers: ``direct`` (a client addressing a backend
  app's route, HAProxy -> backend replica) and ``ingress`` (HAProxy -> the ingress replica,
  which picks the pool by weight -> handle call -> backend): throughput, p50/p99 and CPU per
  request of HAProxy and of the replicas (psutil);
* what Serve's rendered configuration does with this product's requests: whether the
  backends' internal routes, ``/-/routes`` and Serve's control headers reach the replicas from
  any client, whether a request head has a deadline, and which addresses it binds.

One node only: on this machine every simulated node shares 127.0.0.1, and Serve's HAProxy
binds the same frontend, stats and metrics ports on every node. Loopback only (the replicas'
ports bind all interfaces in this mode; nothing but this script connects to them).

Usage::

    .venv/bin/python bench/spike_serve_haproxy_mode.py [--requests 300] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Short: Serve adds a 56-character directory per node, and a socket path has at most 97.
WORK = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Serve reads these when its modules are imported, in this process and in every Ray worker
# (which inherit this environment): set them before importing Ray.
os.environ.update(
    {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(WORK / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(WORK / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(WORK),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(WORK / "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(WORK / "metrics.sock"),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402
import ray  # noqa: E402
import requests  # noqa: E402
from ray import serve  # noqa: E402

from bench.bench_serve_ingress import cpu_s, run_load, summarize  # noqa: E402
from serve.config import IngressConfig, ModelConfig, ServingConfig  # noqa: E402
from serve.control import operations as ops  # noqa: E402
from serve.control.client import read_details  # noqa: E402
from serve.spec import backend_route_prefix  # noqa: E402

PREDICT = "/v1/models/sample/predict"
BODY = {"inputs": [[0.05 * i for i in range(16)]]}


def load(url: str, n: int, concurrency: int = 4) -> dict[str, Any]:
    """`n` POSTs over `concurrency` keep-alive clients (the ingress benchmark's load)."""
    return summarize([asyncio.run(run_load(url, concurrency, n))])


def replica_pids(app: str) -> list[int]:
    apps = read_details().get("applications") or {}
    return [
        int(r["pid"])
        for d in (apps.get(app) or {}).get("deployments", {}).values()
        for r in d.get("replicas") or []
        if r.get("pid")
    ]


def haproxy_pids() -> list[int]:
    return [p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "haproxy"]


def listening(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        out += [f"{c.laddr.ip}:{c.laddr.port}" for c in conns if c.status == "LISTEN"]
    return sorted(set(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    port = free_port()
    ray.init(
        _node_ip_address="127.0.0.1",
        num_cpus=4,
        num_gpus=2,
        resources={"pool_head": 1000, "pool_cluster": 1000},
        labels={"pool": "cluster"},
        include_dashboard=False,
        log_to_driver=False,
    )
    findings: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        ops.deploy(
            ServingConfig(
                ingress=IngressConfig(num_replicas=1, num_cpus=0.25),
                models=[ModelConfig(name="sample", num_cpus=1.0, num_gpus=1.0, min_replicas=1)],
            ),
            wait=True,
        )
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.post(base + PREDICT, json=BODY, timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.5)
        # Serve writes it under a directory of the node's own.
        cfg = next(WORK.rglob("haproxy.cfg")).read_text()
        internal = base + backend_route_prefix("sample", "external") + PREDICT
        routes = requests.get(base + "/-/routes", timeout=5)
        findings = {
            "routes_answered_to_any_client": routes.status_code == 200,
            "routes_body": routes.text[:300],
            "backend_route_reachable_by_clients": requests.post(
                base + backend_route_prefix("sample", "cluster") + PREDICT, json=BODY, timeout=10
            ).status_code
            == 200,
            "external_pool_route_status": requests.post(
                internal, json=BODY, timeout=10
            ).status_code,
            "config_has_http_request_deadline": "timeout http-request" in cfg,
            "config_drops_serve_control_headers": "x-request-timeout-seconds" in cfg,
            "config_backends": cfg.count("\nbackend "),
            "haproxy_listens": listening(haproxy_pids()),
            "replica_listens": listening(
                replica_pids("rcp-ingress") + replica_pids("rcp-sample-cluster")
            ),
        }
        urls = {
            "direct": base + backend_route_prefix("sample", "cluster") + PREDICT,
            "ingress": base + PREDICT,
        }
        hap = haproxy_pids()
        groups = {
            "haproxy": hap,
            "ingress_replica": replica_pids("rcp-ingress"),
            "backend_replica": replica_pids("rcp-sample-cluster"),
        }
        for url in urls.values():
            load(url, 100)
        for name, url in urls.items():
            before = {k: cpu_s(v) for k, v in groups.items()}
            result = load(url, args.requests)
            for k, v in groups.items():
                result[f"{k}_cpu_ms_per_request"] = 1000 * (cpu_s(v) - before[k]) / args.requests
            paths[name] = result
    finally:
        serve.shutdown()
        ray.shutdown()

    print(f"Serve HAProxy mode, one node, {args.requests} requests per path, concurrency 4")
    print(f"{'path':<9}{'req/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'fail':>6}  CPU ms/request")
    for name, r in paths.items():
        cpu = ", ".join(
            f"{k.removesuffix('_cpu_ms_per_request')} {v:.3f}"
            for k, v in r.items()
            if k.endswith("_cpu_ms_per_request")
        )
        print(
            f"{name:<9}{r['throughput_rps']:>8.1f}{r['p50_ms']:>8.2f}{r['p99_ms']:>8.2f}"
            f"{r['failures']:>6}  {cpu}"
        )
    for k, v in findings.items():
        print(f"{k}: {v}")
    if args.json:
        print(
            json.dumps(
                {"benchmark": "spike_serve_haproxy_mode", "paths": paths, "findings": findings}
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
