"""`rcp health [clear | breaker] | cordon | uncordon | fault inject`: nodes, by hand.

Each is one SDK call to the API (any cluster, given its URL and a token; changing anything
needs an operator's token). ``rcp health-clear`` and ``rcp health-breaker`` are the older
spellings, kept hidden. `fault stockout` and `fault reclaim` play a provider's faults on the
local cluster.
Must not: judge health (the controller does) or reach Ray.
"""

from __future__ import annotations

import json
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
from controlplane.inventory import format_health_table
from controlplane.pools import Pool

__all__ = [
    "cordon",
    "fault_group",
    "health_breaker_alias",
    "health_clear_alias",
    "health_group",
    "uncordon",
]

FAULT_KINDS = ("hot-gpu", "xid", "nvlink-errors", "ib-errors", "ib-link-down", "clear")


def client(url: str | None, state_dir: str | None) -> Any:
    """The SDK client; `--url`/`--state-dir` given to a group (``rcp health --url U clear``)
    count for its subcommands too."""
    meta = click.get_current_context().meta
    return sdk_client(url or meta.get("rcp.url"), state_dir or meta.get("rcp.state_dir"))


@click.group("fault")
def fault_group() -> None:
    """Inject simulated faults: hardware (telemetry.source=simulated only) and, on the local
    cluster, an external provider's stock-out."""


@fault_group.command("inject")
@client_options
@click.argument("node")
@click.argument("kind", type=click.Choice(FAULT_KINDS))
def fault_inject(url: str | None, state_dir: str | None, node: str, kind: str) -> None:
    """Make NODE's telemetry report KIND from its next sample on (`clear` ends all faults).

    NODE is a node id or a unique prefix or suffix of one (as `rcp nodes` shows it).
    """
    api = client(url, state_dir)
    result = api_call(lambda: api.inject_fault(node, kind))
    faults = ", ".join(result.get("faults") or []) or "none"
    click.echo(f"node {result.get('node_id', node)}: injected {kind}; active faults: {faults}")


@fault_group.command("stockout")
@click.argument("provider")
@config_options
@click.option("--end", is_flag=True, help="End PROVIDER's stock-out: it launches nodes again.")
def fault_stockout(
    config_file: str | None, overrides: tuple[str, ...], provider: str, end: bool
) -> None:
    """Make external PROVIDER deliver no node from now on, as a provider out of stock does
    (the local cluster's fake provider only; nodes already up stay). Placement marks it out
    once its delivery deadline passes and rents from the next provider. PROVIDER `cluster`:
    the owned pool gets no replacement for a node that dies (a gang that lost one borrows a
    node from serving). `--end` ends it."""
    from controlplane.local.autoscaler import stockout_file  # deferred: imports Ray
    from controlplane.local.cluster import LocalCluster
    from controlplane.local.provider import read_stockouts, write_stockouts

    given = load_cfg(config_file, overrides)
    cfg = LocalCluster(given).running_config() or given  # the providers `rcp up` started
    names = [p.name for p in cfg.pools.external.providers]
    if provider not in [*names, Pool.CLUSTER.value]:
        fail(
            f"no external provider {provider!r}; pools.external.providers: {', '.join(names)} "
            f"(or {Pool.CLUSTER.value!r}: the cluster pool's replacements)"
        )
    path = stockout_file(cfg)
    if not path.parent.is_dir():
        fail(f"no local cluster state in {path.parent} (run `rcp up` first)")
    now = read_stockouts(path)
    write_stockouts(path, now - {provider} if end else now | {provider})
    left = ", ".join(sorted(read_stockouts(path))) or "none"
    click.echo(
        f"provider {provider}: stock-out {'ended' if end else 'started'}; stocked out: {left}"
    )


