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

import dataclasses
import difflib
import math
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet

__all__ = [
    "CODE_ARCHIVE_SUFFIXES",
    "DEFAULT_PRIORITY_CLASSES",
    "REMOTE_URI_SCHEMES",
    "RUNTIME_ENV_KEYS",
    "USER_ENV_VARS",
    "JOBS_AREA",
    "MAX_RESTARTS_LIMIT",
    "CheckpointSpec",
    "FieldError",
    "JobSpec",
    "SpecError",
    "check_checkpoint_uri",
]

DEFAULT_PRIORITY_CLASSES = ("low", "medium", "high")
MAX_RESTARTS_LIMIT = 1000
MAX_INTERVAL_S = 7 * 86400.0
"""The longest checkpoint.interval_s: a week between checkpoints is already no checkpointing."""
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

REMOTE_URI_SCHEMES = ("s3", "gs", "azure", "abfss", "https")
"""Where a job's code may come from: Ray's remote runtime_env protocols
(``ray/_private/runtime_env/protocol.py``, ``get_remote_protocols``) less ``file`` (a path on
a node's own disk) and ``http`` (code fetched in clear text). Ray's ``gcs://`` (packages other
jobs uploaded) and ``local://`` (a directory on the node) are local paths in disguise."""

CODE_ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")
"""Archives Ray unpacks from a remote URI as a working_dir or a py_module."""
_PY_MODULE_SUFFIXES = (*CODE_ARCHIVE_SUFFIXES, ".whl")

RUNTIME_ENV_KEYS = ("working_dir", "py_modules", "pip", "uv", "conda", "env_vars", "config")
"""The runtime_env keys a job may set. Refused, among others: ``container``/``image_uri``
(another image, host mounts through run options), ``excludes`` (only for local uploads),
``py_executable`` and ``worker_process_setup_hook`` (ask an operator for the image instead)."""

USER_ENV_VARS = frozenset({"RCP_TRAIN_CONFIG", "RCP_TORCH_BACKEND"})
"""The only ``RCP_*`` variables a job sets itself (read by `jobs.launcher`); every other
``RCP_*`` and every ``RAY_*`` name belongs to the control plane and Ray."""
_RESERVED_ENV_PREFIXES = ("RCP_", "RAY_")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONDA_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PIP_DICT_KEYS = ("packages", "pip_check", "pip_version")
_UV_DICT_KEYS = ("packages", "uv_version", "uv_check")
_CONDA_DICT_KEYS = ("name", "channels", "dependencies")
"""An environment mapping's keys. Refused: ``prefix`` (a path on the node), ``variables``
(environment variables around the ``env_vars`` rules)."""
_CONDA_SPEC_RE = re.compile(
    r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*(::[A-Za-z0-9_][A-Za-z0-9_.\-]*)?[^:/\\]*$"
)
"""A conda match spec: ``numpy``, ``numpy>=1.26``, ``conda-forge::numpy 1.26.* py311*``;
no URL, path or ``file:``."""
_ARCHIVE_NAME_SUFFIXES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tar", ".egg")
"""A requirement named like an archive is read by pip as a file on the node, not a name."""
_CONFIG_KEYS = {"setup_timeout_seconds": int, "eager_install": bool}


@dataclass(frozen=True)
class FieldError:
    """One problem with one field; `field` is a dotted path such as ``checkpoint.interval_s``."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class SpecError(ValueError):
    """A job spec is invalid. `errors` lists every problem, each naming its field."""

    def __init__(self, errors: Iterable[FieldError]) -> None:
        self.errors = tuple(errors)
        lines = "\n  ".join(str(e) for e in self.errors)
        super().__init__(f"invalid job spec:\n  {lines}")

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(e.field for e in self.errors)


@dataclass(frozen=True)
class CheckpointSpec:
    """How a job checkpoints; the helpers in `jobs/` read these from the job's environment."""

    enabled: bool = True
    """False: the job never checkpoints; a preemption then loses all its work."""
    interval_s: float | None = None
    """Seconds between periodic checkpoints; None lets the checkpoint policy choose."""
    keep_last: int = 2
    """Complete checkpoints to keep; older ones are deleted after a newer one is complete."""
    preempt_deadline_s: float = 120.0
    """How long a preemption waits for the checkpoint-now snapshot before stopping the gang."""
    uri: str | None = None
    """Where checkpoints go: an ``s3://bucket/prefix`` URI whose bucket exists (checked at
    submission), outside the cluster's per-job area ``<storage.uri>/jobs/``. None (the
    default) means ``<storage.uri>/jobs/<job id>/``. Never file:// or a path. Naming the same
    URI in a later job resumes from the checkpoints an earlier one left there."""


