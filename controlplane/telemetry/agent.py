"""The per-node telemetry agent: a Ray actor pinned to its node that samples and exports.

Owns: `TelemetryAgent` (plain class; `manager` wraps it with `ray.remote`): a background thread
that samples every `telemetry.interval_s`, the node's Prometheus endpoint (bound to the node's
own address on its own port), and methods the manager calls: `info`, `latest`, `recent`,
`inject_fault`, `stop`.
Must not: judge health or act; a failing read is recorded in the summary's problems and the
loop goes on.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from controlplane.telemetry.dcgm import VisibleGpus
from controlplane.telemetry.exporter import SummaryCollector, start_exporter
from controlplane.telemetry.sampling import NodeSampler, Summary
from controlplane.telemetry.sources import make_source

__all__ = ["TelemetryAgent"]

log = logging.getLogger(__name__)


VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"


def pod_gpus(environ: dict[str, str] | None = None) -> VisibleGpus | None:
    """The GPUs of this pod, from ``NVIDIA_VISIBLE_DEVICES`` (None: every GPU of the host;
    see `VisibleGpus`). With the device plugin's ``volume-mounts`` strategy it names a
    directory whose entries are the devices."""
    value = (os.environ if environ is None else environ).get(VISIBLE_DEVICES_ENV)
    entries: list[str] = []
    if value and value.strip().startswith("/"):
        try:
            entries = os.listdir(value.strip())
        except OSError:
            log.warning("%s=%s: cannot list it; counting every GPU", VISIBLE_DEVICES_ENV, value)
            return None
    return VisibleGpus.parse(value, entries)


class TelemetryAgent:
    def __init__(
        self,
        node_id: str,
        pool: str,
        host: str,
        num_gpus: int,
        telemetry: dict[str, Any],
        health: dict[str, Any] | None = None,
    ) -> None:
        """`telemetry` and `health` are config sections as dicts (they cross Ray as data); the
        agent only keeps `health` so that `rcp health` and `rcp nodes` judge with the thresholds
        the control plane was started with."""
        self.node_id = node_id
        self.health = dict(health or {})
        self.pool = pool
        self.interval_s = float(telemetry["interval_s"])
        source_name = str(telemetry["source"])
        source = make_source(
            source_name,
            num_gpus=num_gpus,
            num_ib_ports=int(telemetry.get("simulated_ib_ports", 0)),
            dcgm_url=str(telemetry.get("dcgm_url", "")),
            dcgm_timeout_s=float(telemetry.get("dcgm_timeout_s", 2.0)),
            visible=pod_gpus(),
        )
        ib_root = None if source_name == "simulated" else telemetry.get("ib_sysfs_root")
        self._lock = threading.Lock()
        self.sampler = NodeSampler(
            node_id,
            pool,
            source,
            gpus_expected=num_gpus,
            ib_sysfs_root=ib_root,
            history_samples=int(telemetry.get("history_samples", 120)),
        )
        self._server, self.port = start_exporter(
            SummaryCollector(self.latest), host, int(telemetry.get("exporter_port", 0))
        )
        self.host = host
        self._stop = threading.Event()
        self.sample_errors = 0
        self._thread = threading.Thread(target=self._loop, name="rcp-telemetry", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_s = time.monotonic()
        while not self._stop.is_set():
            try:
                with self._lock:
                    self.sampler.sample()
            except Exception:  # the loop never dies; the next sample may work
                self.sample_errors += 1
                log.exception("telemetry sample failed on node %s", self.node_id)
            next_s += self.interval_s
            delay = next_s - time.monotonic()
            if delay < 0:  # fell behind (a slow source): start afresh rather than burst
                next_s, delay = time.monotonic(), 0.0
            self._stop.wait(delay)

    def info(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "pool": self.pool,
            "source": self.sampler.source.kind,
            "interval_s": self.interval_s,
            "exporter_url": f"http://{self.host}:{self.port}/metrics",
            "exporter_host": self.host,
            "exporter_port": self.port,
            "samples": self.sampler.seq,
            "sample_errors": self.sample_errors,
            "health": self.health,
        }

    def latest(self) -> Summary | None:
        with self._lock:
            return self.sampler.latest()

    def recent(self, max_samples: int | None = None, after_s: float | None = None) -> list[Summary]:
        """The newest `max_samples` summaries (oldest first); with `after_s`, only those
        sampled after it (what the caller has not seen yet)."""
        with self._lock:
            summaries = self.sampler.recent(max_samples)
        if after_s is not None:
            summaries = [s for s in summaries if float(s["sampled_s"]) > after_s]
        return summaries

    def inject_fault(self, kind: str) -> dict[str, Any]:
        """Inject a fault into the simulated source; effective from the next sample."""
        with self._lock:
            self.sampler.source.inject_fault(kind)
            return {
                "node_id": self.node_id,
                "fault": kind,
                "faults": sorted(getattr(self.sampler.source, "faults", ())),
                "injected_s": time.time(),
                "after_seq": self.sampler.seq,
            }

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
