"""The local cluster's Redis: the store that makes the head's GCS fault tolerant.

With ``ray.gcs_fault_tolerance`` on (the default), `rcp up` starts ``redis-server`` on
``ray.node_ip``:``ray.redis_port`` before the head, and the head's GCS keeps its tables there.
When the head's processes die, the worker nodes' raylets wait for a GCS at the same address
(up to ``ray.gcs_reconnect_timeout_s``); a restarted head reads the cluster back from Redis.

Owns: the Redis config and data under ``<state_dir>/redis`` (owner-only), its password (random
per state dir, in ``<state_dir>/redis-password``, 0600), starting the server and waiting for
an authenticated PING, and the head's Redis settings (`gcs_redis_env`, never the password).
Must not: bind anything but ``ray.node_ip`` (``protected-mode yes``, a password always), put
the password in an environment variable, or stop Redis (`rcp down` does, with the rest).

Ray 2.60 limitation (docs/operations.md): the GCS gets the password on its command line,
readable from ``/proc`` by other users of this machine.
"""

from __future__ import annotations

import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from controlplane.config import Config
from controlplane.ray_connection import ClusterError
from controlplane.statefiles import private_dir, write_private

__all__ = [
    "REDIS_PASSWORD_FILE",
    "LocalRedis",
    "gcs_redis_env",
    "redis_conf",
]

REDIS_PASSWORD_FILE = "redis-password"
REDIS_DIR = "redis"
# appendfsync everysec: a Redis restart loses at most a second of GCS writes, and the GCS
# writes again what it holds in memory.
_APPEND_FSYNC = "everysec"


def redis_conf(host: str, port: int, password: str, data_dir: Path) -> str:
    """redis.conf for the GCS store: loopback bind, protected mode, a password, AOF on."""
    return "\n".join(
        [
            f"bind {host}",
            f"port {port}",
            "protected-mode yes",
            f"requirepass {password}",
            f"dir {data_dir}",
            "appendonly yes",
            f"appendfsync {_APPEND_FSYNC}",
            'save ""',
            "daemonize no",
            "logfile ''",
            "",
        ]
    )


def gcs_redis_env(cfg: Config, cluster_id: str) -> dict[str, str]:
    """The head's environment for a GCS on the local Redis (empty when FT is off): the address
    and a storage namespace per cluster, so a new cluster never reads an old one's tables."""
    if not cfg.ray.gcs_fault_tolerance:
        return {}
    return {
        "RAY_REDIS_ADDRESS": f"{cfg.ray.node_ip}:{cfg.ray.redis_port}",
        "RAY_external_storage_namespace": f"rcp-{cluster_id}",
    }


class LocalRedis:
    """``redis-server`` for one local cluster, its files under ``<state_dir>/redis``."""

    def __init__(self, cfg: Config) -> None:
        self.host = cfg.ray.node_ip
        self.port = cfg.ray.redis_port
        self.work_dir = cfg.state_path / REDIS_DIR
        self.password_file = cfg.state_path / REDIS_PASSWORD_FILE

    def password(self) -> str:
        """The password, made (random, 0600) on first use."""
        if not self.password_file.exists():
            write_private(self.password_file, secrets.token_hex(24) + "\n")
        return self.password_file.read_text().strip()

    def start(self, env: Mapping[str, str], fresh: bool, timeout_s: float = 30.0) -> None:
        """Start the server; `fresh` empties its data first (a new cluster, not a restart)."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise ClusterError(
                "ray.gcs_fault_tolerance needs redis-server (Debian package redis-server; "
                "bash infra/local/install.sh installs it), or turn it off with "
                "ray.gcs_fault_tolerance=false"
            )
        data = private_dir(self.work_dir / "data")
        if fresh:
            for old in data.iterdir():
                if old.is_dir():
                    shutil.rmtree(old)
                else:
                    old.unlink()
        conf = self.work_dir / "redis.conf"
        write_private(conf, redis_conf(self.host, self.port, self.password(), data))
        with open(self.work_dir / "redis.log", "ab") as log:
            subprocess.Popen(
                [binary, str(conf)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ping():
                return
            time.sleep(0.1)
        raise ClusterError(
            f"redis-server did not answer on {self.host}:{self.port} within {timeout_s:.0f}s; "
            f"see {self.work_dir / 'redis.log'}"
        )

    def ping(self) -> bool:
        """True when the server answers an authenticated PING."""
        auth = self.password().encode()
        request = b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n*1\r\n$4\r\nPING\r\n" % (len(auth), auth)
        try:
            with socket.create_connection((self.host, self.port), timeout=1.0) as sock:
                sock.sendall(request)
                reply = b""
                while b"+PONG" not in reply and len(reply) < 256:
                    chunk = sock.recv(256)
                    if not chunk:
                        break
                    reply += chunk
        except OSError:
            return False
        return reply.startswith(b"+OK\r\n+PONG")
