"""Local mode's Ray connection keeps a loopback address on loopback, whatever was imported first,
and the CLI's job commands do not load Ray at all (nor torch, nor matplotlib: `rcp timeline`
loads it only to draw).

Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` when it is first imported; on Linux it then
rewrites ``127.0.0.1`` into the host's own IP, where the local cluster does not listen. When the
``rcp`` CLI imported Ray at load (through the local cluster and the runner), `rcp demo` waited
on that address for good, and every `rcp status` paid seconds for Ray. Each case runs in a
fresh interpreter without the variable (this test suite's conftest sets it for its own process).
"""

from __future__ import annotations

import os
import subprocess
import sys

CONNECT_AFTER_RAY = """
import sys
import ray  # a process that loaded Ray before it connects
from ray._private import services
from controlplane.ray_connection import keep_ray_on_loopback
keep_ray_on_loopback(sys.argv[1])
print(services.canonicalize_bootstrap_address(sys.argv[1] + ":6390"))
"""

CLI_LOAD = """
import sys
from controlplane.cli import cli
for name in cli.list_commands(None):  # every command's module, as `rcp --help` loads them
    cli.get_command(None, name)
print(sorted(m for m in ("ray", "torch", "matplotlib") if m in sys.modules))
"""

ONE_COMMAND_LOAD = """
import sys
from controlplane.cli import cli
cli.get_command(None, sys.argv[1])
print(sorted(m for m in sys.argv[2:] if m in sys.modules))
"""


def run_fresh(script: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def test_a_process_that_imported_ray_first_still_reaches_a_loopback_cluster() -> None:
    assert run_fresh(CONNECT_AFTER_RAY, "127.0.0.1") == "127.0.0.1:6390"


def test_loading_the_cli_loads_neither_ray_nor_torch_nor_matplotlib() -> None:
    assert run_fresh(CLI_LOAD) == "[]"


def test_one_command_loads_only_its_own_module() -> None:
    """`rcp status` loads neither the simulator, the local cluster, the identity store nor
    aiohttp (every call paid about a second for them when the CLI loaded every command)."""
    heavy = ["controlplane.simulate", "controlplane.local.cluster", "controlplane.api.identity"]
    assert run_fresh(ONE_COMMAND_LOAD, "status", *heavy, "aiohttp") == "[]"
    assert run_fresh(ONE_COMMAND_LOAD, "simulate", "controlplane.simulate") == (
        "['controlplane.simulate']"
    )


def test_every_command_a_cli_module_defines_is_named_in_the_group() -> None:
    """A top-level command added to a ``controlplane.cli`` module and not to `COMMANDS` would
    never be reachable; each name resolves to the command of that name."""
    import importlib
    import pkgutil

    import click

    import controlplane.cli as cli_pkg

    named = {(mod, attr) for mod, attr in cli_pkg.COMMANDS.values()}
    for info in pkgutil.iter_modules(cli_pkg.__path__):
        if info.name.startswith("_"):
            continue  # __main__ runs the CLI
        module = importlib.import_module(f"controlplane.cli.{info.name}")
        objects = {k: v for k, v in vars(module).items() if isinstance(v, click.Command)}
        nested = {
            id(sub)
            for group in objects.values()
            if isinstance(group, click.Group)
            for sub in group.commands.values()
        }
        for attr, command in objects.items():
            if (
                id(command) in nested
                or getattr(command.callback, "__module__", "") != module.__name__
            ):
                continue  # a group's subcommand, or one imported from elsewhere
            assert (info.name, attr) in named, (
                f"controlplane.cli.{info.name}.{attr} is not in COMMANDS"
            )
    for name in cli_pkg.COMMANDS:
        assert cli_pkg.cli.get_command(None, name).name == name  # type: ignore[union-attr]
