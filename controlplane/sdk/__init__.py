"""The researcher's SDK: submit, watch and cancel training jobs through the control plane's API.

``controlplane.sdk`` is the SDK's public import path: it names the client, the records it
returns and the errors it raises, each owned by one module of the package::

    from controlplane import Client, JobSpec

    client = Client()                      # RCP_API_URL/RCP_API_TOKEN, else ~/.rcp's files
    job = client.submit(JobSpec(name="ft", entrypoint="python train.py", num_workers=2))
    job = client.wait(job.id, timeout_s=3600)
    print(job.state, client.logs(job.id))

* `controlplane.sdk.connection`: finding the API and its token, the HTTP calls and their
  retries;
* `controlplane.sdk.client`: `Client`, the API's routes as methods (jobs, users, operations);
* `controlplane.sdk.records`: what the API answers, as frozen records (`Job`, `Attempt`,
  `User`, `JobList`);
* `controlplane.sdk.errors`: typed errors carrying the server's message (`ApiError` and its
  kinds, by HTTP status).

Owns: the SDK's public names, nothing else. Must not: import Ray or the store (nothing in
the package does: it talks HTTP only).
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
