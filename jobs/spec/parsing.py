"""Plain data and YAML into typed field values, before a `JobSpec` is built from them.

Owns: the types each field accepts (`FIELD_TYPES`, by dotted path), `typed_fields` (the
known, well-typed fields of a mapping; an unknown key is an error with a "did you mean"
hint, a wrong type an error naming what was expected) and `load_yaml` (malformed YAML is a
`SpecError` with the line and column).

Must not: check values (see `job_spec.validate`) or build the spec (see `JobSpec.from_dict`).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

import yaml

from jobs.spec.errors import FieldError, SpecError, kind

__all__ = ["FIELD_TYPES", "load_yaml", "typed_fields"]


FIELD_TYPES: dict[str, tuple[type, ...]] = {
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


def typed_fields(
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
        allowed = FIELD_TYPES[path]
        is_bool = isinstance(value, bool)
        if (is_bool and bool not in allowed) or not isinstance(value, allowed):
            want = " or ".join(
                "null" if t is type(None) else {"Mapping": "mapping"}.get(t.__name__, t.__name__)
                for t in allowed
            )
            errors.append(FieldError(path, f"must be {want}, got {kind(value)}"))
            continue
        values[key] = value
    return values


def load_yaml(text: str) -> object:
    """The data of a YAML job file; malformed YAML is a SpecError with the line and column."""
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
    return data
