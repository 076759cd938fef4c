"""Checkpoints belong to their job: a checkpoint.uri that names another job's prefix, or a
parent of the per-job area, is refused at submission with the same parser the storages open
URIs with; retention and upload aborts under a parent prefix never touch another job's keys;
the session policy a job's credentials would carry allows its own prefix only. No Ray."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from controlplane.config import Config
from controlplane.store import JobRecord, JobState
from controlplane.store.job_info import checkpoint_uri
from jobs.checkpoint import CheckpointEngine
from jobs.checkpoint.layout import manifest_key, shard_key
from jobs.checkpoint.retention import should_abort_upload
from jobs.checkpoint.storages import S3Storage, open_storage
from jobs.spec import FieldError, JobSpec, SpecError, check_checkpoint_uri
from jobs.storage_uri import (
    StorageUri,
    StorageUriError,
    job_storage_policy,
    parse_storage_uri,
)
from tests.unit.moto_s3 import REGION, client, moto_s3

CLUSTER = "s3://b/cluster1"
AREA = "s3://b/cluster1/jobs"
VICTIM = "cluster1/jobs/victim"


def refusal(uri: str, storage_uri: str = CLUSTER) -> list[FieldError]:
    """What submission says about a spec with this checkpoint.uri: the spec's own checks,
    then the check against the cluster's storage.uri (as `parse_spec` runs them)."""
    try:
        spec = JobSpec.from_dict(
            {"name": "t", "entrypoint": "python t.py", "checkpoint": {"uri": uri}}
        )
    except SpecError as exc:
        return list(exc.errors)
    return check_checkpoint_uri(spec, storage_uri)


# The probes of the review, and their neighbours: each names the victim's prefix, a parent of
# every job's prefix, or something two readers could resolve differently.
PROBES = [
    pytest.param("s3://b//cluster1/jobs/victim", "empty path segment", id="leading-double-slash"),
    pytest.param("s3://b/cluster1//jobs/victim", "empty path segment", id="inner-double-slash"),
    pytest.param("s3://b/cluster1/jobs//victim", "empty path segment", id="double-slash-in-area"),
    pytest.param("S3://b/cluster1/jobs/victim", "is inside", id="upper-case-scheme"),
    pytest.param("s3://b/cluster1/jobs/victim/", "is inside", id="trailing-slash"),
    pytest.param("s3://b/cluster1/jobs/victim/step-000000000001", "is inside", id="inside-a-step"),
    pytest.param("s3://b/cluster1/./jobs/victim", "'.' path segment", id="dot-segment"),
    pytest.param("s3://b/cluster1/x/../jobs/victim", "'..' path segment", id="dot-dot"),
    pytest.param("s3://b/cluster1%2Fjobs%2Fvictim", "percent-encoding", id="encoded-slashes"),
    pytest.param("s3://b/cluster1/jobs/%76ictim", "percent-encoding", id="encoded-letter"),
    pytest.param("s3://b/cluster1/jobs/victim?x=1", "queries", id="query"),
    pytest.param("s3://b/cluster1/jobs/victim#f", "fragments", id="fragment"),
    pytest.param("s3://b/cluster1/jobs\\victim", "backslashes", id="backslash"),
    pytest.param("s3://B/cluster1/jobs/victim", "must name a bucket", id="upper-case-bucket"),
    pytest.param("s3://me@b/cluster1/jobs/victim", "must name a bucket", id="userinfo"),
    pytest.param("s3://b:443/cluster1/jobs/victim", "must name a bucket", id="port"),
    pytest.param("s3://b/cluster1/jobs/*", "key segment", id="wildcard"),
    pytest.param("s3://b/cluster1/${aws:username}", "key segment", id="policy-variable"),
    pytest.param("s3://b/cluster1/jobs", "is inside", id="the-area-itself"),
    pytest.param("s3://b/cluster1", "contains", id="parent-of-the-area"),
    pytest.param("s3://b/", "contains", id="bucket-root-slash"),
    pytest.param("s3://b", "contains", id="bucket-root"),
]


@pytest.mark.parametrize(("uri", "says"), PROBES)
def test_a_checkpoint_uri_reaching_another_jobs_prefix_is_refused(uri: str, says: str) -> None:
    errors = refusal(uri)
    assert [e.field for e in errors] == ["checkpoint.uri"], errors
    assert says in errors[0].message
    assert uri in errors[0].message or repr(uri) in errors[0].message


@pytest.mark.parametrize(
    "uri",
    [
        pytest.param("s3://b/cluster1/jobs/victim", id="plain"),
        pytest.param("S3://b/cluster1/jobs/victim", id="upper-case-scheme"),
        pytest.param("s3://b/cluster1", id="parent"),
    ],
)
def test_an_overlap_names_the_field_and_the_per_job_area(uri: str) -> None:
    (error,) = refusal(uri)
    assert error.field == "checkpoint.uri"
    assert f"{AREA}/<job id>/" in error.message


