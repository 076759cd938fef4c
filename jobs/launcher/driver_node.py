"""The Ray Job's driver attaches to the Ray node it runs on, never to the head by default.

Owns: finding the raylet the driver's process descends from (`own_raylet_node_id`: the Ray
Jobs supervisor that started the driver is a worker process of that raylet) and connecting
the driver to Ray through that raylet (`connect_driver`).

Why: Ray Train places a gang's controller (``TrainController``), its ``SynchronizationActor``
and ``DatasetManager`` on the driver's node, and the driver is on the node whose raylet it
connected to, not where its process runs. ``ray.init()`` picks among the raylets of its
machine, the head's first when there is one (Ray 2.60,
``ray._private.services.get_node_to_connect_for_driver``). On Kubernetes a cluster-pool pod
runs one raylet, so the driver is attached there; in local mode every node shares one
machine, so every driver was attached to the head, its gang's controller ran on the head, and
killing the head ended every running gang (issue 26). Here the driver sees only its own
raylet, as on Kubernetes.

Must not: import Ray at module level (the driver sets ``RAY_DEDUP_LOGS`` before Ray is first
imported), or change how anything but the driver's own connection picks its raylet.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import psutil

__all__ = [
    "RAYLET_NODE_ID_FLAG",
    "connect_driver",
    "only_raylet",
    "own_raylet_node_id",
    "raylet_node_id",
]

RAYLET_NODE_ID_FLAG = "--node_id="
"""How a raylet's command line names its node (what Ray itself reads, `find_node_ids`)."""


def raylet_node_id(cmdline: Sequence[str]) -> str | None:
    """The node id a raylet's command line names; None for any other process::

    raylet_node_id([".../ray/core/src/ray/raylet/raylet", "--node_id=ab12", ...]) -> "ab12"
    raylet_node_id(["python", "-m", "x", "--node_id=ab12"])                      -> None
    """
    if not cmdline or os.path.basename(cmdline[0]) != "raylet":
        return None
    for arg in cmdline[1:]:
        if arg.startswith(RAYLET_NODE_ID_FLAG):
            return arg[len(RAYLET_NODE_ID_FLAG) :] or None
    return None


def own_raylet_node_id() -> str | None:
    """The node id of the nearest raylet among this process's ancestors (a Ray Job's driver:
    the raylet that started its supervisor), or None when no raylet started it."""
    for proc in psutil.Process().parents():
        try:
            node_id = raylet_node_id(proc.cmdline())
        except psutil.Error:  # gone, or not ours to read: not the raylet we look for
            continue
        if node_id is not None:
            return node_id
    return None


@contextmanager
def only_raylet(node_id: str) -> Iterator[None]:
    """While open, a driver connecting to Ray (``ray.init()``) finds only the raylet of
    `node_id` on this machine: Ray still asks the GCS for that node (alive, its sockets), but
    no other raylet of the machine, the head's included, is a candidate."""
    from ray._private import services  # deferred: see the module doc

    name = "find_node_ids"
    original: Callable[[], list[str]] = getattr(services, name)
    setattr(services, name, lambda: [node_id])
    try:
        yield
    finally:
        setattr(services, name, original)


def connect_driver() -> str | None:
    """Connect this Ray Job driver to Ray through the raylet it runs under (``ray.init()``
    with the cluster address Ray Jobs set); returns that node's id. None, and nothing done,
    outside a Ray node (a script tried on a laptop: Ray Train starts a local Ray itself)."""
    node_id = own_raylet_node_id()
    if node_id is None:
        return None
    import ray  # deferred: see the module doc

    with only_raylet(node_id):
        ray.init()
    return node_id
