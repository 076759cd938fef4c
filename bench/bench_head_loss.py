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

    flock /tmp/rcp-integration.lock .venv/bin/python bench/bench_head_loss.py [--json]

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
from controlplane.local.cluster import LocalCluster, isolated_overrides  # noqa: E402
from controlplane.local.processes import kill_now, node_processes  # noqa: E402
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


def _scenario(name: str, overrides: tuple[str, ...], traffic_s: float) -> dict[str, float]:
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
        gang = client.submit(mnistlike_job("gang", steps=100_000, gpus_per_worker=2)).id
        _until("the gang running", lambda: client.status(gang).state == "RUNNING", 300)
        queued = client.submit(mnistlike_job("queued", steps=2, gpus_per_worker=2)).id
        time.sleep(2.0)
        assert client.status(queued).state == "QUEUED"
        state = cluster.read_state()
        head_id = LocalCluster.head_node_id(state)
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
        }
    finally:
        cluster.down(echo=lambda _line: None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--down-s", type=float, default=10.0, help="traffic while the head is down")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args(argv)
    # A timeout's SIGTERM still runs each scenario's `finally` (rcp down): no cluster is left.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = {name: _scenario(name, o, args.down_s) for name, o in SCENARIOS.items()}
    ratios = {
        k: round(results["baseline"][k] / results["ha"][k], 2)
        for k in ("api_answers_after_s", "queued_job_admitted_after_s")
        if results["ha"][k]
    }
    keys = list(results["ha"])
    print(f"{'figure':32} {'ha':>10} {'baseline':>10}")
    for k in keys:
        print(f"{k:32} {results['ha'][k]:>10g} {results['baseline'][k]:>10g}")
    for k, r in ratios.items():
        print(f"baseline / ha, {k}: {r:g}x")
    if args.json:
        print(json.dumps({"results": results, "ratios_baseline_over_ha": ratios}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
