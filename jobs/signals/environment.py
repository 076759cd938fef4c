"""The job environment's variable names: what the runner sets for a job's Ray Job.

Owns: the ``RCP_*`` names (set by the control plane's runner, read by `jobs.launcher` and
`jobs.checkpointing`) and the values they may carry that are named here
(`STORAGE_CREDENTIALS_FROM_SIGNALS`).

Must not: import anything (the launcher reads these before Ray is imported); hold values
(a token, credentials) rather than names.
"""

from __future__ import annotations

__all__ = [
    "ENV_ATTEMPT",
    "ENV_CHECKPOINT_ENABLED",
    "ENV_CHECKPOINT_INTERVAL_S",
    "ENV_CHECKPOINT_KEEP_LAST",
    "ENV_CHECKPOINT_URI",
    "ENV_JOB_ID",
    "ENV_MTBF_S",
    "ENV_RESTARTS_IN_PLACE",
    "ENV_SIGNAL_POLL_S",
    "ENV_SIGNAL_TOKEN",
    "ENV_STEP_REPORT_S",
    "ENV_STORAGE_CREDENTIALS",
    "ENV_STORAGE_ENDPOINT_URL",
    "ENV_STORAGE_REGION",
    "STORAGE_CREDENTIALS_FROM_SIGNALS",
]

ENV_JOB_ID = "RCP_JOB_ID"
ENV_ATTEMPT = "RCP_ATTEMPT"
ENV_SIGNAL_POLL_S = "RCP_SIGNAL_POLL_S"
ENV_SIGNAL_TOKEN = "RCP_SIGNAL_TOKEN"
"""This attempt's secret; every job-side call to the signals actor presents it."""
ENV_CHECKPOINT_URI = "RCP_CHECKPOINT_URI"
"""The job's checkpoint location (``s3://bucket/prefix``); also the prefix the actor checks."""
ENV_STORAGE_ENDPOINT_URL = "RCP_STORAGE_ENDPOINT_URL"
"""The S3 endpoint (unset: AWS's own). Credentials come from the node's usual AWS sources."""
ENV_STORAGE_REGION = "RCP_STORAGE_REGION"
ENV_STORAGE_CREDENTIALS = "RCP_STORAGE_CREDENTIALS"
"""`STORAGE_CREDENTIALS_FROM_SIGNALS` when the job's S3 credentials come from this actor
(``storage.job_credentials=scoped``: `_JobSignals.credentials`); unset: the node's own."""
STORAGE_CREDENTIALS_FROM_SIGNALS = "signals"
ENV_CHECKPOINT_ENABLED = "RCP_CHECKPOINT_ENABLED"
"""``"0"`` when the spec's checkpoint.enabled is false."""
ENV_CHECKPOINT_INTERVAL_S = "RCP_CHECKPOINT_INTERVAL_S"
"""The spec's checkpoint.interval_s; unset: Young/Daly from the measured stall and the MTBF."""
ENV_CHECKPOINT_KEEP_LAST = "RCP_CHECKPOINT_KEEP_LAST"
ENV_MTBF_S = "RCP_MTBF_S"
"""The gang's mean time between failures the controller computed from the fleet's record."""
ENV_RESTARTS_IN_PLACE = "RCP_RESTARTS_IN_PLACE"
"""How many times Ray Train may restart the gang's workers inside the run (the restarts the job
has left; unset or 0: none, a failure ends the run): `jobs.launcher.in_place`."""
ENV_STEP_REPORT_S = "RCP_STEP_REPORT_S"
"""How often rank 0 reports the step (`_JobSignals.progress`): jobs.step_report_interval_s."""
