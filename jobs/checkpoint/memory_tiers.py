"""Memory tiers: the newest snapshot of each rank, kept in host memory for a fast restore.

This module owns where that copy lives: in this process (`InProcessMemoryTier`, which
survives a restart of the training loop inside the same worker) or in a small named Ray
actor on the same node (`RayMemoryTier`, which survives the death of the worker process
as long as the node lives). A memory tier is only a cache: restore uses it only when it
holds exactly the step the newest committed manifest names and its bytes match the
committed checksums; otherwise restore reads object storage.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class HeldSnapshot:
    """One rank's snapshot as a memory tier keeps it."""

    step: int
    index: bytes
    payload: memoryview


class MemoryTier(Protocol):
    """Keeps the newest snapshot of each rank."""

    def put(self, rank: int, step: int, index: bytes, payload: memoryview) -> None: ...

    def get(self, rank: int) -> HeldSnapshot | None: ...

    def clear(self) -> None: ...


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


class _Holder:
    """Ray actor body: keeps one rank's newest snapshot (zero-copy in the object store)."""

    def __init__(self) -> None:
        self._held: tuple[int, bytes, Any] | None = None

    def put(self, step: int, index: bytes, payload: Any) -> None:
        self._held = (step, index, payload)

    def get(self) -> tuple[int, bytes, Any] | None:
        return self._held


class RayMemoryTier:
    """Keeps each rank's newest snapshot in a detached Ray actor on the saving node.

    Actors are named ``<name_prefix>/rank-<R>`` in `namespace`; a restarted worker of the
    same run finds them by name. Call `clear()` when the run ends for good.
    """

    def __init__(self, name_prefix: str, *, namespace: str = "rcp-checkpoints") -> None:
        if not name_prefix:
            raise ValueError("RayMemoryTier needs a non-empty name_prefix (the run's name)")
        self.name_prefix = name_prefix
        self.namespace = namespace

    def _name(self, rank: int) -> str:
        return f"{self.name_prefix}/rank-{rank:05d}"

    def _actor(self, rank: int, *, create: bool) -> Any:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        try:
            return ray.get_actor(self._name(rank), namespace=self.namespace)
        except ValueError:
            if not create:
                return None
        holder = ray.remote(num_cpus=0, max_restarts=0)(_Holder)
        return holder.options(
            name=self._name(rank),
            namespace=self.namespace,
            lifetime="detached",
            get_if_exists=True,
            scheduling_strategy=NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=True
            ),
        ).remote()

    def put(self, rank: int, step: int, index: bytes, payload: memoryview) -> None:
        import ray

        array = np.frombuffer(payload, dtype=np.uint8)
        ray.get(self._actor(rank, create=True).put.remote(step, bytes(index), array))

    def get(self, rank: int) -> HeldSnapshot | None:
        import ray

        actor = self._actor(rank, create=False)
        if actor is None:
            return None
        try:
            held = ray.get(actor.get.remote())
        except ray.exceptions.RayActorError:
            return None
        if held is None:
            return None
        step, index, array = held
        return HeldSnapshot(step, index, np.ascontiguousarray(array).data.cast("B"))

    def clear_rank(self, rank: int) -> None:
        """Stop the actor holding `rank`'s snapshot, if there is one."""
        import ray

        actor = self._actor(rank, create=False)
        if actor is not None:
            ray.kill(actor)

    def clear(self, world_size: int = 1) -> None:
        for rank in range(world_size):
            self.clear_rank(rank)
