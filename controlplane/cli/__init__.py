"""`rcp`: the command line of the control plane (also `python -m controlplane`).

Owns: the `rcp` group and its commands' names (`COMMANDS`); the commands live by concern in
the sibling modules, with the shared options and exits in ``cli.common`` and the job tables in
``cli.render``.
Must not: hold logic of its own; every command calls a function that tests can call too.
Errors a user can fix print one clear message to stderr and exit 2 (bad input) or 1 (the
cluster is not in a state to do it).
"""

from __future__ import annotations

import importlib

import click

__all__ = ["cli", "main"]

COMMANDS: dict[str, tuple[str, str]] = {
    "config": ("cluster", "config_group"),
    "up": ("cluster", "up"),
    "down": ("cluster", "down"),
    "nodes": ("cluster", "nodes"),
    "demo": ("cluster", "demo"),
    "serve": ("cluster", "serve_group"),
    "fault": ("health", "fault_group"),
    "health": ("health", "health_group"),
    "health-clear": ("health", "health_clear_alias"),
    "health-breaker": ("health", "health_breaker_alias"),
    "cordon": ("health", "cordon"),
    "uncordon": ("health", "uncordon"),
    "policy": ("policy", "policy_group"),
    "submit": ("jobs", "submit"),
    "status": ("jobs", "status"),
    "queue": ("jobs", "queue_cmd"),
    "cancel": ("jobs", "cancel"),
    "logs": ("jobs", "logs"),
    "events": ("jobs", "events"),
    "whoami": ("users", "whoami"),
    "users": ("users", "users_group"),
    "timeline": ("timeline", "timeline"),
    "simulate": ("simulate", "simulate"),
}
"""Each command's name: (its module under ``controlplane.cli``, the click object there)."""


class _LazyGroup(click.Group):
    """Imports a command's module only when that command runs (or help lists them all): one
    `rcp status` need not load the simulator, the local cluster and the identity store, which
    took about a second of every call."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        command = getattr(importlib.import_module(f"controlplane.cli.{where[0]}"), where[1])
        assert isinstance(command, click.Command), where
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Control plane for one Ray cluster that runs training and production serving.

    Configuration merges packaged defaults, a YAML file (--config) and KEY=VALUE
    overrides, in that order; `rcp config show` prints the result.
    """


def main() -> None:
    cli(prog_name="rcp")
