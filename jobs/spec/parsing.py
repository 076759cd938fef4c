"""YAML into plain data, before a `JobSpec` is checked and built from it (`JobSpec.from_dict`).

Owns: `load_yaml` (malformed YAML is a `SpecError` with the line and column).

Must not: check values (the spec's fields declare their checks, `job_spec`).
"""

from __future__ import annotations

import yaml

from jobs.spec.errors import FieldError, SpecError

__all__ = ["load_yaml"]


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
