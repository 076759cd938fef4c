"""Benchmark: the fleet simulator on the default scenario, and the real policies at two scales.

Runs `controlplane.simulate` (what `rcp simulate` runs):

1. the default scenario (512 nodes x 8 GPUs, 30 days, 3 models, ~5,000 jobs, failures at
   Meta's MTTF), every scheme on the same trace: the table, the goals (training goodput at
   least 1.45x the static split's and 1.0x evict-first's, requests served at least 99.9 %,
   zero minutes of serving shortfall caused by moves, external GPU-hours reported),
   simulated days per wall-clock minute, and the per-decision cost of the real policies (`controlplane.loop.decide.decide`
   on that run's snapshots); the goals are issue 28's (`controlplane.simulate.report`);
2. the stock-out scenario (issue 28): the same trace, the cheapest external provider
   delivering nothing for 6 hours of the morning ramp (08:00-14:00) on days 5, 15 and 25
   (`with_stockouts`), every scheme;
3. the same scenario at 4,096 nodes (32,768 GPUs) for 1 day (jobs scaled with the size):
   its wall time and the per-decision cost there.

``--quick`` runs a small scenario instead (64 nodes, 3 days; 512 nodes for the large one).
The wall clock is this machine's, shared with whatever else runs: the per-decision figures
are process CPU-bound Python, the whole-run times include the neighbours.

Usage::

    .venv/bin/python bench/bench_fleet.py [--quick] [--scenario FILE] [-o DIR]
        [--no-stockout] [--no-large] [--json]

With ``--json`` the last line is one JSON object with every figure, ratio and goal.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controlplane.simulate.report import decision_cost, simulate_and_report, table  # noqa: E402
from controlplane.simulate.scenario import (  # noqa: E402
    control_config,
    load_scenario,
    stockout_provider,
    with_stockouts,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small scenario (minutes less)")
    parser.add_argument("--scenario", help="scenario YAML/JSON (default: the default scenario)")
    parser.add_argument("-o", "--output", default="fleet-sim", help="report directory")
    parser.add_argument("--large-nodes", type=int, default=None, help="nodes of the 1-day run")
    parser.add_argument("--no-large", action="store_true", help="skip the large 1-day run")
    parser.add_argument(
        "--no-stockout", action="store_true", help="skip the stock-out scenario's run"
    )
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()

    base = load_scenario(args.scenario)
    scenario = base.resized(3.0, 64, None) if args.quick else base
    started = time.perf_counter()
    summary, _ = simulate_and_report(scenario, Path(args.output))
    out: dict[str, Any] = {"default": summary}
    print(table(summary))
    if not args.no_stockout:
        stockout = with_stockouts(scenario)
        summary_s, _ = simulate_and_report(stockout, Path(args.output) / "stockout")
        out["stockout"] = summary_s
        hit = stockout_provider(stockout, control_config(stockout))
        print(
            f"\nthe stock-out scenario: external provider {hit} delivers nothing for "
            f"{stockout.external.stockout_hours:g} h from hours "
            f"{', '.join(f'{h:g}' for h in stockout.external.stockout_start_hours)}"
        )
        print(table(summary_s))
    if not args.no_large:
        nodes = args.large_nodes or (512 if args.quick else 4096)
        large = base.resized(1.0, nodes, None)
        t0 = time.perf_counter()
        big, results = simulate_and_report(large, None, ("ours",), png=False)
        wall = time.perf_counter() - t0
        cost = decision_cost(results["ours"])
        out["large"] = {
            "nodes": nodes,
            "gpus": nodes * large.gpus_per_node,
            "days": 1.0,
            "jobs": big["scenario"]["jobs"],
            "wall_s": round(wall, 1),
            "cpu_s": round(results["ours"].cpu_s, 1),
            "decision_cost": cost,
            "goodput_gpu_h": big["schemes"]["ours"]["goodput_gpu_h"],
            "utilisation": big["schemes"]["ours"]["utilisation"],
        }
        print(
            f"\n{nodes} nodes ({nodes * large.gpus_per_node:,} GPUs), 1 day, ours: {wall:.0f} s "
            f"wall ({results['ours'].cpu_s:.0f} s CPU); per decision "
            f"{cost['decide_mean_ms']:.2f} ms mean, {cost['decide_p95_ms']:.2f} ms p95, "
            f"{cost['decide_max_ms']:.1f} ms max over {cost['decisions']:,.0f} decisions "
            f"(process CPU {cost['decide_cpu_mean_ms']:.2f} ms mean, "
            f"{cost['decide_cpu_p95_ms']:.2f} ms p95; observe {cost['observe_mean_ms']:.2f} ms)"
        )
    out["wall_total_s"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
