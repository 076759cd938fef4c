"""The job actuator: admission's plan and a job's life after it, the only code that starts
and stops Ray Jobs.

`apply_admission` (`admission`) applies admission's plan item by item; `runner.JobRunner`
carries out a job's life after admission as `policies.attempts` decides it, idempotently and
from the store alone, so a restarted controller carries on where the last one stopped. One
concern per module (each says what it owns): `admission`, `runner` (the entry points),
`launching`, `credentials`, `preemption`, `watchdog`, `ends`, `checkpoint_reads`,
`background`, `limits`. Beside it, below the loop: `controlplane.adapters.ray_jobs` (the only
module that calls Ray's Job Submission API, the dashboard and the job signals actor),
`controlplane.adapters.job_logs` (attempts' logs for `rcp logs`) and
`controlplane.store.job_info` (the reason codes, attempt-end kinds and job-info keys the
runner writes, and their checked readers).

What the job's info records (the API, CLI and metrics read exactly these keys,
`controlplane.store.job_info`): ``checkpoint_uri`` (its prefix); ``checkpoint`` =
``{"step", "uri", "committed_unix_s", "read_s"}``, the newest committed step as read from
storage; ``progress`` = the running attempt's ``{"step", "step_at_s", "stall_s", "wall_s"}``
from the signals actor (present only while an attempt runs); ``stall_s_total``/
``wall_s_total`` over ended attempts; ``restarts`` (crash and hang restarts used); ``hangs``;
``attempts`` (newest last, at most `job_info.MAX_ATTEMPTS_KEPT`) = ``{"attempt",
"admitted_s", "ended_s", "kind", "reason", "step"}`` with ``kind`` an `AttemptEnd` and
``step`` the last step the attempt reported (None: none). A give-up's attempt has kind
``failed``.

What a gang runs: the Ray Job's driver is always the launcher (`launching.entrypoint_command`:
``module:function`` is every worker's Ray Train loop; a command starts on every worker with the
environment torchrun gives, so a plain ``torch.distributed`` script runs unchanged), and each
worker reports that it started (with its pid and node). Every entrypoint asks for one
``JOB_DRIVER_RESOURCE``, which the head does not offer: user drivers never run beside the
control plane's credentials. The environment carries ``RCP_JOB_ID``,
``RCP_ATTEMPT``, ``RCP_NUM_WORKERS``, ``RCP_GPUS_PER_WORKER``, ``RCP_CPUS_PER_WORKER``,
``RCP_STORAGE_PATH``, ``RCP_NODE_IDS``, the job's checkpoint settings for
`jobs.checkpointing` (``RCP_CHECKPOINT_URI``: its prefix, ``checkpoint.uri`` or
``<storage.uri>/jobs/<job id>``, where it restores the newest committed step from;
``RCP_STORAGE_ENDPOINT_URL`` (unset for AWS's own), ``RCP_STORAGE_REGION``,
``RCP_CHECKPOINT_ENABLED``, ``RCP_CHECKPOINT_INTERVAL_S`` (only when set),
``RCP_CHECKPOINT_KEEP_LAST``, ``RCP_MTBF_S``: the gang's MTBF from the fleet's record,
`reliability.job_mtbf_s`), ``RCP_STEP_REPORT_S``, ``RCP_SIGNAL_POLL_S`` and
``RCP_SIGNAL_TOKEN``: a fresh secret per attempt, kept in the job's info (never in events,
logs or the API's view), and registered with the signals actor (as its hash, with the
prefix) before the gang is submitted, so signals from other jobs or older attempts are
refused. No storage credential is in it (the Jobs tab shows it): with
``storage.job_credentials=scoped`` ``RCP_STORAGE_CREDENTIALS=signals`` tells the job to fetch
the credentials minted for its prefix from the signals actor (`credentials`); with ``shared``
workers find theirs in the node's usual AWS sources.

Must not: decide who runs (that is `policies.admission`); every item is applied as the
policy returned it.
"""

from __future__ import annotations

from controlplane.loop.act.jobs.admission import apply_admission

# Only the light admission step here: the loop (and the simulator, and the CLI through it)
# imports this package, and must not load Ray; the runner is `controlplane.loop.act.jobs.runner`.
__all__ = ["apply_admission"]
