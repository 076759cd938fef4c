"""Never short, on a real cluster: how long serving's demand waits for a new replica when it
must be rented, rented elsewhere, or taken back from training, against a replica start alone,
measured in the same run (issue 28).

One local cluster: the cluster pool is two nodes of one GPU; two providers, ``cheap`` ($1,
up to 6 nodes of 1 GPU) and ``dear`` ($3, up to 3), each out once it has not delivered
within 45 s. The sample model answers in 1 s and wants one replica per request in
flight; a client is added at each stage (the integration tests' load client, back to back
through the Serve endpoint), and another while demand does not exceed what runs, and each
stage waits for the new replica where it must land:

0. ``cluster_room``: a cluster node has a free GPU: the new replica starts there. Its
   replica start alone (the ``serve.scale`` event to the replica RUNNING) is the baseline.
1. ``rent_cheapest``: a low-priority gang (a plain command that checkpoints when asked)
   claims a cluster node (its replica moves to ``cheap`` first): the new replica is rented
   from ``cheap`` (a node start first).
2. ``stockout_handover``: ``rcp fault stockout cheap``: ``cheap`` has room but delivers
   nothing; past its deadline it is out and ``dear`` hosts the replica.
3. ``reclaim_from_training``: ``rcp fault stockout dear`` too: past ``dear``'s deadline
   nobody delivers, serving takes the gang's GPU, checkpoint first, and the replica starts
   on the cluster pool (the figure includes the 45 s until ``dear`` counts as out).

Reported per stage: seconds from the last client's start to the new replica serving (polled
every 0.5 s), its ratio to the baseline's replica start, and requests answered and failed (goal:
0 failed). The forecast is off (``forecast.enabled=false``): it would keep the gang off the
node stage 0's replica used. A spot reclaim with notice is played by
tests/integration/test_providers.py.

    flock /tmp/rcp-integration.lock .venv/bin/python bench/bench_never_short.py [--json]

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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from click.testing import CliRunner  # noqa: E402

from controlplane.cli import cli  # noqa: E402
from controlplane.config import Config, load_config  # noqa: E402
from controlplane.local.cluster import LocalCluster  # noqa: E402
from controlplane.local.ports import isolated_overrides  # noqa: E402
from controlplane.ray_connection import connect  # noqa: E402
from controlplane.sdk import Client  # noqa: E402
from tests.integration.conftest import TEST_SPEED, Load, pools_of, wait_for  # noqa: E402
from tests.integration.test_job_durability import RECOVERY_SCRIPT, steps_of  # noqa: E402

CONFIG = """\
pools:
  external:
    idle_timeout_s: 600
    providers:
      - {name: cheap, price_per_gpu_hour: 1.0, max_nodes: 6, gpus_per_node: 1,
         cpus_per_node: 2, delivery_deadline_s: 45, backoff_s: 3600}
      - {name: dear, price_per_gpu_hour: 3.0, max_nodes: 3, gpus_per_node: 1,
         cpus_per_node: 2, delivery_deadline_s: 45, backoff_s: 3600}
serving:
  models:
    - name: sample
      min_replicas: 1
      max_replicas: 5
      num_gpus: 1
      num_cpus: 0.5
      target_ongoing_requests: 1
      upscale_delay_s: 1
      downscale_delay_s: 3600
      graceful_shutdown_timeout_s: 5
      init_kwargs: {extra_latency_ms: 1000}
"""
OVERRIDES = (
    *TEST_SPEED,
    "serve.deploy_app=true",
    "pools.cluster.num_nodes=2",
    "pools.cluster.gpus_per_node=1",
    "forecast.enabled=false",
    "jobs.step_report_interval_s=1",
)
MAX_CLIENTS_PER_STAGE = 3
"""Clients a stage adds at most before it gives up: one should do (one per replica)."""
STAGES = ("cluster_room", "rent_cheapest", "stockout_handover", "reclaim_from_training")


def where() -> dict[str, int]:
    """Sample's serving replicas by place: ``cluster``, or the provider of their node."""
    import ray  # deferred: ray is heavy

    labels = {n["NodeID"]: n.get("Labels") or {} for n in ray.nodes() if n["Alive"]}
    out: dict[str, int] = {}
    for pool, data in pools_of().items():
        for r in data.get("replicas") or []:
            if r["state"] in ("RUNNING", "PENDING_MIGRATION"):
                place = (
                    "cluster"
                    if pool == "cluster"
                    else labels.get(r["node_id"], {}).get("provider", "?")
                )
                out[place] = out.get(place, 0) + 1
    return out


def targets() -> int:
    """Sample's replica targets, both pools: what the control plane asks Serve for."""
    return sum(int(pool.get("target") or 0) for pool in pools_of().values())


def stage(loads: list[Load], url: str, place: str, want: int, timeout_s: float) -> float:
    """Add a client, and another while demand does not exceed what serves within 20 s (it
    may already, by a replica, from the load board's reading); then seconds from the last
    client's start until `want` replicas serve at `place` (``cluster`` or a provider).
    Prints where every replica serves before and after."""
    before = where()
    served = sum(before.values())
    for _ in range(MAX_CLIENTS_PER_STAGE):
        load = Load(url, threads=1, pace_s=0.0, max_duration_s=1800)
        load.__enter__()
        loads.append(load)
        started = time.monotonic()
        while time.monotonic() - started < 20:
            if targets() > served or where().get(place, 0) >= want:
                break
            time.sleep(0.5)
        else:
            continue  # demand did not rise above what serves: one more client
        break
    else:
        raise AssertionError(
            f"demand never rose above the {served} replica(s) serving ({before}) with "
            f"{MAX_CLIENTS_PER_STAGE} more clients; targets {targets()}, now {where()}"
        )
    wait_for(
        f"{want} replica(s) serving at {place}",
        lambda: where().get(place, 0) >= want or None,
        timeout_s,
    )
    took = time.monotonic() - started
    print(f"  {len(loads)} clients: {before} -> {where()}")
    return took


