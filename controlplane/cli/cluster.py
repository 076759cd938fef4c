"""`rcp config show | up | down | nodes | demo | serve status`: the local cluster and its views.

Owns: printing the merged config, starting and stopping the embedded local cluster, the node
inventory, the end-to-end demo and the Serve application's status. Must not: hold logic of
its own: `controlplane.local.cluster`, `controlplane.views`, `controlplane.demo` and
`serve.status` do the work.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from controlplane.cli.common import config_options, connect_running, fail, load_cfg
from controlplane.config import to_dict, to_yaml
from controlplane.ray_connection import ClusterError
from controlplane.store import StoreError
from serve.status import format_status_table, serve_status

__all__ = ["config_group", "demo", "down", "nodes", "serve_group", "up"]


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
@config_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.option("--all", "include_dead", is_flag=True, help="Include nodes that have gone away.")
def nodes(
    config_file: str | None, overrides: tuple[str, ...], as_json: bool, include_dead: bool
) -> None:
    """List nodes: pool (head, cluster, external), GPUs free/total, labels, state."""
    # Deferred: the node views load Ray (seconds); the job commands never need it.
    from controlplane.views import format_table, node_rows

    connect_running(load_cfg(config_file, overrides))
    rows = node_rows(include_dead=include_dead)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows], indent=2))
    else:
        click.echo(format_table(rows))


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
@config_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def serve_status_cmd(config_file: str | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Per model and pool: target, running, starting, stopping replicas, route weights, nodes."""
    connect_running(load_cfg(config_file, overrides))
    data = serve_status()
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(format_status_table(data))
