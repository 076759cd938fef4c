"""Ongoing requests per model, as the ingress replicas see them, for the demand policy.

Owns: `LoadBoard`, a small detached actor (``rcp-serve-load`` in namespace ``rcp``) that every
ingress replica reports its in-flight request counts to about once a second, and `read_load`,
which sums the fresh reports. The control plane's serving loop reads it each tick; Serve's own
autoscaling metrics are not used because no ``autoscaling_config`` is set (the control plane
owns replica targets).

Must not: decide anything. A report older than `max_age_s` is ignored (its replica is gone).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import ray

LOAD_ACTOR = "rcp-serve-load"
NAMESPACE = "rcp"
REPORT_INTERVAL_S = 1.0


class _LoadBoard:
    def __init__(self) -> None:
        self._reports: dict[str, tuple[float, dict[str, int]]] = {}

    def report(self, reporter: str, counts: Mapping[str, int]) -> None:
        self._reports[reporter] = (time.time(), dict(counts))

    def totals(self, max_age_s: float = 5.0) -> dict[str, float]:
        now = time.time()
        out: dict[str, float] = {}
        for reporter, (ts, counts) in list(self._reports.items()):
            if now - ts > max_age_s:
                del self._reports[reporter]
                continue
            for model, n in counts.items():
                out[model] = out.get(model, 0.0) + n
        return out


LoadBoard = ray.remote(num_cpus=0, max_restarts=-1)(_LoadBoard)
"""The actor class; `board` creates its one detached actor."""


def board() -> Any:
    """The load board's handle, created on first use (detached, on the head). Any: Ray does
    not type calls of an actor handle's methods."""
    return LoadBoard.options(
        name=LOAD_ACTOR,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        resources={"pool_head": 0.001},
    ).remote()


def read_load(timeout_s: float = 5.0) -> dict[str, float]:
    """Ongoing requests per model summed over fresh ingress reports ({} if none)."""
    return dict(ray.get(board().totals.remote(), timeout=timeout_s))
