"""The local cluster's state file, ``<state_dir>/local-cluster.json``: what `rcp up` records.

Owns: the file's name and its reading and writing (owner-only, `write_private`), the endpoints
`up` announces (`Endpoint`), and what a record says on its own: whether the cluster it names
runs (`is_running`: recorded as running and its GCS answers) and its head's node id
(`head_node_id`). The record holds the cluster id, its start time, Ray's temp dir, the config
it was started with, the endpoints, the Serve proxies' ports (``serve_proxies``), the edge's
pid and, after a restart, the head's new node id.
Must not: start or stop anything, or hold a secret (the Ray token lives in its own file).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.config import Config, from_dict
from controlplane.local.autoscaler import FAKE_HEAD_NODE_ID
from controlplane.local.ports import port_in_use
from controlplane.ray_connection import ClusterError
from controlplane.statefiles import write_private

__all__ = [
    "STATE_FILE",
    "Endpoint",
    "head_node_id",
    "is_running",
    "read_state",
    "state_file_path",
    "write_state",
]

STATE_FILE = "local-cluster.json"


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str


def state_file_path(cfg: Config) -> Path:
    """The state file of the local cluster of `cfg` (under ``state_dir``)."""
    return cfg.state_path / STATE_FILE


def read_state(path: Path) -> dict[str, Any] | None:
    """The record at `path`; None when there is none."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as exc:
        raise ClusterError(
            f"{path} is not valid JSON ({exc}); remove it after checking no cluster runs"
        ) from exc


def write_state(path: Path, state: dict[str, Any]) -> None:
    write_private(path, json.dumps(state, indent=2, sort_keys=True))


def is_running(state: dict[str, Any] | None) -> bool:
    """The record says running and the GCS of the config it names answers."""
    if not state or state.get("status") != "running":
        return False
    cfg = from_dict(state["config"])
    return port_in_use(cfg.ray.node_ip, cfg.ray.gcs_port)


def head_node_id(state: dict[str, Any]) -> str:
    """The Ray node id of the cluster's head now: the fake provider's fixed one until a
    restart gives the head a new one (recorded in the state file)."""
    return str(state.get("head_node_id", FAKE_HEAD_NODE_ID))
