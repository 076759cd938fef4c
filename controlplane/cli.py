"""`rcp`: the command line of the control plane (also `python -m controlplane`).

Owns: parsing arguments, loading config, printing tables or JSON, and exit codes.
Must not: hold logic of its own; every command calls a function that tests can call too.
Errors a user can fix print one clear message to stderr and exit 2 (bad input) or 1 (the
cluster is not in a state to do it).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from controlplane.config import Config, ConfigError, load_config, to_yaml

F = TypeVar("F", bound=Callable[..., Any])


def _config_options(func: F) -> F:
    func = click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")(func)
    func = click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False),
        envvar="RCP_CONFIG",
        help="YAML file merged over the packaged defaults (env: RCP_CONFIG).",
    )(func)
    return func


def _load(config_file: str | None, overrides: tuple[str, ...]) -> Config:
    try:
        return load_config(config_file, list(overrides))
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


def _fail(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Control plane for one Ray cluster that runs training and production serving.

    Configuration merges packaged defaults, a YAML file (--config) and KEY=VALUE
    overrides, in that order; `rcp config show` prints the result.
    """


@cli.group("config")
def config_group() -> None:
    """Inspect configuration."""


@config_group.command("show")
@_config_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of YAML.")
def config_show(config_file: str | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Print the merged configuration."""
    cfg = _load(config_file, overrides)
    if as_json:
        from controlplane.config import to_dict

        click.echo(json.dumps(to_dict(cfg), indent=2))
    else:
        click.echo(to_yaml(cfg), nl=False)


@cli.command()
@_config_options
def up(config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Start the embedded local cluster and print its endpoints, one per line.

    Idempotent: if the cluster already runs, prints what runs and starts nothing.
    """
    from controlplane.local.cluster import ClusterError, LocalCluster

    cfg = _load(config_file, overrides)
    try:
        LocalCluster(cfg).up(echo=click.echo)
    except ClusterError as exc:
        _fail(str(exc))


@cli.command()
@_config_options
def down(config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Stop everything `rcp up` started, and only that."""
    from controlplane.local.cluster import LocalCluster

    cfg = _load(config_file, overrides)
    LocalCluster(cfg).down(echo=click.echo)


def _connect_running(cfg: Config) -> Config:
    from controlplane.local.cluster import LocalCluster, connect

    running = LocalCluster(cfg).running_config()
    if running is None:
        _fail(
            f"no local cluster is running for state dir {cfg.state_path}; start one with `rcp up`"
        )
    assert running is not None
    connect(running)
    return running


@cli.command()
@_config_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.option("--all", "include_dead", is_flag=True, help="Include nodes that have gone away.")
def nodes(
    config_file: str | None, overrides: tuple[str, ...], as_json: bool, include_dead: bool
) -> None:
    """List nodes: pool (head, cluster, external), GPUs free/total, labels, state."""
    from controlplane.inventory import format_table, list_nodes

    _connect_running(_load(config_file, overrides))
    rows = list_nodes(include_dead=include_dead)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows], indent=2))
    else:
        click.echo(format_table(rows))


@cli.command()
@_config_options
@click.option("--keep", is_flag=True, help="Leave the cluster running at the end.")
def demo(config_file: str | None, overrides: tuple[str, ...], keep: bool) -> None:
    """The main job on the embedded default: bring the cluster up, show it, take it down.

    Steps: `up` (endpoints), the node inventory, a burst of work pinned to the external pool
    that makes the autoscaler add a rented node, then `down` (unless --keep).
    """
    from controlplane.demo import run_demo
    from controlplane.local.cluster import ClusterError

    cfg = _load(config_file, overrides)
    try:
        run_demo(cfg, keep=keep, echo=click.echo)
    except ClusterError as exc:
        _fail(str(exc))


@cli.group("fault")
def fault_group() -> None:
    """Inject simulated hardware faults (local mode: telemetry.source=simulated)."""


@fault_group.command("inject")
@click.argument("node")
@click.argument(
    "kind",
    type=click.Choice(["hot-gpu", "xid", "nvlink-errors", "ib-errors", "ib-link-down", "clear"]),
)
@_config_options
def fault_inject(node: str, kind: str, config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Make NODE's telemetry report KIND from its next sample on (`clear` ends all faults).

    NODE is a node id or a unique prefix or suffix of one (as `rcp nodes` shows it).
    """
    from controlplane.telemetry.manager import ensure_agents, inject_fault
    from controlplane.telemetry.readings import TelemetryError

    cfg = _connect_running(_load(config_file, overrides))
    ensure_agents(cfg)
    try:
        result = _retry_until_agent_up(lambda: inject_fault(node, kind))
    except TelemetryError as exc:
        _fail(str(exc), code=2)
        return
    faults = ", ".join(result["faults"]) or "none"
    click.echo(f"node {result['node_id']}: injected {kind}; active faults: {faults}")


def _retry_until_agent_up(call: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    """`call()`, retried while agents just started by this command are still coming up."""
    import time

    from controlplane.telemetry.readings import TelemetryError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except TelemetryError as exc:
            if "no telemetry agent" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


@cli.command("health")
@_config_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def health_cmd(config_file: str | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Node health from telemetry: verdict (healthy, degraded, unhealthy) and reasons.

    Starts a telemetry agent on every node that lacks one, then judges each node on the
    samples its agent keeps, with the `health` config section.
    """
    from controlplane.telemetry.manager import ensure_agents, health_report, verdict_json

    cfg = _connect_running(_load(config_file, overrides))
    refs = ensure_agents(cfg)
    verdicts, _state, latest = health_report(cfg.health)
    rows = []
    for ref in refs:
        v = verdicts.get(ref.node_id)
        s = latest.get(ref.node_id, {})
        temps = [g["temp_c"] for g in s.get("gpus", []) if g.get("temp_c") is not None]
        row = (
            verdict_json(v)
            if v
            else {
                "node_id": ref.node_id,
                "verdict": "unknown",
                "reasons": [],
                "details": ["no samples yet"],
                "lemon": False,
            }
        )
        row.update(
            pool=ref.pool,
            gpu_temp_max_c=max(temps) if temps else None,
            faults=s.get("faults", []),
            sampled_s=s.get("sampled_s"),
        )
        rows.append(row)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    lines = [("NODE", "POOL", "HEALTH", "MAX TEMP C", "REASONS", "DETAILS")]
    for r in rows:
        temp = "-" if r["gpu_temp_max_c"] is None else f"{r['gpu_temp_max_c']:.1f}"
        lines.append(
            (
                r["node_id"][-12:],
                r["pool"],
                r["verdict"],
                temp,
                ",".join(r["reasons"]) or "-",
                "; ".join(r["details"]),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for line in lines:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


@cli.group("serve")
def serve_group() -> None:
    """The production Serve application."""


@serve_group.command("status")
@_config_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def serve_status_cmd(config_file: str | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Per model and pool: target, running, starting, stopping replicas, route weights, nodes."""
    from serve.status import format_status_table, serve_status

    _connect_running(_load(config_file, overrides))
    data = serve_status()
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(format_status_table(data))


def main() -> None:
    cli(prog_name="rcp")


if __name__ == "__main__":
    main()
