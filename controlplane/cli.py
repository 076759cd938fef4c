"""`rcp`: the command line of the control plane (also `python -m controlplane`).

Owns: parsing arguments, loading config, printing tables or JSON, and exit codes.
Must not: hold logic of its own; every command calls a function that tests can call too.
Errors a user can fix print one clear message to stderr and exit 2 (bad input) or 1 (the
cluster is not in a state to do it).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from controlplane.config import Config, ConfigError, load_config, to_dict, to_yaml
from controlplane.controller_client import ControllerCallError, NoControllerError, ask_controller
from controlplane.local.cluster import LocalCluster
from controlplane.ray_connection import ClusterError, connect
from controlplane.sdk import ApiError, Client
from controlplane.store import StoreError
from controlplane.telemetry.manager import ensure_agents, health_report, inject_fault
from controlplane.telemetry.readings import TelemetryError
from controlplane.views import format_health_table, format_table, health_rows, node_rows
from jobs.spec import JobSpec, SpecError
from serve.status import format_status_table, serve_status

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
        click.echo(json.dumps(to_dict(cfg), indent=2))
    else:
        click.echo(to_yaml(cfg), nl=False)


@cli.command()
@_config_options
def up(config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Start the embedded local cluster and print its endpoints, one per line.

    Idempotent: if the cluster already runs, prints what runs and starts nothing.
    """
    cfg = _load(config_file, overrides)
    try:
        LocalCluster(cfg).up(echo=click.echo)
    except (ClusterError, StoreError) as exc:  # a corrupt job store names its file
        _fail(str(exc))


