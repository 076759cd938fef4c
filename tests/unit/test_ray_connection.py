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
import controlplane.cli
print(sorted(m for m in ("ray", "torch", "matplotlib") if m in sys.modules))
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
