"""Prometheus metrics of the checkpoint engine, labelled by run.

This module owns the metric names and where they are exported:

* always into the process's ``prometheus_client`` registry (the names below), for whoever
  serves it (a sidecar, a test, ``prometheus_client.start_http_server``);
* and, when the process is a Ray worker (``ray`` imported and initialized: a Ray Train
  worker, an actor), also into Ray's metrics pipeline through ``ray.util.metrics``, which the
  node's metrics agent exports on its Prometheus endpoint with Ray's ``ray_`` prefix:
  ``ray_rcp_checkpoint_stall_seconds_bucket``, ``ray_rcp_checkpoint_last_commit_unix_seconds``,
  counters with a ``_total`` suffix (``ray_rcp_checkpoint_failed_uploads_total``). That is
  how a training job's checkpoint figures reach the cluster's Prometheus and the dashboard.

Engines record through ``METRIC.labels(run).observe/set/inc`` exactly as with
``prometheus_client``. Recording never raises into training: a failure to mirror into Ray is
logged once and the mirror is switched off for that metric.

It must not import Ray when the process has not (unit tests, a plain script): the mirror
only looks at ``sys.modules``.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

logger = logging.getLogger(__name__)

_STALL_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_UPLOAD_BUCKETS_S = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

_PROMETHEUS_KINDS: dict[str, Any] = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}

RAY_PREFIX = "ray_"
"""Prefix Ray's metrics agent puts before every ``ray.util.metrics`` name it exports."""


def _ray_ready() -> bool:
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        return bool(ray.is_initialized())
    except Exception:  # a half-imported or shut-down ray: no mirror
        return False


class MirroredMetric:
    """One metric recorded into ``prometheus_client`` and, inside Ray, ``ray.util.metrics``.

    ``kind`` is ``counter``, ``gauge`` or ``histogram``; ``prometheus`` is the
    ``prometheus_client`` metric (its samples are what a process-local scrape shows).
    """

    def __init__(
        self,
        kind: str,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float] | None = None,
    ) -> None:
        self.kind = kind
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.buckets = tuple(buckets) if buckets else None
        if kind not in _PROMETHEUS_KINDS:
            raise ValueError(f"metric kind must be counter, gauge or histogram, got {kind!r}")
        extra = {"buckets": self.buckets or ()} if kind == "histogram" else {}
        self.prometheus: Any = _PROMETHEUS_KINDS[kind](
            name, documentation, self.labelnames, **extra
        )
        self._ray_metric: Any = None
        self._ray_disabled = False
        self._lock = threading.Lock()

    @property
    def exported_names(self) -> tuple[str, ...]:
        """The names Ray's metrics agent exports this metric under."""
        base = RAY_PREFIX + self.name
        if self.kind == "counter":
            return (base + "_total",)
        if self.kind == "histogram":
            return (base + "_bucket", base + "_sum", base + "_count")
        return (base,)

    def labels(self, *values: str) -> _Child:
        return _Child(self, tuple(str(v) for v in values))

    def _ray(self) -> Any:
        """The ``ray.util.metrics`` twin, built on first use inside a Ray worker; else None."""
        if self._ray_disabled or not _ray_ready():
            return None
        if self._ray_metric is not None:
            return self._ray_metric
        with self._lock:
            if self._ray_metric is None and not self._ray_disabled:
                try:
                    from ray.util import metrics as ray_metrics

                    ray_kind = getattr(ray_metrics, self.kind.capitalize())
                    extra = (
                        {"boundaries": list(self.buckets or ())} if self.kind == "histogram" else {}
                    )
                    self._ray_metric = ray_kind(
                        self.name, self.documentation, tag_keys=self.labelnames, **extra
                    )
                except Exception as exc:
                    self._disable(exc)
        return self._ray_metric

    def _disable(self, exc: BaseException) -> None:
        self._ray_disabled = True
        self._ray_metric = None
        logger.warning("not exporting %s through Ray's metrics pipeline: %r", self.name, exc)

    def _mirror(self, op: str, value: float, values: tuple[str, ...]) -> None:
        if op == "inc" and value <= 0:
            return  # Ray's Counter rejects non-positive increments; nothing changes anyway
        metric = self._ray()
        if metric is None:
            return
        tags = dict(zip(self.labelnames, values, strict=True))
        try:
            getattr(metric, op)(value, tags=tags)  # inc, set or observe
        except Exception as exc:
            self._disable(exc)


class _Child:
    """``METRIC.labels(run)``: records into both pipelines."""

    def __init__(self, parent: MirroredMetric, values: tuple[str, ...]) -> None:
        self._parent = parent
        self._values = values
        self._prometheus = parent.prometheus.labels(*values)

    def inc(self, amount: float = 1.0) -> None:
        self._prometheus.inc(amount)
        self._parent._mirror("inc", float(amount), self._values)

    def set(self, value: float) -> None:
        self._prometheus.set(value)
        self._parent._mirror("set", float(value), self._values)

    def observe(self, value: float) -> None:
        self._prometheus.observe(value)
        self._parent._mirror("observe", float(value), self._values)


STALL_SECONDS = MirroredMetric(
    "histogram",
    "rcp_checkpoint_stall_seconds",
    "Training-visible time of one save() (snapshot to host memory, plus any wait for a slot).",
    ["run"],
    buckets=_STALL_BUCKETS_S,
)
UPLOAD_SECONDS = MirroredMetric(
    "histogram",
    "rcp_checkpoint_upload_seconds",
    "Background time from snapshot to this rank's data being durable in storage.",
    ["run"],
    buckets=_UPLOAD_BUCKETS_S,
)
UPLOAD_BYTES_PER_SECOND = MirroredMetric(
    "gauge", "rcp_checkpoint_upload_bytes_per_second", "Throughput of the last upload.", ["run"]
)
UPLOADED_BYTES = MirroredMetric(
    "counter", "rcp_checkpoint_uploaded_bytes", "Payload bytes uploaded.", ["run"]
)
LAST_COMMIT_UNIX_SECONDS = MirroredMetric(
    "gauge",
    "rcp_checkpoint_last_commit_unix_seconds",
    "Wall-clock time of the newest committed checkpoint (time since = now - this).",
    ["run"],
)
LAST_COMMITTED_STEP = MirroredMetric(
    "gauge", "rcp_checkpoint_last_committed_step", "Newest committed step.", ["run"]
)
FAILED_UPLOADS = MirroredMetric(
    "counter", "rcp_checkpoint_failed_uploads", "Saves whose upload or commit failed.", ["run"]
)
RETRIES = MirroredMetric(
    "counter", "rcp_checkpoint_retries", "Storage calls retried after a transient error.", ["run"]
)
SKIPPED_SAVES = MirroredMetric(
    "counter",
    "rcp_checkpoint_skipped_saves",
    "Saves dropped because every slot was still in flight.",
    ["run"],
)
RESTORES = MirroredMetric(
    "counter", "rcp_checkpoint_restores", "Restores by where the data came from.", ["run", "source"]
)
SKIPPED_ON_RESTORE = MirroredMetric(
    "counter",
    "rcp_checkpoint_skipped_on_restore",
    "Committed checkpoints restore passed over because they failed verification.",
    ["run"],
)

ALL: tuple[MirroredMetric, ...] = tuple(
    m for m in list(globals().values()) if isinstance(m, MirroredMetric)
)
"""Every checkpoint metric; ``exported_names`` of each is what Ray's agent exports."""
