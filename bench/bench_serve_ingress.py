"""Benchmark: what the serving plane's ingress costs over calling the backend directly.

One local Ray cluster (a head and one `cluster` node, logical GPUs), Serve's HTTP proxy on a
free loopback port, the sample model with one backend replica on the cluster node. Three
paths to that same replica:

- ``bare``: HTTP proxy -> backend (its app's own route prefix, ``/_rcp/sample/cluster``);
- ``edge``: the edge router (``serve.edge_router``, the process `rcp up` runs on the
  serve port) -> HTTP proxy -> backend, i.e. the production path: the edge picks the pool by
  the ingress's route table and sends the predict straight to that pool's backend app;
- ``ingress``: HTTP proxy -> the ingress deployment (validation, weighted pool choice, retry
  wrapper) -> handle call -> backend: the path a predict takes when the edge has no fresh
  table, and every predict took before the edge routed them (for comparison).

The same load (``--concurrency`` keep-alive clients, ``--requests`` per round) runs against the
paths in interleaved rounds (bare, edge, ingress, bare, ...) so drift on a shared machine hits
all alike. Reported: p50/p99 latency and throughput per path and their ratios to bare, and the
CPU time per request of each process (psutil; unlike latency it does not depend on what else
the machine runs). The edge's cost is its own process's CPU plus what the ingress replicas
spent meanwhile (the edge fetches the route table from them 4 times a second).

Goals, checked in the same run against the bare backend:

* the ingress (the edge, and the ingress replicas while the edge runs) spends at most 1.0 ms
  of CPU per request;
* throughput through the edge is at least 0.9x the bare backend's, with the ingress replica
  count the policy chooses for the rate the ingress replicas see (`policies.demand.
  ingress_replicas`, ``serving.ingress`` defaults);
* the p50 latency the edge adds is reported (not a goal: on a loaded 2-core machine it is
  mostly queueing for a core).

Usage::

    .venv/bin/python bench/bench_serve_ingress.py [--concurrency 4] [--requests 1000]
        [--rounds 3] [--json]

Prints a table; with ``--json`` the last line is one JSON object with every figure, ratio and
goal. Loopback only.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp  # noqa: E402
import psutil  # noqa: E402
import ray  # noqa: E402
from ray import serve  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from policies.demand import ingress_replicas  # noqa: E402
from serve import control  # noqa: E402
from serve import operations as ops  # noqa: E402
from serve.config import IngressConfig, ModelConfig, ServingConfig  # noqa: E402
from serve.spec import backend_route_prefix  # noqa: E402

GOAL_INGRESS_CPU_MS = 1.0
GOAL_THROUGHPUT_RATIO = 0.9
PREDICT = "/v1/models/sample/predict"
BODY = {"inputs": [[0.05 * i for i in range(16)]]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving_config(ingress_replicas: int = 1) -> ServingConfig:
    return ServingConfig(
        ingress=IngressConfig(num_replicas=ingress_replicas, num_cpus=0.25),
        models=[ModelConfig(name="sample", num_cpus=1.0, num_gpus=1.0, min_replicas=1)],
    )


def start_edge(serve_port: int, state_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The edge router as `rcp up` runs it, over the one proxy (the state file names it)."""
    state = state_dir / "local-cluster.json"
    state.write_text(json.dumps({"serve_proxies": {"head": serve_port, "nodes": []}}))
    port = free_port()
    edge = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serve.edge_router",
            f"--state-file={state}",
            "--host=127.0.0.1",
            f"--port={port}",
            f"--log={state_dir / 'edge.log'}",
        ],
        env={"PATH": os.environ.get("PATH", os.defpath)},
        cwd=Path(__file__).resolve().parents[1],
    )
    return edge, port


def edge_request_counts(log: Path) -> dict[str, int]:
    """What the edge did with its requests, from its last log line (``stopped: requests
    {'routed': N, ...}``): routed straight to a backend, passed to the ingress, ..."""
    for line in reversed(log.read_text().splitlines()):
        if "stopped: requests " in line:
            counts = ast.literal_eval(line.split("stopped: requests ", 1)[1].split("}", 1)[0] + "}")
            return {str(k): int(v) for k, v in counts.items()}
    return {}


