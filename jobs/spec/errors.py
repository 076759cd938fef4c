"""What is wrong with a job spec: one `FieldError` per problem, all of them in a `SpecError`.

Owns: `FieldError` (a dotted field path such as ``checkpoint.interval_s`` and a message a
user can act on), `SpecError` (every problem of one spec at once) and `kind`, the words a
message uses for a value's type ("an integer", "a mapping", ...).

Must not: validate anything itself (see `job_spec.validate`, `values`, `runtime_env`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["FieldError", "SpecError", "kind"]


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


def kind(value: object) -> str:
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
