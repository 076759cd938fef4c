"""Checks of one value of a job spec: a validator raises, `check_remote_code_uri` returns the
`FieldError`s it finds (``runtime_env`` names code under several paths).

Owns: the checks the spec's fields declare (pydantic validators): the entrypoint
(`entrypoint_words`: splits into words as a POSIX shell would, at most
`MAX_ENTRYPOINT_CHARS`), where code comes from (`check_remote_code_uri`, `remote_code`: a
remote archive, never a path on the controller's disk) and the form of ``checkpoint.uri``
(`checkpoint_uri_form`: ``s3://bucket/prefix`` only). Types, bounds and finite numbers are
the fields' own (``Annotated``, `policies.validation`).

Must not: know the whole spec (see `job_spec`) or the cluster (see
`jobs.spec.check_checkpoint_uri`, called at submission).
"""

from __future__ import annotations

import shlex
from urllib.parse import urlsplit

from pydantic import AfterValidator

from jobs.spec.errors import FieldError, kind
from jobs.spec.limits import MAX_ENTRYPOINT_CHARS, REMOTE_URI_SCHEMES
from jobs.storage_uri import StorageUriError, parse_storage_uri
from policies.validation import raise_problems

__all__ = ["check_remote_code_uri", "checkpoint_uri_form", "entrypoint_words", "remote_code"]


def entrypoint_words(entrypoint: str) -> str:
    """A command is split into words as a POSIX shell would (`jobs.launcher` runs it on every
    rank without a shell): an unbalanced quote is refused here, not at admission."""
    if len(entrypoint) > MAX_ENTRYPOINT_CHARS:
        raise ValueError(f"is longer than {MAX_ENTRYPOINT_CHARS} characters")
    try:
        shlex.split(entrypoint)
    except ValueError as exc:
        raise ValueError(
            f"{entrypoint!r} cannot be split into words ({exc}); close the quote, or run a "
            "shell line as bash -c '...'"
        ) from None
    return entrypoint


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


def remote_code(suffixes: tuple[str, ...]) -> AfterValidator:
    """A field that names a remote archive of code (`check_remote_code_uri`), or null."""

    def check(value: str | None) -> str | None:
        if value is not None:
            raise_problems(check_remote_code_uri("", value, suffixes))
        return value

    return AfterValidator(check)


def checkpoint_uri_form(uri: str | None) -> str | None:
    """A job's own checkpoint location: ``s3://bucket/prefix``, never a path or file:// (a
    node's disk), parsed by `jobs.storage_uri.parse_storage_uri`, the parser the checkpoint
    storages open it with. Whether the bucket exists, and that the URI is outside the
    cluster's per-job area, is checked at submission (`check_checkpoint_uri`)."""
    if uri is None:
        return uri
    scheme = urlsplit(uri).scheme.lower()
    if scheme != "s3":
        what = f"the scheme {scheme}:// is not supported" if scheme else "it has no scheme"
        raise ValueError(
            f"{uri!r}: {what}; use s3://bucket/prefix (file:// and local paths are refused: a "
            "node's disk does not survive the node, see docs/checkpointing.md)"
        )
    try:
        parse_storage_uri(uri)
    except StorageUriError as exc:
        raise ValueError(f"{exc}; expected s3://bucket/prefix") from None
    return uri
