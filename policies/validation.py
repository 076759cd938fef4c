"""The one validation layer: pydantic checks plain data into the project's dataclasses, and
every problem is a `FieldError` (the key's full dotted path and the reason).

Owns: `FieldError`, `InvalidInput` (every problem of one input at once; `ConfigError`,
`SpecError`, `ServingError` and `ScenarioError` are its kinds), `Checked` (a `TypeAdapter`
over a dataclass, then its rules across fields; every failure a `FieldError` by path, e.g.
``serving.models[0].min_replicas: must be >= 0, got -1``), `Problems` (what a validator
raises to name fields relative to the value it checks) and the shared checks: `FINITE` (no
NaN or Infinity, no unknown key), `bound` and its kinds (`at_least`, `above`, `at_most`,
`one_of`), `check_fields`, `not_below`, `finite_everywhere` (every number nested in untrusted
data) and `shown` (a value in a message, bounded).

Must not: do I/O or know any one input's fields (each stack declares its checks beside its
dataclasses: ``Annotated`` validators on the fields, rule functions across them).

Example: the simulator's ``SCENARIO = Checked(Scenario, ScenarioError, _across_fields)``;
``SCENARIO.load({"nodes": 0})`` raises ``ScenarioError`` with one `FieldError`, ``nodes: must be
in [1, 100000], got 0``; ``{"nodes": 8, "gpus_per_node": 4}`` passes every field's check, then
`_across_fields` names ``training.gang_gpus.64`` (and 128, 256: bigger than the 8 x 4 = 32-GPU
cluster) and ``serving.models[0].gpus_per_replica`` (8 GPUs: must fit one 4-GPU node).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import reprlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar, cast, get_args, get_origin, get_type_hints

from pydantic import AfterValidator, ConfigDict, TypeAdapter, ValidationError

__all__ = [
    "FINITE",
    "Checked",
    "FieldError",
    "InvalidInput",
    "Problems",
    "above",
    "at_least",
    "at_most",
    "bound",
    "check_fields",
    "finite_everywhere",
    "join",
    "kind",
    "not_below",
    "one_of",
    "path_of",
    "raise_problems",
    "shown",
]

FINITE = ConfigDict(allow_inf_nan=False, extra="forbid", revalidate_instances="always")
"""Every float finite (NaN compares false with every bound), every unknown key refused, and a
dataclass built in code checked as plain data is."""


@dataclass(frozen=True)
class FieldError:
    """One problem with one key; `field` is its full path, e.g. ``checkpoint.interval_s``."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class InvalidInput(ValueError):
    """An input is invalid. `errors` lists every problem, each naming its key's full path."""

    heading = "invalid input"

    def __init__(self, errors: Iterable[FieldError] | str, heading: str = "") -> None:
        if isinstance(errors, str):  # a problem with the input as a whole (a file, a size)
            self.errors: tuple[FieldError, ...] = ()
            super().__init__(errors)
            return
        self.errors = tuple(errors)
        lines = "\n  ".join(str(e) for e in self.errors)
        super().__init__(f"{heading or self.heading}:\n  {lines}")

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(e.field for e in self.errors)


class Problems(ValueError):
    """Raised by a validator: each `FieldError`'s field is relative to the object checked."""

    def __init__(self, *errors: FieldError) -> None:
        super().__init__("; ".join(map(str, errors)))
        self.errors = errors


def raise_problems(errors: list[FieldError]) -> None:
    """In a validator: raise `errors` (paths relative to the value checked), if any."""
    if errors:
        raise Problems(*errors)


def join(base: str, field: str) -> str:
    """``join("models[0]", "name")`` -> ``models[0].name``; ``join("a", "[1]")`` -> ``a[1]``."""
    if not base or not field:
        return base or field
    return base + field if field.startswith("[") else f"{base}.{field}"


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict = 3, 4, 4
_SHOWN.maxstring = _SHOWN.maxother = _SHOWN.maxlong = 60


def shown(value: Any) -> str:
    """`value` for a message, bounded (a YAML alias can nest billions of items in a few
    hundred bytes, and ``repr`` would walk them all)."""
    return _SHOWN.repr(value)


def kind(value: object) -> str:
    """The words a message uses for a value's type ("an integer", "a mapping", ...)."""
    if value is None:
        return "null"
    for t, word in ((bool, "a boolean"), (int, "an integer"), (float, "a number")):
        if isinstance(value, t):
            return word
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    return "a list" if isinstance(value, list | tuple) else type(value).__name__


def bound(ok: Callable[[Any], bool], text: str) -> AfterValidator:
    """A check of one value (`ok`); a failure says `text` and the value. None passes."""

    def check(value: Any) -> Any:
        if value is not None and not ok(value):
            raise ValueError(f"{text}, got {shown(value)}")
        return value

    return AfterValidator(check)


def at_least(minimum: float, why: str = "") -> AfterValidator:
    """``Annotated[float, at_least(1, "a pool with no nodes")]``: ``must be >= 1 (...)``."""
    return bound(lambda v: v >= minimum, f"must be >= {minimum:g}" + (f" ({why})" if why else ""))


def above(minimum: float) -> AfterValidator:
    """A strict lower bound: ``Annotated[float | None, above(0)]`` (None passes)."""
    return bound(lambda v: v > minimum, f"must be > {minimum:g}")


def at_most(maximum: float, why: str) -> AfterValidator:
    """An upper bound for a count, size or wait: past it the control plane would hang, run out
    of memory or overflow a 64-bit field (`why` says which)."""
    return bound(lambda v: v <= maximum, f"must be <= {maximum:g} ({why})")


