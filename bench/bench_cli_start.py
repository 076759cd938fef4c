"""Benchmark: the CPU one `rcp` call spends before its command runs.

`controlplane.cli` loads a command's module only when that command runs (`_LazyGroup`). The
baseline, measured in the same run, is what every call paid before: loading every command's
module (what `rcp --help` still does). Each case is a fresh interpreter, timed by its own
CPU (user + system, from ``resource.getrusage`` of the child): on a shared machine the wall
clock measures the neighbours.

Usage::

    .venv/bin/python bench/bench_cli_start.py [--runs 7] [--json]

Prints a table; with ``--json`` the last line is one JSON object with every figure, the
ratios to the baseline and the goal (`rcp status` at most 0.6x the baseline, medians).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_RATIO = 0.6

BASELINE = "baseline: every command loaded"
EVERY_COMMAND = (  # what every call loaded before
    "from controlplane.cli import cli\n"
    "for name in cli.list_commands(None):\n"
    "    cli.get_command(None, name)\n"
)
RCP = "from controlplane.cli import main; main()"
CASES: dict[str, tuple[str, list[str]]] = {
    BASELINE: (EVERY_COMMAND, []),
    **{f"rcp {c} --help": (RCP, [c, "--help"]) for c in ("status", "nodes", "submit")},
}
"""Each case: (the code a fresh interpreter runs, its arguments)."""


def child_cpu_s(code: str, args: list[str]) -> float:
    """CPU seconds (user + system) of one fresh interpreter running `code` with `args`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [sys.executable, "-c", f"import sys; sys.argv[0] = 'rcp'\n{code}", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    opts = parser.parse_args(argv)
    if opts.runs < 1:
        parser.error("--runs: at least 1")
    samples: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(opts.runs):  # interleaved, so a busy moment hits every case alike
        for name, (code, args) in CASES.items():
            samples[name].append(child_cpu_s(code, args))
    medians = {name: statistics.median(s) for name, s in samples.items()}
    base = medians[BASELINE]
    ratios = {name: m / base for name, m in medians.items()}
    print(f"{'case':34} {'CPU s (median)':>15} {'x baseline':>11}")
    for name, m in medians.items():
        print(f"{name:34} {m:15.3f} {ratios[name]:11.2f}")
    met = ratios["rcp status --help"] <= GOAL_RATIO
    print(f"goal: rcp status at most {GOAL_RATIO}x the baseline: {'met' if met else 'NOT met'}")
    if opts.json:
        result = {
            "runs": opts.runs,
            "cpu_s_median": medians,
            "ratio_to_baseline": ratios,
            "goal_status_ratio_max": GOAL_RATIO,
            "goal_met": met,
        }
        print(json.dumps(result, sort_keys=True))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
