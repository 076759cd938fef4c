"""The job actuator: admission's plan and a job's life after it, the only code that starts
and stops Ray Jobs.

`apply_admission` (`admission`) applies admission's plan item by item; `runner.JobRunner`
carries out a job's life after admission as `policies.attempts` decides it, idempotently and
from the store alone, so a restarted controller carries on where the last one stopped. One
concern per module (each says what it owns): `admission`, `runner` (the entry points),
`launching`, `credentials`, `preemption`, `watchdog`, `ends`, `checkpoint_reads`,
`background`, `limits`. Beside it: `controlplane.adapters.ray_jobs` (the Ray side),
`controlplane.adapters.job_logs` and `controlplane.store.job_info` (the job-info keys).

What a gang runs: the Ray Job's driver is always the launcher (`launching.entrypoint_command`:
``module:function`` is every worker's Ray Train loop; a command starts on every worker with the
environment torchrun gives, so a plain ``torch.distributed`` script runs unchanged), and each
worker reports that it started (with its pid and node). Every entrypoint asks for one
``JOB_DRIVER_RESOURCE``, which the head does not offer: user drivers never run beside the
control plane's credentials. The environment carries the ``RCP_*`` names of
`jobs.signals.environment` and `jobs.launcher` (the job, its attempt and gang, its checkpoint
settings and MTBF), among them ``RCP_SIGNAL_TOKEN``: a fresh secret per attempt, kept in the
job's info (never in events, logs or the API's view) and registered with the signals actor
(as its hash) before the gang is submitted, so signals from other jobs or older attempts are
refused. No storage credential is in it (the Jobs tab shows it): scoped jobs fetch theirs
from the signals actor (`credentials`).

Must not: decide who runs (that is `policies.admission`); every item is applied as the
policy returned it.
"""

from __future__ import annotations

from controlplane.loop.act.jobs.admission import apply_admission

# Only the light admission step here: the loop (and the simulator, and the CLI through it)
# imports this package, and must not load Ray; the runner is `controlplane.loop.act.jobs.runner`.
__all__ = ["apply_admission"]