@cli.command()
@_config_options
def down(config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Stop everything `rcp up` started, and only that."""
    cfg = _load(config_file, overrides)
    LocalCluster(cfg).down(echo=click.echo)


def _connect_running(cfg: Config) -> Config:
    running = LocalCluster(cfg).running_config()
    if running is None:
        _fail(
            f"no local cluster is running for state dir {cfg.state_path}; start one with `rcp up`"
        )
    assert running is not None
    try:
        connect(running)
    except ClusterError as exc:  # e.g. no Ray token: a cluster an older `rcp up` started
        _fail(str(exc))
    return running


@cli.command()
@_config_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.option("--all", "include_dead", is_flag=True, help="Include nodes that have gone away.")
def nodes(
    config_file: str | None, overrides: tuple[str, ...], as_json: bool, include_dead: bool
) -> None:
    """List nodes: pool (head, cluster, external), GPUs free/total, labels, state."""
    _connect_running(_load(config_file, overrides))
    rows = node_rows(include_dead=include_dead)
    if as_json:
        click.echo(json.dumps([r.to_json() for r in rows], indent=2))
    else:
        click.echo(format_table(rows))


@cli.command()
@_config_options
@click.option("--keep", is_flag=True, help="Leave the cluster running at the end.")
def demo(config_file: str | None, overrides: tuple[str, ...], keep: bool) -> None:
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
    6. It prints the policy actor's decisions and how many requests failed, then `down`
       (unless --keep).

    Exit status: 0 when every request was served and the job succeeded with a committed
    checkpoint; 1 when any request failed, the job did not succeed or committed no
    checkpoint, or a step timed out (the reason is printed).
    """
    # Deferred: the demo reads checkpoints through jobs.checkpoint, which imports torch (heavy).
    from controlplane.demo import run_demo

    cfg = _load(config_file, overrides)
    try:
        result = run_demo(cfg, keep=keep, echo=click.echo)
    except ClusterError as exc:
        _fail(str(exc))
        return
    failures = result.failures()
    if failures:
        _fail("the demo missed its bar: " + "; ".join(failures))
    click.echo("demo passed: no request failed")


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

    Starts a telemetry agent on every node that lacks one. The verdicts are the controller's
    (the ones it acts on, lemon records included; "cordoned" marks nodes it took out) when it
    runs, else each node is judged here on the samples its agent keeps.
    """
    cfg = _connect_running(_load(config_file, overrides))
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
    _connect_running(cfg)
    try:
        return ask_controller(method, *args)
    except NoControllerError:
        _fail(_no_controller_actor(cfg))
    except ControllerCallError as exc:
        _fail(str(exc), code=2)


@cli.command("health-clear")
@click.argument("node")
@_config_options
def health_clear(node: str, config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Let a lemon node back in: forget NODE's lemon record and held verdict (operator only).

    NODE is a node id or a unique prefix or suffix. A node the controller already drained is
    not brought back (Ray cannot undo a drain); on Kubernetes, let its host take pods again
    with `rcp uncordon`.
    """
    result = _ask_controller(_load(config_file, overrides), "clear_node", node)
    note = " (already drained: its replacement starts clean)" if result["cordoned"] else ""
    click.echo(f"node {result['node_id']}: lemon record cleared{note}")


@cli.command("health-breaker")
@click.option("--reset", is_flag=True, help="Close the breaker (operator only); logs an event.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@_config_options
def health_breaker(
    reset: bool, as_json: bool, config_file: str | None, overrides: tuple[str, ...]
) -> None:
    """The removal breaker: open?, its budget, recent removals, held nodes; --reset closes it.

    Once a removal is held because health.breaker's budget is spent, the breaker stays open:
    no node is taken out until an operator resets it. Find the cause first (rcp health, rcp
    events): many nodes failing at once is more often an exporter or driver rollout than
    hardware. A reset lifts the latch, not the rate limit: removals in the window still count.
    """
    cfg = _load(config_file, overrides)
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


@cli.command("uncordon")
@click.argument("kube_node")
@_config_options
def uncordon(kube_node: str, config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Kubernetes: let KUBE_NODE (a Kubernetes node name) take Ray pods again.

    Removes the taint and the cordon the control plane put there when health removed the
    node; other taints stay. Needs `kubernetes.enabled=true` and API access (kubeconfig or
    in-cluster).
    """
    # Deferred: controlplane.kube imports the kubernetes client (heavy, production only).
    from controlplane.kube import KubernetesActuatorError, from_config

    cfg = _load(config_file, overrides)
    try:
        actuator = from_config(cfg)
        if actuator is None:
            _fail("kubernetes.enabled is false: local mode has no Kubernetes nodes", code=2)
            return
        with actuator:
            result = actuator.uncordon(kube_node)
    except KubernetesActuatorError as exc:
        _fail(str(exc))
        return
    click.echo(result.detail or f"node {kube_node}: uncordoned")


@cli.group("serve")
def serve_group() -> None:
    """The production Serve application."""


@serve_group.command("status")
@_config_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def serve_status_cmd(config_file: str | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Per model and pool: target, running, starting, stopping replicas, route weights, nodes."""
    _connect_running(_load(config_file, overrides))
    data = serve_status()
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        click.echo(format_status_table(data))


# -- the training queue (talks to the control plane's HTTP API through the SDK) ---------------


def _remember_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    ctx.meta["rcp.config_file"] = value


def _client_options(func: F) -> F:
    func = click.option(
        "--state-dir",
        envvar="RCP_STATE_DIR",
        default=None,
        help="Where `rcp up` wrote api-url and api-token (env: RCP_STATE_DIR; default: the "
        "state_dir of --config, else ~/.rcp).",
    )(func)
    func = click.option(
        "--config",
        type=click.Path(dir_okay=False),
        envvar="RCP_CONFIG",
        expose_value=False,
        callback=_remember_config,
        help="The YAML config `rcp up` ran with: its state_dir is used (env: RCP_CONFIG).",
    )(func)
    func = click.option(
        "--url", envvar="RCP_API_URL", help="Control-plane API URL (env: RCP_API_URL)."
    )(func)
    return func


def _client(url: str | None, state_dir: str | None) -> Any:
    if state_dir is None:
        config_file = click.get_current_context().meta.get("rcp.config_file")
        state_dir = str(_load(config_file, ()).state_path)
    try:
        return Client(url=url, state_dir=state_dir)
    except ApiError as exc:
        _fail(exc.message)


def _api(call: Callable[[], Any]) -> Any:
    """Run an SDK call; an API refusal prints the server's message and exits 2 (bad input) or 1."""
    try:
        return call()
    except ApiError as exc:
        _fail(str(exc), 2 if 400 <= exc.status < 500 and exc.status != 401 else 1)


def _job_row(job: Any) -> tuple[str, ...]:
    step = job.last_committed_step
    return (
        job.id,
        job.name,
        job.state,
        job.priority_class,
        job.queue,
        f"{job.num_workers}x{job.gpus_per_worker}",
        str(job.num_preemptions),
        f"{job.restarts}/{'-' if job.max_restarts is None else job.max_restarts}",
        "-" if step is None else str(step),
    )


def _duration(seconds: float) -> str:
    """``42s``, ``12m 5s``, ``3h 4m``, ``2d 5h``: a duration a person reads at a glance."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _when(t_s: float | None) -> str:
    return "-" if t_s is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t_s))


def _recovery_lines(job: Any) -> list[str]:
    """`rcp status ID`'s checkpoint and restart block (see `controlplane.sdk.Job`)."""
    ckpt = job.last_checkpoint
    if not ckpt:
        lines = ["checkpoint:  no checkpoint committed yet"]
    else:
        age = ckpt.get("age_s")
        when = "" if age is None else f", committed {_duration(age)} ago"
        where = f" ({ckpt['uri']})" if ckpt.get("uri") else ""
        lines = [f"checkpoint:  step {ckpt.get('step')}{when}{where}"]
    stall = float(job.raw.get("checkpoint_stall_s") or 0.0)
    wall = float(job.raw.get("checkpoint_wall_s") or 0.0)
    if job.checkpoint_overhead_pct is None:
        lines.append("overhead:    no training time measured yet")
    else:
        lines.append(
            f"overhead:    {job.checkpoint_overhead_pct:.2f}% of training time stalled on "
            f"checkpoints ({stall:.1f}s of {wall:.0f}s)"
        )
    limit = "-" if job.max_restarts is None else str(job.max_restarts)
    hangs = f" ({job.hangs} after a hang)" if job.hangs else ""
    lines.append(f"restarts:    {job.restarts} of {limit} used{hangs}")
    progress = job.progress
    if progress:
        age = progress.get("step_age_s")
        grew = "" if age is None else f", last grew {_duration(age)} ago"
        lines.append(f"progress:    step {progress.get('step')}{grew}")
    if job.attempts:
        rows: list[tuple[str, ...]] = [
            (
                "-" if a.attempt is None else str(a.attempt),
                _when(a.ended_s),
                a.kind,
                "-" if a.step is None else str(a.step),
                a.reason,
            )
            for a in job.attempts
        ]
        lines.append("attempts:")
        table = _table(rows, ("ATTEMPT", "ENDED", "KIND", "STEP", "REASON"))
        lines += ["  " + line for line in table.splitlines()]
    return lines


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    lines = [header, *rows]
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in lines
    )


_JOB_HEADER = (
    "ID", "NAME", "STATE", "PRIORITY", "QUEUE", "GANG", "PREEMPTED", "RESTARTS", "CHECKPOINT"
)  # fmt: skip


@cli.command(context_settings={"ignore_unknown_options": True})
@_client_options
@click.argument("args", nargs=-1, type=click.UNPROCESSED, metavar="JOB.yaml | -- CMD...")
@click.option("--workers", type=int, help="Gang size (workers); with -- CMD.")
@click.option("--gpus-per-worker", type=int, default=1, show_default=True, help="GPUs per worker.")
@click.option("--cpus-per-worker", type=float, default=1.0, show_default=True)
@click.option("--priority", "priority_class", help="Priority class (default: the configured one).")
@click.option("--queue", default="default", show_default=True, help="Team queue.")
@click.option("--name", help="Job name (default: from the YAML, else the command's first word).")
@click.option("--max-runtime-s", type=float, help="Stop the job after this long.")
@click.option(
    "--max-restarts",
    type=int,
    help="Restarts from the last checkpoint after a crash or hang before FAILED (default 3).",
)
@click.option(
    "--stall-timeout-s",
    type=float,
    help="No new step for this long: hung, restarted (default: the cluster's jobs.stall_timeout_s).",
)
@click.option("--idempotency-key", help="Retrying with the same key returns the same job.")
@click.option("--json", "as_json", is_flag=True, help='Print {"id": ..., "state": ...}.')
def submit(
    url: str | None,
    state_dir: str | None,
    args: tuple[str, ...],
    workers: int | None,
    gpus_per_worker: int,
    cpus_per_worker: float,
    priority_class: str | None,
    queue: str,
    name: str | None,
    max_runtime_s: float | None,
    max_restarts: int | None,
    stall_timeout_s: float | None,
    idempotency_key: str | None,
    as_json: bool,
) -> None:
    """Queue a training job; prints its id.

    \b
    rcp submit job.yaml
    rcp submit --workers 2 --gpus-per-worker 1 --priority high -- python train.py --lr 3e-4

    A module:function command (e.g. jobs.examples.train_mnistlike:train_loop) runs as the Ray
    Train loop of every worker; any other command runs on every worker of the gang with the
    environment torchrun gives (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK), so a
    torch.distributed script runs unchanged. --max-restarts and --stall-timeout-s override a
    JOB.yaml's values too.
    """
    payload: dict[str, Any]
    if len(args) == 1 and workers is None and args[0].endswith((".yaml", ".yml")):
        path = Path(args[0])
        if not path.is_file():
            _fail(f"{path}: no such job file", 2)
        try:
            payload = JobSpec.from_yaml(path.read_text()).to_dict()
        except SpecError as exc:
            _fail(f"{path}: {exc}", 2)
        if priority_class:
            payload["priority_class"] = priority_class
    else:
        if not args:
            _fail(
                "give a JOB.yaml or a command after --, e.g. rcp submit --workers 2 -- python train.py",
                2,
            )
        command = shlex.join(args)
        default_name = re.sub(
            r"[^A-Za-z0-9._-]+",
            "-",
            Path(args[-1] if args[0].startswith("python") else args[0]).name,
        )
        payload = {
            "name": name or (default_name.strip("-.") or "job")[:64],
            "entrypoint": command,
            "num_workers": 1 if workers is None else workers,
            "gpus_per_worker": gpus_per_worker,
            "cpus_per_worker": cpus_per_worker,
            "queue": queue,
            "max_runtime_s": max_runtime_s,
        }
        if priority_class:
            payload["priority_class"] = priority_class
    if name:
        payload["name"] = name
    if max_restarts is not None:
        payload["max_restarts"] = max_restarts
    if stall_timeout_s is not None:
        payload["stall_timeout_s"] = stall_timeout_s
    client = _client(url, state_dir)
    job = _api(lambda: client.submit(payload, idempotency_key=idempotency_key))
    click.echo(json.dumps({"id": job.id, "state": job.state}) if as_json else job.id)


@cli.command()
@_client_options
@click.argument("job_id", required=False, metavar="[ID]")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(url: str | None, state_dir: str | None, job_id: str | None, as_json: bool) -> None:
    """One job's state, checkpoints, restarts and history, or every job's state without an ID.

    For one job: the last committed checkpoint step and its age, the checkpoint overhead
    (training time stalled on checkpoints over wall time), restarts used of --max-restarts,
    the running attempt's step and when it last grew, and how each attempt ended."""
    client = _client(url, state_dir)
    if job_id is None:
        jobs = _api(lambda: client.list())
        invalid = getattr(jobs, "invalid", [])
        if as_json:
            click.echo(json.dumps([dict(j.raw) for j in jobs], indent=2))
        else:
            click.echo(_table([_job_row(j) for j in jobs], _JOB_HEADER))
        for row in invalid:  # on stderr, so --json output stays one JSON document
            click.echo(
                f"INVALID {row.get('id')} ({row.get('state')}): stored row no longer "
                f"validates, skipped by the controller: {row.get('error')}",
                err=True,
            )
        return
    job = _api(lambda: client.status(job_id))
    if as_json:
        click.echo(json.dumps(dict(job.raw), indent=2))
        return
    click.echo(_table([_job_row(job)], _JOB_HEADER))
    for line in _recovery_lines(job):
        click.echo(line)
    if job.history:
        click.echo("history:")
    for t in job.history:
        click.echo(f"  {t['at_s']:.3f}  {t['from'] or '-':>9} -> {t['to']:<9}  {t['reason']}")


@cli.command("queue")
@_client_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.option("--all", "show_all", is_flag=True, help="Include finished jobs.")
def queue_cmd(url: str | None, state_dir: str | None, as_json: bool, show_all: bool) -> None:
    """Jobs waiting or holding GPUs (QUEUED, ADMITTED, RUNNING), oldest in the queue first."""
    client = _client(url, state_dir)
    state = None if show_all else "QUEUED,ADMITTED,RUNNING,PREEMPTED"
    jobs = _api(lambda: client.list(state=state))
    if as_json:
        click.echo(json.dumps([dict(j.raw) for j in jobs], indent=2))
    else:
        click.echo(_table([_job_row(j) for j in jobs], _JOB_HEADER))


@cli.command()
@_client_options
@click.argument("job_id", metavar="ID")
def cancel(url: str | None, state_dir: str | None, job_id: str) -> None:
    """Cancel a job; a running gang is stopped."""
    client = _client(url, state_dir)
    job = _api(lambda: client.cancel(job_id))
    click.echo(f"{job.id} {job.state}")


@cli.command()
@_client_options
@click.argument("job_id", metavar="ID")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
def logs(url: str | None, state_dir: str | None, job_id: str, follow: bool) -> None:
    """The job's driver logs (every attempt)."""
    client = _client(url, state_dir)
    if follow:
        for chunk in _api(lambda: client.logs(job_id, follow=True)):
            click.echo(chunk, nl=False)
    else:
        click.echo(_api(lambda: client.logs(job_id)), nl=False)


@cli.command()
@_client_options
@click.option("--job", "job_id", help="Only this job's events.")
@click.option("--after", type=int, default=0, help="Only events after this sequence number.")
@click.option("--limit", type=int, default=200, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def events(
    url: str | None,
    state_dir: str | None,
    job_id: str | None,
    after: int,
    limit: int,
    as_json: bool,
) -> None:
    """The control plane's event log: state changes, admissions, preemptions."""
    client = _client(url, state_dir)
    evs = _api(lambda: client.events(after=after, job_id=job_id, limit=limit))
    if as_json:
        click.echo(json.dumps(evs, indent=2))
        return
    for e in evs:
        when = time.strftime("%H:%M:%S", time.localtime(e["at_s"]))
        click.echo(f"{e['seq']:>6}  {when}  {e['kind']:<24} {e['message']}")


def main() -> None:
    cli(prog_name="rcp")


if __name__ == "__main__":
    main()
