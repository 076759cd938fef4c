"""Benchmark: the depth guard of the shared JSON reader on hostile bodies.

`serve.inputs._too_deep` runs before `json.loads` on every untrusted body (the Serve ingress,
the backend, the control plane's API, the kube actuator service). The bodies below are the
shapes that made the old regex guard quadratic (a string that never closes, re-scanned from
every escaped quote: 12 s at 80 KB, about 30 minutes at 1 MiB). Each is timed at 10 KB,
100 KB and 1 MiB against the same-run baseline: ``json.loads`` of a benign body of the same
size (an array of small records with strings and floats).

Usage::

    .venv/bin/python bench/bench_json_guard.py [--runs 15] [--json]

Prints a table; with ``--json`` the last line is one JSON object with every figure, ratio and
the goal (the guard on the reviewer's hostile 1 MiB body at most 2x ``json.loads`` on the
benign 1 MiB body, medians). Process CPU time is used: on a shared machine the wall clock
measures the neighbours.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serve.inputs import MAX_JSON_DEPTH, _too_deep  # noqa: E402

GOAL_RATIO = 2.0
SIZES = {"10KB": 10_000, "100KB": 100_000, "1MiB": 1 << 20}


def fill(head: bytes, unit: bytes, tail: bytes, size: int) -> bytes:
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


SHAPES: dict[str, Callable[[int], bytes]] = {
    # The reviewer's body: 65 brackets, then one string of escaped quotes that never closes.
    'reviewer: [*65 + " + \\"*n': lambda n: fill(b"[" * 65 + b'"', b'\\"', b"", n),
    "unclosed string of [": lambda n: fill(b'{"s": "', b"[", b"", n),
    'alternating \\\\ \\" [ unclosed': lambda n: fill(b"[" * 65 + b'"', b'\\\\\\"[', b"", n),
    "many strings holding [": lambda n: fill(b"[" * 65, b'"[", ', b'""', n),
    "many empty strings": lambda n: fill(b"[" * 65, b'"", ', b'""', n),
    "all brackets [][]...": lambda n: fill(b"", b"[]", b"", n),
}


def benign(size: int, seed: int = 7) -> bytes:
    rng = random.Random(seed)
    items: list[str] = []
    total = 12
    while total < size:
        item = json.dumps(
            {
                "id": rng.randrange(10**6),
                "text": f"lorem ipsum dolor {rng.randrange(1000)}",
                "x": [round(rng.random(), 6) for _ in range(8)],
            }
        )
        if total + len(item) + 1 > size:
            break
        items.append(item)
        total += len(item) + 1
    return ('{"inputs":[' + ",".join(items) + "]}").encode()


def cpu_ms(fn: Callable[[], object], runs: int) -> list[float]:
    fn()  # warm
    out = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        out.append((time.process_time() - t0) * 1000.0)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args(argv)
    result: dict[str, object] = {
        "bench": "json_guard",
        "python": platform.python_version(),
        "runs": args.runs,
        "max_depth": MAX_JSON_DEPTH,
    }
    print(f"depth guard vs json.loads (benign, same size); median CPU ms of {args.runs} runs")
    print(f"{'body':<34}" + "".join(f"{s + ' ms':>11}{'x loads':>9}" for s in SIZES))
    base: dict[str, float] = {}
    for size_name, size in SIZES.items():
        body = benign(size)
        base[size_name] = statistics.median(cpu_ms(partial(json.loads, body), args.runs))
        guard = statistics.median(cpu_ms(partial(_too_deep, body, MAX_JSON_DEPTH), args.runs))
        result[f"baseline_json_loads_benign_{size_name}_ms"] = round(base[size_name], 3)
        result[f"guard_benign_{size_name}_ms"] = round(guard, 3)
    print(
        f"{'baseline: json.loads benign':<34}"
        + "".join(f"{base[s]:>11.2f}{1.0:>9.2f}" for s in SIZES)
    )
    for i, (shape, build) in enumerate(SHAPES.items()):
        cells = ""
        for size_name, size in SIZES.items():
            body = build(size)
            ms = statistics.median(cpu_ms(partial(_too_deep, body, MAX_JSON_DEPTH), args.runs))
            ratio = ms / base[size_name]
            cells += f"{ms:>11.2f}{ratio:>9.2f}"
            result[f"guard_shape{i}_{size_name}_ms"] = round(ms, 3)
            result[f"ratio_shape{i}_{size_name}_vs_json_loads"] = round(ratio, 3)
        result[f"shape{i}"] = shape
        print(f"{shape:<34}{cells}")
    goal_ratio = result["ratio_shape0_1MiB_vs_json_loads"]
    result["goal_ratio_at_most"] = GOAL_RATIO
    result["goal_met"] = isinstance(goal_ratio, float) and goal_ratio <= GOAL_RATIO
    print(
        f"goal: guard on the reviewer's hostile 1 MiB <= {GOAL_RATIO:g}x json.loads on benign "
        f"1 MiB: {goal_ratio}x, {'met' if result['goal_met'] else 'NOT met'}"
    )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