@fault_group.command("reclaim")
@click.argument("node")
@config_options
@click.option(
    "--notice-s",
    type=float,
    default=30.0,
    show_default=True,
    help="How long before the node is taken (a spot notice is 30 s to 2 min).",
)
def fault_reclaim(
    node: str, config_file: str | None, overrides: tuple[str, ...], notice_s: float
) -> None:
    """Take external NODE back as its provider would (a spot reclaim or termination notice,
    local cluster only): Ray is told to drain it with that deadline, so Serve starts its
    replicas elsewhere first, then the node is killed when the notice ends. Waits that long.

    NODE is a node id or a unique prefix or suffix of one (as `rcp nodes` shows it)."""
    from controlplane.local.cluster import LocalCluster  # deferred: imports Ray
    from controlplane.local.faults import ReclaimError, reclaim_node

    local = LocalCluster(load_cfg(config_file, overrides))
    state = local.read_state()
    cfg = local.running_config()
    if state is None or cfg is None:
        fail(f"no local cluster runs from {local.state_dir} (run `rcp up` first)")
        return
    try:
        reclaim_node(cfg, state, node, notice_s, echo=click.echo)
    except ReclaimError as exc:
        fail(str(exc))


@click.group("health", invoke_without_command=True)
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def health_group(ctx: click.Context, url: str | None, state_dir: str | None, as_json: bool) -> None:
    """Node health: the verdicts the policy actor acts on (healthy, degraded, unhealthy),
    lemon records included; "taken out" marks nodes health drained, "cordoned" nodes an
    operator cordoned. `rcp health clear NODE`, `rcp health breaker [--reset]`."""
    if ctx.invoked_subcommand is not None:
        ctx.meta["rcp.url"], ctx.meta["rcp.state_dir"] = url, state_dir
        return
    api = client(url, state_dir)
    data = api_call(api.health)
    if as_json:
        click.echo(json.dumps(data["nodes"], indent=2))
        return
    rows = []
    for row in data["nodes"]:
        marks = [*(["taken out"] if row.get("taken_out") else [])]
        if row.get("cordon"):
            marks.append(f"cordoned by {row['cordon']['by']}: {row['cordon']['reason']}")
        rows.append({**row, "details": [*row.get("details", []), *marks]})
    click.echo(format_health_table(rows) if rows else "no verdicts yet (no telemetry)")


CLEAR_HELP = """Let a lemon node back in: forget NODE's lemon record and held verdict (operator).

NODE is a node id or a unique prefix or suffix. A node health already drained is not
brought back (Ray cannot undo a drain); on Kubernetes, let its host take pods again with
`rcp uncordon`."""


@health_group.command("clear", help=CLEAR_HELP)
@client_options
@click.argument("node")
def health_clear(url: str | None, state_dir: str | None, node: str) -> None:
    api = client(url, state_dir)
    result = api_call(lambda: api.clear_node(node))
    note = " (already drained: its replacement starts clean)" if result["taken_out"] else ""
    click.echo(f"node {result['node_id']}: lemon record cleared{note}")


health_clear_alias = click.Command(
    "health-clear",
    callback=health_clear.callback,
    params=health_clear.params,
    help=CLEAR_HELP,
    hidden=True,
)


def print_breaker(state: dict[str, Any]) -> None:
    """The breaker's window, what it let health take out in it, whether it tripped."""
    status = f"open since {local_time(state['opened_s'])}" if state["open"] else "closed"
    click.echo(f"breaker:  {status}{'' if state['act'] else ' (health.act is false)'}")
    click.echo(
        f"budget:   {state['max_nodes']} node(s), {state['max_pool_fraction']:.0%} of a pool "
        f"(at least 1), per {state['window_s']:g} s window"
    )
    removals = [
        f"{r['node_id'][-12:]} ({r['pool']}, {local_time(r['at_s'])})" for r in state["removals"]
    ]
    click.echo(f"removals: {', '.join(removals) or 'none'} in the window")
    click.echo(f"held:     {', '.join(n[-12:] for n in state['held']) or 'none'}")
    if state["open"]:
        click.echo("no node is taken out until `rcp health breaker reset` (an operator)")


def _breaker(
    url: str | None, state_dir: str | None, reset: bool, reason: str | None, as_json: bool
) -> None:
    api = client(url, state_dir)
    if not reset:
        state = api_call(api.breaker)
        if as_json:
            click.echo(json.dumps(state, indent=2))
        else:
            print_breaker(state)
        return
    result = api_call(lambda: api.reset_breaker(reason))
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    was = result["was"]
    click.echo(
        f"breaker reset: closed (it was open since {local_time(was['opened_s'])})"
        if was["open"]
        else "breaker reset: it was closed already"
    )


