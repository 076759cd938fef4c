"""One checkpointing helper for training loops: restore, should_checkpoint, save, report, finish.

Owns the training loop's side of every checkpoint the control plane runs::

    from jobs.checkpointing import Checkpointing

    ckpt = Checkpointing()                 # everything from the RCP_* environment
    restored = ckpt.restore()              # the same step on every rank, or None
    start = restored.step + 1 if restored else 0
    for step in range(start, num_steps):
        loss = train_step()
        if ckpt.should_checkpoint(step):   # the same answer on every rank
            ckpt.save(step, {"model": model.state_dict(), "optim": optim.state_dict()})
            if ckpt.preempted:             # the control plane asked for this one
                break
        ckpt.report(step, {"loss": loss})
    ckpt.finish()

It works in both ways a job runs:

* inside a Ray Train worker (``entrypoint: module:function``, `jobs.launcher.run_gang`): rank
  and world size from ``ray.train.get_context()``, metrics also go to ``ray.train.report``,
  and Ray Train's own preemption signal (a node being drained) triggers a checkpoint;
* inside a plain process (``rcp submit -- python train.py``: the command runs on every rank
  with torchrun's environment): rank and world size from ``torch.distributed`` when it is
  initialised, else ``RANK``/``WORLD_SIZE``. Under the control plane (``RCP_JOB_ID`` set) the
  helper joins the node's Ray cluster (``ray.init(address="auto")``) to reach the signals
  actor and the memory tier; if that fails it warns and goes on without them (no step
  reports, so the hang watchdog never arms; no checkpoint-now requests; no memory tier).

Behind it is `jobs.checkpoint.CheckpointEngine` (a snapshot into host memory on the training
thread, the upload in the background, the manifest last), writing straight to
``RCP_CHECKPOINT_URI`` (the job's own prefix) with the credentials the control plane minted for
it (``RCP_STORAGE_CREDENTIALS=signals``, `credentials`), else boto3's usual chain on the node.
When Ray is up the newest snapshot is also held by a `RayMemoryTier` named after the job id.

When to checkpoint (`should_checkpoint`), first match wins:

1. checkpointing disabled (``RCP_CHECKPOINT_ENABLED=0``, or no URI at all): never;
2. a checkpoint-now request (rank 0 polls the signals actor every ``RCP_SIGNAL_POLL_S``) or
   Ray Train's preemption signal: now, once per request;
3. ``every_n_steps`` given in code: after every n-th step (``(step + 1) % n == 0``);
4. a fixed interval (the ``interval_s`` argument, else ``RCP_CHECKPOINT_INTERVAL_S``): once
   that long has passed since the last save (or the start);
5. else Young/Daly (`policies.checkpointing`) from the measured stalls, the last upload time
   and ``RCP_MTBF_S``; ``IntervalConfig.min_interval_s`` until the first save is measured.

Each rank computes its own answer and one one-element all-reduce (MAX) makes it the gang's,
so every rank saves the same step. On a request `save` waits for the commit (rank 0's
manifest), rank 0 tells the controller (``checkpointed``, a hint: the controller reads the
manifest from storage), and `preempted` turns True; `finish` then waits for the controller to
stop the gang and raises `PreemptedError` if it does not, so a preempted loop never ends as a
success. Rank 0 reports its step to the controller (``progress``) at the first step and then
at most every ``RCP_STEP_REPORT_S``, with the attempt's checkpoint stall, wall time, saves
and newest committed step: the hang watchdog and ``rcp status`` read these.

Metrics (label ``run``: the job id; see `jobs.checkpoint.metrics`): the engine's
``rcp_checkpoint_*`` plus `reporting`'s started and interval gauges. After a restore rank 0
sets the engine's newest-commit gauges from the restored manifest, so a restarted job's newest
commit is known before it commits again.

Its parts: `helper` (the `Checkpointing` class), `settings` (`detect_gang`,
`settings_from_env`, joining Ray), `cadence`, `agreement` (the gloo all-reduce and the agreed
restore) and `reporting` (rank 0's calls to the signals actor, the metrics).

Must not: import `controlplane` (everything comes from ``RCP_*`` variables); log or print the
signal token or storage credentials; let a slow or missing signals actor stop training.
"""

from __future__ import annotations

from jobs.checkpointing.helper import PREEMPTED_WAIT_S, Checkpointing, PreemptedError
from jobs.checkpointing.reporting import (
    INTERVAL_SECONDS,
    RAY_TRAIN_REPORT_INTERVAL_S,
    STARTED_UNIX_SECONDS,
)
from jobs.checkpointing.settings import (
    DEFAULT_MTBF_S,
    DEFAULT_SIGNAL_POLL_S,
    DEFAULT_STEP_REPORT_S,
    Gang,
    Settings,
    detect_gang,
    settings_from_env,
)

__all__ = [
    "DEFAULT_MTBF_S",
    "DEFAULT_SIGNAL_POLL_S",
    "DEFAULT_STEP_REPORT_S",
    "INTERVAL_SECONDS",
    "PREEMPTED_WAIT_S",
    "RAY_TRAIN_REPORT_INTERVAL_S",
    "STARTED_UNIX_SECONDS",
    "Checkpointing",
    "Gang",
    "PreemptedError",
    "Settings",
    "detect_gang",
    "settings_from_env",
]
