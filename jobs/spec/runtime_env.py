"""The ``runtime_env`` of a job spec: only what names no file on the controller or a node.

Owns: `check_runtime_env`: the keys in `RUNTIME_ENV_KEYS` only; code (``working_dir``,
``py_modules``) only as remote archives; ``pip``/``uv`` as lists of single PEP 508
requirements (a direct URL only over https, never a requirements-file path or pip option);
``conda`` as an env name on the image or a mapping of match specs and https channels;
``env_vars`` without ``RAY_*``/``RCP_*`` names except `USER_ENV_VARS`; ``config`` with its
two known keys (each problem by its path under ``runtime_env``; no NaN or Infinity anywhere is
the field's own check, `policies.validation.finite_everywhere`).

Must not: read a file, fetch a URL, or resolve a requirement (the checks are on the text).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet

from jobs.spec.errors import FieldError, kind
from jobs.spec.limits import (
    ARCHIVE_NAME_SUFFIXES,
    CODE_ARCHIVE_SUFFIXES,
    CONDA_DICT_KEYS,
    CONDA_NAME_RE,
    CONDA_SPEC_RE,
    CONFIG_KEYS,
    ENV_NAME_RE,
    PIP_DICT_KEYS,
    PY_MODULE_SUFFIXES,
    RESERVED_ENV_PREFIXES,
    RUNTIME_ENV_KEYS,
    USER_ENV_VARS,
    UV_DICT_KEYS,
)
from jobs.spec.values import check_remote_code_uri
from policies.validation import raise_problems

__all__ = ["check_runtime_env", "runtime_env_rules"]


def runtime_env_rules(env: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """The validator of ``runtime_env``: its problems by path under it."""
    raise_problems(check_runtime_env(env))
    return env


def check_runtime_env(env: Mapping[Any, Any]) -> list[FieldError]:
    errors: list[FieldError] = []
    for key, value in env.items():
        path = str(key)
        if key not in RUNTIME_ENV_KEYS:
            errors.append(
                FieldError(path, f"is not accepted; allowed keys: {', '.join(RUNTIME_ENV_KEYS)}")
            )
        elif key == "working_dir":
            errors += check_remote_code_uri(path, value, CODE_ARCHIVE_SUFFIXES)
        elif key == "py_modules":
            if not isinstance(value, list):
                errors.append(FieldError(path, f"must be a list of URIs, got {kind(value)}"))
                continue
            for i, item in enumerate(value):
                errors += check_remote_code_uri(f"{path}[{i}]", item, PY_MODULE_SUFFIXES)
        elif key in ("pip", "uv"):
            errors += _packages(path, value, PIP_DICT_KEYS if key == "pip" else UV_DICT_KEYS)
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
        why = (
            "a requirements-file path is not accepted (it would be read on the controller); "
            "list the requirements, e.g. ['torch==2.5.1', 'numpy']"
        )
        return [FieldError(path, why)]
    packages: object = value
    errors: list[FieldError] = []
    where = path
    if isinstance(value, Mapping):
        errors += _unknown_keys(path, value, dict_keys)
        for version_key in ("pip_version", "uv_version"):
            if version_key in value and version_key in dict_keys:
                errors += _version_spec(f"{path}.{version_key}", value[version_key])
        packages = value.get("packages")
        where = f"{path}.packages"
        if isinstance(packages, str):
            return [*errors, *_packages(where, packages, dict_keys)]
    if not isinstance(packages, list):
        return [*errors, FieldError(where, f"must be a list of strings, got {kind(packages)}")]
    for i, req in enumerate(packages):
        errors += _requirement(f"{where}[{i}]", req)
    return errors


def _unknown_keys(
    path: str, value: Mapping[Any, Any], allowed: tuple[str, ...]
) -> list[FieldError]:
    """The first key of `value` (sorted) that is not `allowed`, if any."""
    unknown = sorted(str(k) for k in value if k not in allowed)
    if not unknown:
        return []
    return [FieldError(f"{path}.{unknown[0]}", f"unknown key; allowed: {', '.join(allowed)}")]


def _has_control_chars(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def _requirement(path: str, req: object) -> list[FieldError]:
    """One pip/uv item: a single PEP 508 requirement; a direct URL only over https."""
    if not isinstance(req, str):
        return [FieldError(path, f"must be a string, got {kind(req)}")]
    refused = (
        f"{req!r}: only one requirement specifier per item (name, extras, version, markers, "
        "or name @ https://...) is accepted; no pip options, newlines, local paths or file: URLs"
    )
    if _has_control_chars(req) or req.strip().startswith("-"):
        return [FieldError(path, refused)]
    try:
        parsed = Requirement(req)
    except InvalidRequirement:
        return [FieldError(path, refused)]
    if parsed.name.lower().endswith(ARCHIVE_NAME_SUFFIXES):
        return [FieldError(path, refused)]
    if parsed.url is not None:
        url = urlsplit(parsed.url)
        if url.scheme != "https" or not url.netloc:
            why = "a direct URL must be https:// (no file: URLs, http:, VCS or local paths)"
            return [FieldError(path, f"{req!r}: {why}")]
    return []


def _version_spec(path: str, value: object) -> list[FieldError]:
    if not isinstance(value, str):
        return [FieldError(path, f"must be a version specifier string, got {kind(value)}")]
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        return [FieldError(path, f"{value!r} is not a version specifier (e.g. '==24.0')")]
    return []


def _conda(path: str, value: object) -> list[FieldError]:
    """conda: an env name on the image, or an environment mapping (name, channels,
    dependencies) whose dependencies are match specs or one ``{pip: [...]}`` list."""
    if isinstance(value, str):
        if not CONDA_NAME_RE.match(value) or value.lower().endswith((".yml", ".yaml")):
            why = (
                "give the name of a conda env present on the image or the environment as a "
                "mapping, never a file path"
            )
            return [FieldError(path, f"{value!r}: {why}")]
        return []
    if not isinstance(value, Mapping):
        return [FieldError(path, f"must be a name or a mapping, got {kind(value)}")]
    errors = _unknown_keys(path, value, CONDA_DICT_KEYS)
    name = value.get("name")
    if name is not None and not (isinstance(name, str) and CONDA_NAME_RE.match(name)):
        errors.append(FieldError(f"{path}.name", f"{name!r} is not an env name"))
    channels = value.get("channels", [])
    if not isinstance(channels, list):
        errors.append(FieldError(f"{path}.channels", f"must be a list, got {kind(channels)}"))
        channels = []
    for i, ch in enumerate(channels):
        url = urlsplit(ch) if isinstance(ch, str) else None
        named = isinstance(ch, str) and CONDA_NAME_RE.match(ch) is not None
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
        return [*errors, FieldError(f"{path}.dependencies", f"must be a list, got {kind(deps)}")]
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
    if _has_control_chars(spec) or any(token.startswith("-") for token in spec.split()):
        return False
    return CONDA_SPEC_RE.match(spec.strip()) is not None and "file:" not in spec


def _env_vars(path: str, value: object) -> list[FieldError]:
    if not isinstance(value, Mapping):
        return [FieldError(path, f"must be a mapping of names to strings, got {kind(value)}")]
    errors: list[FieldError] = []
    for name, val in value.items():
        where = f"{path}.{name}"
        if not isinstance(name, str) or not ENV_NAME_RE.match(name):
            errors.append(FieldError(where, "is not a valid environment variable name"))
            continue
        if name.upper().startswith(RESERVED_ENV_PREFIXES) and name not in USER_ENV_VARS:
            errors.append(
                FieldError(
                    where,
                    "RAY_* and RCP_* variables belong to Ray and the control plane; a job may "
                    f"set only {', '.join(sorted(USER_ENV_VARS))} of them",
                )
            )
        if isinstance(val, bool) or not isinstance(val, str | int | float):
            errors.append(FieldError(where, f"must be a string, got {kind(val)}"))
    return errors


def _runtime_env_config(path: str, value: object) -> list[FieldError]:
    if not isinstance(value, Mapping):
        return [FieldError(path, f"must be a mapping, got {kind(value)}")]
    errors: list[FieldError] = []
    for key, val in value.items():
        want = CONFIG_KEYS.get(key)
        if want is None:
            errors.append(
                FieldError(f"{path}.{key}", f"unknown key; allowed: {', '.join(CONFIG_KEYS)}")
            )
        elif not isinstance(val, want) or (want is int and isinstance(val, bool)):
            errors.append(FieldError(f"{path}.{key}", f"must be {want.__name__}, got {kind(val)}"))
    return errors
