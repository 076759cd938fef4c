"""Checkpoint storage URIs, parsed once: what a ``s3://bucket/prefix`` or ``file:///path`` names.

Owns: `parse_storage_uri` (the one parser: the checkpoint storages open what it returns, the
job spec checks what it returns, the control plane compares what it returns), `StorageUri`
(scheme, bucket, path segments; prefixes compared segment by segment, never as strings) and
`job_storage_policy`, the S3 permissions a job needs on its own prefix and no more.

A URI is refused, not guessed at, wherever two readers could disagree on what it names: an
upper-case or unknown scheme is lower-cased or refused, and an empty path segment (``//``),
a ``.`` or ``..`` segment, a percent sign (``%2F`` decoded or not), a query, a fragment,
whitespace or a control character, or a bucket that is not a plain S3 bucket name is refused.
For ``s3://`` the path's characters are limited to those that mean the same thing in a key, a
URL and an IAM policy (no ``*``, ``?`` or ``$``). Worked example::

    parse_storage_uri("S3://b/team/run-7/").segments   -> ("team", "run-7")
    parse_storage_uri("s3://b//cluster1/jobs/j-1")     -> StorageUriError (empty segment)
    parse_storage_uri("s3://b/t").contains(parse_storage_uri("s3://b/t/x"))  -> True
    parse_storage_uri("s3://b/t").contains(parse_storage_uri("s3://b/tx"))   -> False

Must not: do I/O, import anything heavy (the job spec imports this), or decode anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SCHEMES",
    "StorageUri",
    "StorageUriError",
    "job_storage_policy",
    "parse_storage_uri",
]

SCHEMES = ("s3", "file")
"""The schemes a checkpoint storage opens (`jobs.checkpoint.storages.STORAGES`)."""
_BUCKET_RE = re.compile(r"^[a-z0-9](?:[a-z0-9.-]{0,61}[a-z0-9])?$")
"""An S3 bucket name: lower-case letters, digits, dots and hyphens (a one-letter name is
allowed: S3-compatible stores and tests use them)."""
_S3_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_~=+,@.-]+$")
"""A key segment whose bytes mean the same in an S3 key, a URL and an IAM ARN or condition."""
_REFUSED_ANYWHERE = re.compile(r"[%?#\\\x00-\x20\x7f]")


class StorageUriError(ValueError):
    """A storage URI that is malformed or could name more than one place."""


@dataclass(frozen=True)
class StorageUri:
    """A parsed storage URI: scheme (lower case), bucket (``""`` for file://) and path segments.

    `str()` is the canonical form (no trailing slash); two URIs name the same place exactly
    when they are equal."""

    scheme: str
    bucket: str
    segments: tuple[str, ...]

    @property
    def key_prefix(self) -> str:
        """The object key prefix (s3) or absolute path (file) without a trailing slash."""
        joined = "/".join(self.segments)
        return "/" + joined if self.scheme == "file" else joined

    def child(self, *segments: str) -> StorageUri:
        """This URI with `segments` appended (each checked like a parsed one)."""
        return parse_storage_uri(f"{self}/{'/'.join(segments)}")

    def contains(self, other: StorageUri) -> bool:
        """Whether `other` is this place or lies below it (segment by segment)."""
        return (
            self.scheme == other.scheme
            and self.bucket == other.bucket
            and other.segments[: len(self.segments)] == self.segments
        )

    def overlaps(self, other: StorageUri) -> bool:
        """Whether either lies within the other: objects of one could be objects of the other."""
        return self.contains(other) or other.contains(self)

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file://{self.key_prefix}"
        return f"s3://{self.bucket}/{self.key_prefix}" if self.segments else f"s3://{self.bucket}"


def parse_storage_uri(uri: object) -> StorageUri:
    """`uri` parsed, or StorageUriError saying what is wrong with it (see the module docs)."""
    if not isinstance(uri, str):
        raise StorageUriError(f"expected a string URI, got {type(uri).__name__}")
    if "://" not in uri:
        raise StorageUriError(f"{uri!r} must look like s3://bucket/prefix or file:///path")
    scheme, rest = uri.split("://", 1)
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise StorageUriError(
            f"scheme {scheme!r} is not supported ({uri!r}); use one of "
            f"{', '.join(s + '://' for s in SCHEMES)}"
        )
    bad = _REFUSED_ANYWHERE.search(rest)
    if bad is not None:
        raise StorageUriError(
            f"{uri!r} contains {bad.group()!r}: percent-encoding, queries, fragments, "
            "backslashes, whitespace and control characters are refused"
        )
    netloc, slash, path = rest.partition("/")
    if scheme == "file":
        if netloc not in ("", "localhost"):
            raise StorageUriError(f"file URI must be file:///absolute/path, got {uri!r}")
        bucket = ""
    else:
        if not _BUCKET_RE.match(netloc):
            raise StorageUriError(
                f"{uri!r} must name a bucket (s3://bucket/prefix) of lower-case letters, "
                "digits, dots and hyphens"
            )
        bucket = netloc
    if not slash:
        if scheme == "file":
            raise StorageUriError(f"file URI must be file:///absolute/path, got {uri!r}")
        return StorageUri(scheme, bucket, ())
    parts = path.split("/")
    if parts[-1] == "":
        parts.pop()  # one trailing slash: a prefix written as a directory
    for part in parts:
        if part in ("", ".", ".."):
            what = "an empty path segment (//)" if part == "" else f"a {part!r} path segment"
            raise StorageUriError(f"{uri!r} has {what}, which storages resolve differently")
        if scheme == "s3" and not _S3_SEGMENT_RE.match(part):
            raise StorageUriError(
                f"{uri!r}: the key segment {part!r} may use only letters, digits and . _ ~ = + , @ -"
            )
    if scheme == "file" and not parts:
        raise StorageUriError(f"file URI must name a directory below /, got {uri!r}")
    return StorageUri(scheme, bucket, tuple(parts))


def job_storage_policy(prefix: StorageUri) -> dict[str, Any]:
    """The IAM policy (a session policy) that lets a job's credentials read, write, list and
    delete objects under `prefix`, and abort its own multipart uploads, and nothing else.

    Listing the bucket is allowed only with ``s3:prefix`` at or below `prefix`. S3 cannot
    narrow the listing of unfinished multipart uploads by prefix, so a job may see the key
    names of other uploads in the bucket (not their data) but abort only its own. Example:
    ``s3://b/team/run-7`` allows ``s3:PutObject`` on ``arn:aws:s3:::b/team/run-7/*`` and
    ``s3:ListBucket`` on ``arn:aws:s3:::b`` where ``s3:prefix`` is like ``team/run-7/*``.
    """
    if prefix.scheme != "s3":
        raise StorageUriError(f"only s3:// prefixes have a policy, got {prefix}")
    if not prefix.segments:
        raise StorageUriError(f"{prefix} is a whole bucket; a job's prefix names a key prefix")
    bucket_arn = f"arn:aws:s3:::{prefix.bucket}"
    keys = prefix.key_prefix
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "JobObjects",
                "Effect": "Allow",
                "Action": [
                    "s3:AbortMultipartUpload",
                    "s3:DeleteObject",
                    "s3:GetObject",
                    "s3:ListMultipartUploadParts",
                    "s3:PutObject",
                ],
                "Resource": [f"{bucket_arn}/{keys}/*"],
            },
            {
                "Sid": "JobListing",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [bucket_arn],
                "Condition": {"StringLike": {"s3:prefix": [f"{keys}/", f"{keys}/*"]}},
            },
            {
                "Sid": "JobUploads",
                "Effect": "Allow",
                "Action": ["s3:ListBucketMultipartUploads"],
                "Resource": [bucket_arn],
            },
        ],
    }
