"""The limits and allowed sets a job spec is checked against, each named once.

Owns: the default priority classes, the bounds on restarts, checkpoint intervals and the
entrypoint's length, the names a job may use, where its code may come from
(`REMOTE_URI_SCHEMES`, `CODE_ARCHIVE_SUFFIXES`), what its ``runtime_env`` may hold
(`RUNTIME_ENV_KEYS`, the pip/uv/conda keys, `USER_ENV_VARS`) and the cluster's per-job
checkpoint area (`JOBS_AREA`).

Must not: check anything (see `job_spec`, `values`, `runtime_env`) or import the
rest of the package.
"""

from __future__ import annotations

import re

__all__ = [
    "ARCHIVE_NAME_SUFFIXES",
    "CODE_ARCHIVE_SUFFIXES",
    "CONDA_DICT_KEYS",
    "CONDA_NAME_RE",
    "CONDA_SPEC_RE",
    "CONFIG_KEYS",
    "DEFAULT_PRIORITY_CLASSES",
    "ENV_NAME_RE",
    "JOBS_AREA",
    "MAX_ENTRYPOINT_CHARS",
    "MAX_INTERVAL_S",
    "MAX_RESTARTS_LIMIT",
    "NAME_RE",
    "PIP_DICT_KEYS",
    "PY_MODULE_SUFFIXES",
    "REMOTE_URI_SCHEMES",
    "RESERVED_ENV_PREFIXES",
    "RUNTIME_ENV_KEYS",
    "USER_ENV_VARS",
    "UV_DICT_KEYS",
]

DEFAULT_PRIORITY_CLASSES = ("low", "medium", "high")
MAX_RESTARTS_LIMIT = 1000
MAX_INTERVAL_S = 7 * 86400.0
"""The longest checkpoint.interval_s: a week between checkpoints is already no checkpointing."""
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")

REMOTE_URI_SCHEMES = ("s3", "gs", "azure", "abfss", "https")
"""Where a job's code may come from: Ray's remote runtime_env protocols
(``ray/_private/runtime_env/protocol.py``, ``get_remote_protocols``) less ``file`` (a path on
a node's own disk) and ``http`` (code fetched in clear text). Ray's ``gcs://`` (packages other
jobs uploaded) and ``local://`` (a directory on the node) are local paths in disguise."""

CODE_ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz")
"""Archives Ray unpacks from a remote URI as a working_dir or a py_module."""
PY_MODULE_SUFFIXES = (*CODE_ARCHIVE_SUFFIXES, ".whl")

RUNTIME_ENV_KEYS = ("working_dir", "py_modules", "pip", "uv", "conda", "env_vars", "config")
"""The runtime_env keys a job may set. Refused, among others: ``container``/``image_uri``
(another image, host mounts through run options), ``excludes`` (only for local uploads),
``py_executable`` and ``worker_process_setup_hook`` (ask an operator for the image instead)."""

USER_ENV_VARS = frozenset({"RCP_TRAIN_CONFIG", "RCP_TORCH_BACKEND"})
"""The only ``RCP_*`` variables a job sets itself (read by `jobs.launcher`); every other
``RCP_*`` and every ``RAY_*`` name belongs to the control plane and Ray."""
RESERVED_ENV_PREFIXES = ("RCP_", "RAY_")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
CONDA_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")
PIP_DICT_KEYS = ("packages", "pip_check", "pip_version")
UV_DICT_KEYS = ("packages", "uv_version", "uv_check")
CONDA_DICT_KEYS = ("name", "channels", "dependencies")
"""An environment mapping's keys. Refused: ``prefix`` (a path on the node), ``variables``
(environment variables around the ``env_vars`` rules)."""
CONDA_SPEC_RE = re.compile(
    r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*(::[A-Za-z0-9_][A-Za-z0-9_.\-]*)?[^:/\\]*\Z"
)
"""A conda match spec: ``numpy``, ``numpy>=1.26``, ``conda-forge::numpy 1.26.* py311*``;
no URL, path or ``file:``."""
ARCHIVE_NAME_SUFFIXES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tar", ".egg")
"""A requirement named like an archive is read by pip as a file on the node, not a name."""
CONFIG_KEYS = {"setup_timeout_seconds": int, "eager_install": bool}
MAX_ENTRYPOINT_CHARS = 16384
"""The longest entrypoint command, in characters."""

JOBS_AREA = "jobs"
"""Under the cluster's storage.uri, the control plane's per-job checkpoint prefixes:
``<storage.uri>/jobs/<job id>/``. No job may name a URI there (another job's checkpoints)."""
