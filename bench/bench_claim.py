"""A training claim over several served models, against the same claim over one model,
measured in the same run (issue 16).

Seconds from a gang's submit until it runs, seconds until the first replica runs on the
external pool, requests answered and failed (goal: 0 failed).

Two local clusters, one after the other, each with one cluster node of 4 logical GPUs that
Serve replicas fill, an external pool of 2 nodes x 2 GPUs, and steady HTTP load on every
model (the integration tests' load client, 2 threads per model, through the Serve endpoint):

- ``two_models``: ``sample`` (the lowest priority class) and ``ranker`` (priority high),
  2 one-GPU replicas each;
- ``one_model``: ``sample`` alone, 4 one-GPU replicas.

Then a 4 x 1-GPU gang (the example training loop, high priority) claims the whole node: every
replica moves to the external pool make-before-break (the low-priority model first) before
it is admitted. Reported for each: the figures above (times polled every 0.5 s), and the
ratios two_models / one_model.
No goal is asserted (benchmarks are not tests).

    flock /tmp/rcp-integration.lock .venv/bin/python bench/bench_claim.py [--json]

Starts Ray, so it holds the integration lock like the integration tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.config import load_config  # noqa: E402
from controlplane.local.cluster import LocalCluster  # noqa: E402
from controlplane.local.ports import isolated_overrides  # noqa: E402
from controlplane.ray_connection import connect  # noqa: E402
from controlplane.sdk import Client  # noqa: E402
from tests.integration.conftest import MNISTLIKE, Load, pools_of, wait_for  # noqa: E402

CLUSTER = (
    "serve.deploy_app=true",
    "pools.cluster.num_nodes=1",
    "pools.cluster.gpus_per_node=4",
    "pools.external.max_nodes=2",
    "pools.external.gpus_per_node=2",
    "policy.tick_s=0.5",
    "jobs.gang_start_timeout_s=300",
)
GANG_WORKERS = 4

SCENARIOS: dict[str, dict[str, tuple[int, str | None]]] = {
    # model -> (replicas, priority class; None: the lowest)
    "two_models": {"sample": (2, None), "ranker": (2, "high")},
    "one_model": {"sample": (4, None)},
}


def _config(models: dict[str, tuple[int, str | None]], directory: Path) -> Path:
    lines = ["serving:", "  models:"]
    for name, (replicas, priority) in models.items():
        lines += [
            f"    - name: {name}",
            f"      min_replicas: {replicas}",
            f"      max_replicas: {replicas}",
            "      num_gpus: 1",
            "      num_cpus: 0.5",
            "      graceful_shutdown_timeout_s: 5",
        ]
        if priority is not None:
            lines.append(f"      priority: {priority}")
    path = directory / "rcp.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _scenario(name: str, models: dict[str, tuple[int, str | None]]) -> dict[str, float]:
    import ray  # deferred: ray is heavy

    state_dir = Path(tempfile.mkdtemp(prefix=f"rcp-bench-claim-{name}-"))
    conf = _config(models, state_dir)
    cfg = load_config(conf, isolated_overrides(state_dir, *CLUSTER))
    cluster = LocalCluster(cfg)
    cluster.up(echo=lambda _line: None)
    try:
        connect(cfg)
        client = Client(state_dir=cfg.state_path)
        serve_url = f"http://{cfg.ray.node_ip}:{cfg.serve.http_port}"
        wait_for(
            "every replica on the cluster pool",
            lambda: all(pools_of(m)["cluster"]["running"] == n for m, (n, _) in models.items()),
            300,
        )
        loads = [Load(serve_url, model=m, threads=2, max_duration_s=600) for m in models]
        with contextlib.ExitStack() as running:
            for load in loads:
                running.enter_context(load)
            for load in loads:
                load.wait_for(20)
            train_config = {"num_steps": 2, "checkpoint_every": 1000, "step_sleep_s": 0.5}
            submitted = time.monotonic()
            job = client.submit(
                {
                    "name": "claims-the-cluster",
                    "entrypoint": MNISTLIKE,
                    "num_workers": GANG_WORKERS,
                    "gpus_per_worker": 1,
                    "priority_class": "high",
                    "runtime_env": {"env_vars": {"RCP_TRAIN_CONFIG": json.dumps(train_config)}},
                }
            )
            wait_for(
                "a replica on the external pool",
                lambda: any(pools_of(m)["external"]["running"] >= 1 for m in models),
                300,
            )
            first_external_s = time.monotonic() - submitted
            wait_for(
                "the gang running",
                lambda: client.status(job.id).state in ("RUNNING", "SUCCEEDED"),
                300,
            )
            gang_running_s = time.monotonic() - submitted
            for load in loads:
                load.wait_for(load.total + 20)
        return {
            "replicas_moved": float(sum(n for n, _ in models.values())),
            "submit_to_first_external_replica_s": round(first_external_s, 1),
            "submit_to_gang_running_s": round(gang_running_s, 1),
            "requests_answered": float(sum(sum(ld.statuses.values()) for ld in loads)),
            "requests_failed": float(sum(len(ld.errors) for ld in loads)),
        }
    finally:
        ray.shutdown()
        cluster.down(echo=lambda _line: None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args(argv)
    # A timeout's SIGTERM still runs each scenario's `finally` (rcp down): no cluster is left.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = {name: _scenario(name, models) for name, models in SCENARIOS.items()}
    ratios = {
        k: round(results["two_models"][k] / results["one_model"][k], 2)
        for k in ("submit_to_first_external_replica_s", "submit_to_gang_running_s")
        if results["one_model"][k]
    }
    print(f"{'figure':36} {'two_models':>11} {'one_model':>11}")
    for k in results["two_models"]:
        print(f"{k:36} {results['two_models'][k]:>11g} {results['one_model'][k]:>11g}")
    for k, r in ratios.items():
        print(f"two_models / one_model, {k}: {r:g}x")
    failed = sum(r["requests_failed"] for r in results.values())
    print(f"failed requests, both runs: {failed:g} (goal 0)")
    if args.json:
        goals = {"requests_failed": {"value": failed, "goal": 0, "met": failed == 0}}
        print(json.dumps({"results": results, "ratios_two_over_one": ratios, "goals": goals}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
