"""Memory tiers: the newest snapshot of each rank, kept in host memory for a fast restore.

Owns where that copy lives: in this process (`InProcessMemoryTier`, which survives a restart
of the training loop inside the same worker) or in a small named Ray actor on another node than
the rank that wrote it (`RayMemoryTier`, which survives the death of the worker and of its
node). A tier is only a cache, fed only with snapshots already durable in storage: restore
uses it only when it holds exactly the committed step and its bytes match the checksums.

It must not decide anything about storage or restore order (see `engine`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from policies.snapshot import POOL_LABEL, Pool

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "rcp-checkpoints"
NODE_ID_LABEL = "ray.io/node-id"
"""The label Ray gives every node: its node id (hex)."""
DEFAULT_POOL_SELECTOR: Mapping[str, str] = {POOL_LABEL: Pool.CLUSTER.value}
"""Holders go to the cluster pool; never to the head (pool=head), where jobs' drivers run."""
DEFAULT_PUT_TIMEOUT_S = 60.0
_NAME_RELEASE_WAIT_S = 10.0


@dataclass(frozen=True)
class HeldSnapshot:
    """One rank's snapshot as a memory tier keeps it."""

    step: int
    index: bytes
    payload: memoryview


class MemoryTier(Protocol):
    """Keeps the newest snapshot of each rank.

    `put` must have copied `payload` when it returns: the engine reuses the buffer. `clear`
    drops every held snapshot; what it returns (`RayMemoryTier` counts holders) is the tier's.
    """

    def put(self, rank: int, step: int, index: bytes, payload: memoryview) -> None: ...

    def get(self, rank: int) -> HeldSnapshot | None: ...

    def clear(self) -> object: ...


class InProcessMemoryTier:
    """Holds each rank's newest snapshot in a reusable buffer of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, tuple[int, bytes, bytearray, int]] = {}

    def put(self, rank: int, step: int, index: bytes, payload: memoryview) -> None:
        with self._lock:
            old = self._held.get(rank)
            buffer = old[2] if old is not None and len(old[2]) >= len(payload) else None
            if buffer is None:
                buffer = bytearray(len(payload))
            memoryview(buffer)[: len(payload)] = payload
            self._held[rank] = (step, bytes(index), buffer, len(payload))

    def get(self, rank: int) -> HeldSnapshot | None:
        with self._lock:
            held = self._held.get(rank)
        if held is None:
            return None
        step, index, buffer, size = held
        return HeldSnapshot(step, index, memoryview(buffer)[:size])

    def clear(self) -> None:
        with self._lock:
            self._held.clear()


# ------------------------------------------------------------------ placement (pure)


def holder_name(name_prefix: str, rank: int) -> str:
    """The Ray actor name of `rank`'s holder: ``<name_prefix>/rank-<R:05d>``."""
    return f"{name_prefix}/rank-{rank:05d}"


def holder_label_selector(pool_selector: Mapping[str, str], writer_node_id: str) -> dict[str, str]:
    """The label selector of a holder: the pool's labels, and not the writer's node.

    Example: ``({"pool": "cluster"}, "ab12")`` -> ``{"pool": "cluster",
    "ray.io/node-id": "!ab12"}``.
    """
    return {**pool_selector, NODE_ID_LABEL: f"!{writer_node_id}"}


def label_matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    """Whether a node's labels satisfy a Ray label selector.

    Values are ``v`` (equals), ``!v`` (absent or different), ``in(a,b)`` and ``!in(a,b)``.
    """
    for key, wanted in selector.items():
        value = labels.get(key)
        negate = wanted.startswith("!")
        expr = wanted[1:] if negate else wanted
        if expr.startswith("in(") and expr.endswith(")"):
            options = {v.strip() for v in expr[3:-1].split(",")}
        else:
            options = {expr}
        if (value in options) == negate:
            return False
    return True


def peer_nodes(
    nodes: Iterable[Mapping[str, Any]], pool_selector: Mapping[str, str], writer_node_id: str
) -> list[str]:
    """Ids of live nodes (as `ray.nodes()` lists them) a holder for this writer may go to."""
    selector = holder_label_selector(pool_selector, writer_node_id)
    return [
        str(node["NodeID"])
        for node in nodes
        if node.get("Alive")
        and label_matches({NODE_ID_LABEL: str(node["NodeID"]), **node.get("Labels", {})}, selector)
    ]


# ------------------------------------------------------------------------ Ray holders


