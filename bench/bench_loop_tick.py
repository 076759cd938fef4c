"""Benchmark: the control loop's tick cost now against a base revision, in one run.

What is timed is the work a tick does between its reads and its writes, on the simulated
1,000-node cluster of `bench_admission` (10,000 queued jobs, 60 % full, Serve replicas of one
model on the cluster pool), with a training claim standing:

- **after** (this tree): `controlplane.loop.decide.decide` on one `Observation`: admission,
  health remediation, demand and placement in one batch, the claim handed over as data, and
  (where the tree has `policies.attempts`) every running gang's lifecycle, one `GangView` a
  gang (a base revision decided that in the runner, outside the decide phase, untimed here);
- **before** (a base revision without `controlplane.loop`): what its two threads did per tick,
  `policies.admission.decide` + `policies.health.remediate` in the admission tick, then
  `controlplane.serving.ServingStep.decide` with the claim as a GPU count in the serving tick.

With ``--baseline-rev REV`` the base revision is checked out in a temporary ``git worktree``
and both trees are measured in subprocesses of the same Python, alternately (before, after,
before, ...), ``--rounds`` times; the ratio after/before of the median CPU time per tick is
printed with the goal (<= 1.05: the noise margin of a shared machine, where two runs of the
same tree differ by up to 5 %). ``--with-policy-benches`` also runs `bench_admission` and
`bench_health` (``--json``) in both trees and prints their ratios.

Usage::

    .venv/bin/python bench/bench_loop_tick.py --baseline-rev <commit> [--rounds 3] [--json]
    .venv/bin/python bench/bench_loop_tick.py            # this tree only

No Ray and no store: the decide phase is pure; the adapters' I/O is the same calls before
and after (one inventory read, one Serve status read, one store read per key).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOAL_RATIO = 1.05
MODEL = "llm"


def _measure(tree: Path, runs: int, nodes: int, jobs: int) -> dict[str, float]:
    """Time one tick's decide work in `tree` (run inside a subprocess whose path is `tree`)."""
    sys.path.insert(0, str(tree))
    spec = importlib.util.spec_from_file_location(
        "bench_admission", tree / "bench/bench_admission.py"
    )
    assert spec is not None and spec.loader is not None
    ba = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ba)

    from policies import admission, health
    from policies.admission import AdmissionConfig, AdmissionState, QueueConfig
    from policies.placement import PlacementConfig
    from policies.plan import MoveServeReplicas
    from serve.config import ModelConfig, ServingConfig

    snap = ba.build_snapshot(nodes, jobs, 7, 0.6)
    config = AdmissionConfig(queues=tuple(QueueConfig(q, 1.0 / len(ba.QUEUES)) for q in ba.QUEUES))
    serving = ServingConfig(models=[ModelConfig(name=MODEL, min_replicas=1, max_replicas=100_000)])
    placement = PlacementConfig(external_max_gpus=64, migrate_back_idle_s=60.0)
    loads = {MODEL: 100.0}

    if (tree / "controlplane/loop/decide.py").exists():
        from controlplane.adapters.serve import PoolView, ServeView
        from controlplane.loop.decide import Policies, decide
        from controlplane.loop.types import Observation, ServingPolicyState
        from controlplane.policy_config import demand_config
        from policies.snapshot import Pool

        running = sum(1 for r in snap.serve_replicas if r.model == MODEL)
        view = ServeView(
            deployed=True,
            pools={(MODEL, Pool.CLUSTER): PoolView(target=running, running=running, weight=1.0)},
            replicas=snap.serve_replicas,
        )
        obs = Observation(snapshot=snap, serve=view, loads=loads)
        if (tree / "policies/attempts").exists():
            # The jobs' lifecycle is decided in the tick too (issue 29): one view per gang,
            # every one running and stepping (the common case: the table's last row).
            from dataclasses import replace

            from policies.attempts import GangStatus, GangView, JobsView

            gangs = tuple(
                GangView(
                    job_id=g.job_id,
                    running=True,
                    status=GangStatus.RUNNING,
                    now_s=snap.now_s,
                    admitted_s=g.started_s,
                    num_workers=g.num_workers,
                    started_ranks=g.num_workers,
                    max_runtime_s=g.max_runtime_s,
                    step=100,
                    step_at_s=snap.now_s - 1.0,
                )
                for g in snap.running
            )
            obs = replace(obs, jobs_view=JobsView(gangs))
        model = serving.models[0]
        pol = Policies(
            admission=config,
            placement=placement,
            demand={MODEL: demand_config(model)},
            gpus_per_replica={MODEL: model.num_gpus},
        )

        def tick() -> object:
            return decide(obs, pol, AdmissionState(), ServingPolicyState())

    else:
        from controlplane.serving import ServingPolicyState as OldState
        from controlplane.serving import ServingStep

        step = ServingStep(serving, placement)

        def tick() -> object:
            plan, _ = admission.decide(snap, config, AdmissionState())
            health.remediate(snap, {})
            claim = sum(a.num_replicas for a in plan if isinstance(a, MoveServeReplicas))
            return step.decide(snap, loads, OldState(), claim)

    tick()  # warm-up (imports, caches)
    wall: list[float] = []
    cpu: list[float] = []
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.process_time()
        tick()
        cpu.append((time.process_time() - c0) * 1000.0)
        wall.append((time.perf_counter() - w0) * 1000.0)
    return {"cpu_median_ms": statistics.median(cpu), "wall_median_ms": statistics.median(wall)}


