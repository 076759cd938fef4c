"""`rcp config show | up | down | demo` (local) and `rcp nodes | serve status|pin|unpin` (API).

Must not: hold logic of its own: `controlplane.local.cluster`, `controlplane.demo` and the
API do the work.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from controlplane.cli.common import (
    api_call,
    client_options,
    config_options,
    fail,
    load_cfg,
    sdk_client,
)
from controlplane.cli.render import local_time
from controlplane.config import to_dict, to_yaml
from controlplane.inventory import NodeRow, format_table
from controlplane.ray_connection import ClusterError
from controlplane.store import StoreError
from policies.forecast import duration
from serve.control.status import format_status_table

__all__ = ["config_group", "demo", "down", "guard_lines", "nodes", "serve_group", "up"]


@click.group("config")
def config_group() -> None:
    """Inspect configuration."""


@config_group.command("show")
@config_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of YAML.")
def config_show(config_file: str | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Print the merged configuration."""
    cfg = load_cfg(config_file, overrides)
    if as_json:
        click.echo(json.dumps(to_dict(cfg), indent=2))
    else:
        click.echo(to_yaml(cfg), nl=False)


@click.command()
@config_options
def up(config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Start the embedded local cluster and print its endpoints, one per line.

    Idempotent: if the cluster already runs, prints what runs and starts nothing.
    """
    # Deferred: the local cluster loads Ray (seconds); the job commands never need it.
    from controlplane.local.cluster import LocalCluster

    cfg = load_cfg(config_file, overrides)
    try:
        LocalCluster(cfg).up(echo=click.echo)
    except (ClusterError, StoreError) as exc:  # a corrupt job store names its file
        fail(str(exc))


@click.command()
@config_options
def down(config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Stop everything `rcp up` started, and only that."""
    # Deferred: the local cluster loads Ray (seconds); the job commands never need it.
    from controlplane.local.cluster import LocalCluster

    cfg = load_cfg(config_file, overrides)
    LocalCluster(cfg).down(echo=click.echo)


@click.command()
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def nodes(url: str | None, state_dir: str | None, as_json: bool) -> None:
    """List nodes: pool (head, cluster, external), state, health, GPUs free/total, labels;
    a node an operator cordoned shows it (``cordoned``), and so does one health keeps for
    serving only (``serving-only``: fabric faults; replicas run there, no gang)."""
    api = sdk_client(url, state_dir)
    rows = api_call(api.nodes)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    shown = []
    for row in rows:
        state = f"{row['state']},cordoned" if row.get("cordon") else row["state"]
        if row.get("serving_only"):
            state += ",serving-only"
        shown.append(NodeRow.from_json({**row, "state": state}))
    click.echo(format_table(shown))


@click.command()
@config_options
@click.option("--keep", is_flag=True, help="Leave the cluster running at the end.")
@click.option(
    "--timeline",
    "timeline_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("rcp-demo-timeline.png"),
    show_default=True,
    help="Where to draw the run's timeline (PNG).",
)
def demo(
    config_file: str | None, overrides: tuple[str, ...], keep: bool, timeline_path: Path
) -> None:
    """The main job on the embedded default, end to end (a few minutes).

    \b
    1. `up`: the endpoints, then the node inventory.
    2. The sample model serves on the owned `cluster` pool under steady HTTP traffic.
    3. A training job that needs every cluster GPU is submitted; the policy actor moves the
       replicas to the rented `external` pool make-before-break (the autoscaler adds a node)
       and admits the gang, which trains, checkpoints and finishes.
    4. The checkpoint objects the job wrote to the embedded object store, by step, each
       step's manifest (its commit) marked.
    5. The replicas come back a step at a time; the external pool scales to zero.
    6. It prints the policy actor's decisions and how many requests failed, draws the
       run's timeline to --timeline (a PNG: replicas per pool, GPUs by owner, traffic,
       decisions) and says where, then `down` (unless --keep).

    Exit status: 0 when every request was served and the job succeeded with a committed
    checkpoint; 1 when any request failed, the job did not succeed or committed no
    checkpoint, or a step timed out (the reason is printed).
    """
    # Deferred: the demo reads checkpoints through jobs.checkpoint, which imports torch (heavy).
    from controlplane.demo import run_demo

    cfg = load_cfg(config_file, overrides)
    try:
        result = run_demo(cfg, keep=keep, echo=click.echo, timeline_path=timeline_path)
    except ClusterError as exc:
        fail(str(exc))
        return
    failures = result.failures()
    if failures:
        fail("the demo missed its bar: " + "; ".join(failures))
    click.echo("demo passed: no request failed")


@click.group("serve")
def serve_group() -> None:
    """The production Serve application."""


@serve_group.command("status")
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def serve_status_cmd(url: str | None, state_dir: str | None, as_json: bool) -> None:
    """Per model and pool: target, running, starting, stopping replicas, route weights, nodes;
    each model's last measured p99 and its SLO; the external providers; each model's forecast
    peak; then whether the policy actor is paused (who, why, since) and the pinned models."""
    api = sdk_client(url, state_dir)
    data = api_call(api.serve_status)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(format_status_table(data))
    for line in provider_lines(data.get("providers") or []):
        click.echo(line)
    for line in forecast_lines(data.get("forecast") or {}):
        click.echo(line)
    for line in guard_lines(data.get("policy") or {}):
        click.echo(line)


def provider_lines(providers: list[dict[str, Any]]) -> list[str]:
    """The external pool's providers as `rcp serve status` prints them: price, GPUs live of
    asked (of their most), and whether each is delivering."""
    lines = []
    for p in providers:
        if p.get("out"):
            state = f"OUT for {p['out_for_s']:.0f} s more (did not deliver in time)"
        elif p.get("owed_for_s") is not None:
            state = f"delivering: owed for {p['owed_for_s']:.0f} s"
        else:
            state = "delivering"
        lines.append(
            f"provider:     {p['name']} ${p['price_per_gpu_hour']:g}/GPU-h, GPUs live "
            f"{p['gpus_live']} asked {p['gpus_requested']} of {p['gpus_max']}: {state}"
        )
    return lines


def forecast_lines(forecast: dict[str, Any]) -> list[str]:
    """Serving's forecast as `rcp serve status` prints it: each model's peak over the next
    24 h (from its daily profile) and when, then the cluster GPUs that peak needs beyond what
    the providers can host, which admission keeps long gangs off."""
    lines = []
    for m in forecast.get("models") or []:
        if m["peak_replicas"] <= 0:
            lines.append(f"forecast:     {m['model']}: no demand recorded for the next 24 h yet")
            continue
        when = "now" if m["peak_in_s"] <= 0 else f"in {duration(m['peak_in_s'])}"
        lines.append(
            f"forecast:     {m['model']} peaks at {m['peak_replicas']} replica(s) {when} "
            "(next 24 h, from its daily profile)"
        )
    if forecast.get("cluster_gpus"):
        when = forecast["cluster_gpus_in_s"]
        lines.append(
            f"forecast:     serving needs {forecast['cluster_gpus']} cluster GPU(s) the providers "
            f"cannot host {'now' if not when else 'in ' + duration(when)}: gangs whose run "
            "would overlap it wait (serving-forecast)"
        )
    return lines


def guard_lines(policy: dict[str, Any]) -> list[str]:
    """The policy actor's guards as `rcp serve status` and `rcp policy status` print them."""
    pause = policy.get("pause")
    if pause:
        lines = [
            f"policy actor: PAUSED by {pause['by']} since {local_time(pause['since_s'])}: "
            f"{pause['reason']} (no new moves, admissions or removals; `rcp policy resume`)"
        ]
    else:
        lines = ["policy actor: running"]
    for model, pin in (policy.get("pins") or {}).items():
        lines.append(
            f"pinned:       {model} -> {pin['pool']} (by {pin['by']}, {local_time(pin['since_s'])})"
        )
    for node, c in (policy.get("cordons") or {}).items():
        lines.append(f"cordoned:     {node[-12:]} by {c['by']}: {c['reason']}")
    return lines


@serve_group.command("pin")
@client_options
@click.argument("model")
@click.option(
    "--pool", required=True, type=click.Choice(["cluster", "external"]), help="Where it stays."
)
def serve_pin(url: str | None, state_dir: str | None, model: str, pool: str) -> None:
    """Keep MODEL's replicas in POOL until `rcp serve unpin MODEL` (operator): placement never
    moves them out of it, and training's claim never takes their cluster GPUs (a gang that
    then cannot be admitted waits, its reason naming the model)."""
    api = sdk_client(url, state_dir)
    result = api_call(lambda: api.pin(model, pool))
    click.echo(f"{result['model']}: pinned to {result['pin']['pool']}")


@serve_group.command("unpin")
@client_options
@click.argument("model")
def serve_unpin(url: str | None, state_dir: str | None, model: str) -> None:
    """Let the policies place MODEL's replicas again (operator)."""
    api = sdk_client(url, state_dir)
    result = api_call(lambda: api.unpin(model))
    click.echo(f"{result['model']}: unpinned (was pinned to {result['was']['pool']})")
