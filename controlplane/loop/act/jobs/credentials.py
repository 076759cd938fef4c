"""Scoped storage credentials of admitted jobs: minted, handed to the signals actor, refreshed.

With ``storage.job_credentials=scoped`` a job whose checkpoint prefix is on S3 reaches it
only with credentials minted for it (`controlplane.storage.JobCredentialMinter`: STS
``AssumeRole`` with the session policy of its prefix), which its code fetches from the
signals actor with its attempt's token (`jobs.signals`, ``RCP_STORAGE_CREDENTIALS``).

Owns `JobCredentials`: `prefix` / `wanted` (which jobs get them), `issue` (at admission; it
raises when minting or handing over fails, so a scoped job never starts without them) and
`refresh` (every tick: put the cached ones again, or mint on a worker thread, as
`policies.credentials.credentials_action` says; a failed mint is tried again after
`limits.CREDENTIALS_MINT_RETRY_S`).

The credentials live in this process's memory only: never in the store, events, logs or the
job's runtime env. A restarted controller mints anew when the actor's are due.

Must not: call STS or Ray but through `controlplane.storage` and `ray_jobs.RayJobs`, or
decide when to mint (`policies.credentials`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from controlplane.adapters.ray_jobs import RayJobsApi
from controlplane.config import Config
from controlplane.loop.act.jobs import limits
from controlplane.loop.act.jobs.background import Background
from controlplane.storage import JobCredentialMinter
from controlplane.store import JobRecord
from controlplane.store.job_info import as_finite, uri_of
from jobs.storage_credentials import JobCredentialsMode, StorageCredentials
from jobs.storage_uri import StorageUri, parse_storage_uri
from policies.credentials import CredentialsAction, credentials_action

__all__ = ["JobCredentials", "Mint"]

log = logging.getLogger(__name__)

Mint = Callable[[str, StorageUri], StorageCredentials]
"""``mint(job_id, prefix)``: credentials allowed only under `prefix` (STS in production)."""


class JobCredentials:
    def __init__(
        self,
        cfg: Config,
        ray_jobs: RayJobsApi,
        clock: Callable[[], float],
        work: Background[StorageCredentials],
        mint: Mint | None = None,
    ) -> None:
        self.cfg = cfg
        self.ray = ray_jobs
        self.clock = clock
        self._work = work
        self._mint = mint or JobCredentialMinter(cfg).mint
        self._minted: dict[str, tuple[int, StorageCredentials]] = {}
        """Per job: the attempt and the newest credentials minted for it."""
        self._retry_at_s: dict[str, float] = {}

    def prefix(self, job: JobRecord) -> StorageUri | None:
        """The S3 prefix `job` gets credentials for, or None (shared mode, or not on S3)."""
        if self.cfg.storage.job_credentials != JobCredentialsMode.SCOPED.value:
            return None
        uri = parse_storage_uri(uri_of(self.cfg, job))
        return uri if uri.scheme == "s3" else None

    def wanted(self, job: JobRecord) -> bool:
        """Whether `job`'s code reaches storage with credentials from the signals actor."""
        return self.prefix(job) is not None

    def issue(self, job: JobRecord) -> None:
        """Mint `job`'s credentials and hand them to the signals actor (admission: the
        attempt is registered already). Raises when either fails; a no-op when not wanted."""
        prefix = self.prefix(job)
        if prefix is None:
            return
        attempt = int(job.info["attempt"])
        minted = self._mint(job.job_id, prefix)
        self._minted[job.job_id] = (attempt, minted)
        if not self.ray.put_storage_credentials(job.job_id, attempt, minted):
            raise RuntimeError("the job signals actor did not take the storage credentials")

    def refresh(
        self, jobs: Iterable[JobRecord], sigs: Mapping[str, Mapping[str, Any]], deadline_s: float
    ) -> None:
        """Keep every admitted job's credentials fresh; one job's failure never stops the others."""
        now = self.clock()
        duration_s = float(self.cfg.storage.job_credentials_duration_s)
        minting: dict[tuple[str, ...], tuple[JobRecord, int]] = {}
        for job in jobs:
            try:
                prefix = self.prefix(job)
                sig = sigs.get(job.job_id) or {}
                attempt = int(job.info["attempt"])
                if prefix is None or sig.get("attempt") != attempt:
                    continue  # not scoped, or the actor does not hold this attempt (yet)
                held = as_finite(sig.get("credentials_expire_unix_s"))
                cached = self._cached(job.job_id, attempt)
                cached_s = cached["expires_unix_s"] if cached is not None else None
                action = credentials_action(held, cached_s, now, duration_s)
                if action is CredentialsAction.PUT and cached is not None:
                    self._put(job.job_id, attempt, cached)
                elif action is CredentialsAction.MINT:
                    key: tuple[str, ...] = ("mint", job.job_id, str(attempt))
                    if self._work.pending(key) or now >= self._retry_at_s.get(job.job_id, 0.0):
                        self._work.start(key, functools.partial(self._mint, job.job_id, prefix))
                        minting[key] = (job, attempt)
            except Exception as exc:
                log.warning("storage credentials of job %s: %s", job.job_id, exc)
        self._work.wait(minting, deadline_s)
        for key, (job, attempt) in minting.items():
            done, minted, error = self._work.take(key)
            if not done:
                continue
            if minted is None:
                self._retry_at_s[job.job_id] = now + limits.CREDENTIALS_MINT_RETRY_S
                log.warning(
                    "minting storage credentials for job %s failed (again in %gs): %s",
                    job.job_id,
                    limits.CREDENTIALS_MINT_RETRY_S,
                    error,
                )
                continue
            self._minted[job.job_id] = (attempt, minted)
            self._retry_at_s.pop(job.job_id, None)
            try:
                self._put(job.job_id, attempt, minted)
            except Exception as exc:  # the next tick puts the cached ones (PUT)
                log.warning("handing job %s its storage credentials failed: %s", job.job_id, exc)

    def forget_others(self, live: set[str]) -> None:
        """Drop what is kept for jobs not in `live` (no longer ADMITTED or RUNNING)."""
        for table in (self._minted, self._retry_at_s):
            for job_id in set(table) - live:
                del table[job_id]
        self._work.drop(lambda key: key[1] in live)

    def _cached(self, job_id: str, attempt: int) -> StorageCredentials | None:
        kept = self._minted.get(job_id)
        return kept[1] if kept is not None and kept[0] == attempt else None

    def _put(self, job_id: str, attempt: int, credentials: StorageCredentials) -> None:
        if not self.ray.put_storage_credentials(job_id, attempt, credentials):
            log.warning("the job signals actor did not take job %s's credentials", job_id)
