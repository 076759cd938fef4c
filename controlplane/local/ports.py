"""Loopback ports of the local cluster: which are taken, and free ones for a cluster of one's
own (tests, benchmarks) or for listeners that start later (`quiet_loopback_ports`,
`serve_proxy_ports`).
Must not: bind anything but 127.0.0.1 (and ``ray.node_ip`` to probe), or start anything.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence
from pathlib import Path

from controlplane.config import Config
from controlplane.ray_connection import ClusterError

__all__ = [
    "check_ports_free",
    "free_loopback_ports",
    "isolated_overrides",
    "pick_proxy_port",
    "port_in_use",
    "quiet_loopback_ports",
    "quiet_port_ranges",
    "serve_proxy_ports",
]

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL_RANGE = (32768, 60999)
"""Linux's default, used where `EPHEMERAL_RANGE_FILE` cannot be read."""
RAY_WORKER_PORT_RANGE = (10002, 19999)
"""Ray's default ``min_worker_port``..``max_worker_port`` (its workers' gRPC servers)."""
LOWEST_QUIET_PORT = 20000


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def free_loopback_ports(n: int) -> list[int]:
    """`n` distinct TCP ports free on 127.0.0.1 right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def isolated_overrides(state_dir: Path, *extra: str) -> list[str]:
    """Config overrides for a cluster of one's own beside others on this machine (tests,
    benchmarks): its state dir, a free loopback port for every listener (`quiet_loopback_ports`:
    nothing takes one by chance while a restarted head is down), no Serve app and no
    Prometheus (callers that need them turn them on in `extra`)."""
    gcs, dash, client, metrics, serve, edge_admin, s3, api, redis = quiet_loopback_ports(9)
    return [
        f"state_dir={state_dir}",
        f"ray.gcs_port={gcs}",
        f"ray.dashboard_port={dash}",
        f"ray.client_port={client}",
        f"ray.metrics_export_port={metrics}",
        f"serve.http_port={serve}",
        f"serve.edge_admin_port={edge_admin}",
        f"storage.embedded_port={s3}",
        f"api.port={api}",
        f"ray.redis_port={redis}",
        # Modules that test serving turn it on; the others get the whole cluster pool.
        "serve.deploy_app=false",
        # One Prometheus per module would fight over its port; test_observability turns it on.
        "observability.prometheus=false",
        *extra,
    ]


def check_ports_free(cfg: Config) -> None:
    """Raise ClusterError naming every listener of `cfg` whose port is taken on ray.node_ip."""
    ip = cfg.ray.node_ip
    busy = [f"{k}={p}" for k, p in cfg.listener_ports.items() if port_in_use(ip, p)]
    if busy:
        raise ClusterError(
            f"ports already in use on {ip}: {', '.join(busy)}; stop what uses them "
            "or choose other ports (e.g. `rcp up ray.gcs_port=6391`)"
        )


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for ports it picks itself (a bind to port 0, an outgoing connection)."""
    try:
        low, high = (int(x) for x in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL_RANGE
    return low, high


def quiet_port_ranges(
    ephemeral: tuple[int, int], ray_workers: tuple[int, int] = RAY_WORKER_PORT_RANGE
) -> list[range]:
    """Ports from `LOWEST_QUIET_PORT` up that neither the kernel hands out by itself
    (`ephemeral`) nor Ray gives its workers (`ray_workers`): a port chosen there stays free
    while nothing listens on it, unless someone names it.

    >>> quiet_port_ranges((32768, 60999))
    [range(20000, 32768), range(61000, 65536)]
    >>> quiet_port_ranges((1024, 65535))
    []
    """
    taken = sorted([ephemeral, ray_workers])
    ranges: list[range] = []
    start = LOWEST_QUIET_PORT
    for low, high in taken:
        if low > start:
            ranges.append(range(start, low))
        start = max(start, high + 1)
    if start <= 65535:
        ranges.append(range(start, 65536))
    return ranges


def quiet_loopback_ports(n: int, rng: random.Random | None = None) -> list[int]:
    """`n` distinct ports free on 127.0.0.1 now, chosen at random in `quiet_port_ranges`
    (ephemeral ones from `free_loopback_ports` for the rest where those ranges run short):
    for a listener that starts later, or again after its process died, so that no process
    the kernel gives "any free port" takes it in between (docs/serving.md)."""
    pick = rng or random.Random()
    pool = [p for r in quiet_port_ranges(ephemeral_port_range()) for p in r]
    chosen: list[int] = []
    for port in pick.sample(pool, min(len(pool), 64 * n)):
        if len(chosen) == n:
            break
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
    # Ephemeral ports lie outside the quiet ranges, so they cannot repeat a chosen one.
    return chosen + free_loopback_ports(n - len(chosen))


def serve_proxy_ports(cfg: Config) -> dict[str, object]:
    """Free loopback ports for the cluster's Serve proxies, as the state file records them:
    ``{"head": port, "nodes": [port, ...]}``, twice as many node ports as the pools can hold
    at once, so a replacement node finds one free while the node it replaces is not yet
    gone (``controlplane.local.provider``)."""
    slots = 2 * (cfg.pools.cluster.num_nodes + cfg.pools.external.max_nodes)
    head, *nodes = quiet_loopback_ports(1 + max(slots, 2))
    return {"head": head, "nodes": nodes}


def pick_proxy_port(
    ports: Sequence[int], held: set[int], listening: set[int] | None = None
) -> int | None:
    """The first port of `ports` that no live node holds (`held`); else the first held one
    that nothing listens on (`listening`: its node died before it was terminated here); None
    when every port is held and answering.

    >>> pick_proxy_port([41001, 41002], held={41001})
    41002
    >>> pick_proxy_port([41001, 41002], held={41001, 41002}, listening={41001})
    41002
    """
    for port in ports:
        if port not in held:
            return port
    for port in ports:
        if listening is not None and port not in listening:
            return port
    return None
