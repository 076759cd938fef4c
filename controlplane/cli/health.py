"""`rcp fault inject | health | health-clear | health-breaker | uncordon`: node health.

Owns: injecting simulated faults, printing node health (telemetry joined with the controller's
verdicts), the operator's commands on the controller actor (forget a lemon, the removal
breaker) and on Kubernetes (uncordon). Must not: judge health itself beyond what
`controlplane.telemetry.manager` reports, or call the controller actor where none runs
(Kubernetes runs it in-process; the message says so).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import click

from controlplane.cli.common import config_options, connect_running, fail, load_cfg
from controlplane.config import Config
from controlplane.telemetry.readings import TelemetryError

__all__ = ["fault_group", "health_breaker", "health_clear", "health_cmd", "uncordon"]


@click.group("fault")
def fault_group() -> None:
    """Inject simulated hardware faults (local mode: telemetry.source=simulated)."""


@fault_group.command("inject")
@click.argument("node")
@click.argument(
    "kind",
    type=click.Choice(["hot-gpu", "xid", "nvlink-errors", "ib-errors", "ib-link-down", "clear"]),
)
@config_options
def fault_inject(node: str, kind: str, config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Make NODE's telemetry report KIND from its next sample on (`clear` ends all faults).

    NODE is a node id or a unique prefix or suffix of one (as `rcp nodes` shows it).
    """
    # Deferred: the telemetry manager loads Ray (seconds); the job commands never need it.
    from controlplane.telemetry.manager import ensure_agents, inject_fault

    cfg = connect_running(load_cfg(config_file, overrides))
    ensure_agents(cfg)
    try:
        result = _retry_until_agent_up(lambda: inject_fault(node, kind))
    except TelemetryError as exc:
        fail(str(exc), code=2)
        return
    faults = ", ".join(result["faults"]) or "none"
    click.echo(f"node {result['node_id']}: injected {kind}; active faults: {faults}")


def _retry_until_agent_up(call: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    """`call()`, retried while agents just started by this command are still coming up."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except TelemetryError as exc:
            if "no telemetry agent" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


@click.command("health")
@config_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def health_cmd(config_file: str | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Node health from telemetry: verdict (healthy, degraded, unhealthy) and reasons.

    Starts a telemetry agent on every node that lacks one. The verdicts are the controller's
    (the ones it acts on, lemon records included; "cordoned" marks nodes it took out) when it
    runs, else each node is judged here on the samples its agent keeps.
    """
    # Deferred: the telemetry manager and the views load Ray (seconds); the job commands never
    # need it.
    from controlplane.telemetry.manager import ensure_agents, health_report
    from controlplane.views import format_health_table, health_rows

    cfg = connect_running(load_cfg(config_file, overrides))
    refs = ensure_agents(cfg)
    judged, _state, latest = health_report(cfg.health)
    rows = health_rows(refs, judged, latest)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(format_health_table(rows))


def _no_controller_actor(cfg: Config) -> str:
    """Why a command that calls the controller actor cannot run, and what to do instead."""
    if cfg.kubernetes.enabled:
        return (
            "this command calls the rcp-controller actor, which exists in local mode only: on "
            "Kubernetes the controller runs in-process in the head pod's rcp-controller "
            "container (no actor), so health-clear and health-breaker are not available there"
        )
    return "no controller runs on this cluster (start it with `rcp up`)"


def _ask_controller(cfg: Config, method: str, *args: Any) -> Any:
    """Call `method` on the running local cluster's controller actor; exits with a clear
    message when there is none (Kubernetes runs it in-process) or when the call raised."""
    # Deferred: asking the controller actor loads Ray (seconds); the job commands never need it.
    from controlplane.controller_client import (
        ControllerCallError,
        NoControllerError,
        ask_controller,
    )

    connect_running(cfg)
    try:
        return ask_controller(method, *args)
    except NoControllerError:
        fail(_no_controller_actor(cfg))
    except ControllerCallError as exc:
        fail(str(exc), code=2)


@click.command("health-clear")
@click.argument("node")
@config_options
def health_clear(node: str, config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Let a lemon node back in: forget NODE's lemon record and held verdict (operator only).

    NODE is a node id or a unique prefix or suffix. A node the controller already drained is
    not brought back (Ray cannot undo a drain); on Kubernetes, let its host take pods again
    with `rcp uncordon`.
    """
    result = _ask_controller(load_cfg(config_file, overrides), "clear_node", node)
    note = " (already drained: its replacement starts clean)" if result["cordoned"] else ""
    click.echo(f"node {result['node_id']}: lemon record cleared{note}")


@click.command("health-breaker")
@click.option("--reset", is_flag=True, help="Close the breaker (operator only); logs an event.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@config_options
def health_breaker(
    reset: bool, as_json: bool, config_file: str | None, overrides: tuple[str, ...]
) -> None:
    """The removal breaker: open?, its budget, recent removals, held nodes; --reset closes it.

    Once a removal is held because health.breaker's budget is spent, the breaker stays open:
    no node is taken out until an operator resets it. Find the cause first (rcp health, rcp
    events): many nodes failing at once is more often an exporter or driver rollout than
    hardware. A reset lifts the latch, not the rate limit: removals in the window still count.
    """
    cfg = load_cfg(config_file, overrides)
    state = _ask_controller(cfg, "reset_breaker" if reset else "breaker_status")
    if as_json:
        click.echo(json.dumps({**state, "reset": reset}, indent=2))
        return

    def when(t_s: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t_s))

    if reset:
        click.echo(
            "breaker reset: closed (it was open since " + when(state["opened_s"]) + ")"
            if state["open"]
            else "breaker reset: it was closed already"
        )
        return
    status = f"open since {when(state['opened_s'])}" if state["open"] else "closed"
    click.echo(f"breaker:  {status}{'' if state['act'] else ' (health.act is false)'}")
    click.echo(
        f"budget:   {state['max_nodes']} node(s), {state['max_pool_fraction']:.0%} of a pool "
        f"(at least 1), per {state['window_s']:g} s"
    )
    removals = [f"{r['node_id'][-12:]} ({r['pool']}, {when(r['at_s'])})" for r in state["removals"]]
    click.echo(f"removals: {', '.join(removals) or 'none'} in the window")
    click.echo(f"held:     {', '.join(n[-12:] for n in state['held']) or 'none'}")
    if state["open"]:
        click.echo("no node is taken out until `rcp health-breaker --reset`")


@click.command("uncordon")
@click.argument("kube_node")
@config_options
def uncordon(kube_node: str, config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Kubernetes: let KUBE_NODE (a Kubernetes node name) take Ray pods again.

    Removes the taint and the cordon the control plane put there when health removed the
    node; other taints stay. Needs `kubernetes.enabled=true` and API access (kubeconfig or
    in-cluster).
    """
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
