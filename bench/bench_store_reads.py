"""The tick's job reads with a store full of finished jobs: before (every FAILED/CANCELLED job
parsed to find the few whose Ray Job may still run) and after (the partial index
``jobs_unsettled``). Not a test; prints seconds per read.

    .venv/bin/python bench/bench_store_reads.py [num_finished]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from controlplane.store import JobState, Store
from jobs.spec import JobSpec

S = JobState


def main(num_finished: int = 100_000) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bench.db")
        spec = JobSpec(name="b", entrypoint="python t.py", num_workers=2, gpus_per_worker=1)
        t0 = time.perf_counter()
        with store._tx() as db:  # bulk load: one transaction, not one per job
            for i in range(num_finished):
                state = (S.SUCCEEDED, S.FAILED, S.CANCELLED)[i % 3].value
                db.execute(
                    "INSERT INTO jobs (job_id, name, spec_json, queue, priority_class, state, "
                    "submitted_s, queued_s, updated_s, info_json) "
                    "VALUES (?, 'b', ?, 'default', 'medium', ?, 0, 0, 0, ?)",
                    (
                        f"job-{i}",
                        _spec_json(spec),
                        state,
                        '{"submission_id": "x-1", "ray_done": true}',
                    ),
                )
        for _ in range(20):
            store.submit(spec)
        print(f"loaded {num_finished} finished jobs in {time.perf_counter() - t0:.1f}s")

        def timed(label: str, fn: object, n: int = 5) -> None:
            best = min(_once(fn) for _ in range(n))
            print(f"{label:<58} {best * 1000:9.1f} ms")

        timed(
            "before: FAILED+CANCELLED parsed, filtered in Python",
            lambda: [
                j
                for j in store.list_jobs(states=[S.CANCELLED, S.FAILED])
                if j.info.get("submission_id") and not j.info.get("ray_done")
            ],
        )
        timed(
            "after:  FAILED+CANCELLED, unsettled_only (partial index)",
            lambda: store.list_jobs(states=[S.CANCELLED, S.FAILED], unsettled_only=True),
        )
        timed(
            "active: QUEUED+ADMITTED+RUNNING (jobs_by_state)",
            lambda: store.list_jobs(states=[S.QUEUED, S.ADMITTED, S.RUNNING]),
        )
        t0 = time.perf_counter()
        Store(Path(tmp) / "bench.db").close()
        print(f"{'open (quick_check included)':<58} {(time.perf_counter() - t0) * 1000:9.1f} ms")
        t0 = time.perf_counter()
        pruned = store.prune_jobs(1.0, limit=1000)
        print(
            f"{'prune_jobs, one batch of ' + str(len(pruned)):<58} "
            f"{(time.perf_counter() - t0) * 1000:9.1f} ms"
        )
        store.close()


def _spec_json(spec: JobSpec) -> str:
    import json

    return json.dumps(spec.to_dict(), sort_keys=True)


def _once(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000)
