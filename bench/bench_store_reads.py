"""The tick's job reads with a store full of finished jobs (issue 12, item 7).

Baseline, measured in the same run: the read the tick did before, every FAILED/CANCELLED job
parsed to find the few whose Ray Job may still run. Against it: the same answer through the
partial index ``jobs_unsettled``, the active jobs (``jobs_by_state``), one bounded listing
page (`GET /v1/jobs`'s default), one retention batch and opening the store (quick_check).

Goal: the tick's reads of finished jobs cost at most 1% of the baseline at 100,000 finished
jobs, and at most 10 ms (a 1 s tick must not spend its time on the past).

    .venv/bin/python bench/bench_store_reads.py [--jobs N] [--runs K] [--json]

Prints a table; with ``--json`` the last line is one JSON object with every figure, ratio and
goal. Not a test: absolute times on a shared machine are noise, the ratios are the result.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controlplane.api.jobs import DEFAULT_LIST_LIMIT
from controlplane.store import JobState, Store
from jobs.spec import JobSpec

S = JobState
GOAL_RATIO = 0.01
GOAL_MS = 10.0


def load(store: Store, num_finished: int, spec: JobSpec) -> None:
    """`num_finished` settled finished jobs in one transaction, then 20 queued ones."""
    spec_json = json.dumps(spec.to_dict(), sort_keys=True)
    with store._tx() as db:  # bulk load: one transaction, not one per job
        for i in range(num_finished):
            state = (S.SUCCEEDED, S.FAILED, S.CANCELLED)[i % 3].value
            db.execute(
                "INSERT INTO jobs (job_id, name, spec_json, queue, priority_class, state, "
                "submitted_s, queued_s, updated_s, info_json) "
                "VALUES (?, 'b', ?, 'default', 'medium', ?, 0, 0, 0, ?)",
                (f"job-{i}", spec_json, state, '{"submission_id": "x-1", "ray_done": true}'),
            )
    for _ in range(20):
        store.submit(spec)


def median_ms(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def measure(num_finished: int, runs: int) -> dict[str, Any]:
    spec = JobSpec(name="b", entrypoint="python t.py", num_workers=2, gpus_per_worker=1)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.db"
        store = Store(path)
        load(store, num_finished, spec)
        ended = [S.CANCELLED, S.FAILED]
        figures: dict[str, Any] = {
            "bench": "store_reads",
            "finished_jobs": num_finished,
            "runs": runs,
            "baseline_parse_all_finished_ms": median_ms(
                lambda: [
                    j
                    for j in store.list_jobs(states=ended)
                    if j.info.get("submission_id") and not j.info.get("ray_done")
                ],
                runs,
            ),
            "unsettled_index_ms": median_ms(
                lambda: store.list_jobs(states=ended, unsettled_only=True), runs
            ),
            "active_jobs_ms": median_ms(
                lambda: store.list_jobs(states=[S.QUEUED, S.ADMITTED, S.RUNNING]), runs
            ),
            "listing_page_ms": median_ms(lambda: store.scan_jobs(limit=DEFAULT_LIST_LIMIT), runs),
        }
        t0 = time.perf_counter()
        Store(path).close()
        figures["open_with_quick_check_ms"] = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        pruned = store.prune_jobs(1.0, limit=1000)
        figures["prune_batch_ms"] = (time.perf_counter() - t0) * 1000
        figures["prune_batch_jobs"] = len(pruned)
        store.close()
    base = figures["baseline_parse_all_finished_ms"]
    tick = figures["unsettled_index_ms"] + figures["active_jobs_ms"]
    figures["tick_reads_ms"] = tick
    figures["ratio_tick_reads_vs_baseline"] = tick / base
    figures["ratio_listing_page_vs_baseline"] = figures["listing_page_ms"] / base
    figures["goal_ratio_at_most"] = GOAL_RATIO
    figures["goal_ms_at_most"] = GOAL_MS
    figures["goal_met"] = tick / base <= GOAL_RATIO and tick <= GOAL_MS
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="finished jobs in the store")
    parser.add_argument("--runs", type=int, default=5, help="runs per read (median)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args()
    f = measure(args.jobs, args.runs)
    base = f["baseline_parse_all_finished_ms"]
    print(f"store reads with {f['finished_jobs']:,} finished jobs; median of {f['runs']} runs")
    print(f"{'read':<58} {'ms':>9} {'x baseline':>11}")
    rows = [
        ("baseline: FAILED+CANCELLED parsed, filtered in Python", base),
        ("tick: FAILED+CANCELLED unsettled (partial index)", f["unsettled_index_ms"]),
        ("tick: QUEUED+ADMITTED+RUNNING (jobs_by_state)", f["active_jobs_ms"]),
        (f"GET /v1/jobs default page ({DEFAULT_LIST_LIMIT})", f["listing_page_ms"]),
        ("open (quick_check included)", f["open_with_quick_check_ms"]),
        (f"prune_jobs, one batch of {f['prune_batch_jobs']}", f["prune_batch_ms"]),
    ]
    for label, ms in rows:
        print(f"{label:<58} {ms:9.2f} {ms / base:11.4f}")
    verdict = "met" if f["goal_met"] else "NOT met"
    print(
        f"goal: tick reads <= {GOAL_RATIO:g}x baseline and <= {GOAL_MS:g} ms: "
        f"{f['ratio_tick_reads_vs_baseline']:.5f}x, {f['tick_reads_ms']:.2f} ms, {verdict}"
    )
    if args.json:
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in f.items()}))


if __name__ == "__main__":
    main()
