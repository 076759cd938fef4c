"""Benchmark: what the serving plane's HTTP ingress costs over calling the backend directly.

One local Ray cluster (a head and one `cluster` node, logical GPUs), Serve's HTTP proxy on a
free loopback port. Two paths to the same sample model, each with one backend replica of
identical settings on the cluster node:

- ``bare``: HTTP proxy -> backend deployment (the backend app gets its own route prefix);
- ``ingress``: HTTP proxy -> ingress (validation, weighted pool choice, retry wrapper) ->
  backend deployment, i.e. the production path.

First a calibration round on each path (one ingress replica) measures the bare backend's
throughput and the ingress replica's CPU per request; `policies.demand.ingress_replicas` turns
those into the ingress replica count the control loop would run at that rate (the rule and
``serving.ingress`` defaults `policies.ingress.decide_ingress` scales the ingress by), and the
ingress is redeployed with it (``--ingress-replicas`` overrides). Then the same load
(``--concurrency`` keep-alive clients, ``--requests`` per round) is run against both paths in interleaved rounds
(bare, ingress, bare, ingress, ...) so drift on a shared machine hits both alike. Reported:
p50/p99 latency and throughput for each path and their ratios, and the CPU time per request of
each replica process (psutil; unlike latency it does not depend on what else the machine runs).

Goals, checked in the same run against the bare backend:

* the ingress replicas spend at most 1.0 ms of CPU per request;
* throughput through the ingress is at least 0.9x the bare backend's, with the policy's
  ingress replica count;
* the p50 latency the ingress adds is reported (not a goal: on a loaded 2-core machine it is
  mostly queueing for a core).

Usage::

    .venv/bin/python bench/bench_serve_ingress.py [--concurrency 4] [--requests 1000]
        [--rounds 3] [--ingress-replicas N] [--json]

Prints a table; with ``--json`` the last line is one JSON object with every figure, ratio and
goal. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import sys
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
from serve.spec import build_app_configs  # noqa: E402

GOAL_INGRESS_CPU_MS = 1.0
GOAL_THROUGHPUT_RATIO = 0.9
BARE_APP = "bench-bare"
BARE_PREFIX = "/bare"
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


def deploy_bare_backend(timeout_s: float = 120.0) -> None:
    """The sample model's backend once more, as its own app with an HTTP route prefix."""
    state = ops.read_state()
    assert state is not None
    ours = build_app_configs(state)
    bare = json.loads(json.dumps(next(a for a in ours if a["name"] == "rcp-sample-cluster")))
    bare["name"] = BARE_APP
    bare["route_prefix"] = BARE_PREFIX
    bare["deployments"][0]["num_replicas"] = 1
    control.apply_app_configs([*ours, bare])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        app = (control.read_details().get("applications") or {}).get(BARE_APP) or {}
        if str(app.get("status", "")).rsplit(".", 1)[-1].upper() == "RUNNING":
            return
        time.sleep(0.2)
    raise TimeoutError(f"bare backend app {BARE_APP!r} not RUNNING after {timeout_s:g}s")


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


