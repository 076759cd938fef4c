"""What a researcher submits: the `JobSpec` of a training gang, its validation and YAML form.

Owns: the fields of a job (what to run, how many workers with how many GPUs, which queue and
priority class, how long it may run, how it checkpoints), their validation with errors that
name the field, and the round trip to dicts and YAML (the `rcp submit JOB.yaml` format).

Must not: import `controlplane`, talk to Ray, or know the live cluster. Checks that need the
control plane's configuration or the live pool (is the priority class configured? could the
pool ever hold this gang?) take those as arguments in `JobSpec.check_against`, which the
service calls at submit time.

A spec is untrusted input (anyone with the API token writes one), so validation is also the
security boundary for what the controller hands to Ray:

* code comes only from remote URIs (`working_dir`, ``runtime_env.py_modules``): Ray's job
  client zips a local path on the submitting machine's disk, which is the controller's;
* ``runtime_env`` takes only the keys in `RUNTIME_ENV_KEYS`, each in a form that names no
  file (``pip`` as a list of requirement specifiers, never a requirements-file path);
* ``env_vars`` may not set ``RAY_*`` or ``RCP_*`` names, except `USER_ENV_VARS`;
* every number is finite (NaN and Infinity are refused wherever they appear).

Its parts: `job_spec` (`JobSpec`, `CheckpointSpec`, `check_checkpoint_uri`), `limits` (every
limit and allowed set, named once), `values` (checks of one value), `runtime_env` and `errors`
(`SpecError`, `FieldError`).

Example YAML::

    name: llama-ft
    entrypoint: python train.py --epochs 3
    working_dir: s3://team-code/llama-ft/v3.zip
    num_workers: 4
    gpus_per_worker: 2
    queue: research
    priority_class: high
    max_runtime_s: 7200
    checkpoint:
      interval_s: 600
"""

from __future__ import annotations

from jobs.spec.errors import FieldError, SpecError
from jobs.spec.job_spec import CheckpointSpec, JobSpec, check_checkpoint_uri
from jobs.spec.limits import (
    CODE_ARCHIVE_SUFFIXES,
    DEFAULT_PRIORITY_CLASSES,
    JOBS_AREA,
    MAX_RESTARTS_LIMIT,
    REMOTE_URI_SCHEMES,
    RUNTIME_ENV_KEYS,
    USER_ENV_VARS,
)

__all__ = [
    "CODE_ARCHIVE_SUFFIXES",
    "DEFAULT_PRIORITY_CLASSES",
    "JOBS_AREA",
    "MAX_RESTARTS_LIMIT",
    "REMOTE_URI_SCHEMES",
    "RUNTIME_ENV_KEYS",
    "USER_ENV_VARS",
    "CheckpointSpec",
    "FieldError",
    "JobSpec",
    "SpecError",
    "check_checkpoint_uri",
]
