"""The registry of telemetry sources: one name per interchangeable way to read GPUs.

Owns: the `TelemetrySource` interface and `make_source(name, ...)`. Sources: ``simulated``
(local mode, fault injection), ``nvml`` (nvidia-ml-py, imported only when chosen) and
``dcgm`` (scrape a node-local dcgm-exporter). InfiniBand is read from sysfs by the sampler for
the real sources; the simulated source brings its own ports.
Must not: hold per-read state beyond what a source needs (rates live in `sampling`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from controlplane.telemetry.dcgm import DcgmSource, VisibleGpus
from controlplane.telemetry.nvml import NvmlSource
from controlplane.telemetry.readings import SourceReading, TelemetryError
from controlplane.telemetry.simulated import SimulatedSource

__all__ = ["SOURCES", "RetryingSource", "TelemetrySource", "make_source"]


class TelemetrySource(Protocol):
    kind: str

    def read(self) -> SourceReading:
        """One reading of every GPU (and, for the simulated source, IB port)."""

    def inject_fault(self, kind: str) -> None:
        """Simulated only; the others raise TelemetryError."""


SOURCES: dict[str, Callable[[int, int, str, float, VisibleGpus | None], TelemetrySource]] = {
    "simulated": lambda num_gpus, num_ib_ports, *_: SimulatedSource(num_gpus, num_ib_ports),
    "nvml": lambda *_: NvmlSource(),
    "dcgm": lambda _gpus, _ports, url, timeout_s, visible: DcgmSource(url, timeout_s, visible),
}
"""Each source's factory: (num_gpus, num_ib_ports, dcgm_url, dcgm_timeout_s, visible)."""


class RetryingSource:
    """Builds its source on first use and again after every failure to build.

    An agent must start even where NVML or the exporter is not there yet (driver loading,
    exporter pod starting): each read then fails with the reason, the sampler records
    ``source_ok: false``, and a later read succeeds once the source can be built.
    """

    def __init__(self, kind: str, factory: Callable[[], TelemetrySource]) -> None:
        self.kind = kind
        self._factory = factory
        self._inner: TelemetrySource | None = None

    def _source(self) -> TelemetrySource:
        if self._inner is None:
            self._inner = self._factory()
        return self._inner

    @property
    def faults(self) -> set[str]:
        return set(getattr(self._inner, "faults", ()))

    def read(self) -> SourceReading:
        return self._source().read()

    def inject_fault(self, kind: str) -> None:
        self._source().inject_fault(kind)


def make_source(
    name: str,
    *,
    num_gpus: int = 0,
    num_ib_ports: int = 0,
    dcgm_url: str = "",
    dcgm_timeout_s: float = 2.0,
    visible: VisibleGpus | None = None,
) -> TelemetrySource:
    """The source called `name` (built on first read, see `RetryingSource`);
    `num_gpus`/`num_ib_ports` only shape the simulated one; `visible` (the pod's GPUs, None:
    all of the host's) filters dcgm's host-wide answer. NVML needs no filter: inside the
    pod's container it only sees the pod's devices."""
    try:
        factory = SOURCES[name]
    except KeyError:
        raise TelemetryError(
            f"telemetry.source: unknown source {name!r}; one of: {', '.join(SOURCES)}"
        ) from None
    return RetryingSource(
        name, lambda: factory(num_gpus, num_ib_ports, dcgm_url, dcgm_timeout_s, visible)
    )
