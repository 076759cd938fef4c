"""The local cluster's node provider: Ray's fake multi-node provider, each node with a Serve
proxy port of its own.

Every simulated node shares 127.0.0.1, so their Serve proxies cannot all bind
``serve.http_port``. Ray 2.60's proxy binds ``RAY_SERVE_WORKER_PROXY_HTTP_PORT`` instead when
that variable is in its worker's environment (``ray/serve/_private/proxy.py``,
``apply_per_node_port_overrides``; the head is exempt and binds Serve's own port), and a
worker process inherits its raylet's environment. The fake provider starts every node's
raylet from the autoscaler's process with ``os.environ`` plus a fixed set of variables, so
this provider sets the variable in that process for the moment it starts one node, to a port
of the list `rcp up` allocated (``provider.serve_proxy_ports`` in the autoscaler config, the
same list the state file records and the loopback balancer health-checks).

Owns: which node gets which port (a port no live node of this provider holds, else one that
nothing listens on: a node that died may not have been terminated here yet).
Must not: change anything else about how the fake provider starts or stops nodes.
It runs inside Ray's autoscaler (``monitor.py``), which imports it by its dotted path.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

from controlplane.local.ports import pick_proxy_port, port_in_use

__all__ = ["PROXY_PORT_ENV", "ProxyPortNodeProvider"]

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


class ProxyPortNodeProvider(FakeMultiNodeProvider):
    """``FakeMultiNodeProvider`` whose every worker node's Serve proxy has its own port."""

    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        super().__init__(provider_config, cluster_name)
        self._proxy_ports = [int(p) for p in provider_config.get("serve_proxy_ports", [])]
        self._port_of: dict[str, int] = {}

    def _create_node_with_resources_and_labels(
        self,
        node_config: dict[str, Any],
        tags: dict[str, str],
        count: int,
        resources: dict[str, float],
        labels: dict[str, str],
    ) -> None:
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
