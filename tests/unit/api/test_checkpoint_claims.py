"""An explicit ``checkpoint.uri`` belongs to the user whose job named it first: the store
refuses another user's job whose prefix is it, lies in it or contains it (compared as parsed,
segment by segment), in the submission's own transaction. The API answers that refusal 409 on
``checkpoint.uri`` (`JobService.submit`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.api.access import Principal, Role
from controlplane.api.jobs import ApiError, JobService
from controlplane.config import load_config
from controlplane.store import CheckpointClaimConflict, Store
from jobs.spec import JobSpec

FIRST = "s3://ckpt/team-a/run"


def spec(uri: str | None, name: str = "j") -> JobSpec:
    checkpoint = {} if uri is None else {"checkpoint": {"uri": uri}}
    return JobSpec.from_dict({"name": name, "entrypoint": "pkg.mod:train", **checkpoint})


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "store.db")
    s.submit(spec(FIRST), owner="olga", owner_id="u-olga")
    yield s
    s.close()


@pytest.mark.parametrize(
    ("second", "refused"),
    [
        (FIRST, True),
        ("S3://ckpt/team-a/run/", True),
        ("s3://ckpt/team-a/run/step-1", True),
        ("s3://ckpt/team-a", True),
        ("s3://ckpt", True),
        ("s3://ckpt/team-a/run2", False),
        ("s3://ckpt/team-b/run", False),
        ("s3://other/team-a/run", False),
    ],
    ids=[
        "same", "same-as-parsed", "inside", "around", "the-bucket", "string-prefix-neighbour",
        "sibling", "other-bucket",
    ],
)  # fmt: skip
def test_another_users_job_may_not_name_an_overlapping_prefix(
    store: Store, second: str, refused: bool
) -> None:
    before = len(store.list_jobs())
    if refused:
        with pytest.raises(CheckpointClaimConflict, match="another user's job"):
            store.submit(spec(second), owner="otto", owner_id="u-otto")
        assert len(store.list_jobs()) == before
    else:
        store.submit(spec(second), owner="otto", owner_id="u-otto")
        assert len(store.list_jobs()) == before + 1


def test_the_owner_names_their_prefix_again_and_jobs_without_one_are_not_held(
    store: Store,
) -> None:
    """A second run of the same user resumes from the first's prefix; a job with no explicit
    URI (its own per-job area) claims nothing; a job of no user claims for nobody."""
    store.submit(spec(FIRST, "again"), owner="olga", owner_id="u-olga")
    store.submit(spec(None, "own-area"), owner="otto", owner_id="u-otto")
    store.submit(spec("s3://ckpt/shared"), owner=None, owner_id=None)
    store.submit(spec("s3://ckpt/shared/x"), owner="otto", owner_id="u-otto")
    assert len(store.list_jobs()) == 5


class Buckets:
    """The one S3 call submission makes (`check_bucket`'s head_bucket): every bucket exists."""

    def head_bucket(self, Bucket: str) -> dict[str, str]:  # noqa: N803 (boto3's keyword)
        return {}


def test_the_api_answers_409_on_checkpoint_uri(store: Store, tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [
            f"state_dir={tmp_path}",
            "storage.embedded=false",
            "storage.uri=s3://ckpt/cl",
            "storage.job_credentials=shared",
        ],
    )
    service = JobService(store, cfg)
    service._s3 = Buckets()
    otto = Principal("otto", Role.RESEARCHER, user_id="u-otto")
    before = len(store.list_jobs())
    with pytest.raises(ApiError) as refused:
        service.submit(
            {"name": "x", "entrypoint": "pkg.mod:train", "checkpoint": {"uri": FIRST}},
            principal=otto,
        )
    assert refused.value.status == 409 and refused.value.field == "checkpoint.uri"
    assert "another user's job" in str(refused.value)
    assert len(store.list_jobs()) == before
    mine = {"name": "y", "entrypoint": "pkg.mod:train", "checkpoint": {"uri": "s3://ckpt/otto"}}
    job, created = service.submit(mine, principal=otto)
    assert created and job.owner == "otto"
