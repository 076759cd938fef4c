"""Local mode's Ray connection keeps a loopback address on loopback, whatever was imported first.

Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` when it is first imported; on Linux it then
rewrites ``127.0.0.1`` into the host's own IP, where the local cluster does not listen. The
``rcp`` CLI imports Ray (through `jobs.signals`) before it connects, so `rcp demo` waited on
that address for good. Each case runs in a fresh interpreter without the variable (this test
suite's conftest sets it for its own process).
"""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import sys
import controlplane.cli  # the CLI's own imports load Ray first, as `rcp` does
assert "ray" in sys.modules, "the premise: the CLI imports Ray before it connects"
from ray._private import services
from controlplane.ray_connection import keep_ray_on_loopback
keep_ray_on_loopback(sys.argv[1])
print(services.canonicalize_bootstrap_address(sys.argv[1] + ":6390"))
"""


def run_fresh(node_ip: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, node_ip],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def test_a_process_that_imported_ray_first_still_reaches_a_loopback_cluster() -> None:
    assert run_fresh("127.0.0.1") == "127.0.0.1:6390"
