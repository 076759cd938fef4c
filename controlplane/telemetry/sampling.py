"""Sampling: one read of a node's sources turned into a summary with rates, kept in a history.

Owns: `NodeSampler` (source + InfiniBand sysfs + counter rates + a bounded history) and the
summary format every consumer reads (a JSON-ready dict, so it crosses Ray and the CLI as is):

``{"node_id", "pool", "source", "source_ok", "seq", "sampled_s", "gpus_expected", "faults", "problems",
"bad_counter_readings",
"gpus": [{GpuReading fields..., "new_xids", "thermal_throttle", "nvlink_errors_per_s"}],
"ib_ports": [{"port", "device", "port_num", "state", "phys_state", "up", "rate_gbps",
"width", "link_layer", "counters", "hw_counters", "xmit_bytes_per_s", "rcv_bytes_per_s",
"errors_per_s", "xmit_wait_per_s", "link_downed_delta"}]}``

Rates are per second of the sampler's clock between two samples, from counter deltas with
wrap, jitter, reset and bad values handled (`counters`); the first sample has None rates, and
so does an interval with a reset or a bad reading. A rate above `PLAUSIBLE_MAX_PER_S` is
discarded and counted (`bad_counter_readings`, cumulative; the reason goes to `problems`).
Must not: judge health or start servers.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from controlplane.telemetry.counters import CounterRates
from controlplane.telemetry.infiniband import (
    BYTES_PER_DATA_WORD,
    COUNTER_WIDTH_BITS,
    ERROR_COUNTERS,
    read_ports,
)
from controlplane.telemetry.readings import GpuReading, IbPortReading, TelemetryError
from controlplane.telemetry.sources import TelemetrySource

__all__ = ["PLAUSIBLE_MAX_PER_S", "NodeSampler"]

Summary = dict[str, Any]

PLAUSIBLE_MAX_PER_S = 1e11
"""No counter we rate moves faster: a GPU's NVLinks carry about 5.6e10 flits/s (H100: 900 GB/s
in 16-byte flits), so no more CRC or replay errors than that; an 800 Gb/s IB port moves 2.5e10
4-byte words/s, and its error counters count at most one per symbol or packet. A faster rate
is a misread counter (a reset or glitch read as a huge increase), not a fact."""


class NodeSampler:
    """Everything one node's agent knows. Not thread-safe: the agent holds a lock around it."""

    def __init__(
        self,
        node_id: str,
        pool: str,
        source: TelemetrySource,
        *,
        gpus_expected: int | None = None,
        ib_sysfs_root: str | Path | None = None,
        history_samples: int = 120,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id = node_id
        self.pool = pool
        self.source = source
        self.gpus_expected = gpus_expected
        self.ib_sysfs_root = ib_sysfs_root
        self.clock = clock
        self.history: deque[Summary] = deque(maxlen=history_samples)
        self.rates = CounterRates()
        self.seq = 0
        self._last_xid: dict[int, int] = {}

    def sample(self) -> Summary:
        """Read the sources once and append the summary to the history."""
        now_s = self.clock()
        problems: list[str] = []
        source_ok = True
        try:
            reading = self.source.read()
            gpus, ports = list(reading.gpus), list(reading.ports)
            problems += reading.problems
        except TelemetryError as exc:
            gpus, ports = [], []
            problems.append(str(exc))
            source_ok = False
        if self.ib_sysfs_root is not None:
            sys_ports, sys_problems = read_ports(self.ib_sysfs_root)
            ports += sys_ports
            problems += sys_problems
        keys: set[str] = set()
        self.seq += 1
        summary: Summary = {
            "node_id": self.node_id,
            "pool": self.pool,
            "source": self.source.kind,
            "source_ok": source_ok,
            "seq": self.seq,
            "sampled_s": now_s,
            "gpus_expected": self.gpus_expected,
            "faults": sorted(getattr(self.source, "faults", ())),
            "gpus": [self._gpu(g, now_s, keys) for g in gpus],
            "ib_ports": [self._port(p, now_s, keys) for p in ports],
            "problems": problems,
        }
        problems += self.rates.take_problems()
        summary["bad_counter_readings"] = self.rates.bad_readings
        self.rates.forget_except(keys)
        self.history.append(summary)
        return summary

    def latest(self) -> Summary | None:
        return self.history[-1] if self.history else None

    def recent(self, max_samples: int | None = None) -> list[Summary]:
        items = list(self.history)
        return items if max_samples is None else items[-max_samples:]

    def _gpu(self, g: GpuReading, now_s: float, keys: set[str]) -> dict[str, Any]:
        new_xids = list(g.new_xids)
        previous = self._last_xid.get(g.gpu)
        if not new_xids and g.last_xid and previous is not None and g.last_xid != previous:
            new_xids = [g.last_xid]
        if g.last_xid is not None:
            self._last_xid[g.gpu] = g.last_xid
        rate_total: float | None = None
        for name, value in g.nvlink_error_counts.items():
            key = f"gpu{g.gpu}/nvlink/{name}"
            keys.add(key)
            rate = self.rates.update(key, value, now_s, 64, PLAUSIBLE_MAX_PER_S)
            if rate is not None:
                rate_total = (rate_total or 0.0) + rate
        out = asdict(g)
        out["nvlink_error_counts"] = dict(g.nvlink_error_counts)
        out["throttle_reasons"] = list(g.throttle_reasons)
        out["new_xids"] = new_xids
        out["thermal_throttle"] = g.thermal_throttle
        out["nvlink_errors_per_s"] = rate_total
        return out

    def _port(self, p: IbPortReading, now_s: float, keys: set[str]) -> dict[str, Any]:
        def rate(name: str) -> float | None:
            if name not in p.counters:
                return None
            key = f"{p.name}/{name}"
            keys.add(key)
            return self.rates.update(
                key, p.counters[name], now_s, COUNTER_WIDTH_BITS.get(name), PLAUSIBLE_MAX_PER_S
            )

        xmit_words = rate("port_xmit_data")
        rcv_words = rate("port_rcv_data")
        errors: float | None = None
        for name in ERROR_COUNTERS:
            r = rate(name)
            if r is not None:
                errors = (errors or 0.0) + r
        link_downed_delta = 0
        if "link_downed" in p.counters:
            key = f"{p.name}/link_downed/increase"
            keys.add(key)
            link_downed_delta = self.rates.increase(key, p.counters["link_downed"], 8)
        return {
            "port": p.name,
            "device": p.device,
            "port_num": p.port,
            "state": p.state,
            "phys_state": p.phys_state,
            "up": p.up,
            "rate_gbps": p.rate_gbps,
            "width": p.width,
            "link_layer": p.link_layer,
            "counters": dict(p.counters),
            "hw_counters": dict(p.hw_counters),
            "xmit_bytes_per_s": None if xmit_words is None else xmit_words * BYTES_PER_DATA_WORD,
            "rcv_bytes_per_s": None if rcv_words is None else rcv_words * BYTES_PER_DATA_WORD,
            "errors_per_s": errors,
            "xmit_wait_per_s": rate("port_xmit_wait"),
            "link_downed_delta": link_downed_delta,
        }
