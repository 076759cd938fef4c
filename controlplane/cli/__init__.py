"""`rcp`: the command line of the control plane (also `python -m controlplane`).

Owns: parsing arguments, loading config, printing tables or JSON, and exit codes. This module
holds the `rcp` group and names its commands; they live by concern: ``cli.cluster`` (config,
up, down, demo locally; nodes, serve status/pin/unpin over the API), ``cli.health`` (health,
health clear, health breaker [reset], cordon, uncordon, fault inject), ``cli.policy``
(policy pause/resume/status), ``cli.jobs`` (submit, status, queue, cancel, logs, events),
``cli.users`` (whoami, users add/list/remove/rotate-token over the API, users
recover-admin beside the store),
``cli.timeline`` (timeline: a PNG of events and metrics), ``cli.simulate``
(simulate: the fleet simulator), with the shared options and exits in ``cli.common`` and the
job tables in ``cli.render``.
Must not: hold logic of its own; every command calls a function that tests can call too.
Errors a user can fix print one clear message to stderr and exit 2 (bad input) or 1 (the
cluster is not in a state to do it).
"""

from __future__ import annotations

import click

from controlplane.cli.cluster import config_group, demo, down, nodes, serve_group, up
from controlplane.cli.health import (
    cordon,
    fault_group,
    health_breaker_alias,
    health_clear_alias,
    health_group,
    uncordon,
)
from controlplane.cli.jobs import cancel, events, logs, queue_cmd, status, submit
from controlplane.cli.policy import policy_group
from controlplane.cli.simulate import simulate
from controlplane.cli.timeline import timeline
from controlplane.cli.users import users_group, whoami

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Control plane for one Ray cluster that runs training and production serving.

    Configuration merges packaged defaults, a YAML file (--config) and KEY=VALUE
    overrides, in that order; `rcp config show` prints the result.
    """


for command in (
    config_group, up, down, nodes, demo, fault_group, health_group, health_clear_alias,
    health_breaker_alias, cordon, uncordon, policy_group, serve_group, submit, status, queue_cmd,
    cancel, logs, events, whoami, users_group, timeline, simulate,
):  # fmt: skip
    cli.add_command(command)


def main() -> None:
    cli(prog_name="rcp")
