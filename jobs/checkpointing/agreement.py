"""Rank agreement: every rank of the gang takes the same decision, through one all-reduce.

Owns: `GangAgreement.all_reduce` (small int vectors reduced with MAX or MIN on a gloo
group, so agreeing costs no GPU sync per step: the world group when it is gloo, else one
gloo group made on first use), the flag bits `should_checkpoint` agrees on (`DUE`, `ASKED`,
`ASK_RAY_TRAIN`), and `agree_on_restore`: ranks propose the newest step they verified; while
proposals differ, ranks above the smallest try again at most that step, until all hold the
same one (or none, and every rank starts fresh).

Must not: decide when to checkpoint (see `cadence`) or talk to the control plane (see
`reporting`); every rank must call each collective here the same number of times.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.distributed as dist

from jobs.checkpoint import CheckpointEngine, RestoredCheckpoint

__all__ = ["ASKED", "ASK_RAY_TRAIN", "DUE", "GangAgreement", "agree_on_restore"]

DUE, ASKED, ASK_RAY_TRAIN = 1, 2, 4
"""Bits of the flags every rank all-reduces in `should_checkpoint`."""


class GangAgreement:
    """All-reduces over this process's gang (rank `rank` of `world_size`)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self._group: dist.ProcessGroup | None = None

    def all_reduce(self, values: list[int], op: Literal["max", "min"]) -> list[int]:
        """Ints all-reduced over the gang (on a gloo group: no GPU sync per step)."""
        if self.world_size == 1:
            return values
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                f"Checkpointing on rank {self.rank} of {self.world_size} needs "
                "torch.distributed initialised (every rank must agree on when to checkpoint "
                "and what to restore): call torch.distributed.init_process_group() first"
            )
        if self._group is None:
            self._group = (
                dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
            )
        tensor = torch.tensor(values, dtype=torch.int64)
        reduce_op = dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN
        dist.all_reduce(tensor, op=reduce_op, group=self._group)
        return [int(v) for v in tensor.tolist()]


def agree_on_restore(
    engine: CheckpointEngine, agreement: GangAgreement, map_location: str | torch.device
) -> RestoredCheckpoint | None:
    """The newest committed checkpoint every rank can verify, or None on every rank."""
    restored = engine.restore(map_location=map_location)
    while True:
        # Every rank takes part in every round: [min, -max] of the proposals.
        proposal = restored.step if restored is not None else -1
        lowest, highest = agreement.all_reduce([proposal, -proposal], "min")
        if lowest == -highest:
            break
        if lowest < 0:
            restored = None
            break
        if proposal > lowest:
            restored = engine.restore(max_step=lowest, map_location=map_location)
    return restored
