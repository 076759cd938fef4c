"""Where replicas fit on the cluster pool's nodes: each whole on one node, best fit (the
admission policy's `FreeGpus`, a replica a gang of one). Rule 5 of `policies.placement` brings
a replica back only where it fits so.

Must not: decide how many replicas a model wants or may have there (`policies.placement`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from policies.admission.fit import FreeGpus
from policies.placement.targets import ModelDemand
from policies.snapshot import ClusterSnapshot, Pool, ReplicaState


def take(free: FreeGpus, gpus: int, n: int) -> int:
    """How many of `n` replicas of `gpus` GPUs each fit, each whole on one node (best fit,
    `FreeGpus.place`); takes their GPUs from `free`."""
    placed = 0
    while placed < n:
        spot = free.place(gpus, 1)
        if not spot:
            break
        free.add(spot[0][0], -gpus)
        placed += 1
    return placed


def free_after_growth(
    snapshot: ClusterSnapshot, demands: Sequence[ModelDemand], grown: Mapping[str, int]
) -> FreeGpus:
    """Free GPUs per live cluster node once the replicas not on a node yet have theirs:
    those Serve has not placed (no node) and this tick's growth (rule 4), largest first."""
    free = FreeGpus({n.node_id: n.gpus_free for n in snapshot.live_nodes(Pool.CLUSTER)})
    gpus_of = {d.model: d.gpus_per_replica for d in demands}
    pending = [
        r.gpus
        for r in snapshot.serve_replicas
        if r.pool is Pool.CLUSTER and not r.node_id and r.state is not ReplicaState.STOPPING
    ]
    pending += [gpus_of[m] for m, k in grown.items() for _ in range(k)]
    for gpus in sorted(pending, reverse=True):
        take(free, gpus, 1)
    return free
