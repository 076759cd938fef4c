"""`rcp whoami` and `rcp users add | list | remove | rotate-token | recover-admin`: who may
use the API.

Owns: printing what the API's user routes answer, and `recover-admin`, the break-glass way
back when no admin can sign in: it opens the job store itself
(`controlplane.api.identity.recover_admin`) and needs no API and no token. A new token is
printed once, to stdout, and nowhere else. Must not: reach the store in any other command.
"""

from __future__ import annotations

import getpass
import json
import socket
from pathlib import Path

import click

from controlplane.api.identity import BOOTSTRAP_ADMIN, recover_admin
from controlplane.cli.common import api_call, client_options, fail, load_cfg, sdk_client
from controlplane.cli.render import local_time, text_table
from controlplane.store import Store, StoreError

__all__ = ["users_group", "whoami"]

ROLES = ("researcher", "operator", "admin")


@click.command()
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def whoami(url: str | None, state_dir: str | None, as_json: bool) -> None:
    """The user, role and queues of the token in use; per queue its share of the cluster pool,
    the GPUs its gangs hold, its jobs running and queued, and the caller's own part."""
    client = sdk_client(url, state_dir)
    me = api_call(lambda: client.whoami())
    if as_json:
        click.echo(json.dumps(me))
        return
    click.echo(f"{me['name']} ({me['role']}), queues: {', '.join(me['queues']) or '-'}")
    shares = me.get("shares") or []
    if shares:
        header = ("QUEUE", "SHARE", "NOMINAL GPUS", "GPUS HELD", "RUNNING", "QUEUED", "YOURS")
        rows: list[tuple[str, ...]] = [
            (
                str(q["queue"]),
                f"{100 * q['share']:g}%",
                f"{q['nominal_gpus']:g}",
                str(q["used_gpus"]),
                str(q["running"]),
                str(q["queued"]),
                f"{q['mine']['used_gpus']} GPUs, {q['mine']['running']} running, "
                f"{q['mine']['queued']} queued",
            )
            for q in shares
        ]
        click.echo(text_table(rows, header))


@click.group("users")
def users_group() -> None:
    """Users of the API, their roles and tokens (admins only)."""


@users_group.command("add")
@client_options
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), required=True, help="What the user may do.")
@click.option(
    "--queue",
    "queues",
    multiple=True,
    help="A queue the user may submit to (repeat for several; '*' for every queue).",
)
@click.option("--expires-in-s", type=float, help="The token stops working after this long.")
@click.option("--json", "as_json", is_flag=True, help="Print the user and token as JSON.")
def users_add(
    url: str | None,
    state_dir: str | None,
    name: str,
    role: str,
    queues: tuple[str, ...],
    expires_in_s: float | None,
    as_json: bool,
) -> None:
    """Add a user; prints their token, this once."""
    client = sdk_client(url, state_dir)
    user = api_call(lambda: client.users_add(name, role, queues, expires_in_s=expires_in_s))
    _print_token(user, as_json)


@users_group.command("list")
@client_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def users_list(url: str | None, state_dir: str | None, as_json: bool) -> None:
    """Every user: role, queues, when their token was issued and when it expires."""
    client = sdk_client(url, state_dir)
    users = api_call(lambda: client.users_list())
    if as_json:
        click.echo(json.dumps([_user_json(u) for u in users], indent=2))
        return
    rows: list[tuple[str, ...]] = [
        (
            u.name,
            u.role,
            ",".join(u.queues) or "-",
            local_time(u.rotated_s),
            local_time(u.expires_s, "never"),
        )
        for u in users
    ]
    click.echo(text_table(rows, ("NAME", "ROLE", "QUEUES", "TOKEN ISSUED", "EXPIRES")))


@users_group.command("remove")
@client_options
@click.argument("name")
def users_remove(url: str | None, state_dir: str | None, name: str) -> None:
    """Remove a user; their token stops working at once (not the last admin)."""
    client = sdk_client(url, state_dir)
    user = api_call(lambda: client.users_remove(name))
    click.echo(f"removed {user.name} ({user.role})")


@users_group.command("rotate-token")
@client_options
@click.argument("name")
@click.option("--expires-in-s", type=float, help="The new token stops working after this long.")
@click.option("--json", "as_json", is_flag=True, help="Print the user and token as JSON.")
def users_rotate_token(
    url: str | None, state_dir: str | None, name: str, expires_in_s: float | None, as_json: bool
) -> None:
    """Give a user a new token (printed this once); the old one stops working at once."""
    client = sdk_client(url, state_dir)
    user = api_call(lambda: client.users_rotate_token(name, expires_in_s=expires_in_s))
    _print_token(user, as_json)


@users_group.command("recover-admin")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    envvar="RCP_CONFIG",
    help="The YAML config the controller runs with: its job store is opened (env: RCP_CONFIG).",
)
@click.option(
    "--state-dir",
    envvar="RCP_STATE_DIR",
    default=None,
    help="The controller's state dir, holding controlplane.db (env: RCP_STATE_DIR; default: "
    "the state_dir of --config, else ~/.rcp).",
)
@click.option(
    "--name",
    default=BOOTSTRAP_ADMIN,
    show_default=True,
    help="The admin to restore (or create): an admin, or a name no user has.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the admin and token as JSON.")
def users_recover_admin(
    config_file: str | None, state_dir: str | None, name: str, as_json: bool
) -> None:
    """Restore an admin when no admin can sign in; prints its new token, this once.

    Run it on the controller's host (on KubeRay: in the head pod's rcp-controller container),
    where the job store is: it opens the store itself and needs neither the API nor a token.
    The admin gets a token that never expires (its old one stops at once); a running
    controller accepts it on the next request. The audit event audit.users.recover-admin
    names the admin, and who ran this where."""
    cfg = load_cfg(config_file, (f"state_dir={state_dir}",) if state_dir else ())
    path = Path(cfg.jobs_db_path)
    if not path.is_file():
        fail(
            f"no job store at {path}: run this on the controller's host, with the --config "
            "or --state-dir the controller runs with",
            2,
        )
    actor = f"{getpass.getuser()}@{socket.gethostname()} (rcp users recover-admin)"
    try:
        with Store(path) as store:
            user, token, created = recover_admin(store, name, actor)
    except ValueError as exc:
        fail(str(exc), 2)
        return
    except StoreError as exc:
        fail(str(exc))
        return
    if as_json:
        click.echo(json.dumps({**_user_json(user), "token": token, "created": created}))
        return
    click.echo(token)
    what = "created" if created else "restored: its old token no longer works"
    click.echo(
        f"(the token of admin {user.name}, {what}; it never expires. Shown this once: keep "
        "it private, or hand it to the admin who will add the others)",
        err=True,
    )


def _user_json(user: object) -> dict[str, object]:
    keys = ("name", "role", "queues", "created_s", "rotated_s", "expires_s")
    return {k: list(v) if isinstance(v := getattr(user, k), tuple) else v for k in keys}


def _print_token(user: object, as_json: bool) -> None:
    token = getattr(user, "token", None)
    if as_json:
        click.echo(json.dumps({**_user_json(user), "token": token}))
        return
    click.echo(token)
    click.echo(
        f"(the token of {getattr(user, 'name', '?')}, {getattr(user, 'role', '?')}: shown "
        "this once; hand it over privately)",
        err=True,
    )
