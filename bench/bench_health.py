"""Benchmark: the controller's health phase per tick on a simulated 1,000-node cluster.

No Ray, no store, no agents: the pure CPU cost of what `Controller._health` and the tick do
with telemetry once it has arrived. Per node, the 16 most recent summaries (as the telemetry
agents produce them: dicts of 8 GPUs and 8 IB ports, seeded, with about 2% of nodes hot or
faulty so remediation has work) are judged each tick, of which only the newest is new.
Steady state: a first tick builds the stored `HealthState`; the next tick, one new summary per
node, is timed in three parts:

- (a) ``judge``: summaries -> `NodeSample` (parse) -> `evaluate` -> verdicts and state;
- (b) the state's store round trip: `to_dict` -> ``json.dumps`` -> ``json.loads`` ->
  `from_dict` (what the controller writes and reads back; the SQLite call itself is left out);
- (c) `acting_verdicts` + `limit_removals` (the breaker, default budget) + `with_verdicts` +
  `remediate` on a matching `ClusterSnapshot`
  (``build_snapshot`` of bench_admission: same node ids, running gangs and Serve replicas);

and the whole phase (a + b + c, timed as one). Two baselines, same run, same machine:

- ``admission``: `policies.admission.decide` on the same cluster with 100 queued jobs (the
  loop's existing per-tick policy cost);
- ``judge, all seen``: (a) again with every summary already evaluated (the cheap path), to show
  what skipping seen samples buys.

Rows for diagnosis, not goals: (a) split into parsing all summaries and `evaluate` on
pre-parsed samples, and the parse of only the newest summary per node for scale.

Usage::

    .venv/bin/python bench/bench_health.py [--nodes 1000] [--runs 10] [--seed 7] [--json]

Prints a table; with ``--json`` the last line is one JSON object with every figure, ratio and
the goal (median of the whole phase under 10% of the default ``policy.tick_s``: health never
eats the tick). Process CPU time is reported beside wall-clock time: on a shared,
oversubscribed machine the wall clock measures the neighbours, not the policy.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_admission import CPU_MS, QUEUES, build_snapshot, percentile, time_runs  # noqa: E402

from controlplane.config import HealthConfig, PolicyConfig  # noqa: E402
from controlplane.telemetry.verdicts import judge, node_sample  # noqa: E402
from policies.admission import AdmissionConfig, AdmissionState, QueueConfig, decide  # noqa: E402
from policies.health import (  # noqa: E402
    BreakerState,
    CordonNode,
    HealthState,
    NodeVerdict,
    RemovalBudget,
    Verdict,
    acting_verdicts,
    evaluate,
    limit_removals,
    remediate,
    with_verdicts,
)
from policies.plan import DrainNode, MoveServeReplicas, PreemptJob  # noqa: E402
from policies.snapshot import ClusterSnapshot  # noqa: E402

GOAL_TICK_SHARE = 0.10
"""The whole health phase's median must stay under this share of the default tick."""
HEALTH_SAMPLES = 16
"""Summaries per node handed to `judge` each tick (the controller's ``HEALTH_SAMPLES``)."""
GPUS_PER_NODE = 8
IB_PORTS_PER_NODE = 8
ADMISSION_JOBS = 100
FAULTY_SHARE = 0.02
FAULTS = ("hot-gpu", "xid", "ecc", "nvlink-down", "nvlink-errors", "ib-link-down", "ib-errors")
DRAINED_BY_OTHERS = 2
"""Nodes Ray drains for someone else (not cordoned by us) in the timed tick."""