BREAKER_HELP = """The removal breaker: open?, its window and budget, the removals in the
window, held nodes; --reset (or `rcp health breaker reset`) closes it (operator).

Once a removal is held because health.breaker's budget is spent, the breaker stays open: no
node is taken out until an operator resets it. Find the cause first (rcp health, rcp events):
many nodes failing at once is more often an exporter or driver rollout than hardware. A reset
lifts the latch, not the rate limit: removals in the window still count. The reset is an
audited event naming who did it."""
_RESET = click.option("--reset", is_flag=True, help="Close the breaker (operator).")
_REASON = click.option("--reason", help="Why (kept in the event log).")
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@health_group.group("breaker", invoke_without_command=True, help=BREAKER_HELP)
@client_options
@_RESET
@_REASON
@_JSON
@click.pass_context
def health_breaker(
    ctx: click.Context,
    url: str | None,
    state_dir: str | None,
    reset: bool,
    reason: str | None,
    as_json: bool,
) -> None:
    if ctx.invoked_subcommand is None:
        _breaker(url, state_dir, reset, reason, as_json)
    else:
        ctx.meta["rcp.url"] = url or ctx.meta.get("rcp.url")
        ctx.meta["rcp.state_dir"] = state_dir or ctx.meta.get("rcp.state_dir")


@health_breaker.command("reset")
@client_options
@_REASON
@_JSON
def health_breaker_reset(
    url: str | None, state_dir: str | None, reason: str | None, as_json: bool
) -> None:
    """Close the breaker (operator); prints what it was."""
    _breaker(url, state_dir, True, reason, as_json)


health_breaker_alias = click.Command(
    "health-breaker",
    callback=_breaker,
    params=health_breaker.params,
    help=BREAKER_HELP,
    hidden=True,
)


@click.command("cordon")
@client_options
@click.argument("node")
@click.option("--reason", required=True, help="Why (shown with the node and in the event log).")
def cordon(url: str | None, state_dir: str | None, node: str, reason: str) -> None:
    """Drain NODE by hand (operator): it counts for no capacity, so no new gang lands there
    and serving replicas move off it make-before-break; gangs on it keep running. Until
    `rcp uncordon NODE`; survives a controller restart."""
    api = client(url, state_dir)
    result = api_call(lambda: api.cordon(node, reason))
    c = result["cordon"]
    already = "" if result["changed"] else " (already)"
    click.echo(f"node {result['node_id']}: cordoned{already} by {c['by']}: {c['reason']}")


@click.command("uncordon")
@client_options
@click.argument("node")
@click.option("--reason", help="Why (kept in the event log).")
@click.option(
    "--kube",
    is_flag=True,
    help="Kubernetes, with your own kubeconfig: remove the taint and cordon health put on "
    "the Kubernetes node NODE (reads --config's kubernetes section and KEY=VALUE overrides, "
    "not the API).",
)
@click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")
def uncordon(
    url: str | None,
    state_dir: str | None,
    node: str,
    reason: str | None,
    kube: bool,
    overrides: tuple[str, ...],
) -> None:
    """Give NODE back (operator): undo `rcp cordon NODE`. On Kubernetes, a NODE no Ray node
    has is taken as a Kubernetes node: the controller removes the taint and cordon health put
    there (other taints stay); --kube does that here, with your own kubeconfig."""
    if kube:
        config_file = click.get_current_context().meta.get("rcp.config_file")
        _uncordon_kube(node, config_file, overrides)
        return
    if overrides:
        fail("KEY=VALUE overrides go with --kube only", code=2)
    api = client(url, state_dir)
    result = api_call(lambda: api.uncordon(node, reason))
    if result.get("kubernetes"):
        click.echo(str(result["kubernetes"]))
    else:
        click.echo(f"node {result['node_id']}: uncordoned")


def _uncordon_kube(kube_node: str, config_file: str | None, overrides: tuple[str, ...]) -> None:
    # Deferred: controlplane.kube imports the kubernetes client (heavy, production only).
    from controlplane.kube import KubernetesActuatorError, from_config

    cfg = load_cfg(config_file, overrides)
    try:
        actuator = from_config(cfg)
        if actuator is None:
            fail("kubernetes.enabled is false: local mode has no Kubernetes nodes", code=2)
            return
        with actuator:
            result = actuator.uncordon(kube_node)
    except KubernetesActuatorError as exc:
        fail(str(exc))
        return
    click.echo(result.detail or f"node {kube_node}: uncordoned")
