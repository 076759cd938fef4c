"""A job's scoped storage credentials, fetched from the signals actor with its attempt's token.

Owns `SignalsCredentials`, the `jobs.storage_credentials.CredentialSource` each rank's S3
storage calls when ``RCP_STORAGE_CREDENTIALS=signals`` (``storage.job_credentials=scoped``):
botocore calls it on the first request and again from 15 minutes before the credentials
expire (`jobs.checkpoint.storages.s3`). The control plane puts fresh ones into the actor
before that (`controlplane.loop.act.jobs.credentials`), so one call per refresh suffices.

Must not: import `controlplane`; log or print the token or the credentials; hand out
anything the actor did not give (no fallback to the node's credentials).
"""

from __future__ import annotations

from jobs.checkpoint.retrying import TransientError
from jobs.checkpointing.reporting import SIGNALS_TIMEOUT_S
from jobs.signals.handle import SignalsHandle
from jobs.storage_credentials import StorageCredentials, check_credentials

__all__ = ["SignalsCredentials"]


class SignalsCredentials:
    """Attempt `attempt` of job `job_id`'s storage credentials, from the signals actor. A
    call that gets none (the actor is slow, restarting or replaced, holds none yet, or refused
    the token) raises `TransientError`, which the storage's retries back off from."""

    def __init__(
        self,
        signals: SignalsHandle,
        job_id: str,
        attempt: int,
        token: str,
        *,
        timeout_s: float = SIGNALS_TIMEOUT_S,
    ) -> None:
        self.signals = signals
        self.job_id = job_id
        self.attempt = attempt
        self._token = token
        self.timeout_s = timeout_s

    def __repr__(self) -> str:  # never the token
        return f"SignalsCredentials(job_id={self.job_id!r}, attempt={self.attempt})"

    def __call__(self) -> StorageCredentials:
        try:
            got = self.signals.call(
                "credentials", self.job_id, self.attempt, self._token, timeout_s=self.timeout_s
            )
        except Exception as exc:
            raise TransientError(
                f"storage credentials of job {self.job_id}: the signals actor did not answer "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        if got is None:
            raise TransientError(
                f"the signals actor holds no storage credentials for job {self.job_id} attempt "
                f"{self.attempt} (not handed over yet, or a wrong token or stale attempt)"
            )
        return check_credentials(got)