def _gpu(i: int, step: int, fault: str | None, newest: bool) -> dict[str, Any]:
    """One GPU of one summary, with the keys `NodeSampler._gpu` writes."""
    hot = i == 0 and fault == "hot-gpu"
    xid = i == 0 and fault == "xid" and newest
    return {
        "gpu": i,
        "uuid": f"GPU-bench-{i:04d}",
        "temp_c": 91.5 if hot else 45.0 + 2 * i + step % 3,
        "slowdown_temp_c": 87.0,
        "power_w": 650.0 if hot else 300.0 + 5 * (step % 4),
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1200.0 if hot else 1980.0,
        "mem_clock_mhz": 2619.0,
        "throttle_reasons": ["hw_thermal_slowdown"] if hot else [],
        "fb_used_mib": 40_000.0,
        "fb_total_mib": 81_559.0,
        "gpu_util_pct": 100.0,
        "tensor_active_ratio": 0.55,
        "last_xid": 79 if xid else 0,
        "new_xids": [79] if xid else [],
        "ecc_sbe_volatile": 0,
        "ecc_dbe_volatile": 2 if i == 0 and fault == "ecc" else 0,
        "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 0,
        "row_remap_pending": False,
        "row_remap_failure": False,
        "nvlink_links_total": 4,
        "nvlink_links_up": 3 if i == 0 and fault == "nvlink-down" else 4,
        "nvlink_error_counts": {"crc_flit": step, "crc_data": 0, "replay": 0, "recovery": 0},
        "thermal_throttle": hot,
        "nvlink_errors_per_s": 500.0 if i == 0 and fault == "nvlink-errors" else 0.0,
    }


def _port(p: int, step: int, fault: str | None) -> dict[str, Any]:
    """One IB port of one summary, with the keys `NodeSampler._port` writes."""
    down = p == 0 and fault == "ib-link-down"
    words = 250_000_000 * step
    return {
        "port": f"mlx5_{p}/1",
        "device": f"mlx5_{p}",
        "port_num": 1,
        "state": "DOWN" if down else "ACTIVE",
        "phys_state": "Disabled" if down else "LinkUp",
        "up": not down,
        "rate_gbps": 400.0,
        "width": 4,
        "link_layer": "InfiniBand",
        "counters": {"port_xmit_data": words, "port_rcv_data": words, "link_downed": int(down)},
        "hw_counters": {"out_of_buffer": 0, "local_ack_timeout_err": 0},
        "xmit_bytes_per_s": 0.0 if down else 1e9,
        "rcv_bytes_per_s": 0.0 if down else 1e9,
        "errors_per_s": 200.0 if p == 0 and fault == "ib-errors" else 0.0,
        "xmit_wait_per_s": 1000.0,
        "link_downed_delta": 1 if down else 0,
    }


def build_histories(
    node_ids: list[str], num_summaries: int, newest_s: float, interval_s: float, seed: int
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, str]]:
    """`num_summaries` summaries per node, oldest first, the newest at `newest_s` (agent
    clock); about `FAULTY_SHARE` of nodes carry one fault in every summary (an XID only in
    its newest). Returns the histories and the fault of each faulty node."""
    rng = random.Random(seed)
    faulty = rng.sample(node_ids, k=max(1, round(FAULTY_SHARE * len(node_ids))))
    fault_of = {node_id: FAULTS[i % len(FAULTS)] for i, node_id in enumerate(sorted(faulty))}
    histories: dict[str, list[dict[str, Any]]] = {}
    for node_id in node_ids:
        fault = fault_of.get(node_id)
        jitter_s = rng.uniform(-0.2, 0.2)
        summaries = []
        for k in range(num_summaries):
            step = 1000 + k
            newest = k == num_summaries - 1
            summaries.append(
                {
                    "node_id": node_id,
                    "pool": "cluster",
                    "source": "bench",
                    "source_ok": True,
                    "seq": step,
                    "sampled_s": newest_s - (num_summaries - 1 - k) * interval_s + jitter_s,
                    "gpus_expected": GPUS_PER_NODE,
                    "faults": [fault] if fault else [],
                    "gpus": [_gpu(i, step, fault, newest) for i in range(GPUS_PER_NODE)],
                    "ib_ports": [_port(p, step, fault) for p in range(IB_PORTS_PER_NODE)],
                    "problems": [],
                }
            )
        histories[node_id] = summaries
    return histories, fault_of


def store_round_trip(state: HealthState) -> HealthState:
    """What the controller writes to the store and reads back next tick (SQLite left out)."""
    return HealthState.from_dict(json.loads(json.dumps(state.to_dict())))