@dataclass(frozen=True)
class JobSpec:
    """One training gang. Construct it directly or with `from_dict`/`from_yaml`; both validate."""

    name: str
    entrypoint: str
    """The command the Ray Job runs, e.g. ``python train.py --lr 3e-4``."""
    num_workers: int = 1
    """Ray Train workers; all of them start together or none does (gang)."""
    gpus_per_worker: int = 1
    """GPUs each worker needs on a single node; 0 for a CPU-only job."""
    cpus_per_worker: float = 1.0
    working_dir: str | None = None
    """The job's code: a remote archive (``s3://bucket/code.zip``; see `REMOTE_URI_SCHEMES`
    and `CODE_ARCHIVE_SUFFIXES`), unpacked by Ray as the working dir. Never a local path."""
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    """Extra Ray runtime_env, only the keys in `RUNTIME_ENV_KEYS` (pip, env_vars, ...); use
    `working_dir` above for the code."""
    queue: str = "default"
    """The team queue; it owns a share of the cluster pool."""
    priority_class: str = "medium"
    """A configured priority class (defaults: low, medium, high)."""
    max_runtime_s: float | None = None
    """The job is stopped after this long; also lets it backfill. None: no limit."""
    max_restarts: int = 3
    """Times a gang that failed (a worker raised or was killed, a node was lost) or hung is
    restarted from its last committed checkpoint before the job is FAILED. Preemptions and
    moves by node health do not count."""
    stall_timeout_s: float | None = None
    """A running job that reports no new step for this long is declared hung: its workers'
    stacks go to its logs and it restarts from its last checkpoint (a restart). None: the
    cluster's ``jobs.stall_timeout_s``. Must be at least ``jobs.step_report_interval_s``.
    Armed once the job reports its first step (through `jobs.checkpointing`)."""
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)

    def __post_init__(self) -> None:
        errors = _validate(self)
        if errors:
            raise SpecError(errors)
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
        if (
            step_report_interval_s is not None
            and self.stall_timeout_s is not None
            and self.stall_timeout_s < step_report_interval_s
        ):
            errors.append(
                FieldError(
                    "stall_timeout_s",
                    f"{self.stall_timeout_s:g}s is shorter than the step report interval "
                    f"(jobs.step_report_interval_s = {step_report_interval_s:g}s): a healthy "
                    "job would be declared hung between two reports",
                )
            )
        classes = list(priority_classes)
        if self.priority_class not in classes:
            errors.append(
                FieldError(
                    "priority_class",
                    f"unknown priority class {self.priority_class!r}; "
                    f"configured: {', '.join(classes)}",
                )
            )
        if queues is not None:
            known = list(queues)
            if self.queue not in known:
                errors.append(
                    FieldError(
                        "queue", f"unknown queue {self.queue!r}; configured: {', '.join(known)}"
                    )
                )
        if cluster_node_gpus is not None and self.gpus_per_worker > 0:
            node_gpus = list(cluster_node_gpus)
            largest = max(node_gpus, default=0)
            slots = sum(g // self.gpus_per_worker for g in node_gpus)
            if self.gpus_per_worker > largest:
                errors.append(
                    FieldError(
                        "gpus_per_worker",
                        f"{self.gpus_per_worker} GPUs per worker, but the largest cluster node "
                        f"has {largest}",
                    )
                )
            elif slots < self.num_workers:
                errors.append(
                    FieldError(
                        "num_workers",
                        f"{self.num_workers} workers x {self.gpus_per_worker} GPUs cannot fit: "
                        f"the cluster pool holds at most {slots} such workers",
                    )
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
            raise SpecError([FieldError("<spec>", f"must be a mapping, got {_kind(data)}")])
        errors: list[FieldError] = []
        values = _typed_fields(cls, data, "", errors)
        ckpt = data.get("checkpoint")
        if ckpt is None or "checkpoint" not in data:
            values.pop("checkpoint", None)
        elif not isinstance(ckpt, Mapping):
            errors.append(FieldError("checkpoint", f"must be a mapping, got {_kind(ckpt)}"))
            values.pop("checkpoint", None)
        else:
            ckpt_values = _typed_fields(CheckpointSpec, ckpt, "checkpoint.", errors)
            if not any(e.field.startswith("checkpoint.") for e in errors):
                try:
                    values["checkpoint"] = CheckpointSpec(**ckpt_values)
                except SpecError as exc:  # pragma: no cover - CheckpointSpec does not validate
                    errors.extend(exc.errors)
        for required in ("name", "entrypoint"):
            if required not in data or data[required] is None:
                errors.append(FieldError(required, "is required"))
        if errors:
            # Also report the value problems of the fields that were well-typed.
            placeholders = {"name": "placeholder", "entrypoint": "placeholder"}
            try:
                cls(**{**placeholders, **values})
            except SpecError as exc:
                seen = {e.field for e in errors}
                errors.extend(e for e in exc.errors if e.field not in seen)
            except TypeError:
                pass
            raise SpecError(errors)
        return cls(**values)

    @classmethod
    def from_yaml(cls, text: str) -> JobSpec:
        """Parse a YAML job file; malformed YAML is a SpecError with the line and column."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            where = ""
            mark = getattr(exc, "problem_mark", None)
            if mark is not None:
                where = f" at line {mark.line + 1}, column {mark.column + 1}"
            problem = str(getattr(exc, "problem", None) or str(exc).splitlines()[0])
            raise SpecError([FieldError("<yaml>", f"not valid YAML{where}: {problem}")]) from exc
        if data is None:
            raise SpecError([FieldError("<yaml>", "the file is empty")])
        return cls.from_dict(data)

    def to_yaml(self) -> str:
        return str(yaml.safe_dump(self.to_dict(), sort_keys=False))


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "entrypoint": (str,),
    "num_workers": (int,),
    "gpus_per_worker": (int,),
    "cpus_per_worker": (int, float),
    "working_dir": (str, type(None)),
    "runtime_env": (Mapping,),
    "queue": (str,),
    "priority_class": (str,),
    "max_runtime_s": (int, float, type(None)),
    "max_restarts": (int,),
    "stall_timeout_s": (int, float, type(None)),
    "checkpoint": (Mapping, type(None)),
    "checkpoint.enabled": (bool,),
    "checkpoint.interval_s": (int, float, type(None)),
    "checkpoint.keep_last": (int,),
    "checkpoint.preempt_deadline_s": (int, float),
    "checkpoint.uri": (str, type(None)),
}


def _typed_fields(
    cls: type, data: Mapping[Any, Any], prefix: str, errors: list[FieldError]
) -> dict[str, Any]:
    names = [f.name for f in dataclasses.fields(cls)]
    values: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in names:
            hint = difflib.get_close_matches(str(key), names, n=1)
            extra = f"; did you mean {prefix}{hint[0]!r}?" if hint else ""
            errors.append(FieldError(path, f"unknown field{extra}"))
            continue
        allowed = _FIELD_TYPES[path]
        is_bool = isinstance(value, bool)
        if (is_bool and bool not in allowed) or not isinstance(value, allowed):
            want = " or ".join(
                "null" if t is type(None) else {"Mapping": "mapping"}.get(t.__name__, t.__name__)
                for t in allowed
            )
            errors.append(FieldError(path, f"must be {want}, got {_kind(value)}"))
            continue
        values[key] = value
    return values


def _validate(spec: JobSpec) -> list[FieldError]:
    errors: list[FieldError] = []
    for name in ("name", "entrypoint", "queue", "priority_class"):
        value = getattr(spec, name)
        if not isinstance(value, str) or not value.strip():
            errors.append(FieldError(name, "is required and must be a non-empty string"))
    if isinstance(spec.name, str) and spec.name.strip() and not _NAME_RE.match(spec.name):
        errors.append(
            FieldError(
                "name",
                f"{spec.name!r}: use 1-128 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit",
            )
        )
    if isinstance(spec.entrypoint, str) and spec.entrypoint.strip():
        errors += _entrypoint(spec.entrypoint)
    errors += _int_at_least("num_workers", spec.num_workers, 1, "a gang needs at least 1 worker")
    errors += _int_at_least("gpus_per_worker", spec.gpus_per_worker, 0)
    if not _is_number(spec.cpus_per_worker) or spec.cpus_per_worker < 0:
        errors.append(
            FieldError(
                "cpus_per_worker", f"must be a finite number >= 0, got {spec.cpus_per_worker!r}"
            )
        )
    if spec.max_runtime_s is not None and (
        not _is_number(spec.max_runtime_s) or spec.max_runtime_s <= 0
    ):
        errors.append(
            FieldError(
                "max_runtime_s",
                f"must be a finite number > 0 or null, got {spec.max_runtime_s!r}",
            )
        )
    errors += _int_at_least("max_restarts", spec.max_restarts, 0)
    if isinstance(spec.max_restarts, int) and spec.max_restarts > MAX_RESTARTS_LIMIT:
        errors.append(
            FieldError("max_restarts", f"must be <= {MAX_RESTARTS_LIMIT}, got {spec.max_restarts}")
        )
    if spec.stall_timeout_s is not None and (
        not _is_number(spec.stall_timeout_s) or spec.stall_timeout_s <= 0
    ):
        errors.append(
            FieldError(
                "stall_timeout_s",
                f"must be a finite number > 0 or null, got {spec.stall_timeout_s!r}",
            )
        )
    if spec.working_dir is not None:
        errors += _remote_code_uri("working_dir", spec.working_dir, CODE_ARCHIVE_SUFFIXES)
    if not isinstance(spec.runtime_env, Mapping):
        errors.append(
            FieldError("runtime_env", f"must be a mapping, got {_kind(spec.runtime_env)}")
        )
    else:
        if "working_dir" in spec.runtime_env and spec.working_dir is not None:
            errors.append(
                FieldError(
                    "runtime_env.working_dir",
                    "set either working_dir or runtime_env.working_dir, not both",
                )
            )
        errors += _validate_runtime_env(spec.runtime_env)
    c = spec.checkpoint
    if not isinstance(c, CheckpointSpec):
        errors.append(FieldError("checkpoint", f"must be a CheckpointSpec, got {_kind(c)}"))
        return errors
    if c.interval_s is not None and (
        not _is_number(c.interval_s) or not 0 < c.interval_s <= MAX_INTERVAL_S
    ):
        errors.append(
            FieldError(
                "checkpoint.interval_s",
                f"must be a finite number > 0 and at most {MAX_INTERVAL_S:g} (a week), or null; "
                f"got {c.interval_s!r}",
            )
        )
    errors += _int_at_least("checkpoint.keep_last", c.keep_last, 1)
    if not _is_number(c.preempt_deadline_s) or c.preempt_deadline_s <= 0:
        errors.append(
            FieldError(
                "checkpoint.preempt_deadline_s",
                f"must be a finite number > 0, got {c.preempt_deadline_s!r}",
            )
        )
    if c.uri is not None:
        errors += _checkpoint_uri(c.uri)
    return errors


MAX_ENTRYPOINT_CHARS = 16384


def _entrypoint(entrypoint: str) -> list[FieldError]:
    """A command is split into words as a POSIX shell would (`jobs.launcher` runs it on every
    rank without a shell): an unbalanced quote is refused here, not at admission."""
    if len(entrypoint) > MAX_ENTRYPOINT_CHARS:
        return [FieldError("entrypoint", f"is longer than {MAX_ENTRYPOINT_CHARS} characters")]
    try:
        shlex.split(entrypoint)
    except ValueError as exc:
        return [
            FieldError(
                "entrypoint",
                f"{entrypoint!r} cannot be split into words ({exc}); close the quote, or run "
                "a shell line as bash -c '...'",
            )
        ]
    return []


def _is_number(value: object) -> bool:
    """A finite int or float (NaN and Infinity compare false with every bound: refuse them)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not isinstance(value, float) or math.isfinite(value)


def _remote_code_uri(path: str, value: object, suffixes: tuple[str, ...]) -> list[FieldError]:
    """`value` names a remote archive; local paths (the controller's own disk) are refused."""
    if not isinstance(value, str):
        return [FieldError(path, f"must be a string URI, got {_kind(value)}")]
    schemes = ", ".join(f"{s}://" for s in REMOTE_URI_SCHEMES)
    how = (
        f"upload the code as a {' or '.join(suffixes)} archive to object storage and give "
        f"its URI ({schemes}), or install it in the cluster's image"
    )
    parts = urlsplit(value.strip())
    scheme = parts.scheme.lower()
    if not scheme or len(scheme) == 1:  # no scheme, or a Windows drive letter
        return [FieldError(path, f"{value!r} is a local path, which is not accepted: {how}")]
    if scheme not in REMOTE_URI_SCHEMES:
        return [FieldError(path, f"{scheme}:// is not accepted ({value!r}): {how}")]
    if not parts.netloc:
        return [FieldError(path, f"{value!r} names no bucket or host")]
    if not parts.path.lower().endswith(suffixes):
        return [FieldError(path, f"{value!r} must name a {' or '.join(suffixes)} archive")]
    return []


def _validate_runtime_env(env: Mapping[Any, Any]) -> list[FieldError]:
    errors = _non_finite("runtime_env", env)
    for key, value in env.items():
        path = f"runtime_env.{key}"
        if key not in RUNTIME_ENV_KEYS:
            errors.append(
                FieldError(path, f"is not accepted; allowed keys: {', '.join(RUNTIME_ENV_KEYS)}")
            )
        elif key == "working_dir":
            errors += _remote_code_uri(path, value, CODE_ARCHIVE_SUFFIXES)
        elif key == "py_modules":
            if not isinstance(value, list):
                errors.append(FieldError(path, f"must be a list of URIs, got {_kind(value)}"))
                continue
            for i, item in enumerate(value):
                errors += _remote_code_uri(f"{path}[{i}]", item, _PY_MODULE_SUFFIXES)
        elif key in ("pip", "uv"):
            errors += _packages(path, value, _PIP_DICT_KEYS if key == "pip" else _UV_DICT_KEYS)
        elif key == "conda":
            errors += _conda(path, value)
        elif key == "env_vars":
            errors += _env_vars(path, value)
        elif key == "config":
            errors += _runtime_env_config(path, value)
    return errors


def _packages(path: str, value: object, dict_keys: tuple[str, ...]) -> list[FieldError]:
    """pip/uv: a list of requirement specifiers (or {packages: [...], ...}); never a file."""
    if isinstance(value, str):
        return [
            FieldError(
                path,
                "a requirements-file path is not accepted (it would be read on the controller); "
                "list the requirements, e.g. ['torch==2.5.1', 'numpy']",
            )
        ]
    packages: object = value
    errors: list[FieldError] = []
    where = path
    if isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in dict_keys)
        if unknown:
            errors.append(
                FieldError(f"{path}.{unknown[0]}", f"unknown key; allowed: {', '.join(dict_keys)}")
            )
        for version_key in ("pip_version", "uv_version"):
            if version_key in value and version_key in dict_keys:
                errors += _version_spec(f"{path}.{version_key}", value[version_key])
        packages = value.get("packages")
        where = f"{path}.packages"
        if isinstance(packages, str):
            return [*errors, *_packages(where, packages, dict_keys)]
    if not isinstance(packages, list):
        return [*errors, FieldError(where, f"must be a list of strings, got {_kind(packages)}")]
    for i, req in enumerate(packages):
        errors += _requirement(f"{where}[{i}]", req)
    return errors


def _checkpoint_uri(uri: str) -> list[FieldError]:
    """A job's own checkpoint location: ``s3://bucket/prefix``, never a path or file:// (a
    node's disk). Whether the bucket exists, and that the URI is outside the cluster's per-job
    area, is checked at submission (`check_checkpoint_uri`)."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme != "s3":
        what = f"the scheme {scheme}:// is not supported" if scheme else "it has no scheme"
        return [
            FieldError(
                "checkpoint.uri",
                f"{uri!r}: {what}; use s3://bucket/prefix (file:// and local paths are "
                "refused: a node's disk does not survive the node, see docs/checkpointing.md)",
            )
        ]
    if not parts.netloc or any(c.isspace() for c in uri) or parts.query or parts.fragment:
        return [FieldError("checkpoint.uri", f"{uri!r}: expected s3://bucket/prefix")]
    if any(seg in (".", "..") for seg in parts.path.split("/")):
        return [FieldError("checkpoint.uri", f"{uri!r}: no . or .. segments")]
    return []


JOBS_AREA = "jobs"
"""Under the cluster's storage.uri, the control plane's per-job checkpoint prefixes:
``<storage.uri>/jobs/<job id>/``. No job may name a URI there (another job's checkpoints)."""


def check_checkpoint_uri(spec: JobSpec, storage_uri: str) -> list[FieldError]:
    """At submission: `spec`'s checkpoint.uri, if set, must not lie in the cluster's per-job
    area (``<storage_uri>/jobs/``), where it could name another job's checkpoints. Job ids are
    assigned after this check, so no job may name even its own default there."""
    uri = spec.checkpoint.uri
    if uri is None:
        return []
    area = storage_uri.rstrip("/") + f"/{JOBS_AREA}"
    if uri.rstrip("/") == area or uri.startswith(area + "/"):
        return [
            FieldError(
                "checkpoint.uri",
                f"{uri!r} is inside {area}/, where the control plane keeps each job's own "
                "checkpoints; leave checkpoint.uri unset for that, or use a prefix elsewhere",
            )
        ]
    return []


def _requirement(path: str, req: object) -> list[FieldError]:
    """One pip/uv item: a single PEP 508 requirement; a direct URL only over https."""
    if not isinstance(req, str):
        return [FieldError(path, f"must be a string, got {_kind(req)}")]
    refused = (
        f"{req!r}: only one requirement specifier per item (name, extras, version, markers, "
        "or name @ https://...) is accepted; no pip options, newlines, local paths or file: URLs"
    )
    if any(ord(c) < 32 or ord(c) == 127 for c in req) or req.strip().startswith("-"):
        return [FieldError(path, refused)]
    try:
        parsed = Requirement(req)
    except InvalidRequirement:
        return [FieldError(path, refused)]
    if parsed.name.lower().endswith(_ARCHIVE_NAME_SUFFIXES):
        return [FieldError(path, refused)]
    if parsed.url is not None:
        url = urlsplit(parsed.url)
        if url.scheme != "https" or not url.netloc:
            return [
                FieldError(
                    path,
                    f"{req!r}: a direct URL must be https:// (no file: URLs, http:, VCS or local paths)",
                )
            ]
    return []


def _version_spec(path: str, value: object) -> list[FieldError]:
    if not isinstance(value, str):
        return [FieldError(path, f"must be a version specifier string, got {_kind(value)}")]
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        return [FieldError(path, f"{value!r} is not a version specifier (e.g. '==24.0')")]
    return []


def _conda(path: str, value: object) -> list[FieldError]:
    """conda: an env name on the image, or an environment mapping (name, channels,
    dependencies) whose dependencies are match specs or one ``{pip: [...]}`` list."""
    if isinstance(value, str):
        if not _CONDA_NAME_RE.match(value) or value.lower().endswith((".yml", ".yaml")):
            return [
                FieldError(
                    path,
                    f"{value!r}: give the name of a conda env present on the image or "
                    "the environment as a mapping, never a file path",
                )
            ]
        return []
    if not isinstance(value, Mapping):
        return [FieldError(path, f"must be a name or a mapping, got {_kind(value)}")]
    errors: list[FieldError] = []
    unknown = sorted(str(k) for k in value if k not in _CONDA_DICT_KEYS)
    if unknown:
        errors.append(
            FieldError(
                f"{path}.{unknown[0]}", f"unknown key; allowed: {', '.join(_CONDA_DICT_KEYS)}"
            )
        )
    name = value.get("name")
    if name is not None and not (isinstance(name, str) and _CONDA_NAME_RE.match(name)):
        errors.append(FieldError(f"{path}.name", f"{name!r} is not an env name"))
    channels = value.get("channels", [])
    if not isinstance(channels, list):
        errors.append(FieldError(f"{path}.channels", f"must be a list, got {_kind(channels)}"))
        channels = []
    for i, ch in enumerate(channels):
        url = urlsplit(ch) if isinstance(ch, str) else None
        named = isinstance(ch, str) and _CONDA_NAME_RE.match(ch) is not None
        remote = url is not None and url.scheme == "https" and bool(url.netloc)
        if not (named or remote):
            errors.append(
                FieldError(
                    f"{path}.channels[{i}]",
                    f"{ch!r}: a channel name or an https:// URL (no file:, http: or paths)",
                )
            )
    deps = value.get("dependencies", [])
    if not isinstance(deps, list):
        return [*errors, FieldError(f"{path}.dependencies", f"must be a list, got {_kind(deps)}")]
    for i, dep in enumerate(deps):
        where = f"{path}.dependencies[{i}]"
        if isinstance(dep, Mapping):
            if set(dep) != {"pip"} or not isinstance(dep["pip"], list):
                errors.append(FieldError(where, "a mapping here must be {pip: [requirements]}"))
                continue
            for j, req in enumerate(dep["pip"]):
                errors += _requirement(f"{where}.pip[{j}]", req)
        elif not isinstance(dep, str) or not _conda_spec_ok(dep):
            errors.append(
                FieldError(
                    where,
                    f"{dep!r}: a conda match spec (e.g. 'numpy>=1.26', "
                    "'conda-forge::numpy'); no options, URLs, paths or file:",
                )
            )
    return errors


def _conda_spec_ok(spec: str) -> bool:
    if any(ord(c) < 32 or ord(c) == 127 for c in spec):
        return False
    if any(token.startswith("-") for token in spec.split()):
        return False
    return _CONDA_SPEC_RE.match(spec.strip()) is not None and "file:" not in spec


def _env_vars(path: str, value: object) -> list[FieldError]:
    if not isinstance(value, Mapping):
        return [FieldError(path, f"must be a mapping of names to strings, got {_kind(value)}")]
    errors: list[FieldError] = []
    for name, val in value.items():
        where = f"{path}.{name}"
        if not isinstance(name, str) or not _ENV_NAME_RE.match(name):
            errors.append(FieldError(where, "is not a valid environment variable name"))
            continue
        if name.upper().startswith(_RESERVED_ENV_PREFIXES) and name not in USER_ENV_VARS:
            errors.append(
                FieldError(
                    where,
                    "RAY_* and RCP_* variables belong to Ray and the control plane; a job may "
                    f"set only {', '.join(sorted(USER_ENV_VARS))} of them",
                )
            )
        if isinstance(val, bool) or not isinstance(val, str | int | float):
            errors.append(FieldError(where, f"must be a string, got {_kind(val)}"))
    return errors


def _runtime_env_config(path: str, value: object) -> list[FieldError]:
    if not isinstance(value, Mapping):
        return [FieldError(path, f"must be a mapping, got {_kind(value)}")]
    errors: list[FieldError] = []
    for key, val in value.items():
        want = _CONFIG_KEYS.get(key)
        if want is None:
            errors.append(
                FieldError(f"{path}.{key}", f"unknown key; allowed: {', '.join(_CONFIG_KEYS)}")
            )
        elif not isinstance(val, want) or (want is int and isinstance(val, bool)):
            errors.append(FieldError(f"{path}.{key}", f"must be {want.__name__}, got {_kind(val)}"))
    return errors


def _non_finite(path: str, value: object) -> list[FieldError]:
    """Every NaN or Infinity nested in `value`, by its path (iterative: depth is untrusted)."""
    errors: list[FieldError] = []
    stack: list[tuple[str, object]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            errors.append(FieldError(where, f"must be a finite number, got {item!r}"))
        elif isinstance(item, Mapping):
            stack.extend((f"{where}.{k}", v) for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(item))
    return errors


def _int_at_least(name: str, value: object, minimum: int, why: str = "") -> list[FieldError]:
    if isinstance(value, bool) or not isinstance(value, int):
        return [FieldError(name, f"must be an integer, got {_kind(value)}")]
    if value < minimum:
        reason = f" ({why})" if why else ""
        return [FieldError(name, f"must be >= {minimum}{reason}, got {value}")]
    return []
