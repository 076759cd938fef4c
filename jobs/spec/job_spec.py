"""The `JobSpec` of a training gang and its `CheckpointSpec`: fields, validation, round trip.

Owns: the fields of a job (what to run, how many workers with how many GPUs, which queue and
priority class, how long it may run, how it checkpoints) with each one's checks declared on it
(``Annotated``: strict types, bounds), `SPEC` (pydantic's check of a whole spec, run on every
construction: every field's problems at once, by path), the checks that need the control
plane's view (`JobSpec.check_against`, `check_checkpoint_uri`, called by the service at submit
time) and the round trip to dicts and YAML.

Must not: import `controlplane`, talk to Ray, or know the live cluster (the control plane's
configuration and the pool come in as arguments).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, StrictBool, StrictFloat, StrictInt, StrictStr

from jobs.spec.errors import FieldError, SpecError, kind
from jobs.spec.limits import (
    CODE_ARCHIVE_SUFFIXES,
    DEFAULT_PRIORITY_CLASSES,
    JOBS_AREA,
    MAX_INTERVAL_S,
    MAX_RESTARTS_LIMIT,
    NAME_RE,
)
from jobs.spec.runtime_env import runtime_env_rules
from jobs.spec.values import checkpoint_uri_form, entrypoint_words, remote_code
from jobs.storage_uri import StorageUriError, parse_storage_uri
from policies.validation import (
    FINITE,
    Checked,
    above,
    at_least,
    at_most,
    finite_everywhere,
)

__all__ = ["SPEC", "CheckpointSpec", "JobSpec", "check_checkpoint_uri"]


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("is required and must be a non-empty string")
    return value


def _name(value: str) -> str:
    if not NAME_RE.match(_non_empty(value)):
        raise ValueError(
            f"{value!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or "
            "digit"
        )
    return value


Text = Annotated[StrictStr, AfterValidator(_non_empty)]
Seconds = Annotated[StrictFloat | None, above(0)]
"""A positive number of seconds, or null."""


@dataclass(frozen=True)
class CheckpointSpec:
    """How a job checkpoints; the helpers in `jobs/` read these from the job's environment."""

    enabled: StrictBool = True
    """False: the job never checkpoints; a preemption then loses all its work."""
    interval_s: Annotated[Seconds, at_most(MAX_INTERVAL_S, "a week")] = None
    """Seconds between periodic checkpoints; None lets the checkpoint policy choose."""
    keep_last: Annotated[StrictInt, at_least(1)] = 2
    """Complete checkpoints to keep; older ones are deleted after a newer one is complete."""
    preempt_deadline_s: Annotated[StrictFloat, above(0)] = 120.0
    """How long a preemption waits for the checkpoint-now snapshot before stopping the gang."""
    uri: Annotated[StrictStr | None, AfterValidator(checkpoint_uri_form)] = None
    """Where checkpoints go: an ``s3://bucket/prefix`` URI whose bucket exists (checked at
    submission), outside the cluster's per-job area ``<storage.uri>/jobs/``. None (the
    default) means ``<storage.uri>/jobs/<job id>/``. Never file:// or a path. Naming the same
    URI in a later job resumes from the checkpoints an earlier one left there."""


