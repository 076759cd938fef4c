"""`rcp policy pause | resume | status`: the on-call engineer's brake on the policy actor.

Paused, the actor still decides every tick but applies no new serving move, admission,
preemption or health removal (``policy.held`` events say what it would have done); the pause
survives a controller restart. Must not: hold logic of its own.
"""

from __future__ import annotations

import json

import click

from controlplane.cli.cluster import guard_lines
from controlplane.cli.common import api_call, client_options, sdk_client

__all__ = ["policy_group"]


@click.group("policy")
def policy_group() -> None:
    """Pause, resume and inspect the policy actor."""


@policy_group.command("pause")
@client_options
@click.option("--reason", required=True, help="Why (shown in `rcp serve status` and events).")
def pause(url: str | None, state_dir: str | None, reason: str) -> None:
    """Freeze the policy actor's moves: no new serving moves, admissions or health removals
    until `rcp policy resume`; moves in flight finish safely."""
    api = sdk_client(url, state_dir)
    result = api_call(lambda: api.pause(reason))
    p = result["pause"]
    already = "" if result["changed"] else " (already: the first pause stands)"
    click.echo(f"policy actor paused{already} by {p['by']}: {p['reason']}")


@policy_group.command("resume")
@client_options
@click.option("--reason", help="Why (kept in the event log).")
def resume(url: str | None, state_dir: str | None, reason: str | None) -> None:
    """Let the policy actor act again; what waited is decided afresh on the next tick."""
    api = sdk_client(url, state_dir)
    result = api_call(lambda: api.resume(reason))
    was = result["was"]
    if was is None:
        click.echo("policy actor was not paused")
    else:
        click.echo(f"policy actor resumed (paused by {was['by']}: {was['reason']})")


@policy_group.command("status")
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(url: str | None, state_dir: str | None, as_json: bool) -> None:
    """Whether the policy actor is paused (who, why, since), the pins and hand cordons."""
    api = sdk_client(url, state_dir)
    data = api_call(api.policy)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    for line in guard_lines(data):
        click.echo(line)