def act_on(
    judged: Mapping[str, NodeVerdict],
    previous: Mapping[str, NodeVerdict],
    cordoned: Mapping[str, float],
    draining: set[str],
    snapshot: ClusterSnapshot,
) -> tuple[ClusterSnapshot, tuple[Any, ...]]:
    """(c): the verdicts acted on (past the breaker's default budget: held), the snapshot
    marked, the remediation plan."""
    verdicts, _ = acting_verdicts(judged, previous, cordoned, draining, snapshot)
    out = set(cordoned) | draining
    verdicts, _state = limit_removals(
        verdicts, snapshot, RemovalBudget(), BreakerState(), out, snapshot.now_s
    )
    marked = with_verdicts(snapshot, verdicts)
    return marked, remediate(marked, verdicts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=10, help="timed runs of each case")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args(argv)

    tick_s = PolicyConfig().tick_s
    goal_ms = GOAL_TICK_SHARE * tick_s * 1000.0
    cfg = HealthConfig()

    t0 = time.perf_counter()
    snap = build_snapshot(args.nodes, ADMISSION_JOBS, args.seed)
    node_ids = [n.node_id for n in snap.nodes if n.node_id != "head"]
    now_s = snap.now_s
    histories, fault_of = build_histories(
        node_ids, HEALTH_SAMPLES + 1, now_s - 0.5, tick_s, args.seed
    )
    first = {n: h[:HEALTH_SAMPLES] for n, h in histories.items()}
    window = {n: h[1:] for n, h in histories.items()}
    build_ms = (time.perf_counter() - t0) * 1000.0

    # Tick 1 builds the stored state; our cordons are last tick's unhealthy nodes.
    verdicts_1, state_1 = judge(first, cfg, None, now_s - tick_s)
    stored = store_round_trip(state_1)
    cordoned = {n: now_s - tick_s for n, v in verdicts_1.items() if v.verdict is Verdict.UNHEALTHY}
    busy = sorted({n for g in snap.running for n in g.gpus_by_node} - set(cordoned))
    others = set(random.Random(args.seed).sample(busy, k=min(DRAINED_BY_OTHERS, len(busy))))
    draining = set(cordoned) | others

    # Tick 2, once untimed for the counts.
    verdicts_2, state_2 = judge(window, cfg, stored, now_s)
    marked, plan = act_on(verdicts_2, verdicts_1, cordoned, draining, snap)
    new_samples = sum(
        1
        for n, h in window.items()
        for s in h
        if s["sampled_s"] > (stored.nodes[n].last_sampled_s or float("-inf"))
    )
    counts = {v.value: 0 for v in Verdict}
    for v in verdicts_2.values():
        counts[v.verdict.value] += 1

    def phase() -> object:
        judged, state = judge(window, cfg, stored, now_s)
        store_round_trip(state)
        return act_on(judged, verdicts_1, cordoned, draining, snap)

    admission_cfg = AdmissionConfig(queues=tuple(QueueConfig(q, 1.0 / len(QUEUES)) for q in QUEUES))
    summaries = [s for h in window.values() for s in h]
    parsed = {n: [node_sample(s) for s in h] for n, h in window.items()}
    limits = cfg  # the health section is the policy's HealthThresholds

    cases: dict[str, list[float]] = {
        "phase": time_runs(phase, args.runs),
        "judge": time_runs(lambda: judge(window, cfg, stored, now_s), args.runs),
        "store": time_runs(lambda: store_round_trip(state_2), args.runs),
        "act": time_runs(
            lambda: act_on(verdicts_2, verdicts_1, cordoned, draining, snap), args.runs
        ),
        "judge_seen": time_runs(lambda: judge(window, cfg, state_2, now_s), args.runs),
        "parse": time_runs(lambda: [node_sample(s) for s in summaries], args.runs),
        "evaluate": time_runs(lambda: evaluate(parsed, limits, stored, now_s), args.runs),
        "parse_newest": time_runs(lambda: [node_sample(h[-1]) for h in window.values()], args.runs),
        "admission": time_runs(lambda: decide(marked, admission_cfg, AdmissionState()), args.runs),
    }
    med = {k: statistics.median(v) for k, v in cases.items()}
    cpu = {k: statistics.median(CPU_MS[id(v)]) for k, v in cases.items()}
    p99 = {k: percentile(v, 0.99) for k, v in cases.items()}

    result: dict[str, Any] = {
        "bench": "health",
        "python": platform.python_version(),
        "nodes": args.nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "ib_ports_per_node": IB_PORTS_PER_NODE,
        "summaries_per_node": HEALTH_SAMPLES,
        "summaries_judged": len(summaries),
        "new_summaries": new_samples,
        "faulty_nodes": len(fault_of),
        "drained_by_others": len(others),
        "cordoned_nodes": len(cordoned),
        "verdicts": counts,
        "remediation_actions": len(plan),
        "remediation_cordons": sum(isinstance(a, CordonNode) for a in plan),
        "remediation_preemptions": sum(isinstance(a, PreemptJob) for a in plan),
        "remediation_moves": sum(isinstance(a, MoveServeReplicas) for a in plan),
        "remediation_drains": sum(isinstance(a, DrainNode) for a in plan),
        "admission_queued_jobs": ADMISSION_JOBS,
        "running_gangs": len(snap.running),
        "runs": args.runs,
        "seed": args.seed,
        "inputs_build_ms": round(build_ms, 2),
        "tick_s": tick_s,
    }
    for k in cases:
        result[f"{k}_median_ms"] = round(med[k], 3)
        result[f"{k}_p99_ms"] = round(p99[k], 3)
        result[f"{k}_min_ms"] = round(min(cases[k]), 3)
        result[f"{k}_cpu_median_ms"] = round(cpu[k], 3)
    parts_ms = med["judge"] + med["store"] + med["act"]
    result.update(
        {
            "parts_sum_median_ms": round(parts_ms, 3),
            "phase_share_of_tick": round(med["phase"] / (tick_s * 1000.0), 4),
            "ratio_phase_vs_admission": round(med["phase"] / med["admission"], 2),
            "ratio_phase_vs_admission_cpu": round(cpu["phase"] / cpu["admission"], 2),
            "ratio_judge_vs_judge_seen": round(med["judge"] / med["judge_seen"], 2),
            "ratio_parse_vs_judge": round(med["parse"] / med["judge"], 2),
            "ratio_evaluate_vs_judge": round(med["evaluate"] / med["judge"], 3),
            "ratio_parse_newest_vs_parse": round(med["parse_newest"] / med["parse"], 3),
            "goal_tick_share": GOAL_TICK_SHARE,
            "goal_median_ms": round(goal_ms, 3),
            "goal_met": med["phase"] < goal_ms,
            "goal_p99_met": p99["phase"] < goal_ms,
            "goal_cpu_median_met": cpu["phase"] < goal_ms,
        }
    )

    labels = {
        "phase": "health phase (a+b+c)",
        "judge": "(a) judge: parse+evaluate",
        "store": "(b) state store round trip",
        "act": "(c) acting+with+remediate",
        "judge_seen": "baseline: judge, all seen",
        "parse": "  of (a): parse all 16/node",
        "evaluate": "  of (a): evaluate only",
        "parse_newest": "  for scale: parse newest 1/node",
        "admission": f"baseline: admission {ADMISSION_JOBS} jobs",
    }
    print(
        f"health phase: {args.nodes} nodes x {GPUS_PER_NODE} GPUs x {IB_PORTS_PER_NODE} IB "
        f"ports, {HEALTH_SAMPLES} summaries/node ({new_samples} new), {len(fault_of)} faulty, "
        f"{len(snap.running)} running gangs, {args.runs} runs"
    )
    print(f"{'case':<34}{'median ms':>11}{'cpu ms':>10}{'p99 ms':>10}{'x admission':>13}")
    for k, name in labels.items():
        print(
            f"{name:<34}{med[k]:>11.2f}{cpu[k]:>10.2f}{p99[k]:>10.2f}"
            f"{med[k] / med['admission']:>13.2f}"
        )
    print(
        f"verdicts {counts}, remediation {len(plan)} actions; judge / judge all seen "
        f"{result['ratio_judge_vs_judge_seen']}x; phase = {100 * med['phase'] / (tick_s * 1000):.1f}"
        f"% of tick_s {tick_s:g} s; goal median < {goal_ms:g} ms: "
        f"{'met' if result['goal_met'] else 'NOT met'}"
    )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