@dataclass(frozen=True)
class JobSpec:
    """One training gang. Construct it directly or with `from_dict`/`from_yaml`; both validate."""

    __pydantic_config__ = FINITE

    name: Annotated[StrictStr, AfterValidator(_name)]
    entrypoint: Annotated[Text, AfterValidator(entrypoint_words)]
    """The command the Ray Job runs, e.g. ``python train.py --lr 3e-4``."""
    num_workers: Annotated[StrictInt, at_least(1, "a gang needs at least 1 worker")] = 1
    """Ray Train workers; all of them start together or none does (gang)."""
    gpus_per_worker: Annotated[StrictInt, at_least(0)] = 1
    """GPUs each worker needs on a single node; 0 for a CPU-only job."""
    cpus_per_worker: Annotated[StrictFloat, at_least(0)] = 1.0
    working_dir: Annotated[StrictStr | None, remote_code(CODE_ARCHIVE_SUFFIXES)] = None
    """The job's code: a remote archive (``s3://bucket/code.zip``; see `REMOTE_URI_SCHEMES`
    and `CODE_ARCHIVE_SUFFIXES`), unpacked by Ray as the working dir. Never a local path."""
    runtime_env: Annotated[
        Mapping[str, Any], AfterValidator(finite_everywhere), AfterValidator(runtime_env_rules)
    ] = field(default_factory=dict)
    """Extra Ray runtime_env, only the keys in `RUNTIME_ENV_KEYS` (pip, env_vars, ...); use
    `working_dir` above for the code."""
    queue: Text = "default"
    """The team queue; it owns a share of the cluster pool."""
    priority_class: Text = "medium"
    """A configured priority class (defaults: low, medium, high)."""
    max_runtime_s: Seconds = None
    """The job is stopped after this long; also lets it backfill. None: no limit."""
    max_restarts: Annotated[
        StrictInt, at_least(0), at_most(MAX_RESTARTS_LIMIT, "restarts of one job")
    ] = 3
    """Times a gang that failed (a worker raised or was killed) or hung is restarted from its
    last committed checkpoint before the job is FAILED. Preemptions, moves by node health and
    a node lost under the gang do not count."""
    restart_in_place: StrictBool = True
    """A crashed worker restarts the gang inside the same run (Ray Train starts a new worker
    group on the same nodes, in seconds) rather than as a new attempt through the queue. Each
    counts against ``max_restarts``; once the run has used its share, or a node is lost, the
    job restarts through the queue as before."""
    stall_timeout_s: Seconds = None
    """A running job that reports no new step for this long is declared hung: its workers'
    stacks go to its logs and it restarts from its last checkpoint (a restart). None: the
    cluster's ``jobs.stall_timeout_s``. Must be at least ``jobs.step_report_interval_s``.
    Armed once the job reports its first step (through `jobs.checkpointing`)."""
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)

    def __post_init__(self) -> None:
        if not _CHECKING.get():  # built in code: check it as plain data is
            _checked(self)
        object.__setattr__(self, "runtime_env", dict(self.runtime_env))

    @property
    def gpus_total(self) -> int:
        return self.num_workers * self.gpus_per_worker

    # -- checks that need the control plane's view --------------------------------------------

    def check_against(
        self,
        *,
        priority_classes: Iterable[str] = DEFAULT_PRIORITY_CLASSES,
        queues: Iterable[str] | None = None,
        cluster_node_gpus: Iterable[int] | None = None,
        step_report_interval_s: float | None = None,
    ) -> None:
        """Raise SpecError if the cluster as configured could never run this job.

        `cluster_node_gpus` is ``gpus_total`` of every node of the `cluster` pool; the gang fits
        only if each worker's GPUs fit on one node and all workers fit at once.
        `step_report_interval_s` is how often a job reports its step: a `stall_timeout_s`
        shorter than that would declare every healthy job hung.
        """
        errors: list[FieldError] = []

        def refuse(path: str, reason: str) -> None:
            errors.append(FieldError(path, reason))

        if (
            step_report_interval_s is not None
            and self.stall_timeout_s is not None
            and self.stall_timeout_s < step_report_interval_s
        ):
            refuse(
                "stall_timeout_s",
                f"{self.stall_timeout_s:g}s is shorter than the step report interval "
                f"(jobs.step_report_interval_s = {step_report_interval_s:g}s): a healthy "
                "job would be declared hung between two reports",
            )
        classes = list(priority_classes)
        if self.priority_class not in classes:
            refuse(
                "priority_class",
                f"unknown priority class {self.priority_class!r}; configured: {', '.join(classes)}",
            )
        known = None if queues is None else list(queues)
        if known is not None and self.queue not in known:
            refuse("queue", f"unknown queue {self.queue!r}; configured: {', '.join(known)}")
        if cluster_node_gpus is not None and self.gpus_per_worker > 0:
            node_gpus = list(cluster_node_gpus)
            largest = max(node_gpus, default=0)
            slots = sum(g // self.gpus_per_worker for g in node_gpus)
            if self.gpus_per_worker > largest:
                refuse(
                    "gpus_per_worker",
                    f"{self.gpus_per_worker} GPUs per worker, but the largest cluster node "
                    f"has {largest}",
                )
            elif slots < self.num_workers:
                refuse(
                    "num_workers",
                    f"{self.num_workers} workers x {self.gpus_per_worker} GPUs cannot fit: "
                    f"the cluster pool holds at most {slots} such workers",
                )
        if errors:
            raise SpecError(errors)

    # -- dict and YAML ---------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON and YAML safe); `from_dict(to_dict())` gives an equal spec."""
        data = dataclasses.asdict(self)
        data["runtime_env"] = dict(self.runtime_env)
        return data

    @classmethod
    def from_dict(cls, data: object) -> JobSpec:
        """Build and validate a spec from plain data. Unknown keys are errors (typos)."""
        if not isinstance(data, Mapping):
            raise SpecError([FieldError("<spec>", f"must be a mapping, got {kind(data)}")])
        if "checkpoint" in data and data["checkpoint"] is None:  # null: the defaults
            data = {k: v for k, v in data.items() if k != "checkpoint"}
        return _checked(data)

    @classmethod
    def from_yaml(cls, text: str) -> JobSpec:
        """Parse a YAML job file; malformed YAML is a SpecError with the line and column."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"
            problem = str(getattr(exc, "problem", None) or str(exc).splitlines()[0])
            raise SpecError([FieldError("<yaml>", f"not valid YAML{where}: {problem}")]) from exc
        if data is None:
            raise SpecError([FieldError("<yaml>", "the file is empty")])
        return cls.from_dict(data)

    def to_yaml(self) -> str:
        return str(yaml.safe_dump(self.to_dict(), sort_keys=False))


def _across_fields(spec: JobSpec) -> list[FieldError]:
    if "working_dir" in spec.runtime_env and spec.working_dir is not None:
        why = "set either working_dir or runtime_env.working_dir, not both"
        return [FieldError("runtime_env.working_dir", why)]
    return []


SPEC = Checked(JobSpec, SpecError, _across_fields)
_CHECKING = ContextVar("_CHECKING", default=False)


def _checked(data: object) -> JobSpec:
    """`data` (plain data, or a spec built in code) checked; the spec pydantic builds is not
    checked again on its way (`JobSpec.__post_init__`)."""
    token = _CHECKING.set(True)
    try:
        return SPEC.load(data)
    finally:
        _CHECKING.reset(token)


def check_checkpoint_uri(spec: JobSpec, storage_uri: str) -> list[FieldError]:
    """At submission: `spec`'s checkpoint.uri, if set, must not overlap the cluster's per-job
    area (``<storage_uri>/jobs/``): neither lie in it, where it could name another job's
    checkpoints, nor contain it, where the job's retention would reach theirs. Both URIs are
    parsed by `jobs.storage_uri.parse_storage_uri` (the parser the storages open them with)
    and compared segment by segment, so ``s3://b//x``, ``S3://b/x`` and ``%2F`` tricks are
    refused or resolve as storage resolves them. Job ids are assigned after this check, so no
    job may name even its own default there."""
    uri = spec.checkpoint.uri
    if uri is None:
        return []
    area = parse_storage_uri(storage_uri).child(JOBS_AREA)
    try:
        parsed = parse_storage_uri(uri)
    except StorageUriError as exc:
        return [FieldError("checkpoint.uri", f"{exc}; expected s3://bucket/prefix")]
    if not parsed.overlaps(area):
        return []
    where = "is inside" if area.contains(parsed) else "contains"
    return [
        FieldError(
            "checkpoint.uri",
            f"{uri!r} {where} {area}/, where the control plane keeps each job's own "
            f"checkpoints (a job's default prefix is {area}/<job id>/); leave checkpoint.uri "
            f"unset for that, or use a prefix that neither lies in {area}/ nor contains it",
        )
    ]
