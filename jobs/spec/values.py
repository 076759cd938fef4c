"""Checks of one value of a job spec, each returning the `FieldError`s it finds.

Owns: numbers (`is_number`: finite, never a boolean; `int_at_least`; `non_finite`, every NaN
or Infinity nested anywhere), the entrypoint (`check_entrypoint`: splits into words as a POSIX
shell would, at most `MAX_ENTRYPOINT_CHARS`), where code comes from
(`check_remote_code_uri`: a remote archive, never a path on the controller's disk) and the
form of ``checkpoint.uri`` (`check_checkpoint_uri_form`: ``s3://bucket/prefix`` only).

Must not: know the whole spec (see `job_spec.validate`) or the cluster (see
`jobs.spec.check_checkpoint_uri`, called at submission).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping
from urllib.parse import urlsplit

from jobs.spec.errors import FieldError, kind
from jobs.spec.limits import MAX_ENTRYPOINT_CHARS, REMOTE_URI_SCHEMES
from jobs.storage_uri import StorageUriError, parse_storage_uri

__all__ = [
    "check_checkpoint_uri_form",
    "check_entrypoint",
    "check_remote_code_uri",
    "int_at_least",
    "is_number",
    "non_finite",
]


def check_entrypoint(entrypoint: str) -> list[FieldError]:
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


def is_number(value: object) -> bool:
    """A finite int or float (NaN and Infinity compare false with every bound: refuse them)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not isinstance(value, float) or math.isfinite(value)


def check_remote_code_uri(path: str, value: object, suffixes: tuple[str, ...]) -> list[FieldError]:
    """`value` names a remote archive; local paths (the controller's own disk) are refused."""
    if not isinstance(value, str):
        return [FieldError(path, f"must be a string URI, got {kind(value)}")]
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


def check_checkpoint_uri_form(uri: str) -> list[FieldError]:
    """A job's own checkpoint location: ``s3://bucket/prefix``, never a path or file:// (a
    node's disk), parsed by `jobs.storage_uri.parse_storage_uri`, the parser the checkpoint
    storages open it with. Whether the bucket exists, and that the URI is outside the
    cluster's per-job area, is checked at submission (`check_checkpoint_uri`)."""
    scheme = urlsplit(uri).scheme.lower() if isinstance(uri, str) else ""
    if scheme != "s3":
        what = f"the scheme {scheme}:// is not supported" if scheme else "it has no scheme"
        return [
            FieldError(
                "checkpoint.uri",
                f"{uri!r}: {what}; use s3://bucket/prefix (file:// and local paths are "
                "refused: a node's disk does not survive the node, see docs/checkpointing.md)",
            )
        ]
    try:
        parse_storage_uri(uri)
    except StorageUriError as exc:
        return [FieldError("checkpoint.uri", f"{exc}; expected s3://bucket/prefix")]
    return []


def non_finite(path: str, value: object) -> list[FieldError]:
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


def int_at_least(name: str, value: object, minimum: int, why: str = "") -> list[FieldError]:
    if isinstance(value, bool) or not isinstance(value, int):
        return [FieldError(name, f"must be an integer, got {kind(value)}")]
    if value < minimum:
        reason = f" ({why})" if why else ""
        return [FieldError(name, f"must be >= {minimum}{reason}, got {value}")]
    return []