class _Holder:
    """Ray actor body: keeps one rank's newest snapshot in its own reusable buffer.

    The bytes are copied out of the object store on arrival: an object stays owned by the
    process that sent it, and is lost with it, which is exactly the failure this copy is for.
    """

    def __init__(self) -> None:
        self._step: int | None = None
        self._index = b""
        self._buffer = bytearray()
        self._size = 0

    def node_id(self) -> str:
        import ray  # deferred: this runs inside the actor, where Ray is always present

        return str(ray.get_runtime_context().get_node_id())

    def put(self, step: int, index: bytes, payload: np.ndarray) -> str:
        self._step = None
        size = int(payload.nbytes)
        if len(self._buffer) < size:
            self._buffer = bytearray()  # free the old one before allocating the new one
            self._buffer = bytearray(size)
        np.copyto(np.frombuffer(self._buffer, np.uint8, size), payload.reshape(-1))
        self._step, self._index, self._size = step, index, size
        return self.node_id()

    def get(self) -> tuple[int, bytes, np.ndarray] | None:
        if self._step is None:
            return None
        return self._step, self._index, np.frombuffer(self._buffer, np.uint8, self._size)


@functools.cache
def _holder_class() -> Any:
    import ray  # deferred: heavy, and only this tier needs it

    return ray.remote(num_cpus=0, max_restarts=0)(_Holder)


class MemoryTierUnavailableError(Exception):
    """The memory tier could not keep a snapshot; storage still has it."""