def wait_for_ingress_replicas(n: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(replica_pids("rcp-ingress")) == n:
            return
        time.sleep(0.2)
    raise TimeoutError(f"the ingress did not run {n} replicas within {timeout_s:g}s")


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
    parser.add_argument(
        "--ingress-replicas", type=int, help="ingress replicas (default: the policy's choice)"
    )
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
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")
        ops.deploy(serving_config())
        deploy_bare_backend()
        base = f"http://127.0.0.1:{port}"
        urls = {
            "bare": f"{base}{BARE_PREFIX}",
            "ingress": f"{base}/v1/models/sample/predict",
        }
        for url in urls.values():
            warm = asyncio.run(run_load(url, args.concurrency, args.warmup))
            if warm["failures"]:
                raise RuntimeError(f"warm-up against {url} had {warm['failures']} failures")

        # Calibration with one ingress replica: the rate the bare backend sustains and the
        # ingress replica's CPU per request give the count the policy would run.
        calib, calib_cpu_s = measure(
            urls, {"ingress_replica": replica_pids("rcp-ingress")}, args.concurrency, args.requests
        )
        bare_rps = len(calib["bare"]["latencies_ms"]) / calib["bare"]["elapsed_s"]
        calib_cpu_ms = (
            1000.0 * calib_cpu_s["ingress_replica"] / len(calib["ingress"]["latencies_ms"])
        )
        # The same rule and settings the control loop scales the ingress by
        # (`policies.ingress`, serving.ingress's defaults), at the bare backend's rate.
        ing = IngressConfig()
        chosen = ingress_replicas(
            bare_rps,
            calib_cpu_ms,
            target_utilization=ing.target_utilization,
            max_replicas=ing.max_replicas,
        )
        n_ingress = args.ingress_replicas or chosen
        if n_ingress != 1:
            ops.deploy(serving_config(n_ingress))
            wait_for_ingress_replicas(n_ingress)
            asyncio.run(run_load(urls["ingress"], args.concurrency, args.warmup))

        results: dict[str, list[dict[str, Any]]] = {k: [] for k in urls}
        pids = {
            "ingress_replica": replica_pids("rcp-ingress"),
            "bare_backend": replica_pids(BARE_APP),
            "ingress_backend": replica_pids("rcp-sample-cluster"),
        }
        cpu_used_s = dict.fromkeys(pids, 0.0)
        for _ in range(args.rounds):
            got, used = measure(urls, pids, args.concurrency, args.requests)
            for name, r in got.items():
                results[name].append(r)
            for k, v in used.items():
                cpu_used_s[k] += v
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()

    load_1m = os.getloadavg()[0]
    bare, ingress = summarize(results["bare"]), summarize(results["ingress"])
    bare["backend_cpu_ms_per_request"] = 1000.0 * cpu_used_s["bare_backend"] / bare["requests"]
    ingress["backend_cpu_ms_per_request"] = (
        1000.0 * cpu_used_s["ingress_backend"] / ingress["requests"]
    )
    ingress_cpu_ms = 1000.0 * cpu_used_s["ingress_replica"] / ingress["requests"]
    ingress["ingress_replica_cpu_ms_per_request"] = ingress_cpu_ms
    ingress["ingress_replicas"] = n_ingress
    p50_added_ms = ingress["p50_ms"] - bare["p50_ms"]
    throughput_ratio = ingress["throughput_rps"] / bare["throughput_rps"]
    ratios = {
        "p50_ratio": ingress["p50_ms"] / bare["p50_ms"],
        "p99_ratio": ingress["p99_ms"] / bare["p99_ms"],
        "throughput_ratio": throughput_ratio,
        "p50_added_ms": p50_added_ms,
        "p99_added_ms": ingress["p99_ms"] - bare["p99_ms"],
        "ingress_cpu_ms_per_bare_backend_cpu_ms": ingress_cpu_ms
        / bare["backend_cpu_ms_per_request"],
    }
    calibration = {
        "bare_rps": bare_rps,
        "ingress_cpu_ms_per_request_one_replica": calib_cpu_ms,
        "policy_ingress_replicas": chosen,
        "ingress_replicas_used": n_ingress,
    }
    goals = {
        "ingress_cpu_ms_max": GOAL_INGRESS_CPU_MS,
        "throughput_ratio_min": GOAL_THROUGHPUT_RATIO,
        "ingress_cpu_met": ingress_cpu_ms <= GOAL_INGRESS_CPU_MS,
        "throughput_met": throughput_ratio >= GOAL_THROUGHPUT_RATIO,
        "p50_added_ms_reported": p50_added_ms,
    }
    goals["met"] = bool(goals["ingress_cpu_met"] and goals["throughput_met"])
    # Why a goal is missed, from this run's own figures: what an HTTP request into a Serve
    # replica costs over a handle call (the backend measured both ways), and the CPU per
    # request of each path (on a machine with no spare core, throughput follows it).
    http_extra_ms = bare["backend_cpu_ms_per_request"] - ingress["backend_cpu_ms_per_request"]
    path_cpu_ms = {
        "bare": bare["backend_cpu_ms_per_request"],
        "ingress": ingress_cpu_ms + ingress["backend_cpu_ms_per_request"],
    }
    why = []
    if not goals["ingress_cpu_met"]:
        why.append(
            f"an HTTP request into a Serve replica costs {http_extra_ms:.2f} CPU ms more than a "
            f"handle call here (the backend: {bare['backend_cpu_ms_per_request']:.2f} over HTTP, "
            f"{ingress['backend_cpu_ms_per_request']:.2f} on a handle call), and the ingress "
            "pays one HTTP request in and one handle call out"
        )
    if not goals["throughput_met"]:
        why.append(
            f"the replicas spend {path_cpu_ms['ingress']:.2f} CPU ms per request through the "
            f"ingress against {path_cpu_ms['bare']:.2f} bare "
            f"(x{path_cpu_ms['bare'] / path_cpu_ms['ingress']:.2f}) on {os.cpu_count()} cores "
            f"at load average {load_1m:.1f}: with no core to spare, throughput follows CPU"
        )
    goals["why_missed"] = why
    ratios["http_extra_cpu_ms"] = http_extra_ms
    ratios["bare_over_ingress_path_cpu"] = path_cpu_ms["bare"] / path_cpu_ms["ingress"]

    print(
        f"serve ingress benchmark: concurrency {args.concurrency}, {args.rounds} rounds x "
        f"{args.requests} requests per path, {os.cpu_count()} CPUs "
        f"(load average {load_1m:.1f}), Python {platform.python_version()}"
    )
    print(
        f"calibration: bare {bare_rps:.1f} req/s, ingress {calib_cpu_ms:.2f} CPU ms/request "
        f"-> policy: {chosen} ingress replica(s); measured with {n_ingress}"
    )
    print(f"{'path':<9}{'requests':>9}{'fail':>6}{'p50 ms':>9}{'p99 ms':>9}{'req/s':>9}")
    for name, s in (("bare", bare), ("ingress", ingress)):
        print(
            f"{name:<9}{s['requests']:>9}{s['failures']:>6}{s['p50_ms']:>9.2f}"
            f"{s['p99_ms']:>9.2f}{s['throughput_rps']:>9.1f}"
        )
    print(
        f"CPU per request: backend {bare['backend_cpu_ms_per_request']:.2f} ms (bare), "
        f"{ingress['backend_cpu_ms_per_request']:.2f} ms (via ingress); ingress replicas "
        f"{ingress_cpu_ms:.2f} ms"
    )
    print(
        f"ingress/bare: p50 x{ratios['p50_ratio']:.2f} (+{p50_added_ms:.2f} ms), "
        f"p99 x{ratios['p99_ratio']:.2f}, throughput x{throughput_ratio:.2f}"
    )
    print(
        f"goal: ingress <= {GOAL_INGRESS_CPU_MS:g} CPU ms/request -> "
        f"{'met' if goals['ingress_cpu_met'] else 'MISSED'}; >= {GOAL_THROUGHPUT_RATIO:g}x "
        f"throughput with {n_ingress} ingress replica(s) -> "
        f"{'met' if goals['throughput_met'] else 'MISSED'}; p50 added {p50_added_ms:+.2f} ms"
    )
    for reason in why:
        print(f"why missed: {reason}")
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
                    "calibration": calibration,
                    "bare": bare,
                    "ingress": ingress,
                    "ratios": ratios,
                    "goals": goals,
                }
            )
        )
    return 0 if bare["failures"] == 0 and ingress["failures"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
