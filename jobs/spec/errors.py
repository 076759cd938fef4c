"""What is wrong with a job spec: one `FieldError` per problem, all of them in a `SpecError`.

Owns: `SpecError` (every problem of one spec at once, each a `FieldError` naming a dotted
field path such as ``checkpoint.interval_s``); `FieldError` and `kind` are the one validation
layer's (`policies.validation`), named here for the spec's callers.

Must not: validate anything itself (see `job_spec`, `values`, `runtime_env`).
"""

from __future__ import annotations

from policies.validation import FieldError, InvalidInput, kind

__all__ = ["FieldError", "SpecError", "kind"]


class SpecError(InvalidInput):
    """A job spec is invalid. `errors` lists every problem, each naming its field."""

    heading = "invalid job spec"
