"""The Ray Job's driver attaches to its own node's raylet (issue 26, `jobs.launcher.driver_node`).

No Ray is started: Ray's own choice of raylet (``get_node_to_connect_for_driver``) runs
against a fake GCS that holds three live nodes on one machine, as in local mode; the raylet
ancestry is read from real processes (a Python under the name ``raylet``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ray._private import services
from ray.core.generated.gcs_pb2 import GcsNodeInfo

from jobs.launcher.driver_node import only_raylet, own_raylet_node_id, raylet_node_id

RAYLET = "/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet"


@pytest.mark.parametrize(
    "cmdline, node_id",
    [
        ([RAYLET, "--raylet_socket_name=/s", "--node_id=ab12", "--x=1"], "ab12"),
        (["raylet", "--node_id=ab12"], "ab12"),
        ([RAYLET, "--raylet_socket_name=/s"], None),
        ([RAYLET, "--node_id="], None),
        (["python", "-m", "ray.dashboard.agent", "--node_id=ab12"], None),
        (["/bin/raylets", "--node_id=ab12"], None),
        ([], None),
    ],
    ids=[
        "a raylet",
        "a raylet on PATH",
        "a raylet without its flag",
        "an empty node id",
        "another process naming a node",
        "a name that only starts like it",
        "no command line (a zombie)",
    ],
)
def test_a_raylets_command_line_names_its_node(cmdline: list[str], node_id: str | None) -> None:
    assert raylet_node_id(cmdline) == node_id


def test_a_process_started_under_a_raylet_finds_that_raylets_node(tmp_path: Path) -> None:
    """raylet (node n-7) -> a worker -> the driver: the driver names n-7; a process that no
    raylet started (this test) names none."""
    raylet = tmp_path / "raylet"
    raylet.symlink_to(sys.executable)
    driver = "from jobs.launcher.driver_node import own_raylet_node_id; print(own_raylet_node_id())"
    # The "raylet" is a bare Python (outside the venv); the worker it starts runs this venv's.
    worker = (
        f"import subprocess; subprocess.run([{sys.executable!r}, '-c', {driver!r}], check=True)"
    )
    out = subprocess.run(
        [str(raylet), "-c", worker, "--node_id=n-7"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert out.strip() == "n-7"
    assert own_raylet_node_id() is None


HEAD, OWN, OTHER = (f"{i:02x}" * 28 for i in (1, 2, 3))


class FakeGcs:
    """Three live nodes on 127.0.0.1: the head, the driver's own node and another."""

    def get_all_node_info(
        self, timeout: float, node_selectors: list[Any], state_filter: int
    ) -> dict[bytes, GcsNodeInfo]:
        wanted = {s.node_id for s in node_selectors}
        nodes = {
            bytes.fromhex(n): GcsNodeInfo(
                node_id=bytes.fromhex(n),
                node_manager_address="127.0.0.1",
                is_head_node=n == HEAD,
                state=GcsNodeInfo.GcsNodeState.ALIVE,
            )
            for n in (HEAD, OWN, OTHER)
        }
        return {k: v for k, v in nodes.items() if k in wanted}


def every_raylet() -> list[str]:
    return [HEAD, OWN, OTHER]


@pytest.mark.parametrize(
    "only, attached",
    [(None, HEAD), (OWN, OWN), (OTHER, OTHER)],
    ids=[
        "ray's own choice among a machine's raylets: the head",
        "only_raylet: the driver's own node",
        "only_raylet: whichever node it names",
    ],
)
def test_a_driver_attaches_to_the_raylet_it_names_not_the_head(
    monkeypatch: pytest.MonkeyPatch, only: str | None, attached: str
) -> None:
    monkeypatch.setattr(services, "find_node_ids", every_raylet)
    gcs: Any = FakeGcs()
    if only is None:
        info = services.get_node_to_connect_for_driver(gcs, timeout_seconds=5)
    else:
        with only_raylet(only):
            info = services.get_node_to_connect_for_driver(gcs, timeout_seconds=5)
        assert services.find_node_ids is every_raylet  # put back once connected
    assert info.node_id.hex() == attached
