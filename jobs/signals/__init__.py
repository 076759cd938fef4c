"""The job signals: the mailbox between the control plane and a job's training loops.

A small named Ray actor (namespace ``rcp``, name ``rcp-job-signals``) that the control plane
creates holds, per job and attempt, which workers have started (rank, pid, node), the job's
progress (step, when it last grew, checkpoint stall and wall seconds, saves, committed step),
the latest checkpoint the job reported (step, path, time), whether the control plane asked
for a checkpoint now and, with ``storage.job_credentials=scoped``, the attempt's storage
credentials (scoped to its prefix: `put_credentials`, fetched by the job with its token:
`credentials`; `status` shows only when they expire). It is a mailbox, not a source of truth:
the control plane copies what it reads into its durable store every tick, and reads committed
steps from object storage.

The job's side is `jobs.checkpointing.Checkpointing`: rank 0 polls `poll` every
``RCP_SIGNAL_POLL_S``, reports `progress` every ``RCP_STEP_REPORT_S`` and, after saving and
committing a requested checkpoint, `checkpointed`; `jobs.launcher` reports `worker_started`.

Trust (any Ray job in the cluster can reach the actor by name, see docs/operations.md, "Job
signals"): the control plane registers each attempt with the SHA-256 of a fresh secret
(``RCP_SIGNAL_TOKEN``) and the job's checkpoint prefix (``RCP_CHECKPOINT_URI``); the actor
refuses job-side calls without that attempt's token and checkpoints outside that prefix
(`under_prefix`). Its control-plane methods need an HMAC (`admin_auth`) over a fresh nonce,
the method and its arguments, keyed with the secret the controller created this actor with
(derived from the controller's admin key, `derive_admin_secret`; the key itself never leaves
the controller, and no call carries a secret). A recorded call cannot be replayed: nonces
only grow and must be recent (`ADMIN_NONCE_WINDOW_S`). The controller talks only to the
actor whose id it pinned when it created it (`controlplane.adapters.ray_jobs.RayJobs`).

Its modules: `environment` (the ``RCP_*`` names; imports nothing, not even Ray), `trust` (token
hash, admin MAC, checkpoint prefix; pure), `reports` (what the actor returns and counts),
`mailbox` (the actor, `JobSignals`) and `handle` (a job's handle on it, `SignalsHandle`).

Owns: nothing itself; it names the package's concern and imports nothing, so importing
`jobs.signals.environment` does not import Ray.

Must not: import `controlplane` (the runner passes everything through the ``RCP_*``
environment variables in `jobs.signals.environment`); log or print the token or a job's
credentials.
"""
