"""Prometheus metrics of the checkpoint engine, labelled by run.

This module owns the metric names. Engines record into them; whoever serves the process's
Prometheus registry (Ray's metrics agent, a sidecar, the job runner) exports them.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_STALL_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_UPLOAD_BUCKETS_S = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)

STALL_SECONDS = Histogram(
    "rcp_checkpoint_stall_seconds",
    "Training-visible time of one save() (snapshot to host memory, plus any wait for a slot).",
    ["run"],
    buckets=_STALL_BUCKETS_S,
)
UPLOAD_SECONDS = Histogram(
    "rcp_checkpoint_upload_seconds",
    "Background time from snapshot to this rank's data being durable in storage.",
    ["run"],
    buckets=_UPLOAD_BUCKETS_S,
)
UPLOAD_BYTES_PER_SECOND = Gauge(
    "rcp_checkpoint_upload_bytes_per_second", "Throughput of the last upload.", ["run"]
)
UPLOADED_BYTES = Counter("rcp_checkpoint_uploaded_bytes", "Payload bytes uploaded.", ["run"])
LAST_COMMIT_UNIX_SECONDS = Gauge(
    "rcp_checkpoint_last_commit_unix_seconds",
    "Wall-clock time of the newest committed checkpoint (time since = now - this).",
    ["run"],
)
LAST_COMMITTED_STEP = Gauge("rcp_checkpoint_last_committed_step", "Newest committed step.", ["run"])
FAILED_UPLOADS = Counter(
    "rcp_checkpoint_failed_uploads", "Saves whose upload or commit failed.", ["run"]
)
RETRIES = Counter(
    "rcp_checkpoint_retries", "Storage calls retried after a transient error.", ["run"]
)
SKIPPED_SAVES = Counter(
    "rcp_checkpoint_skipped_saves", "Saves dropped because every slot was still in flight.", ["run"]
)
RESTORES = Counter(
    "rcp_checkpoint_restores", "Restores by where the data came from.", ["run", "source"]
)
SKIPPED_ON_RESTORE = Counter(
    "rcp_checkpoint_skipped_on_restore",
    "Committed checkpoints restore passed over because they failed verification.",
    ["run"],
)
