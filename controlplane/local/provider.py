"""The local cluster's node provider: Ray's fake multi-node provider, each node with a Serve
proxy port of its own.

Every simulated node shares 127.0.0.1, so their Serve proxies cannot all bind
``serve.http_port``. Ray 2.60's worker proxy binds ``RAY_SERVE_WORKER_PROXY_HTTP_PORT`` instead
when that is in its environment, which it inherits from its raylet; the fake provider starts
every raylet from the autoscaler's process with ``os.environ``, so this provider sets the
variable there for the moment it starts one node, to a port of the list `rcp up` allocated
(``provider.serve_proxy_ports``).

Owns: which node gets which port, and the local stand-in for a provider's stock-out: while the
stock-out file (`write_stockouts`, `rcp fault stockout`) names a node's ``provider`` label (or,
for the cluster pool's nodes, ``cluster``: no replacement for a node that died), a launch of
its nodes is refused (`StockedOut`, as a cloud without capacity answers).
Must not: change anything else about how the fake provider starts or stops nodes.
It runs inside Ray's autoscaler (``monitor.py``), which imports it by its dotted path.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

from controlplane.local.ports import pick_proxy_port, port_in_use
from controlplane.pools import POOL_LABEL, Pool
from policies.providers import PROVIDER_LABEL

__all__ = [
    "PROXY_PORT_ENV",
    "ProxyPortNodeProvider",
    "StockedOut",
    "read_stockouts",
    "write_stockouts",
]

log = logging.getLogger(__name__)
MAX_STOCKOUT_FILE_BYTES = 65_536

PROXY_PORT_ENV = "RAY_SERVE_WORKER_PROXY_HTTP_PORT"
"""Ray Serve's per-node override of a worker node's proxy port (not the head's)."""

_ENV_LOCK = threading.Lock()


@contextmanager
def _environ(name: str, value: str | None) -> Iterator[None]:
    """`name` set to `value` in this process's environment for the block (unset for None)."""
    with _ENV_LOCK:
        old = os.environ.get(name)
        if value is not None:
            os.environ[name] = value
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old


class StockedOut(RuntimeError):
    """A launch refused: the provider is out of stock (`rcp fault stockout`)."""


def read_stockouts(path: str | Path | None) -> frozenset[str]:
    """The providers the stock-out file names (none when there is no file or it is unreadable:
    a broken file must not stop the pool from scaling)."""
    if not path:
        return frozenset()
    try:
        raw = Path(path).read_bytes()[:MAX_STOCKOUT_FILE_BYTES]
        names = json.loads(raw or b"[]")
    except FileNotFoundError:
        return frozenset()
    except (OSError, ValueError) as exc:
        log.warning("stock-out file %s unreadable, ignored: %s", path, exc)
        return frozenset()
    return (
        frozenset(n for n in names if isinstance(n, str))
        if isinstance(names, list)
        else frozenset()
    )


def write_stockouts(path: str | Path, providers: frozenset[str]) -> None:
    """Replace the stock-out file with `providers` (atomically; 0600)."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(sorted(providers)))
    tmp.chmod(0o600)
    tmp.replace(target)


class ProxyPortNodeProvider(FakeMultiNodeProvider):
    """``FakeMultiNodeProvider`` whose every worker node's Serve proxy has its own port."""

    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        super().__init__(provider_config, cluster_name)
        self._proxy_ports = [int(p) for p in provider_config.get("serve_proxy_ports", [])]
        self._port_of: dict[str, int] = {}
        self._stockout_file = provider_config.get("stockout_file")

    def _create_node_with_resources_and_labels(
        self,
        node_config: dict[str, Any],
        tags: dict[str, str],
        count: int,
        resources: dict[str, float],
        labels: dict[str, str],
    ) -> None:
        provider = labels.get(PROVIDER_LABEL)
        if provider is None and labels.get(POOL_LABEL) == Pool.CLUSTER.value:
            provider = Pool.CLUSTER.value  # the owned pool's replacements
        if provider is not None and provider in read_stockouts(self._stockout_file):
            # Refused, as a cloud answers a launch it has no capacity for: the autoscaler
            # marks the request failed and asks again later (a request dropped in silence
            # would wait out its 10-minute allocation timeout, even after the stock-out).
            raise StockedOut(f"provider {provider} is out of stock: no node launched")
        with self.lock:
            held = set(self._port_of.values())
            listening = {p for p in self._proxy_ports if p in held and port_in_use("127.0.0.1", p)}
            port = pick_proxy_port(self._proxy_ports, held, listening)
            before = set(self._nodes)
            # No port left: the proxy binds Serve's port beside the head's (SO_REUSEPORT).
            with _environ(PROXY_PORT_ENV, None if port is None else str(port)):
                super()._create_node_with_resources_and_labels(  # type: ignore[no-untyped-call]
                    node_config, tags, count, resources, labels
                )
            for node_id in set(self._nodes) - before:
                if port is not None:
                    self._port_of = {n: p for n, p in self._port_of.items() if p != port}
                    self._port_of[node_id] = port

    def terminate_node(self, node_id: str) -> Any:
        with self.lock:
            self._port_of.pop(node_id, None)
            return super().terminate_node(node_id)  # type: ignore[no-untyped-call]
