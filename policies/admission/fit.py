"""Gang fit: whether, and where, all workers of a gang fit at once on the free GPUs.

Owns: `gang_fits` (the submit-time check against a whole pool) and `FreeGpus`, the free GPUs
per node indexed by free count, with `fits` and `place` (whole nodes from the emptiest
first, then the remainder on the smallest node that still takes it: best fit).
Must not: know about queues, priorities or reservations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["FreeGpus", "gang_fits"]


def gang_fits(num_workers: int, gpus_per_worker: int, node_gpus: Iterable[int]) -> bool:
    """Whether `num_workers` workers of `gpus_per_worker` GPUs each fit on nodes with these GPUs.

    The service uses it at submit time with every cluster node's ``gpus_total`` to reject a job
    bigger than the pool could ever hold.
    """
    if num_workers <= 0 or gpus_per_worker <= 0:
        return True
    return sum(g // gpus_per_worker for g in node_gpus) >= num_workers


class FreeGpus:
    """Free GPUs per node, indexed by free count so a gang fit costs O(distinct counts).

    Local scratch for one decision (admission's gangs; placement's way back, a replica being a
    gang of one); mutable on purpose and never escapes the decision that made it.
    """

    __slots__ = ("failed", "free", "levels", "total")

    def __init__(self, free: Mapping[str, int]) -> None:
        self.free: dict[str, int] = {}
        self.levels: dict[int, dict[str, None]] = {}
        self.total = 0
        self.failed: dict[int, int] = {}
        for node_id, gpus in free.items():
            self.free[node_id] = 0
            self.add(node_id, gpus)

    def copy(self) -> FreeGpus:
        return FreeGpus(self.free)

    def add(self, node_id: str, delta: int) -> None:
        """Change a node's free GPUs by `delta` (negative to take)."""
        if delta == 0:
            return
        old = self.free.get(node_id, 0)
        new = old + delta
        assert new >= 0, f"node {node_id}: free GPUs would go negative"
        if old > 0:
            level = self.levels[old]
            del level[node_id]
            if not level:
                del self.levels[old]
        if new > 0:
            self.levels.setdefault(new, {})[node_id] = None
        self.free[node_id] = new
        self.total += delta
        if delta > 0:
            self.failed.clear()

    def fits(self, gpus_per_worker: int, num_workers: int) -> bool:
        if num_workers <= 0 or gpus_per_worker <= 0:
            return True
        if gpus_per_worker * num_workers > self.total:
            return False
        failed_at = self.failed.get(gpus_per_worker)
        if failed_at is not None and num_workers >= failed_at:
            return False
        slots = 0
        for level, nodes in self.levels.items():
            if level >= gpus_per_worker:
                slots += (level // gpus_per_worker) * len(nodes)
                if slots >= num_workers:
                    return True
        self.failed[gpus_per_worker] = num_workers
        return False

    def place(self, gpus_per_worker: int, num_workers: int) -> list[tuple[str, int]] | None:
        """Workers per node for the gang, or None if it does not fit. Does not take the GPUs."""
        if not self.fits(gpus_per_worker, num_workers):
            return None
        if num_workers <= 0 or gpus_per_worker <= 0:
            return []
        remaining = num_workers
        chosen: list[tuple[str, int]] = []
        used: set[str] = set()
        usable = sorted((lv for lv in self.levels if lv >= gpus_per_worker), reverse=True)
        for level in usable:
            per_node = level // gpus_per_worker
            if per_node > remaining:
                continue
            for node_id in self.levels[level]:
                if per_node > remaining:
                    break
                chosen.append((node_id, per_node))
                used.add(node_id)
                remaining -= per_node
            if remaining == 0:
                return chosen
        # Best fit for the remainder: the smallest node that still takes it whole.
        for level in reversed(usable):
            if level // gpus_per_worker >= remaining:
                for node_id in self.levels[level]:
                    if node_id not in used:
                        chosen.append((node_id, remaining))
                        return chosen
        raise AssertionError("fits() said yes but no placement was found")
