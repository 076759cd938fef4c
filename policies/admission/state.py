"""The admission policy's memory between ticks, which the caller persists and hands back.

Owns: `AdmissionState` (recent preemptions, for the caps; the current head-of-queue
`Reservation`, for display) with its JSON form, and `PREEMPTION_WINDOW_S`, the rolling window
of the preemption caps.
Must not: decide anything (`policies.admission.decision` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PREEMPTION_WINDOW_S", "AdmissionState", "PreemptionRecord", "Reservation"]

PREEMPTION_WINDOW_S = 3600.0
"""The rolling window of the preemption caps."""


@dataclass(frozen=True)
class PreemptionRecord:
    job_id: str
    at_s: float


@dataclass(frozen=True)
class Reservation:
    """The head of the queue's claim on future capacity (for `rcp queue` and events)."""

    job_id: str
    start_by_s: float | None
    """When the reservation is guaranteed to be met; None if a needed gang has no max runtime."""
    gpus_by_node: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class AdmissionState:
    """The policy's memory between ticks; the caller persists it (see `to_dict`)."""

    preemptions: tuple[PreemptionRecord, ...] = ()
    """Preemptions decided in the last `PREEMPTION_WINDOW_S`, oldest first."""
    reservation: Reservation | None = None

    def to_dict(self) -> dict[str, Any]:
        r = self.reservation
        return {
            "preemptions": [{"job_id": p.job_id, "at_s": p.at_s} for p in self.preemptions],
            "reservation": None
            if r is None
            else {
                "job_id": r.job_id,
                "start_by_s": r.start_by_s,
                "gpus_by_node": [[n, g] for n, g in r.gpus_by_node],
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdmissionState:
        preemptions = tuple(
            PreemptionRecord(str(p["job_id"]), float(p["at_s"]))
            for p in data.get("preemptions", ())
        )
        raw = data.get("reservation")
        reservation = None
        if raw is not None:
            start = raw.get("start_by_s")
            reservation = Reservation(
                job_id=str(raw["job_id"]),
                start_by_s=None if start is None else float(start),
                gpus_by_node=tuple((str(n), int(g)) for n, g in raw.get("gpus_by_node", ())),
            )
        return cls(preemptions=preemptions, reservation=reservation)