class RayMemoryTier:
    """Keeps each rank's newest snapshot in a detached Ray actor on another node.

    The holder of rank R is named ``<name_prefix>/rank-<R:05d>`` in `namespace`, takes no
    CPU, and is placed by `label_selector` (default ``pool=cluster``) on a node other than
    the writer's. A restarted worker of the same run finds it by name. A holder found on the
    writer's own node (a writer that moved, or an older placement) is killed and created
    again elsewhere. With no other eligible node alive the tier keeps nothing and says so
    once; a holder that cannot be placed or answer within `put_timeout_s` is killed and the
    put fails (the engine logs it and goes on). Call `clear(world_size)` or
    `clear_job_memory_tier` when the run ends for good.
    """

    def __init__(
        self,
        name_prefix: str,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        label_selector: Mapping[str, str] | None = None,
        put_timeout_s: float = DEFAULT_PUT_TIMEOUT_S,
    ) -> None:
        if not name_prefix:
            raise ValueError("RayMemoryTier needs a non-empty name_prefix (the run's name)")
        selector = dict(DEFAULT_POOL_SELECTOR if label_selector is None else label_selector)
        if NODE_ID_LABEL in selector:
            raise ValueError(
                f"label_selector must not set {NODE_ID_LABEL!r}: the tier sets it to keep "
                "each holder off its writer's node"
            )
        if put_timeout_s <= 0:
            raise ValueError(f"put_timeout_s must be > 0, got {put_timeout_s}")
        self.name_prefix = name_prefix
        self.namespace = namespace
        self.label_selector = selector
        self.put_timeout_s = put_timeout_s
        self._holder_nodes: dict[int, str] = {}
        """Rank -> the node its holder was last seen on, by this process."""
        self._warned_no_peer = False

    def _name(self, rank: int) -> str:
        return holder_name(self.name_prefix, rank)

    def actor_options(self, rank: int, writer_node_id: str) -> dict[str, Any]:
        """The Ray options a new holder of `rank` is created with."""
        return {
            "name": self._name(rank),
            "namespace": self.namespace,
            "lifetime": "detached",
            "get_if_exists": True,
            "num_cpus": 0,
            "max_restarts": 0,
            "label_selector": holder_label_selector(self.label_selector, writer_node_id),
        }

    def _lookup(self, rank: int) -> Any:
        import ray  # deferred: heavy, and only this tier needs it

        try:
            return ray.get_actor(self._name(rank), namespace=self.namespace)
        except ValueError:
            return None

    def _kill(self, rank: int, actor: Any) -> None:
        """Kill a holder and wait (bounded) until its name can be taken again."""
        import ray  # deferred: heavy, and only this tier needs it

        self._holder_nodes.pop(rank, None)
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        deadline_s = time.monotonic() + _NAME_RELEASE_WAIT_S
        while self._lookup(rank) is not None and time.monotonic() < deadline_s:
            time.sleep(0.05)

    def _holder_off_node(self, rank: int, writer_node_id: str) -> Any:
        """A holder of `rank` on another node than the writer's, or None when none can be."""
        import ray  # deferred: heavy, and only this tier needs it

        actor = self._lookup(rank)
        if actor is not None:
            node = self._holder_nodes.get(rank)
            if node is None:
                try:
                    node = ray.get(actor.node_id.remote(), timeout=self.put_timeout_s)
                except ray.exceptions.RayError:
                    node = None  # dead, or never placed
            if node is not None and node != writer_node_id:
                self._holder_nodes[rank] = node
                return actor
            logger.info(
                "memory tier %s: re-placing the holder (was %s) off the writer's node %s",
                self._name(rank),
                "unreachable" if node is None else f"on node {node[:12]}",
                writer_node_id[:12],
            )
            self._kill(rank, actor)
        nodes: list[dict[str, Any]] = ray.nodes()
        if not peer_nodes(nodes, self.label_selector, writer_node_id):
            if not self._warned_no_peer:
                self._warned_no_peer = True
                logger.warning(
                    "memory tier %s: no live node with labels %s other than the writer's "
                    "(%s); snapshots of this rank are kept in object storage only",
                    self._name(rank),
                    self.label_selector,
                    writer_node_id[:12],
                )
            return None
        return _holder_class().options(**self.actor_options(rank, writer_node_id)).remote()

    def put(self, rank: int, step: int, index: bytes, payload: memoryview) -> None:
        import ray  # deferred: heavy, and only this tier needs it

        writer_node_id = ray.get_runtime_context().get_node_id()
        actor = self._holder_off_node(rank, writer_node_id)
        if actor is None:
            return
        array = np.frombuffer(payload, dtype=np.uint8)
        try:
            node = ray.get(actor.put.remote(step, bytes(index), array), timeout=self.put_timeout_s)
        except ray.exceptions.RayError as exc:
            self._kill(rank, actor)
            raise MemoryTierUnavailableError(
                f"memory tier {self._name(rank)} did not keep step {step} within "
                f"put_timeout_s={self.put_timeout_s} (no eligible node with labels "
                f"{self.label_selector} other than {writer_node_id[:12]}, or it failed): {exc}"
            ) from exc
        self._holder_nodes[rank] = node

    def get(self, rank: int) -> HeldSnapshot | None:
        import ray  # deferred: heavy, and only this tier needs it

        actor = self._lookup(rank)
        if actor is None:
            return None
        try:
            held = ray.get(actor.get.remote(), timeout=self.put_timeout_s)
        except ray.exceptions.RayError as exc:
            logger.info("memory tier %s unreachable: %s", self._name(rank), exc)
            return None
        if held is None:
            return None
        step, index, array = held
        return HeldSnapshot(step, index, np.ascontiguousarray(array).data.cast("B"))

    def clear_rank(self, rank: int) -> bool:
        """Stop the actor holding `rank`'s snapshot; False when there was none."""
        import ray  # deferred: heavy, and only this tier needs it

        self._holder_nodes.pop(rank, None)
        actor = self._lookup(rank)
        if actor is None:
            return False
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
        return True

    def clear(self, world_size: int = 1) -> int:
        """Stop the holders of ranks 0..world_size-1; returns how many there were."""
        return sum(self.clear_rank(rank) for rank in range(world_size))


def clear_job_memory_tier(
    name_prefix: str, world_size: int | None = None, *, namespace: str = DEFAULT_NAMESPACE
) -> int:
    """Kill every holder of a run by name; returns how many there were.

    For the control plane when a job ends. Holders are found among the named actors of
    `namespace` (``<name_prefix>/rank-*``, whatever the world size was) and, when
    `world_size` is given, also looked up as ranks 0..world_size-1. Works from any connected
    Ray driver, not only the job's; missing or already dead holders are skipped.
    """
    if not name_prefix:
        raise ValueError("clear_job_memory_tier needs a non-empty name_prefix (the run's name)")
    if world_size is not None and world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    import ray  # deferred: heavy, and only this tier needs it

    names = {
        str(actor.get("name", ""))
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor.get("namespace") == namespace
        and str(actor.get("name", "")).startswith(f"{name_prefix}/rank-")
    }
    names.update(holder_name(name_prefix, rank) for rank in range(world_size or 0))
    killed = 0
    for name in sorted(names):
        try:
            actor = ray.get_actor(name, namespace=namespace)
        except ValueError:  # gone meanwhile, or never there
            continue
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
            killed += 1
    return killed
