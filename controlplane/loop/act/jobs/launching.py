"""Admission and launch: an admitted gang becomes a Ray Job, exactly once.

Owns:

* `Launcher.admit` (AdmitJob): QUEUED -> ADMITTED, record the attempt and its Ray submission
  id ``<job_id>-<attempt>`` *before* submitting (Ray refuses a second submission with the
  same id, so a crash between the two never runs a gang twice), register the attempt's signal
  token with the signals actor, hand it the attempt's scoped storage credentials
  (`credentials.JobCredentials.issue`, ``storage.job_credentials=scoped``), then submit the
  launcher;
* `Launcher.submit`: the submission, on a worker thread (`background.Submissions`): the tick
  waits at most ``jobs.submit_timeout_s``; past that the start counts as failed, and a
  submission Ray accepts late is stopped; while an earlier one still hangs the job stays
  QUEUED (event ``job.submit_deferred``) with no start failure;
* what a gang runs (see the package doc): the Ray Job's entrypoint and its runtime env.

Must not: call Ray but through the Ray Jobs adapter (`ray_jobs.RayJobs`), or decide who runs
(that is `policies.admission`).
"""

from __future__ import annotations

import logging
import re
import secrets
import shlex
import sys
from collections.abc import Callable
from typing import Any

from controlplane.adapters.ray_jobs import RayJobsApi, RayJobStatus
from controlplane.config import Config
from controlplane.loop.act.jobs.background import Submissions, SubmitBusy
from controlplane.loop.act.jobs.credentials import JobCredentials
from controlplane.loop.act.jobs.ends import AttemptEnds
from controlplane.ray_connection import ray_connection_env
from controlplane.store import JobRecord, JobState, Store, recoveries, reliability
from controlplane.store.job_info import (
    SIGNAL_TOKEN_INFO,
    Reason,
    as_count,
    checkpoint_uri,
    info_step,
    uri_of,
)
from jobs import launcher
from jobs.signals import environment
from jobs.signals.trust import token_sha256
from policies.plan import AdmitJob

__all__ = ["Launcher", "entrypoint_command"]

log = logging.getLogger(__name__)

TRAIN_HEALTH_CHECK_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
TRAIN_HEALTH_CHECK_S = 0.5
"""How often Ray Train's controller polls a gang's workers when it may restart them in place
(measured here: a SIGKILLed worker found 0.42-0.47 s later at 0.5 s, 0.96 s at Ray's 2 s)."""
TRAIN_PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
"""Off for every gang (a job may set it): Ray Train's watcher is one more actor started with each
worker group, and only logs node drains, which the control plane acts on itself (it asks a
gang to checkpoint before any drain it makes, `policies.health`)."""

_FUNCTION_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def entrypoint_command(entrypoint: str, python: str = sys.executable) -> str:
    """The Ray Job entrypoint for a spec's entrypoint (see the module doc), with `python` the
    cluster's interpreter::

        "pkg.train:loop"            -> "<python> -m jobs.launcher pkg.train:loop"
        "python train.py --lr 3e-4" -> "<python> -m jobs.launcher --command -- <python> train.py --lr 3e-4"
        "bash run.sh 'a b'"         -> "<python> -m jobs.launcher --command -- bash run.sh 'a b'"

    A command is split into words as a POSIX shell splits them (quotes honoured, nothing
    expanded or chained: for pipes, ``&&`` or ``$VAR`` run ``bash -c '...'``) and each word is
    quoted again. ValueError for an empty command or an unbalanced quote."""
    ep = entrypoint.strip()
    run_launcher = f"{shlex.quote(python)} -m jobs.launcher"
    if _FUNCTION_RE.match(ep):
        return f"{run_launcher} {ep}"
    try:
        argv = shlex.split(ep)
    except ValueError as exc:
        raise ValueError(f"entrypoint {entrypoint!r} cannot be split into words: {exc}") from None
    if not argv:
        raise ValueError("the entrypoint is empty: give a command or module:function")
    if argv[0] in ("python", "python3"):
        argv[0] = python
    return f"{run_launcher} {launcher.COMMAND_FLAG} -- {shlex.join(argv)}"


