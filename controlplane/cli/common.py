"""What every `rcp` command shares: its options, loading config, exits, and reaching a cluster.

Must not: define a command (the command modules do) or load Ray: every command but `up`,
`down` and `demo` talks to the API.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from controlplane.config import Config, ConfigError, load_config
from controlplane.sdk import ApiError, Client

__all__ = [
    "api_call",
    "client_options",
    "config_options",
    "fail",
    "load_cfg",
    "sdk_client",
]

F = TypeVar("F", bound=Callable[..., Any])


def config_options(func: F) -> F:
    func = click.argument("overrides", nargs=-1, metavar="[KEY=VALUE]...")(func)
    func = click.option(
        "--config",
        "config_file",
        type=click.Path(dir_okay=False),
        envvar="RCP_CONFIG",
        help="YAML file merged over the packaged defaults (env: RCP_CONFIG).",
    )(func)
    return func


def load_cfg(config_file: str | None, overrides: tuple[str, ...]) -> Config:
    try:
        return load_config(config_file, list(overrides))
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


def fail(message: str, code: int = 1) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _remember_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    ctx.meta["rcp.config_file"] = value


def client_options(func: F) -> F:
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


def sdk_client(url: str | None, state_dir: str | None) -> Any:
    if state_dir is None:
        config_file = click.get_current_context().meta.get("rcp.config_file")
        state_dir = str(load_cfg(config_file, ()).state_path)
    try:
        return Client(url=url, state_dir=state_dir)
    except ApiError as exc:
        fail(exc.message)


def api_call(call: Callable[[], Any]) -> Any:
    """Run an SDK call; an API refusal prints the server's message and exits 2 (bad input) or 1."""
    try:
        return call()
    except ApiError as exc:
        fail(str(exc), 2 if 400 <= exc.status < 500 and exc.status != 401 else 1)
