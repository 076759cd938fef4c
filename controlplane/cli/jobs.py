"""`rcp submit | status | queue | cancel | logs | events`: the training queue, through the API.

Owns: turning a JOB.yaml or a `-- CMD...` into a job spec, and printing what the control
plane's HTTP API answers (through the SDK). Must not: reach Ray or the store directly; every
command is one SDK call.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path
from typing import Any

import click

from controlplane.cli.common import api_call, client_options, fail, sdk_client
from controlplane.cli.log_view import RankLines
from controlplane.cli.render import JOB_HEADER, job_row, local_time, recovery_lines, text_table
from jobs.spec import JobSpec, SpecError

__all__ = ["cancel", "events", "logs", "queue_cmd", "status", "submit"]


@click.command(context_settings={"ignore_unknown_options": True})
@client_options
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
    "--restart-in-place/--no-restart-in-place",
    default=None,
    help="A crashed worker restarts the gang inside its run, in seconds (default), or as a "
    "new attempt through the queue.",
)
@click.option(
    "--stall-timeout-s",
    type=float,
    help="No new step for this long: hung, restarted (default: the cluster's jobs.stall_timeout_s).",
)
@click.option("--idempotency-key", help="Retrying with the same key returns the same job.")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Queue nothing: say whether it would be admitted now, why not, and when it may start.",
)
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
    restart_in_place: bool | None,
    stall_timeout_s: float | None,
    idempotency_key: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Queue a training job; prints its id (with --dry-run: what admission would do now).

    \b
    rcp submit job.yaml
    rcp submit --workers 2 --gpus-per-worker 1 --priority high -- python train.py --lr 3e-4

    A module:function command (e.g. jobs.examples.train_mnistlike:train_loop) runs as the Ray
    Train loop of every worker; any other command runs on every worker of the gang with the
    environment torchrun gives (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK), so a
    torch.distributed script runs unchanged. --max-restarts, --[no-]restart-in-place and
    --stall-timeout-s override a JOB.yaml's values too.
    """
    payload: dict[str, Any]
    if len(args) == 1 and workers is None and args[0].endswith((".yaml", ".yml")):
        path = Path(args[0])
        if not path.is_file():
            fail(f"{path}: no such job file", 2)
        try:
            payload = JobSpec.from_yaml(path.read_text()).to_dict()
        except SpecError as exc:
            fail(f"{path}: {exc}", 2)
    else:
        if not args:
            fail(
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
    if restart_in_place is not None:
        payload["restart_in_place"] = restart_in_place
    if stall_timeout_s is not None:
        payload["stall_timeout_s"] = stall_timeout_s
    client = sdk_client(url, state_dir)
    if dry_run:
        answer = api_call(lambda: client.dry_run(payload))
        click.echo(json.dumps(answer) if as_json else dry_run_text(answer))
        return
    job = api_call(lambda: client.submit(payload, idempotency_key=idempotency_key))
    click.echo(json.dumps({"id": job.id, "state": job.state}) if as_json else job.id)


def dry_run_text(answer: dict[str, Any]) -> str:
    """A dry run's answer for people: admitted or not, why, the estimate, what makes room."""
    verdict = "would be admitted now" if answer["admitted"] else "would wait"
    lines = [f"{verdict} ({answer['code']}): {answer['reason']}"]
    start = answer.get("start_by_s")
    if not answer["admitted"]:
        lines.append(
            f"estimated start: {local_time(start)}"
            if start is not None
            else "estimated start: unknown (it is not the head of the queue, or a job it waits "
            "for has no max runtime)"
        )
    lines.append(f"jobs ahead of it in queue order: {answer['ahead']}")
    lines += [f"makes room: {r}" for r in answer.get("makes_room") or ()]
    return "\n".join(lines)


@click.command()
@client_options
@click.argument("job_id", required=False, metavar="[ID]")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(url: str | None, state_dir: str | None, job_id: str | None, as_json: bool) -> None:
    """One job's state, checkpoints, restarts and history, or every job's state without an ID.

    For one job: the last committed checkpoint step and its age, the checkpoint overhead
    (training time stalled on checkpoints over wall time), restarts used of --max-restarts,
    the running attempt's step and when it last grew, and how each attempt ended."""
    client = sdk_client(url, state_dir)
    if job_id is None:
        jobs = api_call(lambda: client.list())
        invalid = getattr(jobs, "invalid", [])
        if as_json:
            click.echo(json.dumps([dict(j.raw) for j in jobs], indent=2))
        else:
            click.echo(text_table([job_row(j) for j in jobs], JOB_HEADER))
        for row in invalid:  # on stderr, so --json output stays one JSON document
            click.echo(
                f"INVALID {row.get('id')} ({row.get('state')}): stored row no longer "
                f"validates, skipped by the controller: {row.get('error')}",
                err=True,
            )
        return
    job = api_call(lambda: client.status(job_id))
    if as_json:
        click.echo(json.dumps(dict(job.raw), indent=2))
        return
    click.echo(text_table([job_row(job)], JOB_HEADER))
    if job.state == "QUEUED" and job.message:
        click.echo(f"waiting:     {job.message}")
    for line in recovery_lines(job):
        click.echo(line)
    if job.history:
        click.echo("history:")
    for t in job.history:
        click.echo(f"  {t['at_s']:.3f}  {t['from'] or '-':>9} -> {t['to']:<9}  {t['reason']}")


@click.command("queue")
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.option("--all", "show_all", is_flag=True, help="Include finished jobs.")
def queue_cmd(url: str | None, state_dir: str | None, as_json: bool, show_all: bool) -> None:
    """Jobs waiting or holding GPUs (QUEUED, ADMITTED, RUNNING), oldest in the queue first;
    then why each waiting job that has a reason waits (e.g. a pinned model holds its GPUs),
    with the head of the queue's estimated start (its reservation's time) when it has one."""
    client = sdk_client(url, state_dir)
    state = None if show_all else "QUEUED,ADMITTED,RUNNING,PREEMPTED"
    jobs = api_call(lambda: client.list(state=state))
    if as_json:
        click.echo(json.dumps([dict(j.raw) for j in jobs], indent=2))
        return
    click.echo(text_table([job_row(j) for j in jobs], JOB_HEADER))
    waiting = [j for j in jobs if j.state == "QUEUED" and (j.message or j.estimated_start_s)]
    if waiting:
        click.echo("waiting:")
    for j in waiting:
        start = j.estimated_start_s
        by = f"starts by {local_time(start)}" if start else ""
        click.echo(f"  {j.id}  {'; '.join(t for t in (j.message, by) if t)}")


@click.command()
@client_options
@click.argument("job_id", metavar="ID")
def cancel(url: str | None, state_dir: str | None, job_id: str) -> None:
    """Cancel a job; a running gang is stopped."""
    client = sdk_client(url, state_dir)
    job = api_call(lambda: client.cancel(job_id))
    click.echo(f"{job.id} {job.state}")


@click.command()
@client_options
@click.argument("job_id", metavar="ID")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends.")
@click.option(
    "--system", is_flag=True, help="The whole driver log: Ray's and the driver's lines too."
)
def logs(url: str | None, state_dir: str | None, job_id: str, follow: bool, system: bool) -> None:
    """The job's output, every attempt: each rank's own lines once, as [rank R] (a failed
    rank's traceback whole, once), and the launcher's word on the gang; --system prints the
    driver's log as it is, Ray's lines and all."""
    client = sdk_client(url, state_dir)
    pieces = (
        api_call(lambda: client.logs(job_id, follow=True))
        if follow
        else [api_call(lambda: client.logs(job_id))]
    )
    if system:
        for piece in pieces:
            click.echo(piece, nl=False)
        return
    ranks = RankLines()
    for piece in pieces:
        for line in ranks.feed(piece):
            click.echo(line)
    for line in ranks.flush():
        click.echo(line)


@click.command()
@client_options
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
    client = sdk_client(url, state_dir)
    evs = api_call(lambda: client.events(after=after, job_id=job_id, limit=limit))
    if as_json:
        click.echo(json.dumps(evs, indent=2))
        return
    for e in evs:
        when = time.strftime("%H:%M:%S", time.localtime(e["at_s"]))
        click.echo(f"{e['seq']:>6}  {when}  {e['kind']:<24} {e['message']}")
