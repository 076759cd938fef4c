"""The checkpoint engine: fast snapshot on the training thread, persist in the background.

Owns: `CheckpointEngine`, the one object a training loop holds, and the save and restore
protocols it runs (the storage steps of a save are in `saving`, loading one step in
`restoring`, which steps to delete in `retention`):

* `save(state, step)` blocks only while the state's tensors are copied into a reusable host
  buffer (one of `max_in_flight`), by the calling thread and `copy_threads - 1` pool threads;
  one background thread then uploads it (`saving.upload_rank`), and only then feeds the memory
  tier (so the tier holds this rank's newest durable snapshot) and releases the buffer. When
  every buffer is still in flight, `in_flight_policy` decides: WAIT blocks the caller (the
  stall is measured), SKIP drops the new save with a warning and a metric.
* Commit: rank 0 writes the step's manifest only after every rank's index (each written
  after that rank's shards were durable) is present, so a manifest implies complete data.
* `restore()` loads the newest committed step that verifies (`restoring`), skipping corrupt,
  torn or crafted ones with a warning. Where the state came from ("memory" or "storage") is
  in the result, in `stats()` and in the restores metric.

Must not: decide when to checkpoint (see `policies.checkpointing`) or know Ray Train (see
`jobs.checkpointing`).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from jobs.checkpoint import metrics
from jobs.checkpoint.capturing import HostBuffer, Snapshot, take_snapshot
from jobs.checkpoint.layout import keep_key, manifest_key
from jobs.checkpoint.memory_tiers import MemoryTier
from jobs.checkpoint.restoring import RestoredCheckpoint, committed_steps, restore_newest
from jobs.checkpoint.retention import RetentionPlan, plan_retention, should_abort_upload
from jobs.checkpoint.retrying import RetryPolicy
from jobs.checkpoint.saving import (
    DEFAULT_SHARD_SIZE_BYTES,
    InFlightPolicy,
    SaveHandle,
    SaveOutcome,
    as_view,
    check_settings,
    check_step,
    commit_step,
    upload_rank,
)
from jobs.checkpoint.storages import Storage, StorageOptions, open_storage
from jobs.storage_credentials import CredentialSource

__all__ = ["CheckpointEngine"]

logger = logging.getLogger(__name__)


class CheckpointEngine:
    """Asynchronous, verified checkpoints of one rank of a training job.

    Example::

        engine = CheckpointEngine("s3://bucket/run-7", rank=rank, world_size=world_size)
        restored = engine.restore()
        start = restored.step + 1 if restored else 0
        for step in range(start, num_steps):
            train_one_step()
            if step % 100 == 0:
                engine.save({"model": model.state_dict(), "optim": opt.state_dict()}, step)
        engine.close()
    """

    def __init__(
        self,
        uri: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        rank: int = 0,
        world_size: int = 1,
        run_name: str = "default",
        max_in_flight: int = 1,
        in_flight_policy: InFlightPolicy | str = InFlightPolicy.WAIT,
        shard_size_bytes: int = DEFAULT_SHARD_SIZE_BYTES,
        part_size_bytes: int = StorageOptions.part_size_bytes,
        max_concurrency: int = StorageOptions.max_concurrency,
        keep_last: int = 3,
        max_upload_age_s: float = 6 * 3600.0,
        commit_timeout_s: float = 600.0,
        commit_poll_interval_s: float = 0.2,
        retry: RetryPolicy | None = None,
        pin_memory: bool | None = None,
        copy_threads: int | None = None,
        memory_tier: MemoryTier | None = None,
        storage: Storage | None = None,
        before_commit: Callable[[int], None] | None = None,
        credentials: CredentialSource | None = None,
    ) -> None:
        self.in_flight_policy, copy_threads = check_settings(
            rank=rank,
            world_size=world_size,
            max_in_flight=max_in_flight,
            shard_size_bytes=shard_size_bytes,
            keep_last=keep_last,
            copy_threads=copy_threads,
            commit_timeout_s=commit_timeout_s,
            commit_poll_interval_s=commit_poll_interval_s,
            in_flight_policy=in_flight_policy,
        )
        self.rank = rank
        self.world_size = world_size
        self.run_name = run_name
        self.shard_size_bytes = shard_size_bytes
        self.keep_last = keep_last
        self.max_upload_age_s = max_upload_age_s
        self.commit_timeout_s = commit_timeout_s
        self.commit_poll_interval_s = commit_poll_interval_s
        self.memory_tier = memory_tier
        self._before_commit = before_commit
        self._retries = 0
        self._retries_lock = threading.Lock()
        options = StorageOptions(
            part_size_bytes=part_size_bytes,
            max_concurrency=max_concurrency,
            retry=retry or RetryPolicy(),
            on_retry=self._on_retry,
        )
        self.storage = storage or open_storage(
            uri, endpoint_url=endpoint_url, region=region, options=options, credentials=credentials
        )
        pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._free_buffers: queue.Queue[HostBuffer] = queue.Queue()
        for _ in range(max_in_flight):
            self._free_buffers.put(HostBuffer(pin_memory=pin))
        self._persist = ThreadPoolExecutor(1, thread_name_prefix=f"ckpt-persist-{rank}")
        self.copy_threads = copy_threads
        # The training thread copies too, so the pool has one thread fewer.
        self._copy_pool = (
            ThreadPoolExecutor(copy_threads - 1, thread_name_prefix=f"ckpt-copy-{rank}")
            if copy_threads > 1
            else None
        )
        self._pending: list[SaveHandle] = []
        self._last_step: int | None = None
        self._last_commit_unix_s: float | None = None
        self._last_committed_step: int | None = None
        self._failed_uploads = 0
        self._skipped_saves = 0
        self._last_stall_s = 0.0
        self._last_upload_s = 0.0
        self._last_upload_bytes_per_s = 0.0
        self._restored_from: str | None = None
        self._closed = False

    # ----------------------------------------------------------------------------- save

    def _on_retry(self, what: str, exc: BaseException) -> None:
        with self._retries_lock:
            self._retries += 1
        metrics.RETRIES.labels(self.run_name).inc()
        logger.info("retrying %s after %s: %s", what, type(exc).__name__, exc)

    def save(
        self,
        state: Any,
        step: int,
        *,
        keep: bool = False,
        metadata: Mapping[str, Any] | None = None,
    ) -> SaveHandle | None:
        """Snapshot `state` for `step` and persist it in the background.

        Blocks only for the copy into host memory (plus, under WAIT, for a free buffer).
        Returns None when the SKIP policy dropped this save. `keep` exempts the step from
        retention; `metadata` (JSON-serializable) is stored in the manifest.
        """
        if self._closed:
            raise RuntimeError("save() on a closed CheckpointEngine")
        check_step(step)
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(
                f"step {step} is not after the last saved or restored step {self._last_step}; "
                "committed checkpoints are immutable, so steps must increase"
            )
        started_s = time.perf_counter()
        self._pending = [h for h in self._pending if not h.done()]
        if self.in_flight_policy is InFlightPolicy.SKIP:
            try:
                buffer = self._free_buffers.get_nowait()
            except queue.Empty:
                self._skipped_saves += 1
                metrics.SKIPPED_SAVES.labels(self.run_name).inc()
                logger.warning(
                    "checkpoint of step %d skipped: %d save(s) still in flight",
                    step,
                    len(self._pending),
                )
                return None
        else:
            buffer = self._free_buffers.get()
        try:
            snapshot = take_snapshot(
                state, buffer, copy_pool=self._copy_pool, copy_threads=self.copy_threads
            )
        except BaseException:
            self._free_buffers.put(buffer)
            raise
        stall_s = time.perf_counter() - started_s
        self._last_step = step
        self._last_stall_s = stall_s
        metrics.STALL_SECONDS.labels(self.run_name).observe(stall_s)
        future = self._persist.submit(
            self._persist_one, snapshot, buffer, step, keep, dict(metadata or {}), started_s
        )
        handle = SaveHandle(step, stall_s, future)
        self._pending.append(handle)
        return handle

    def _persist_one(
        self,
        snapshot: Snapshot,
        buffer: HostBuffer,
        step: int,
        keep: bool,
        metadata: dict[str, Any],
        started_s: float,
    ) -> SaveOutcome:
        try:
            try:
                upload_started_s = time.perf_counter()
                index_bytes = upload_rank(
                    self.storage,
                    snapshot,
                    step,
                    rank=self.rank,
                    world_size=self.world_size,
                    shard_size_bytes=self.shard_size_bytes,
                )
                upload_s = time.perf_counter() - upload_started_s
                if self.memory_tier is not None:
                    try:
                        self.memory_tier.put(
                            self.rank, step, index_bytes, as_view(snapshot.payload)
                        )
                    except Exception:  # noqa: BLE001 - the tier is only a cache
                        logger.warning("memory tier could not keep step %d", step, exc_info=True)
            finally:
                self._free_buffers.put(buffer)
            bytes_per_s = snapshot.payload_bytes / upload_s if upload_s > 0 else 0.0
            self._last_upload_s = upload_s
            self._last_upload_bytes_per_s = bytes_per_s
            metrics.UPLOAD_SECONDS.labels(self.run_name).observe(upload_s)
            metrics.UPLOAD_BYTES_PER_SECOND.labels(self.run_name).set(bytes_per_s)
            metrics.UPLOADED_BYTES.labels(self.run_name).inc(snapshot.payload_bytes)
            committed = False
            if self.rank == 0:
                if self._before_commit is not None:
                    self._before_commit(step)
                self._commit(step, keep, metadata)
                committed = True
                self._apply_retention_quietly()
            return SaveOutcome(
                step, self.rank, committed, snapshot.payload_bytes, upload_s, bytes_per_s
            )
        except BaseException:
            self._failed_uploads += 1
            metrics.FAILED_UPLOADS.labels(self.run_name).inc()
            logger.exception("checkpoint of step %d (rank %d) failed", step, self.rank)
            raise

    def _commit(self, step: int, keep: bool, metadata: dict[str, Any]) -> None:
        now_s = commit_step(
            self.storage,
            step,
            world_size=self.world_size,
            keep=keep,
            metadata=metadata,
            timeout_s=self.commit_timeout_s,
            poll_interval_s=self.commit_poll_interval_s,
        )
        self._last_commit_unix_s = now_s
        self._last_committed_step = step
        metrics.LAST_COMMIT_UNIX_SECONDS.labels(self.run_name).set(now_s)
        metrics.LAST_COMMITTED_STEP.labels(self.run_name).set(step)

    def reset_step_order(self, step: int | None) -> None:
        """Forget (None) or set the step later saves must come after (used by restore)."""
        self._last_step = step

    def wait(self, timeout_s: float | None = None) -> list[SaveOutcome]:
        """Wait for every save in flight; raises the first failure among them."""
        pending, self._pending = self._pending, []
        return [h.result(timeout_s) for h in pending]

    # ------------------------------------------------------------------------ retention

    def mark_keep(self, step: int) -> None:
        """Exempt a committed step from retention."""
        if not self.storage.exists(manifest_key(step)):
            raise ValueError(f"step {step} has no committed checkpoint in {self.storage.uri}")
        self.storage.put_bytes(keep_key(step), b"")

    def apply_retention(self) -> RetentionPlan:
        """Delete all but the newest `keep_last` committed steps (and keep-marked ones),
        partial steps older than the newest commit, and abandoned multipart uploads."""
        plan = plan_retention(self.storage.list_keys(), keep_last=self.keep_last)
        if plan.keys_in_order:
            self.storage.delete_keys(list(plan.keys_in_order))
        self.storage.abort_abandoned_uploads(
            lambda key, age_s: should_abort_upload(
                key,
                age_s,
                newest_committed_step=plan.newest_committed_step,
                max_upload_age_s=self.max_upload_age_s,
            )
        )
        return plan

    def _apply_retention_quietly(self) -> None:
        try:
            self.apply_retention()
        except Exception:  # noqa: BLE001 - retention failing must not fail the save
            logger.warning("checkpoint retention failed; will retry after next save", exc_info=True)

    # -------------------------------------------------------------------------- restore

    def committed_steps(self) -> list[int]:
        """Steps with a manifest, newest first (not yet verified)."""
        return committed_steps(self.storage)

    def restore(
        self, *, max_step: int | None = None, map_location: str | torch.device = "cpu"
    ) -> RestoredCheckpoint | None:
        """Load the newest committed checkpoint (at most `max_step`) that fully verifies.

        Corrupt, torn or crafted steps are skipped with a warning (and listed in the
        result's `skipped`). Returns None when there is no committed checkpoint; raises
        `NoVerifiedCheckpointError`, naming each step and why, when there are some and none
        verifies. Storage that stays unreachable raises too, so a job never silently
        restarts from scratch because of an outage or damage.
        """
        restored = restore_newest(
            self.storage,
            self.memory_tier,
            rank=self.rank,
            world_size=self.world_size,
            run_name=self.run_name,
            max_step=max_step,
            map_location=map_location,
        )
        if restored is not None:
            self._restored_from = restored.source
            self._last_step = restored.step
            self._last_committed_step = restored.step
        return restored

    # ------------------------------------------------------------------------ reporting

    def stats(self) -> dict[str, float]:
        """Numbers a training loop can report (e.g. through ray.train.report)."""
        since_s = (
            time.time() - self._last_commit_unix_s if self._last_commit_unix_s is not None else -1.0
        )
        return {
            "checkpoint_stall_s": self._last_stall_s,
            "checkpoint_upload_s": self._last_upload_s,
            "checkpoint_upload_bytes_per_s": self._last_upload_bytes_per_s,
            "checkpoint_last_committed_step": float(
                -1 if self._last_committed_step is None else self._last_committed_step
            ),
            "checkpoint_s_since_last_commit": since_s,
            "checkpoint_failed_uploads": float(self._failed_uploads),
            "checkpoint_retries": float(self._retries),
            "checkpoint_skipped_saves": float(self._skipped_saves),
            "checkpoint_in_flight": float(sum(not h.done() for h in self._pending)),
            "checkpoint_restored_from_memory": float(self._restored_from == "memory"),
        }

    def close(self, *, wait: bool = True) -> None:
        """Finish (or, with wait=False, abandon) saves in flight and release resources."""
        if self._closed:
            return
        self._closed = True
        if wait:
            for handle in self._pending:
                # A failure was already logged and counted by the persist thread.
                with contextlib.suppress(Exception):
                    handle.result()
        self._persist.shutdown(wait=wait, cancel_futures=not wait)
        if self._copy_pool is not None:
            self._copy_pool.shutdown(wait=False)
        if wait:
            self.storage.close()

    def __enter__(self) -> CheckpointEngine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