@pytest.mark.parametrize(
    "uri",
    [
        pytest.param("s3://b/cluster1/team-a/run-7", id="beside-the-area"),
        pytest.param("s3://b/cluster1/jobsx/run-7", id="area-name-as-string-prefix"),
        pytest.param("s3://b/cluster1-other/jobs/victim", id="cluster-name-as-string-prefix"),
        pytest.param("s3://other/cluster1/jobs/victim", id="another-bucket"),
        pytest.param("s3://b/team/run-7/", id="trailing-slash"),
        pytest.param("s3://b/team/v1.2_a=b,c@d~e+f", id="every-allowed-character"),
    ],
)
def test_a_checkpoint_uri_of_its_own_is_accepted(uri: str) -> None:
    assert refusal(uri) == []


@pytest.mark.parametrize(
    ("uri", "scheme", "bucket", "segments", "canonical"),
    [
        pytest.param("s3://b", "s3", "b", (), "s3://b", id="bucket"),
        pytest.param("s3://b/", "s3", "b", (), "s3://b", id="bucket-slash"),
        pytest.param("S3://b/x/y/", "s3", "b", ("x", "y"), "s3://b/x/y", id="upper-scheme"),
        pytest.param("file:///tmp/c", "file", "", ("tmp", "c"), "file:///tmp/c", id="file"),
        pytest.param(
            "file://localhost/tmp/c", "file", "", ("tmp", "c"), "file:///tmp/c", id="localhost"
        ),
    ],
)
def test_parse_storage_uri(
    uri: str, scheme: str, bucket: str, segments: tuple[str, ...], canonical: str
) -> None:
    parsed = parse_storage_uri(uri)
    assert (parsed.scheme, parsed.bucket, parsed.segments) == (scheme, bucket, segments)
    assert str(parsed) == canonical
    assert parse_storage_uri(str(parsed)) == parsed


@pytest.mark.parametrize(
    ("outer", "inner", "contains"),
    [
        pytest.param("s3://b/t", "s3://b/t/x", True, id="child"),
        pytest.param("s3://b/t", "s3://b/t", True, id="itself"),
        pytest.param("s3://b", "s3://b/t/x", True, id="bucket-root"),
        pytest.param("s3://b/t", "s3://b/tx", False, id="string-prefix-only"),
        pytest.param("s3://b/t/x", "s3://b/t", False, id="parent"),
        pytest.param("s3://b/t", "s3://c/t/x", False, id="other-bucket"),
        pytest.param("file:///b/t", "s3://b/t/x", False, id="other-scheme"),
    ],
)
def test_storage_uri_contains_by_segments(outer: str, inner: str, contains: bool) -> None:
    a, b = parse_storage_uri(outer), parse_storage_uri(inner)
    assert a.contains(b) is contains
    assert a.overlaps(b) is (contains or b.contains(a))


@pytest.mark.parametrize(("uri", "_says"), PROBES[:18])
def test_storage_opens_no_uri_the_spec_refuses_as_ambiguous(uri: str, _says: str) -> None:
    """The probes the spec refuses as ambiguous, the storages refuse too: before, the S3
    backend stripped the slashes of ``s3://b//cluster1/jobs/victim`` and opened the victim's
    prefix. (Overlaps with the per-job area are well formed: a storage opens them.)"""
    parsed: StorageUri | None
    try:
        parsed = parse_storage_uri(uri)
    except StorageUriError:
        parsed = None
    if parsed is None:
        with pytest.raises(ValueError, match="checkpoint uri"):
            open_storage(uri, endpoint_url="http://127.0.0.1:9", region=REGION)
        return
    storage = open_storage(uri, endpoint_url="http://127.0.0.1:9", region=REGION)
    try:
        assert isinstance(storage, S3Storage)
        assert (storage.bucket, storage.prefix) == (parsed.bucket, parsed.key_prefix)
    finally:
        storage.close()


@pytest.mark.parametrize(
    ("key", "age_s", "newest", "abort"),
    [
        pytest.param(shard_key(3, 0, 0), 1.0, None, False, id="own-fresh"),
        pytest.param(shard_key(3, 0, 0), 7 * 3600.0, None, True, id="own-stale"),
        pytest.param(f"jobs/victim/{shard_key(3, 0, 0)}", 7 * 3600.0, None, False, id="nested"),
        pytest.param(f"jobs/victim/{shard_key(1, 0, 0)}", 1.0, 2, False, id="nested-older-step"),
        pytest.param("notes/big.bin", 7 * 3600.0, None, False, id="outside-the-layout"),
    ],
)
def test_only_uploads_of_the_jobs_own_layout_are_abandoned(
    key: str, age_s: float, newest: int | None, abort: bool
) -> None:
    assert (
        should_abort_upload(key, age_s, newest_committed_step=newest, max_upload_age_s=6 * 3600.0)
        is abort
    )