def run(directory: Path) -> dict[str, Any]:
    import ray  # deferred: ray is heavy

    conf = directory / "rcp.yaml"
    conf.write_text(CONFIG)
    cfg: Config = load_config(conf, isolated_overrides(directory / "state", *OVERRIDES))
    cluster = LocalCluster(cfg)
    cluster.up(echo=lambda _line: None)
    loads: list[Load] = []
    figures: dict[str, dict[str, float]] = {}
    try:
        connect(cfg)
        client = Client(state_dir=cfg.state_path)
        url = f"http://127.0.0.1:{cfg.serve.http_port}"
        wait_for("sample's first replica", lambda: sum(where().values()) >= 1 or None, 300)
        loads.append(Load(url, threads=1, pace_s=0.0, max_duration_s=1800).__enter__())
        loads[0].wait_for(5)
        # 0: room on the cluster pool.
        t0 = time.time()
        took = stage(loads, url, "cluster", 2, 300)
        serving_since = time.time()  # within a poll (0.5 s) of RUNNING
        scaled = next(
            float(e["at_s"])
            for e in client.events(limit=1000)
            if e["kind"] == "serve.scale"
            and "sample/cluster" in str(e["message"])
            and float(e["at_s"]) >= t0 - 1
        )
        figures["cluster_room"] = {
            "demand_to_serving_s": took,
            "scale_to_serving_s": max(0.5, serving_since - scaled),
        }
        # The gang claims a cluster node: its replica moves to cheap first (make-before-break).
        script = directory / "trainer.py"
        script.write_text(RECOVERY_SCRIPT)
        out = directory / "out"
        out.mkdir()
        gang = client.submit(
            {
                "name": "low",
                "entrypoint": f"python {script} {out} 100000 1000 0.2",
                "num_workers": 1,
                "gpus_per_worker": 1,
                "priority_class": "low",
            }
        )
        wait_for("the gang training", lambda: len(steps_of(out)) >= 5 or None, 600)
        # 1: rented from the cheapest provider.
        moved = where()
        figures["rent_cheapest"] = {
            "demand_to_serving_s": stage(loads, url, "cheap", moved.get("cheap", 0) + 1, 400)
        }
        # 2: cheap out of stock: dear, after cheap's deadline.
        got = CliRunner().invoke(cli, ["fault", "stockout", "cheap", f"state_dir={cfg.state_dir}"])
        assert got.exit_code == 0, got.output
        figures["stockout_handover"] = {"demand_to_serving_s": stage(loads, url, "dear", 1, 400)}
        # 3: nothing to rent: past dear's deadline the gang checkpoints and yields its GPU.
        got = CliRunner().invoke(cli, ["fault", "stockout", "dear", f"state_dir={cfg.state_dir}"])
        assert got.exit_code == 0, got.output
        figures["reclaim_from_training"] = {
            "demand_to_serving_s": stage(loads, url, "cluster", 2, 400)
        }
        job = client.status(gang.id)
        figures["reclaim_from_training"]["gang_preemptions"] = float(job.num_preemptions)
        step = job.attempts[0].checkpoint_step if job.attempts else None
        figures["reclaim_from_training"]["gang_checkpoint_step"] = float(
            -1 if step is None else step
        )
        for load in loads:
            load.wait_for(load.total + 5)
        with contextlib.suppress(Exception):
            client.cancel(gang.id)
    finally:
        for load in loads:
            load.__exit__(None, None, None)
        ray.shutdown()
        cluster.down(echo=lambda _line: None)
    answered = float(sum(sum(ld.statuses.values()) for ld in loads))
    failed = float(
        sum(len(ld.errors) for ld in loads)
        + sum(n for ld in loads for s, n in ld.statuses.items() if s != 200)
    )
    return {"stages": figures, "requests_answered": answered, "requests_failed": failed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args(argv)
    # A timeout's SIGTERM still runs `finally` (rcp down): no cluster is left.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="rcp-bench-never-short-") as tmp:
        result = run(Path(tmp))
    stages = result["stages"]
    baseline = stages["cluster_room"]["scale_to_serving_s"]
    ratios = {name: round(stages[name]["demand_to_serving_s"] / baseline, 2) for name in STAGES}
    print(f"replica start alone (serve.scale to serving, node up): {baseline:.1f} s")
    print(f"{'stage':24} {'demand to serving s':>20} {'x replica start':>16}")
    for name in STAGES:
        print(f"{name:24} {stages[name]['demand_to_serving_s']:>20.1f} {ratios[name]:>15g}x")
    print(
        f"requests answered {result['requests_answered']:g}, failed "
        f"{result['requests_failed']:g} (goal 0)"
    )
    reclaim = stages["reclaim_from_training"]
    print(
        f"the gang: preempted {reclaim['gang_preemptions']:g} time(s), checkpointed at step "
        f"{reclaim['gang_checkpoint_step']:g}"
    )
    if args.json:
        failed = result["requests_failed"]
        goals = {
            "requests_failed": {"value": failed, "goal": 0, "met": failed == 0},
            "gang_checkpointed_and_yielded": {
                "value": reclaim["gang_preemptions"],
                "goal": ">= 1 with a checkpoint step",
                "met": reclaim["gang_preemptions"] >= 1 and reclaim["gang_checkpoint_step"] >= 0,
            },
        }
        print(
            json.dumps(
                {
                    "bench": "never_short",
                    **result,
                    "replica_start_s": baseline,
                    "ratios_to_replica_start": ratios,
                    "goals": goals,
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