class Launcher:
    """Admits and submits gangs (see the module doc). Every method is idempotent."""

    def __init__(
        self,
        store: Store,
        cfg: Config,
        ray_jobs: RayJobsApi,
        clock: Callable[[], float],
        submissions: Submissions,
        ends: AttemptEnds,
        credentials: JobCredentials,
    ) -> None:
        self.store = store
        self.cfg = cfg
        self.ray = ray_jobs
        self.clock = clock
        self._submissions = submissions
        self._ends = ends
        self._credentials = credentials

    def admit(self, action: AdmitJob) -> None:
        job = self.store.get(action.job_id)
        if job.state is not JobState.QUEUED:
            return  # already acted on (level-triggered plans repeat)
        hanging = self._submissions.hanging()
        if hanging is not None:
            # Ray's dashboard is not answering: not this job's failure. It stays QUEUED, no
            # attempt is used up, and a later tick admits it again.
            self._defer(
                job,
                f"{Reason.SUBMIT_DEFERRED.value}: Ray has not answered the submission of "
                f"{hanging} yet; admitting again once it does",
            )
            return
        now = self.clock()
        attempt = int(job.info.get("attempt", 0)) + 1
        submission_id = f"{job.job_id}-{attempt}"
        placement: dict[str, int] = {}
        for p in action.placement:
            placement[p.node_id] = (
                placement.get(p.node_id, 0) + p.num_workers * action.gpus_per_worker
            )
        self.store.update_info(
            job.job_id,
            {
                "attempt": attempt,
                "submission_id": submission_id,
                "admitted_s": now,
                "placement": placement,
                "checkpoint_uri": checkpoint_uri(self.cfg, job),
                # The committed step this attempt starts from (progress is measured from it).
                "start_step": info_step(job.info.get("checkpoint")),
                "progress": None,
                "preempting": None,
                "preempt_checkpoint": None,
                "preempt_kind": None,
                "stopping": None,
                "stop_sent": None,
                "ray_done": None,
                "not_before_s": None,
                "in_place_recorded": None,
                **recoveries.admitted(job.info, now),
                # This attempt's secret for the signals actor (RCP_SIGNAL_TOKEN). Kept only
                # here: never in events, logs or the API's job view (`job_to_json`).
                SIGNAL_TOKEN_INFO: secrets.token_urlsafe(32),
            },
        )
        self.store.transition(
            job.job_id, JobState.ADMITTED, action.reason, expected=JobState.QUEUED
        )
        job = self.store.get(job.job_id)
        try:
            self.register_signals(job)
        except Exception as exc:
            log.warning("registering %s with the job signals actor failed: %s", job.job_id, exc)
            self._ends.start_failed(job, f"{Reason.START_FAILED.value}: job signals unavailable")
            return
        try:
            self._credentials.issue(job)
        except Exception as exc:
            log.warning("scoped storage credentials for %s: %s", job.job_id, exc)
            self._ends.start_failed(
                job, f"{Reason.START_FAILED.value}: storage credentials unavailable: {exc}"
            )
            return
        self.submit(job)

    def register_signals(self, job: JobRecord) -> None:
        """Tell the signals actor this attempt's token (as its hash) and checkpoint prefix."""
        self.ray.register_signals(
            job.job_id,
            int(job.info["attempt"]),
            token_sha256(str(job.info[SIGNAL_TOKEN_INFO])),
            uri_of(self.cfg, job),
        )

    def _defer(self, job: JobRecord, reason: str) -> None:
        """Record why `job` was not submitted this time (once per distinct reason: the plan
        repeats every tick) without charging it a start failure."""
        log.info("job %s: %s", job.job_id, reason)
        if job.info.get("message") == reason:
            return
        self.store.update_info(job.job_id, {"message": reason})
        self.store.record_event(
            "job.submit_deferred", f"job {job.job_id}: {reason}", job_id=job.job_id
        )

    def submit(self, job: JobRecord) -> None:
        """Submit off the tick thread, waiting at most ``jobs.submit_timeout_s``. Refused
        because an earlier submission still hangs (`SubmitBusy`) is no start failure: the job
        goes back to QUEUED (its Ray Job does not exist) with the reason in its history and a
        ``job.submit_deferred`` event, and is admitted again later."""
        sid = str(job.info["submission_id"])
        try:
            entrypoint, runtime_env = self._ray_job(job)
            self._submissions.run(
                sid,
                lambda: self.ray.submit(sid, entrypoint, runtime_env),
                lambda: self._stop_late_submission(sid),
                self.cfg.jobs.submit_timeout_s,
            )
        except SubmitBusy as exc:
            reason = f"{Reason.SUBMIT_DEFERRED.value}: {exc}"
            if self.ray.status(sid) is RayJobStatus.MISSING and job.state is JobState.ADMITTED:
                self.store.update_info(
                    job.job_id, {"placement": None, "ray_done": True, "message": reason}
                )
                self.store.transition(
                    job.job_id, JobState.QUEUED, reason, expected=JobState.ADMITTED
                )
                self.store.record_event(
                    "job.submit_deferred", f"job {job.job_id}: {reason}", job_id=job.job_id
                )
            else:
                self._defer(job, reason)
        except Exception as exc:
            log.warning("submitting %s failed: %s", job.job_id, exc)
            self._ends.start_failed(job, f"{Reason.START_FAILED.value}: {exc}")

    def _stop_late_submission(self, sid: str) -> None:
        """Ray accepted a submission after the runner gave up on it: stop that gang (the job
        was re-queued and its next attempt has a new submission id)."""
        log.warning("Ray accepted %s after its submission timed out; stopping it", sid)
        try:
            self.ray.stop(sid)
        except Exception as exc:
            log.error("could not stop late submission %s: %s", sid, exc)

    def _ray_job(self, job: JobRecord) -> tuple[str, dict[str, Any]]:
        s = job.spec
        c = s.checkpoint
        env: dict[str, str] = {
            str(k): str(v) for k, v in dict(s.runtime_env.get("env_vars") or {}).items()
        }
        mtbf_s = reliability.job_mtbf_s(self.store, self.cfg, s.gpus_total, self.clock())
        env.update(
            {
                environment.ENV_JOB_ID: job.job_id,
                environment.ENV_ATTEMPT: str(job.info["attempt"]),
                environment.ENV_SIGNAL_POLL_S: f"{self.cfg.jobs.job_signal_poll_s:g}",
                environment.ENV_CHECKPOINT_URI: uri_of(self.cfg, job),
                environment.ENV_STORAGE_REGION: self.cfg.storage.region,
                environment.ENV_CHECKPOINT_ENABLED: "1" if c.enabled else "0",
                environment.ENV_CHECKPOINT_KEEP_LAST: str(c.keep_last),
                environment.ENV_MTBF_S: f"{mtbf_s:.1f}",
                environment.ENV_STEP_REPORT_S: f"{self.cfg.jobs.step_report_interval_s:g}",
                launcher.ENV_NUM_WORKERS: str(s.num_workers),
                launcher.ENV_GPUS_PER_WORKER: str(s.gpus_per_worker),
                launcher.ENV_CPUS_PER_WORKER: f"{s.cpus_per_worker:g}",
                launcher.ENV_STORAGE_PATH: str(self.cfg.train_storage_path),
                launcher.ENV_NODE_IDS: ",".join(sorted(job.info.get("placement") or {})),
                **ray_connection_env(),
            }
        )
        endpoint = self.cfg.storage_endpoint_url
        if endpoint:
            env[environment.ENV_STORAGE_ENDPOINT_URL] = endpoint
        if c.interval_s is not None:
            env[environment.ENV_CHECKPOINT_INTERVAL_S] = f"{c.interval_s:g}"
        if self._credentials.wanted(job):  # the credentials themselves never go in here
            env[environment.ENV_STORAGE_CREDENTIALS] = environment.STORAGE_CREDENTIALS_FROM_SIGNALS
        if job.info.get(SIGNAL_TOKEN_INFO):
            env[environment.ENV_SIGNAL_TOKEN] = str(job.info[SIGNAL_TOKEN_INFO])
        if s.restart_in_place:  # the restarts the job has left, each one spent when recorded
            left = s.max_restarts - (as_count(job.info.get("restarts")) or 0)
            env[environment.ENV_RESTARTS_IN_PLACE] = str(max(0, left))
            # Ray Train's controller looks at its workers every 2 s by default: a dead one
            # is found half of that later on average. The job's own setting wins.
            env.setdefault(TRAIN_HEALTH_CHECK_ENV, f"{TRAIN_HEALTH_CHECK_S:g}")
        env.setdefault(TRAIN_PREEMPTION_WATCHER_ENV, "0")
        runtime_env = {k: v for k, v in s.runtime_env.items() if k != "env_vars"}
        runtime_env["env_vars"] = env
        if s.working_dir:
            runtime_env["working_dir"] = s.working_dir
        return entrypoint_command(s.entrypoint), runtime_env