def _run_child(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(tree),
        "--runs",
        str(args.runs),
        "--nodes",
        str(args.nodes),
        "--jobs",
        str(args.jobs),
    ]
    out = subprocess.run(cmd, cwd=tree, check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def _policy_bench(tree: Path, name: str, extra: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, str(tree / "bench" / name), "--json", *extra]
    out = subprocess.run(cmd, cwd=tree, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-rev", help="the revision to compare against (git rev)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating before/after rounds")
    parser.add_argument("--runs", type=int, default=20, help="timed ticks per round")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--with-policy-benches", action="store_true")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        print(json.dumps(_measure(Path(args.child), args.runs, args.nodes, args.jobs)))
        return 0
    if not args.baseline_rev:
        after = _run_child(ROOT, args)
        print(f"tick decide work: {after['cpu_median_ms']:.2f} ms CPU (median of {args.runs})")
        if args.json:
            print(json.dumps(after))
        return 0

    with tempfile.TemporaryDirectory(prefix="rcp-bench-base-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(base), args.baseline_rev],
            cwd=ROOT,
            check=True,
        )
        try:
            before: list[dict[str, float]] = []
            after_: list[dict[str, float]] = []
            for _ in range(args.rounds):
                before.append(_run_child(base, args))
                after_.append(_run_child(ROOT, args))
            policy: dict[str, Any] = {}
            if args.with_policy_benches:
                for name, key, extra in (
                    ("bench_admission.py", "decision_cpu_median_ms", ["--runs", "10"]),
                    ("bench_health.py", "phase_cpu_median_ms", ["--runs", "5"]),
                ):
                    b = _policy_bench(base, name, extra)
                    a = _policy_bench(ROOT, name, extra)
                    policy[name] = {
                        "before_ms": b.get(key),
                        "after_ms": a.get(key),
                        "ratio": round(a[key] / b[key], 3) if b.get(key) else None,
                    }
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False
            )
    b_ms = statistics.median(r["cpu_median_ms"] for r in before)
    a_ms = statistics.median(r["cpu_median_ms"] for r in after_)
    ratio = a_ms / b_ms
    print(f"{'tree':<10}{'cpu median ms':>16}{'wall median ms':>16}")
    for label, rows in (("before", before), ("after", after_)):
        cpu = statistics.median(r["cpu_median_ms"] for r in rows)
        wall = statistics.median(r["wall_median_ms"] for r in rows)
        print(f"{label:<10}{cpu:>16.2f}{wall:>16.2f}")
    print(f"after/before (CPU): {ratio:.3f}  goal <= {GOAL_RATIO} -> {ratio <= GOAL_RATIO}")
    for name, r in policy.items():
        print(f"{name}: before {r['before_ms']} ms, after {r['after_ms']} ms, ratio {r['ratio']}")
    if args.json:
        print(
            json.dumps(
                {
                    "baseline_rev": args.baseline_rev,
                    "before_cpu_median_ms": round(b_ms, 3),
                    "after_cpu_median_ms": round(a_ms, 3),
                    "ratio": round(ratio, 3),
                    "goal_ratio": GOAL_RATIO,
                    "goal_met": ratio <= GOAL_RATIO,
                    "policy_benches": policy,
                },
                sort_keys=True,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
