"""The local cluster's S3-protocol object store: moto's server on ``ray.node_ip``.

Owns: starting it (``storage.embedded``) on ``storage.embedded_port`` with the cluster's
environment (so `rcp down` stops it with the rest), its log under ``<state_dir>/logs``, and
creating the bucket once it answers.
Must not: bind anything but ``ray.node_ip``, log storage credentials, or stop it (`rcp down`
does, by the cluster id in its environment).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from controlplane.config import Config
from controlplane.local.readiness import wait_for_port
from controlplane.local.state_file import Endpoint
from controlplane.storage import ensure_bucket

__all__ = ["start_object_store"]


def start_object_store(cfg: Config, env: dict[str, str], log_dir: Path) -> Endpoint:
    """Start the store, wait until it listens, create the bucket; its endpoint."""
    host, port = cfg.ray.node_ip, cfg.storage.embedded_port
    log = open(log_dir / "object-store.log", "ab")  # noqa: SIM115 - owned by the child
    subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    log.close()
    wait_for_port(host, port, 30, "the object store")
    endpoint_url = f"http://{host}:{port}"
    ensure_bucket(cfg, endpoint_url=endpoint_url)
    return Endpoint("storage", endpoint_url)