def wait_for_table(edge: subprocess.Popen[bytes], log: Path, timeout_s: float = 60.0) -> None:
    """Until the edge has the ingress's route table (it logs each new generation)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if log.exists() and "route table generation" in log.read_text():
            return
        if edge.poll() is not None:
            raise RuntimeError(f"the edge exited with {edge.returncode} (log: {log})")
        time.sleep(0.2)
    raise TimeoutError(f"the edge logged no route table within {timeout_s:g}s ({log})")


async def run_load(url: str, concurrency: int, num_requests: int) -> dict[str, Any]:
    """`num_requests` POSTs spread over `concurrency` keep-alive clients."""
    payload = json.dumps(BODY).encode()
    headers = {"Content-Type": "application/json"}
    latencies_ms: list[float] = []
    failures = 0
    remaining = num_requests

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal remaining, failures
        while remaining > 0:
            remaining -= 1
            t0 = time.perf_counter()
            async with session.post(url, data=payload, headers=headers) as resp:
                await resp.read()
                ok = resp.status == 200
            latencies_ms.append((time.perf_counter() - t0) * 1000.0)
            failures += 0 if ok else 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
        elapsed_s = time.perf_counter() - started
    return {"latencies_ms": latencies_ms, "elapsed_s": elapsed_s, "failures": failures}


def replica_pids(app: str) -> list[int]:
    """Process ids of the RUNNING replicas of every deployment of `app` (all on this machine)."""
    app_details = (control.read_details().get("applications") or {}).get(app) or {}
    return [
        int(r["pid"])
        for d in (app_details.get("deployments") or {}).values()
        for r in d.get("replicas") or []
        if r.get("pid") and str(r.get("state", "")).rsplit(".", 1)[-1].upper() == "RUNNING"
    ]


def measure(
    urls: dict[str, str], pids: dict[str, list[int]], concurrency: int, requests: int
) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    """One round per path (in `urls` order): the load's result per path, and the CPU seconds
    each replica group in `pids` spent while its own path ran (keys start with the path)."""
    results: dict[str, dict[str, Any]] = {}
    cpu_used_s = dict.fromkeys(pids, 0.0)
    for name, url in urls.items():
        before = {k: cpu_s(v) for k, v in pids.items()}
        results[name] = asyncio.run(run_load(url, concurrency, requests))
        for k, v in pids.items():
            if k.startswith(name):
                cpu_used_s[k] += cpu_s(v) - before[k]
    return results, cpu_used_s


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100.0 * (len(ordered) - 1))))
    return ordered[idx]


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    lat = [x for r in rounds for x in r["latencies_ms"]]
    elapsed_s = sum(r["elapsed_s"] for r in rounds)
    return {
        "requests": len(lat),
        "failures": sum(r["failures"] for r in rounds),
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "mean_ms": statistics.fmean(lat),
        "throughput_rps": len(lat) / elapsed_s if elapsed_s > 0 else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=1000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per path (interleaved)")
    parser.add_argument("--warmup", type=int, default=200, help="requests per path first")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args(argv)

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
    ray.init(address=cluster.address, log_to_driver=False)
    port = free_port()
    state_dir = Path(tempfile.mkdtemp(prefix="bench-edge-"))
    edge: subprocess.Popen[bytes] | None = None
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        ops.deploy(serving_config())
        edge, edge_port = start_edge(port, state_dir)
        wait_for_table(edge, state_dir / "edge.log")
        base = f"http://127.0.0.1:{port}"
        urls = {
            "bare": f"{base}{backend_route_prefix('sample', 'cluster')}{PREDICT}",
            "edge": f"http://127.0.0.1:{edge_port}{PREDICT}",
            "ingress": f"{base}{PREDICT}",
        }
        for url in urls.values():
            warm = asyncio.run(run_load(url, args.concurrency, args.warmup))
            if warm["failures"]:
                raise RuntimeError(f"warm-up against {url} had {warm['failures']} failures")

        results: dict[str, list[dict[str, Any]]] = {k: [] for k in urls}
        backend = replica_pids("rcp-sample-cluster")
        ingress_replicas_pids = replica_pids("rcp-ingress")
        pids = {
            "bare_backend": backend,
            "edge_process": [edge.pid],
            "edge_ingress_replicas": ingress_replicas_pids,
            "edge_backend": backend,
            "ingress_replicas": ingress_replicas_pids,
            "ingress_backend": backend,
        }
        cpu_used_s = dict.fromkeys(pids, 0.0)
        for _ in range(args.rounds):
            got, used = measure(urls, pids, args.concurrency, args.requests)
            for name, r in got.items():
                results[name].append(r)
            for k, v in used.items():
                cpu_used_s[k] += v
    finally:
        if edge is not None:
            edge.terminate()
            edge.wait(10)
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()

    load_1m = os.getloadavg()[0]
    edge_counts = edge_request_counts(state_dir / "edge.log")
    paths = {name: summarize(rounds) for name, rounds in results.items()}
    bare, via_edge, via_ingress = paths["bare"], paths["edge"], paths["ingress"]
    for name, s in paths.items():
        s["backend_cpu_ms_per_request"] = 1000.0 * cpu_used_s[f"{name}_backend"] / s["requests"]
    edge_process_ms = 1000.0 * cpu_used_s["edge_process"] / via_edge["requests"]
    edge_replicas_ms = 1000.0 * cpu_used_s["edge_ingress_replicas"] / via_edge["requests"]
    edge_cpu_ms = edge_process_ms + edge_replicas_ms
    via_edge["edge_process_cpu_ms_per_request"] = edge_process_ms
    via_edge["ingress_replicas_cpu_ms_per_request"] = edge_replicas_ms
    via_edge["ingress_cpu_ms_per_request"] = edge_cpu_ms
    ingress_cpu_ms = 1000.0 * cpu_used_s["ingress_replicas"] / via_ingress["requests"]
    via_ingress["ingress_cpu_ms_per_request"] = ingress_cpu_ms
    # The ingress replica count the policy runs for what the ingress replicas see while the
    # edge routes (the table fetches): the same rule and settings the control loop uses.
    ing = IngressConfig()
    replica_rps = 4.0  # the edge's table fetches per second (BalancerLimits.interval_s)
    chosen = ingress_replicas(
        replica_rps,
        ingress_cpu_ms,
        target_utilization=ing.target_utilization,
        max_replicas=ing.max_replicas,
    )
    ratios = {
        f"{name}_{what}": paths[name][key] / bare[key]
        for name in ("edge", "ingress")
        for what, key in (("p50_ratio", "p50_ms"), ("p99_ratio", "p99_ms"))
    }
    ratios["edge_throughput_ratio"] = via_edge["throughput_rps"] / bare["throughput_rps"]
    ratios["ingress_throughput_ratio"] = via_ingress["throughput_rps"] / bare["throughput_rps"]
    ratios["edge_p50_added_ms"] = via_edge["p50_ms"] - bare["p50_ms"]
    ratios["ingress_p50_added_ms"] = via_ingress["p50_ms"] - bare["p50_ms"]
    ratios["edge_cpu_over_ingress_cpu"] = edge_cpu_ms / ingress_cpu_ms
    goals = {
        "ingress_cpu_ms_max": GOAL_INGRESS_CPU_MS,
        "throughput_ratio_min": GOAL_THROUGHPUT_RATIO,
        "ingress_cpu_met": edge_cpu_ms <= GOAL_INGRESS_CPU_MS,
        "throughput_met": ratios["edge_throughput_ratio"] >= GOAL_THROUGHPUT_RATIO,
        "p50_added_ms_reported": ratios["edge_p50_added_ms"],
        "policy_ingress_replicas": chosen,
        "edge_requests": edge_counts,
        "edge_routed_every_predict": edge_counts.get("routed", 0)
        == args.warmup + args.rounds * args.requests,
    }
    goals["met"] = bool(goals["ingress_cpu_met"] and goals["throughput_met"])

    print(
        f"serve ingress benchmark: concurrency {args.concurrency}, {args.rounds} rounds x "
        f"{args.requests} requests per path, {os.cpu_count()} CPUs "
        f"(load average {load_1m:.1f}), Python {platform.python_version()}"
    )
    print(
        f"{'path':<9}{'requests':>9}{'fail':>6}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>9}{'x bare':>8}"
    )
    for name, s in paths.items():
        print(
            f"{name:<9}{s['requests']:>9}{s['failures']:>6}{s['p50_ms']:>9.2f}"
            f"{s['p99_ms']:>9.2f}{s['throughput_rps']:>9.1f}"
            f"{s['throughput_rps'] / bare['throughput_rps']:>8.2f}"
        )
    print(
        f"CPU ms per request: backend {bare['backend_cpu_ms_per_request']:.2f} (bare), "
        f"{via_edge['backend_cpu_ms_per_request']:.2f} (edge), "
        f"{via_ingress['backend_cpu_ms_per_request']:.2f} (ingress, handle call); "
        f"edge {edge_process_ms:.3f} + ingress replicas {edge_replicas_ms:.3f} = "
        f"{edge_cpu_ms:.3f}; ingress replicas on the ingress path {ingress_cpu_ms:.2f} "
        f"(x{ratios['edge_cpu_over_ingress_cpu']:.3f})"
    )
    print(f"the edge's requests: {edge_counts}")
    print(
        f"goal: ingress <= {GOAL_INGRESS_CPU_MS:g} CPU ms/request -> "
        f"{'met' if goals['ingress_cpu_met'] else 'MISSED'} ({edge_cpu_ms:.3f}); "
        f">= {GOAL_THROUGHPUT_RATIO:g}x throughput with {chosen} ingress replica(s) -> "
        f"{'met' if goals['throughput_met'] else 'MISSED'} "
        f"(x{ratios['edge_throughput_ratio']:.2f}); p50 added {ratios['edge_p50_added_ms']:+.2f} ms"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "benchmark": "serve_ingress",
                    "concurrency": args.concurrency,
                    "rounds": args.rounds,
                    "requests_per_round": args.requests,
                    "cpus": os.cpu_count(),
                    "load_average_1m": load_1m,
                    "paths": paths,
                    "ratios": ratios,
                    "goals": goals,
                }
            )
        )
    return 0 if all(s["failures"] == 0 for s in paths.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
