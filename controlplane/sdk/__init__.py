"""The researcher's SDK: submit, watch and cancel training jobs through the control plane's API::

    from controlplane import Client, JobSpec

    client = Client()                      # RCP_API_URL/RCP_API_TOKEN, else ~/.rcp's files
    job = client.submit(JobSpec(name="ft", entrypoint="python train.py", num_workers=2))
    job = client.wait(job.id, timeout_s=3600)
    print(job.state, client.logs(job.id))

Modules: `connection` (finding the API and its token, the HTTP calls), `client` (`Client`),
`records` (what the API answers, as frozen records) and `errors` (typed errors by status).

Owns: the SDK's public names. Must not: import Ray or the store (it talks HTTP only).
"""

from __future__ import annotations

from controlplane.sdk.client import Client
from controlplane.sdk.errors import (
    ApiError,
    AuthError,
    ConflictError,
    Forbidden,
    JobNotFound,
    NotConfigured,
    SpecRejected,
    WaitTimeout,
)
from controlplane.sdk.records import TERMINAL_STATES, Attempt, Job, JobList, User

__all__ = [
    "ApiError",
    "Attempt",
    "AuthError",
    "Client",
    "ConflictError",
    "Forbidden",
    "Job",
    "JobList",
    "JobNotFound",
    "NotConfigured",
    "SpecRejected",
    "TERMINAL_STATES",
    "User",
    "WaitTimeout",
]
