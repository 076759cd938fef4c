"""Asynchronous checkpointing: snapshot to host memory, persist in the background, restore
only what was fully committed and verifies.

The package owns the engine (`engine`), its save path (`saving`: upload and commit) and
restore path (`restoring`: the newest step that verifies), the on-storage format
(`layout`), the snapshot into reusable host buffers (`capturing`: the state's skeleton in
`snapshot`, the payload's tensor layout in `payload`, the threaded host copy in `copying`),
the storage backends picked by URI (`storages`),
retries (`retrying`), retention (`retention`), memory tiers (`memory_tiers`) and metrics
(`metrics`). It never imports `controlplane`; callers pass plain parameters (uri,
endpoint_url, region) taken from the user's StorageConfig.
"""

from __future__ import annotations

from jobs.checkpoint.engine import CheckpointEngine
from jobs.checkpoint.layout import CorruptCheckpointError, UnsafeCheckpointError
from jobs.checkpoint.memory_tiers import (
    InProcessMemoryTier,
    MemoryTier,
    MemoryTierUnavailableError,
    RayMemoryTier,
    clear_job_memory_tier,
)
from jobs.checkpoint.restoring import NoVerifiedCheckpointError, RestoredCheckpoint
from jobs.checkpoint.retrying import RetryPolicy
from jobs.checkpoint.saving import CommitTimeoutError, InFlightPolicy, SaveHandle, SaveOutcome
from jobs.checkpoint.storages import LocalStorage, S3Storage, Storage, open_storage

__all__ = [
    "CheckpointEngine",
    "CommitTimeoutError",
    "CorruptCheckpointError",
    "InFlightPolicy",
    "InProcessMemoryTier",
    "LocalStorage",
    "MemoryTier",
    "MemoryTierUnavailableError",
    "NoVerifiedCheckpointError",
    "RayMemoryTier",
    "RestoredCheckpoint",
    "RetryPolicy",
    "S3Storage",
    "SaveHandle",
    "SaveOutcome",
    "Storage",
    "UnsafeCheckpointError",
    "clear_job_memory_tier",
    "open_storage",
]