BUCKET = "ckpt"  # moto wants a real bucket name (3 characters or more)


@pytest.fixture
def s3_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    with moto_s3((BUCKET,)) as url:
        yield url


def uploads(s3: Any) -> set[str]:
    return {u["Key"] for u in s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])}


def test_retention_under_a_parent_prefix_leaves_other_jobs_alone(s3_url: str) -> None:
    """A job rooted at a parent of another job's prefix (the Low finding: it aborted their
    uploads older than 6 h) prunes and aborts only its own layout."""
    s3 = client(s3_url)
    for step in (1, 2):
        s3.put_object(Bucket=BUCKET, Key=f"{VICTIM}/{manifest_key(step)}", Body=b"{}")
    victim_upload = f"{VICTIM}/{shard_key(3, 0, 0)}"
    own_upload = f"cluster1/{shard_key(3, 0, 0)}"
    for key in (victim_upload, own_upload):
        s3.create_multipart_upload(Bucket=BUCKET, Key=key)
    # Every upload counts as older than the limit: the 6 h of the finding without the wait.
    engine = CheckpointEngine(
        f"s3://{BUCKET}/cluster1",
        endpoint_url=s3_url,
        region=REGION,
        keep_last=1,
        max_upload_age_s=-1.0,
    )
    try:
        engine.apply_retention()
    finally:
        engine.close()
    assert uploads(s3) == {victim_upload}
    victim_keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=VICTIM)["Contents"]}
    assert victim_keys == {f"{VICTIM}/{manifest_key(1)}", f"{VICTIM}/{manifest_key(2)}"}


@pytest.mark.parametrize(
    ("uri", "objects", "listing"),
    [
        pytest.param(
            "s3://b/team/run-7",
            "arn:aws:s3:::b/team/run-7/*",
            ["team/run-7/", "team/run-7/*"],
            id="two-segments",
        ),
        pytest.param(
            "S3://b/cluster1/jobs/j-1/",
            "arn:aws:s3:::b/cluster1/jobs/j-1/*",
            ["cluster1/jobs/j-1/", "cluster1/jobs/j-1/*"],
            id="a-jobs-default-prefix",
        ),
    ],
)
def test_job_storage_policy_allows_the_prefix_only(
    uri: str, objects: str, listing: list[str]
) -> None:
    policy = job_storage_policy(parse_storage_uri(uri))
    by_sid = {s["Sid"]: s for s in policy["Statement"]}
    assert all(s["Effect"] == "Allow" for s in by_sid.values())
    assert by_sid["JobObjects"]["Resource"] == [objects]
    assert set(by_sid["JobObjects"]["Action"]) == {
        "s3:AbortMultipartUpload",
        "s3:DeleteObject",
        "s3:GetObject",
        "s3:ListMultipartUploadParts",
        "s3:PutObject",
    }
    assert by_sid["JobListing"]["Action"] == ["s3:ListBucket"]
    assert by_sid["JobListing"]["Condition"] == {"StringLike": {"s3:prefix": listing}}
    assert by_sid["JobUploads"]["Action"] == ["s3:ListBucketMultipartUploads"]
    bucket_wide = [s for s in by_sid.values() if s["Resource"] == ["arn:aws:s3:::b"]]
    assert {a for s in bucket_wide for a in s["Action"]} == {
        "s3:ListBucket",
        "s3:ListBucketMultipartUploads",
    }


@pytest.mark.parametrize(
    "uri", [pytest.param("s3://b", id="whole-bucket"), pytest.param("file:///tmp/c", id="file")]
)
def test_job_storage_policy_refuses_what_is_not_a_key_prefix(uri: str) -> None:
    with pytest.raises(StorageUriError):
        job_storage_policy(parse_storage_uri(uri))


@pytest.mark.parametrize(
    ("uri", "recorded"),
    [
        pytest.param(None, "s3://rcp-checkpoints/jobs/j-1", id="default"),
        pytest.param("S3://team-a/run-7/", "s3://team-a/run-7", id="explicit-canonical"),
    ],
)
def test_the_runner_records_the_prefix_as_parsed(uri: str | None, recorded: str) -> None:
    spec = JobSpec.from_dict({"name": "t", "entrypoint": "python t.py", "checkpoint": {"uri": uri}})
    job = JobRecord("j-1", spec, JobState.QUEUED, submitted_s=0.0, queued_s=0.0, updated_s=0.0)
    assert checkpoint_uri(Config(), job) == recorded