def one_of(allowed: Iterable[str]) -> AfterValidator:
    """A name out of a fixed set (a str field omegaconf can hold, unlike ``Literal``)."""
    names = tuple(allowed)
    return bound(lambda v: v in names, f"must be one of {', '.join(names)}")


def check_fields(obj: Any, checks: Mapping[str, tuple[AfterValidator, ...]]) -> list[FieldError]:
    """The same checks on fields whose type another module owns (a policy's dataclass that a
    config section embeds): the first failing check of each field, by its name."""
    errors: list[FieldError] = []
    for name, validators in checks.items():
        for v in validators:
            try:
                cast(Callable[[Any], Any], v.func)(getattr(obj, name))
            except ValueError as exc:
                errors.append(FieldError(name, str(exc)))
                break
    return errors


def not_below(obj: Any, name: str, floor_name: str) -> list[FieldError]:
    """Field `name` of `obj` may not be below its field `floor_name`."""
    value, floor = getattr(obj, name), getattr(obj, floor_name)
    if value < floor:
        return [FieldError(name, f"must be >= {floor_name} ({floor:g}), got {value!r}")]
    return []


def finite_everywhere(value: Any) -> Any:
    """An `AfterValidator` for untrusted nested data (``Any``, which pydantic does not look
    into): every NaN or Infinity in it, by path (iterative: its depth is untrusted)."""
    errors: list[FieldError] = []
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            errors.append(FieldError(where, f"must be a finite number, got {item!r}"))
        elif isinstance(item, Mapping):
            stack.extend((join(where, str(k)), v) for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(item))
    raise_problems(sorted(errors, key=lambda e: e.field))
    return value


def path_of(loc: Iterable[Any], prefix: str = "") -> str:
    """``("models", 0, "name")`` -> ``models[0].name`` (under `prefix`)."""
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f"{'.' if out else ''}{part}"
    return out


_TYPE_WORDS = {
    "int": "an integer",
    "float": "a number",
    "string": "a string",
    "bool": "true or false",
    "dict": "a mapping",
    "dataclass": "a mapping",
    "list": "a list",
    "tuple": "a list",
}


def _known(root: Any, loc: tuple[Any, ...]) -> list[str]:
    """The field names of the dataclass at `loc` under `root` (for an unknown key's hint)."""
    hint = root
    for part in loc:
        while get_origin(hint) is not None and get_origin(hint) not in (list, dict, tuple):
            hint = next((a for a in get_args(hint) if a is not type(None)), hint)
        if dataclasses.is_dataclass(hint) and isinstance(part, str):
            hint = get_type_hints(hint).get(part)
        elif get_args(hint):
            hint = get_args(hint)[-1 if isinstance(part, str) else 0]
    return [f.name for f in dataclasses.fields(hint)] if dataclasses.is_dataclass(hint) else []


def _message(root: Any, err: Any) -> str:
    kind_, value = err["type"], err.get("input")
    if kind_ == "missing" or kind_ == "missing_argument":
        return "is required"
    if kind_ in ("extra_forbidden", "unexpected_keyword_argument"):
        names = _known(root, tuple(err["loc"][:-1]))
        hint = difflib.get_close_matches(str(err["loc"][-1]), names, n=1)
        return "unknown field" + (
            f"; did you mean {hint[0]!r}?" if hint else f" (known: {', '.join(names)})"
        )
    if kind_ == "finite_number":
        return f"must be a finite number, got {value!r}"
    stem = kind_.split("_")[0]
    if stem in _TYPE_WORDS and kind_.endswith(("_type", "_parsing", "_from_float")):
        return f"must be {_TYPE_WORDS[stem]}, got {kind(value)}"
    return str(err["msg"]).removeprefix("Value error, ") + (
        "" if kind_ == "value_error" else f", got {shown(value)}"
    )


_T = TypeVar("_T")


class Checked(Generic[_T]):
    """A `TypeAdapter` over the dataclass `cls`, then each of `rules` (the checks across its
    fields: each returns `FieldError`s by path in the object); a failure raises `error` (an
    `InvalidInput` kind) with one `FieldError` per problem, each path under `prefix` (a
    problem with the input as a whole: `root`)."""

    def __init__(
        self,
        cls: type[_T],
        error: type[InvalidInput],
        *rules: Callable[[_T], list[FieldError]],
        prefix: str = "",
        root: str = "<input>",
    ) -> None:
        self.cls, self.error, self.prefix, self.root = cls, error, prefix, root
        annotated: Any = Annotated
        after = [AfterValidator(_raising(rule)) for rule in rules]
        self.adapter: TypeAdapter[Any] = TypeAdapter(annotated[(cls, *after)] if after else cls)

    def errors(self, exc: ValidationError) -> list[FieldError]:
        out: list[FieldError] = []
        for err in exc.errors():
            where = path_of(err["loc"], self.prefix)
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, Problems):
                out += [FieldError(join(where, p.field), p.message) for p in cause.errors]
            else:
                out.append(FieldError(where or self.root, _message(self.cls, err)))
        return out

    def problems(self, data: Any) -> list[FieldError]:
        """Every problem of `data` (plain data, or a `cls` built in code), or none."""
        try:
            self.adapter.validate_python(data)
        except ValidationError as exc:
            return self.errors(exc)
        return []

    def load(self, data: Any) -> _T:
        """`data` (plain data) as a `cls`, validated; raise `error` naming every problem."""
        try:
            return cast(_T, self.adapter.validate_python(data))
        except ValidationError as exc:
            raise self.error(self.errors(exc)) from None


def _raising(rule: Callable[[_T], list[FieldError]]) -> Callable[[_T], _T]:
    def check(value: _T) -> _T:
        raise_problems(rule(value))
        return value

    return check
