"""`rcp simulate`: the fleet simulator from the command line.

Owns: parsing the options (a scenario file, days, nodes, seed, output directory, JSON, the
events file that calibrates the move times: `controlplane.simulate.calibrate`) and
printing the table (or, with ``--json``, one JSON object as the last line). The simulation,
the goals and the report files are `controlplane.simulate.report.simulate_and_report`.
Must not: simulate or judge anything itself. A bad scenario or events file exits 2 with the
message naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from controlplane.cli.common import fail
from controlplane.simulate.calibrate import CalibrationError, calibrate, calibrated, load_events
from controlplane.simulate.report import simulate_and_report, table
from controlplane.simulate.run import SCHEME_NAMES
from controlplane.simulate.scenario import ScenarioError, load_scenario

__all__ = ["simulate"]


@click.command("simulate")
@click.option(
    "--scenario",
    "scenario_file",
    type=click.Path(dir_okay=False),
    help="Scenario YAML/JSON (default: the default scenario).",
)
@click.option("--days", type=float, help="Simulated days (the job count scales with it).")
@click.option(
    "--nodes",
    type=int,
    help="Owned cluster nodes (jobs, serving demand and the external pool scale with it).",
)
@click.option("--seed", type=int, help="Seed of the trace.")
@click.option(
    "-o",
    "--output",
    "outdir",
    type=click.Path(file_okay=False),
    default="fleet-sim",
    show_default=True,
    help="Where report.md and fleet.png go.",
)
@click.option(
    "--schemes",
    default=",".join(SCHEME_NAMES),
    show_default=True,
    help="Comma-separated schemes to run (ours is always run).",
)
@click.option(
    "--calibrate-from",
    "events_file",
    type=click.Path(dir_okay=False),
    help="Take replica start and external node start from a cluster's events (a JSON list, "
    "as `rcp events --json` prints them).",
)
@click.option("--no-png", is_flag=True, help="Skip the PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object as the last line.")
def simulate(
    scenario_file: str | None,
    days: float | None,
    nodes: int | None,
    seed: int | None,
    outdir: str,
    schemes: str,
    events_file: str | None,
    no_png: bool,
    as_json: bool,
) -> None:
    """Simulate the fleet: our policies against a static split, evict-first and time-of-day
    lending, on the same trace; prints the figures and whether the goals are met."""
    names = tuple(dict.fromkeys(["ours", *[n.strip() for n in schemes.split(",") if n.strip()]]))
    unknown = [n for n in names if n not in SCHEME_NAMES]
    if unknown:
        fail(f"--schemes: unknown {', '.join(unknown)} (known: {', '.join(SCHEME_NAMES)})", 2)
    try:
        scenario = load_scenario(scenario_file).resized(days, nodes, seed)
        measured = calibrate(load_events(events_file)) if events_file else None
        if measured is not None:
            scenario = calibrated(scenario, measured)
            click.echo(f"move times from {events_file}: {measured.describe()}", err=as_json)
        summary, _ = simulate_and_report(scenario, Path(outdir), names, png=not no_png)
    except (ScenarioError, CalibrationError) as exc:
        fail(str(exc), 2)
        return
    if measured is not None:
        summary["calibration"] = measured.describe()
    if as_json:
        click.echo(table(summary), err=True)
        click.echo(json.dumps(summary, sort_keys=True))
    else:
        click.echo(table(summary))
        click.echo(f"\nreport: {', '.join(summary.get('files', []))}")
