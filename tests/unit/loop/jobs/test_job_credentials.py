"""Scoped job credentials (storage.job_credentials=scoped): the controller mints them per job
with STS AssumeRole and the session policy of exactly the job's prefix, hands them to the
signals actor and refreshes them; the job's storage fetches them from the actor with its
attempt's token and refreshes them through botocore; no storage key is in the job's runtime
env or, locally, the nodes' environment. No Ray: the signals actor is the real class called
in-process, STS and S3 are an in-process moto server.

moto evaluates no session policy, so what S3 would enforce is shown here with a small
evaluator of the policy's Resource and StringLike patterns (`allowed`), fed with every request
a real checkpoint engine makes.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch

from controlplane.adapters.ray_jobs import RayJobs
from controlplane.config import ConfigError, load_config
from controlplane.loop.act.jobs import limits as runner_limits
from controlplane.loop.act.jobs.runner import JobRunner
from controlplane.storage import EMBEDDED_JOB_ROLE_ARN, JobCredentialMinter
from controlplane.store import JobState, Store
from jobs.checkpoint import CheckpointEngine
from jobs.checkpoint.layout import shard_key
from jobs.checkpoint.retrying import RetryPolicy, TransientError
from jobs.checkpoint.storages import S3Storage, StorageOptions
from jobs.checkpointing import settings_from_env
from jobs.checkpointing.credentials import SignalsCredentials
from jobs.signals.handle import SignalsHandle
from jobs.signals.trust import token_sha256
from jobs.spec import CheckpointSpec
from jobs.storage_credentials import StorageCredentials, check_credentials, role_session_name
from jobs.storage_uri import StorageUri, job_storage_policy, parse_storage_uri
from policies.credentials import CredentialsAction, credentials_action
from tests.unit.jobs.test_checkpoint_helpers import helper, job_env, registered
from tests.unit.jobs.test_job_signals import CALLERS, TOKEN, admin, make_signals, status
from tests.unit.loop.jobs.test_runner import Clock, FakeRay, admit, submit
from tests.unit.loop.jobs.test_signals_trust import FakeRayActors
from tests.unit.loop.jobs.test_signals_trust import fake_ray as fake_ray  # noqa: F401 (a fixture)
from tests.unit.moto_s3 import REGION, client, moto_s3
from tests.unit.runner_tick import reconcile

BUCKET = "ckpt"
ROLE = "arn:aws:iam::123456789012:role/rcp-jobs"


def creds(key_id: str = "ASIAJOBKEY1", expires_unix_s: float = 2e9) -> StorageCredentials:
    return StorageCredentials(
        access_key_id=key_id,
        secret_access_key=f"secret-of-{key_id}",
        session_token=f"session-of-{key_id}",
        expires_unix_s=expires_unix_s,
    )


@pytest.fixture
def s3_url() -> Iterator[str]:
    with moto_s3((BUCKET,)) as url:
        yield url


# -- config -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        pytest.param(
            ["storage.job_credentials=mine"],
            "storage.job_credentials: must be one of",
            id="unknown-mode",
        ),
        pytest.param(
            ["storage.embedded=false"],
            "storage.job_role_arn: storage.job_credentials=scoped mints",
            id="scoped-without-a-role",
        ),
        pytest.param(
            ["storage.job_role_arn=arn:aws:iam::1:role/x"],
            "storage.job_role_arn: must be an IAM role ARN",
            id="malformed-role",
        ),
        pytest.param(
            ["storage.job_role_arn=arn:aws:iam::123456789012:user/x"],
            "storage.job_role_arn: must be an IAM role ARN",
            id="a-user-not-a-role",
        ),
        pytest.param(
            ["storage.job_credentials_duration_s=900"],
            "storage.job_credentials_duration_s: must be >= 1800",
            id="duration-below-the-refresh-window",
        ),
        pytest.param(
            ["storage.job_credentials_duration_s=86400"],
            "storage.job_credentials_duration_s: must be <= 43200",
            id="duration-above-sts",
        ),
        pytest.param(
            ["jobs.storage_path=s3://b/ray-train"],
            "jobs.storage_path: 's3://b/ray-train' is on S3",
            id="ray-train-on-s3-while-scoped",
        ),
    ],
)
def test_config_refuses(overrides: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(None, overrides)


@pytest.mark.parametrize(
    ("overrides", "mode"),
    [
        pytest.param([], "scoped", id="default-scoped-with-the-embedded-store"),
        pytest.param(
            ["storage.embedded=false", f"storage.job_role_arn={ROLE}"],
            "scoped",
            id="scoped-with-a-role",
        ),
        pytest.param(
            ["storage.embedded=false", "storage.job_credentials=shared"], "shared", id="shared"
        ),
        pytest.param(
            ["storage.embedded=false", "storage.uri=file:///tmp/ckpt"],
            "scoped",
            id="file-store-needs-no-role",
        ),
        pytest.param(
            ["storage.job_credentials=shared", "jobs.storage_path=s3://b/ray-train"],
            "shared",
            id="ray-train-on-s3-while-shared",
        ),
    ],
)
def test_config_accepts(overrides: list[str], mode: str) -> None:
    assert load_config(None, overrides).storage.job_credentials == mode


# -- when to mint again (policies.credentials) ----------------------------------------------------


@pytest.mark.parametrize(
    ("held", "cached", "action"),
    [
        pytest.param(13_000.0, 13_000.0, CredentialsAction.KEEP, id="fresh"),
        pytest.param(11_801.0, None, CredentialsAction.KEEP, id="just-over-half-left"),
        pytest.param(11_800.0, 11_800.0, CredentialsAction.MINT, id="half-left"),
        pytest.param(11_500.0, 11_500.0, CredentialsAction.MINT, id="due"),
        pytest.param(None, 13_000.0, CredentialsAction.PUT, id="actor-lost-them"),
        pytest.param(11_500.0, 13_000.0, CredentialsAction.PUT, id="actor-holds-older"),
        pytest.param(None, None, CredentialsAction.MINT, id="none-anywhere"),
        pytest.param(9_000.0, None, CredentialsAction.MINT, id="expired"),
    ],
)
def test_credentials_action(
    held: float | None, cached: float | None, action: CredentialsAction
) -> None:
    assert credentials_action(held, cached, now_s=10_000.0, duration_s=3600.0) is action


def test_short_lifetimes_are_refreshed_before_botocores_window() -> None:
    """1800 s credentials are due with 20 min left, not 15 (botocore's advisory window)."""
    assert credentials_action(11_201.0, None, 10_000.0, 1800.0) is CredentialsAction.KEEP
    assert credentials_action(11_200.0, None, 10_000.0, 1800.0) is CredentialsAction.MINT


# -- minting (controlplane.storage) ---------------------------------------------------------------


def assumed_roles() -> list[Any]:
    """What the in-process moto server's STS was asked (it records every AssumeRole)."""
    from moto.sts.models import sts_backends

    return list(sts_backends["123456789012"]["aws"].assumed_roles)


@pytest.mark.parametrize(
    ("overrides", "role"),
    [
        pytest.param(
            ["storage.embedded=false", f"storage.job_role_arn={ROLE}"], ROLE, id="configured-role"
        ),
        pytest.param([], EMBEDDED_JOB_ROLE_ARN, id="embedded-stand-in"),
    ],
)
@pytest.mark.parametrize(
    "prefix",
    [
        pytest.param(f"s3://{BUCKET}/cluster1/jobs/job-1", id="a-jobs-default-prefix"),
        pytest.param(f"s3://{BUCKET}/team-a/run-7", id="an-explicit-prefix"),
    ],
)
def test_the_mint_carries_the_session_policy_of_exactly_the_jobs_prefix(
    s3_url: str, overrides: list[str], role: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "the-controllers-key")  # its own, for AssumeRole
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the-controllers-secret")
    cfg = load_config(None, [f"storage.endpoint_url={s3_url}", *overrides])
    before = len(assumed_roles())
    minted = JobCredentialMinter(cfg).mint("job-1", parse_storage_uri(prefix))
    (asked,) = assumed_roles()[before:]
    assert asked.role_arn == role
    assert asked.session_name == "rcp-job-1"
    assert json.loads(asked.policy) == job_storage_policy(parse_storage_uri(prefix))
    assert minted["access_key_id"] == asked.access_key_id
    assert minted["session_token"] == asked.session_token
    assert minted["expires_unix_s"] == pytest.approx(time.time() + 3600, abs=60)
    # S3 (moto: no policy enforced) takes them.
    job_s3 = boto3.client(
        "s3",
        endpoint_url=s3_url,
        region_name=REGION,
        aws_access_key_id=minted["access_key_id"],
        aws_secret_access_key=minted["secret_access_key"],
        aws_session_token=minted["session_token"],
    )
    key = f"{parse_storage_uri(prefix).key_prefix}/probe"
    job_s3.put_object(Bucket=BUCKET, Key=key, Body=b"1")
    assert client(s3_url).get_object(Bucket=BUCKET, Key=key)["Body"].read() == b"1"


def test_the_mint_asks_for_the_configured_lifetime(s3_url: str) -> None:
    cfg = load_config(
        None, [f"storage.endpoint_url={s3_url}", "storage.job_credentials_duration_s=7200"]
    )
    minted = JobCredentialMinter(cfg).mint("job-2", parse_storage_uri(f"s3://{BUCKET}/t/job-2"))
    assert minted["expires_unix_s"] == pytest.approx(time.time() + 7200, abs=60)


@pytest.mark.parametrize(
    ("job_id", "name"),
    [
        pytest.param("job-3f2a9c0d1e7b", "rcp-job-3f2a9c0d1e7b", id="store-id"),
        pytest.param("a b/c", "rcp-a-b-c", id="characters-sts-refuses"),
        pytest.param("x" * 80, "rcp-" + "x" * 60, id="too-long"),
    ],
)
def test_role_session_name(job_id: str, name: str) -> None:
    assert role_session_name(job_id) == name


# -- what the policy allows: every request a real engine makes ------------------------------------


def _like(pattern: str, value: str) -> bool:
    """IAM's ARN and StringLike matching: ``*`` any run of characters (``/`` too), ``?`` one."""
    parts = (".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch("".join(parts), value) is not None


def allowed(policy: dict[str, Any], action: str, resource: str, context: dict[str, str]) -> bool:
    """Whether an Allow statement of `policy` matches (everything else is denied, as in IAM).
    A condition on a key the request does not carry fails, as IAM's StringLike does."""
    for statement in policy["Statement"]:
        if statement["Effect"] != "Allow" or action not in statement["Action"]:
            continue
        if not any(_like(p, resource) for p in statement["Resource"]):
            continue
        conditions = statement.get("Condition", {})
        assert set(conditions) <= {"StringLike"}, conditions
        if all(
            key in context and any(_like(p, context[key]) for p in patterns)
            for key, patterns in conditions.get("StringLike", {}).items()
        ):
            return True
    return False


ACTIONS = {
    "PutObject": "s3:PutObject",
    "CreateMultipartUpload": "s3:PutObject",
    "UploadPart": "s3:PutObject",
    "CompleteMultipartUpload": "s3:PutObject",
    "GetObject": "s3:GetObject",
    "HeadObject": "s3:GetObject",
    "DeleteObjects": "s3:DeleteObject",
    "DeleteObject": "s3:DeleteObject",
    "AbortMultipartUpload": "s3:AbortMultipartUpload",
    "ListParts": "s3:ListMultipartUploadParts",
    "ListObjectsV2": "s3:ListBucket",
    "ListMultipartUploads": "s3:ListBucketMultipartUploads",
}
"""S3 operation -> the IAM action it needs (an operation missing here fails the test)."""


def requests_of(operation: str, params: dict[str, Any]) -> list[tuple[str, str, dict[str, str]]]:
    """``(action, resource, condition context)`` per object an S3 call touches."""
    action, bucket = ACTIONS[operation], params["Bucket"]
    if operation == "DeleteObjects":
        keys = [o["Key"] for o in params["Delete"]["Objects"]]
        return [(action, f"arn:aws:s3:::{bucket}/{k}", {}) for k in keys]
    if "Key" in params:
        return [(action, f"arn:aws:s3:::{bucket}/{params['Key']}", {})]
    context = {"s3:prefix": params["Prefix"]} if "Prefix" in params else {}
    return [(action, f"arn:aws:s3:::{bucket}", context)]


def engine_requests(s3_url: str, prefix: str) -> list[tuple[str, str, dict[str, str]]]:
    """Every request a checkpoint engine makes for `prefix`: two saves (one large enough for a
    multipart upload), retention with an abandoned upload to abort, and a restore."""
    seen: list[tuple[str, str, dict[str, str]]] = []
    engine = CheckpointEngine(
        prefix,
        endpoint_url=s3_url,
        region=REGION,
        keep_last=1,
        max_upload_age_s=-1.0,
        part_size_bytes=5 << 20,
        shard_size_bytes=16 << 20,
    )

    def record(params: dict[str, Any], model: Any, **_kw: Any) -> None:
        seen.extend(requests_of(model.name, params))

    engine.storage.client.meta.events.register("before-parameter-build.s3", record)  # type: ignore[attr-defined]
    try:
        for step in (1, 2):
            engine.save({"w": torch.full((6 << 18,), float(step))}, step)  # 6 MiB
            engine.wait()
        key = f"{parse_storage_uri(prefix).key_prefix}/{shard_key(3, 0, 0)}"
        client(s3_url).create_multipart_upload(Bucket=BUCKET, Key=key)
        engine.apply_retention()
        assert engine.restore() is not None
    finally:
        engine.close()
    return seen


OWN = f"s3://{BUCKET}/cluster1/jobs/j-1"
NEIGHBOUR = f"s3://{BUCKET}/cluster1/jobs/j-10"  # a string-prefix neighbour of j-1


@pytest.fixture
def node_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys in the environment (moto checks none): the engine below is not under test."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")


@pytest.mark.usefixtures("node_keys")
def test_the_policy_allows_every_request_of_the_jobs_own_engine(s3_url: str) -> None:
    policy = job_storage_policy(parse_storage_uri(OWN))
    seen = engine_requests(s3_url, OWN)
    operations = {action for action, _r, _c in seen}
    assert operations >= set(ACTIONS.values()) - {"s3:ListMultipartUploadParts"}, operations
    assert [r for r in seen if not allowed(policy, *r)] == []


@pytest.mark.usefixtures("node_keys")
def test_the_policy_denies_every_request_on_a_neighbours_prefix(s3_url: str) -> None:
    """What the neighbour's engine does, under j-1's credentials: all denied but listing the
    bucket's unfinished uploads (S3 cannot narrow it; key names only, see the policy doc)."""
    policy = job_storage_policy(parse_storage_uri(OWN))
    seen = engine_requests(s3_url, NEIGHBOUR)
    let_through = {r[0] for r in seen if allowed(policy, *r)}
    assert let_through == {"s3:ListBucketMultipartUploads"}


@pytest.mark.parametrize(
    ("action", "resource", "context", "allow"),
    [
        pytest.param(
            "s3:ListBucket",
            "arn:aws:s3:::ckpt",
            {"s3:prefix": "cluster1/jobs/j-1/"},
            True,
            id="list-own",
        ),
        pytest.param(
            "s3:ListBucket",
            "arn:aws:s3:::ckpt",
            {"s3:prefix": "cluster1/jobs/"},
            False,
            id="list-parent",
        ),
        pytest.param(
            "s3:ListBucket",
            "arn:aws:s3:::ckpt",
            {"s3:prefix": "cluster1/jobs/j-1"},
            False,
            id="list-without-slash",
        ),
        pytest.param("s3:ListBucket", "arn:aws:s3:::ckpt", {}, False, id="list-everything"),
        pytest.param(
            "s3:GetObject", "arn:aws:s3:::ckpt/cluster1/jobs/j-1", {}, False, id="the-prefix-itself"
        ),
        pytest.param(
            "s3:PutObject", "arn:aws:s3:::other/cluster1/jobs/j-1/x", {}, False, id="another-bucket"
        ),
        pytest.param(
            "s3:DeleteObject",
            "arn:aws:s3:::ckpt/cluster1/jobs/j-2/x",
            {},
            False,
            id="delete-other-job",
        ),
        pytest.param("s3:PutBucketPolicy", "arn:aws:s3:::ckpt", {}, False, id="bucket-policy"),
    ],
)
def test_the_policy_on_requests_no_engine_makes(
    action: str, resource: str, context: dict[str, str], allow: bool
) -> None:
    policy = job_storage_policy(parse_storage_uri(OWN))
    assert allowed(policy, action, resource, context) is allow


# -- the signals actor holds and hands them out -------------------------------------------------


def test_the_actor_hands_the_attempts_credentials_to_its_token_only() -> None:
    s = make_signals()
    assert admin(s, "put_credentials", "job-a", 1, creds()) is True
    assert s.credentials("job-a", 1, TOKEN) == creds()
    shown = status(s)
    assert shown["credentials_expire_unix_s"] == 2e9
    assert "secret-of" not in repr(shown) and "session-of" not in repr(shown)
    for caller in CALLERS.values():
        assert s.credentials(*caller) is None
    assert status(s)["rejected_calls"] == len(CALLERS) - 1  # the unknown job is no job's


@pytest.mark.parametrize(
    ("attempt", "value"),
    [
        pytest.param(2, creds(), id="another-attempt"),
        pytest.param(1, {**creds(), "session_token": ""}, id="empty-token"),
        pytest.param(1, {**creds(), "expires_unix_s": float("nan")}, id="nan-expiry"),
        pytest.param(1, {**creds(), "extra": "x"}, id="extra-field"),
    ],
)
def test_the_actor_keeps_no_credentials_for_another_attempt_or_malformed_ones(
    attempt: int, value: Any
) -> None:
    s = make_signals()
    assert admin(s, "put_credentials", "job-a", attempt, value) is False
    assert s.credentials("job-a", 1, TOKEN) is None
    assert status(s)["credentials_expire_unix_s"] is None


def test_a_new_attempt_starts_without_the_old_credentials() -> None:
    s = make_signals()
    admin(s, "put_credentials", "job-a", 1, creds())
    admin(s, "register", "job-a", 2, token_sha256("token-2"), "/train/job-a")
    assert s.credentials("job-a", 2, "token-2") is None


def test_putting_credentials_needs_the_admin_mac() -> None:
    s = make_signals()
    with pytest.raises(PermissionError):
        s.put_credentials("job-a", 1, creds(), auth=(time.time_ns(), "forged"))
    assert s.credentials("job-a", 1, TOKEN) is None


def test_signed_by_the_controller_and_fetched_by_the_job(
    tmp_path: Path,
    fake_ray: FakeRayActors,  # noqa: F811 (the fixture)
) -> None:
    """RayJobs signs the put like every admin call; the job's source finds the actor by name
    (`SignalsHandle`) and presents its attempt's token."""
    cfg = load_config(None, [f"state_dir={tmp_path}"])
    jobs = RayJobs(cfg)
    JobRunner(Store(tmp_path / "db.sqlite"), cfg, jobs)
    jobs.register_signals("job-a", 1, token_sha256(TOKEN), "s3://ckpt/t/job-a")
    assert jobs.put_storage_credentials("job-a", 1, creds()) is True
    assert jobs.signal_status("job-a")["credentials_expire_unix_s"] == 2e9
    assert SignalsCredentials(SignalsHandle(), "job-a", 1, TOKEN)() == creds()
    with pytest.raises(TransientError, match="holds no storage credentials"):
        SignalsCredentials(SignalsHandle(), "job-a", 1, "not-the-token")()


# -- the job's side: a refreshable provider, and nothing else ------------------------------------


class Source:
    """A credential source handing out `given` in order (the last one again after that)."""

    def __init__(self, *given: StorageCredentials | Exception) -> None:
        self.given = list(given)
        self.calls = 0

    def __call__(self) -> StorageCredentials:
        item = self.given[min(self.calls, len(self.given) - 1)]
        self.calls += 1
        if isinstance(item, Exception):
            raise item
        return item


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def signed_with(storage: S3Storage) -> list[tuple[str, str]]:
    """``(access key id, session token)`` of every request `storage` sends from now on."""
    sent: list[tuple[str, str]] = []

    def record(request: Any, **_kw: Any) -> None:
        key_id = re.search(r"Credential=([^/]+)/", _text(request.headers["Authorization"]))
        assert key_id is not None
        token = _text(request.headers.get("X-Amz-Security-Token", ""))
        sent.append((key_id.group(1), token))

    storage.client.meta.events.register("before-send.s3", record)
    return sent


def test_the_jobs_storage_refreshes_credentials_before_they_expire(s3_url: str) -> None:
    """Credentials with 5 min left are inside botocore's mandatory window: the next request
    fetches new ones; those with an hour left are used without asking again."""
    now = time.time()
    source = Source(creds("ASIAFIRST", now + 300), creds("ASIASECOND", now + 3600))
    storage = S3Storage(BUCKET, "t/job-a", endpoint_url=s3_url, region=REGION, credentials=source)
    try:
        sent = signed_with(storage)
        for key in ("a", "b", "c"):
            storage.put_bytes(key, b"x")
    finally:
        storage.close()
    assert sent == [
        ("ASIAFIRST", "session-of-ASIAFIRST"),
        ("ASIASECOND", "session-of-ASIASECOND"),
        ("ASIASECOND", "session-of-ASIASECOND"),
    ]
    assert source.calls == 2


def test_a_source_that_fails_is_retried_and_never_replaced_by_the_nodes_keys(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ANODESBUCKETWIDEKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "node-secret")
    options = StorageOptions(retry=RetryPolicy(max_attempts=3, base_delay_s=0, max_delay_s=0))
    down = TransientError("the signals actor did not answer")
    failing = Source(down)
    storage = S3Storage(
        BUCKET, "t/job-a", endpoint_url=s3_url, region=REGION, options=options, credentials=failing
    )
    try:
        sent = signed_with(storage)
        with pytest.raises(TransientError):
            storage.put_bytes("a", b"x")
    finally:
        storage.close()
    assert sent == [] and failing.calls == 3
    recovering = Source(down, creds("ASIAJOB", time.time() + 3600))
    storage = S3Storage(
        BUCKET,
        "t/job-a",
        endpoint_url=s3_url,
        region=REGION,
        options=options,
        credentials=recovering,
    )
    try:
        sent = signed_with(storage)
        storage.put_bytes("a", b"x")
    finally:
        storage.close()
    assert sent == [("ASIAJOB", "session-of-ASIAJOB")]


@pytest.mark.parametrize(
    ("value", "scoped"),
    [pytest.param("signals", True, id="signals"), pytest.param("", False, id="unset")],
)
def test_settings_read_where_credentials_come_from(value: str, scoped: bool) -> None:
    assert settings_from_env({"RCP_STORAGE_CREDENTIALS": value}).credentials_from_signals is scoped


def test_settings_refuse_an_unknown_credentials_source() -> None:
    with pytest.raises(ValueError, match="RCP_STORAGE_CREDENTIALS must be 'signals'"):
        settings_from_env({"RCP_STORAGE_CREDENTIALS": "env"})


def test_the_helper_saves_with_the_credentials_the_actor_holds(s3_url: str) -> None:
    uri = f"s3://{BUCKET}/t/job-a"
    actor = registered(uri)
    minted = creds("ASIAMINTED", time.time() + 3600)
    admin(actor, "put_credentials", "job-a", 1, minted)
    env = job_env(
        uri,
        RCP_STORAGE_CREDENTIALS="signals",
        RCP_STORAGE_ENDPOINT_URL=s3_url,
        RCP_STORAGE_REGION=REGION,
    )
    ckpt, handle = helper(env, actor=actor, memory_tier=None, every_n_steps=1)
    assert ckpt.engine is not None
    storage = ckpt.engine.storage
    assert isinstance(storage, S3Storage)
    sent = signed_with(storage)
    try:
        ckpt.save(1, {"w": torch.zeros(4)})
        ckpt.engine.wait()
    finally:
        ckpt.engine.close()
    assert sent and {s for s in sent} == {("ASIAMINTED", "session-of-ASIAMINTED")}
    assert handle is not None and handle.named("credentials") == [("job-a", 1, "attempt-token")]


def test_malformed_credentials_from_the_actor_are_refused() -> None:
    class Answers:
        def call(self, method: str, *args: Any, timeout_s: float) -> Any:
            return {**creds(), "secret_access_key": "has space"}

    with pytest.raises(ValueError, match="secret_access_key must be a non-empty token"):
        SignalsCredentials(Answers(), "job-a", 1, TOKEN)()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exactly the fields"):
        check_credentials({"access_key_id": "a"})


# -- the runner: mint at admission, never in the runtime env, refresh while admitted ---------------


class Mints:
    """The runner's mint: records ``(job_id, prefix)``, hands out numbered credentials that
    expire `lifetime_s` after the clock, or raises while `failing`."""

    def __init__(self, clock: Clock, lifetime_s: float = 3600.0) -> None:
        self.clock = clock
        self.lifetime_s = lifetime_s
        self.asked: list[tuple[str, str]] = []
        self.failing = False

    def __call__(self, job_id: str, prefix: StorageUri) -> StorageCredentials:
        self.asked.append((job_id, str(prefix)))
        if self.failing:
            raise RuntimeError("STS is unreachable")
        return creds(f"ASIA{len(self.asked):04d}", self.clock.now + self.lifetime_s)


def runner(tmp_path: Path, *overrides: str) -> tuple[Store, FakeRay, Clock, Mints, JobRunner]:
    cfg = load_config(
        None,
        [
            f"state_dir={tmp_path}",
            f"storage.uri=s3://{BUCKET}/cluster1",
            "jobs.gang_start_timeout_s=600000",
            *overrides,
        ],
    )
    clock = Clock()
    store = Store(tmp_path / "db.sqlite", clock=clock)
    fake = FakeRay()
    mints = Mints(clock)
    return store, fake, clock, mints, JobRunner(store, cfg, fake, clock=clock, mint=mints)


@pytest.mark.parametrize(
    ("spec", "prefix"),
    [
        pytest.param({}, "s3://ckpt/cluster1/jobs/{job_id}", id="default-prefix"),
        pytest.param(
            {"checkpoint": CheckpointSpec(uri="S3://team-ckpt/llama/run-7/")},
            "s3://team-ckpt/llama/run-7",
            id="explicit-uri-as-parsed",
        ),
    ],
)
def test_admission_mints_for_the_jobs_prefix_and_hands_them_over_before_submitting(
    tmp_path: Path, spec: dict[str, Any], prefix: str
) -> None:
    store, fake, _clock, mints, run = runner(tmp_path)
    job_id = submit(store, **spec)
    admit(run, job_id)
    expected = prefix.format(job_id=job_id)
    assert mints.asked == [(job_id, expected)]
    assert fake.registered[0][3] == expected
    assert [c for c in fake.calls if c != "list"] == [
        f"register {job_id}-1",
        f"put-credentials {job_id}-1",
        f"submit {job_id}-1",
    ]
    assert fake.credentials[job_id] == (1, creds("ASIA0001", 1000.0 + 3600.0))
    (_sid, _entrypoint, runtime_env) = fake.submitted[0]
    env = runtime_env["env_vars"]
    assert env["RCP_STORAGE_CREDENTIALS"] == "signals"
    assert env["RCP_CHECKPOINT_URI"] == expected
    shown = json.dumps(runtime_env)
    assert "AWS_" not in shown
    assert not [v for v in creds("ASIA0001").values() if isinstance(v, str) and v in shown]


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(["storage.job_credentials=shared"], id="shared"),
        pytest.param([f"storage.uri=file://{'/tmp'}/rcp-store"], id="file-store"),
    ],
)
def test_no_credentials_are_minted_where_jobs_do_not_get_scoped_ones(
    tmp_path: Path, overrides: list[str]
) -> None:
    store, fake, _clock, mints, run = runner(tmp_path, *overrides)
    job_id = submit(store)
    admit(run, job_id)
    assert mints.asked == [] and fake.credentials == {}
    assert "RCP_STORAGE_CREDENTIALS" not in fake.submitted[0][2]["env_vars"]


def test_a_failed_mint_is_a_start_failure_and_nothing_runs(tmp_path: Path) -> None:
    store, fake, _clock, mints, run = runner(tmp_path)
    mints.failing = True
    job_id = submit(store)
    admit(run, job_id)
    assert fake.submitted == []
    job = store.get(job_id)
    assert job.state is JobState.QUEUED
    assert "storage credentials unavailable: STS is unreachable" in str(job.info.get("message"))


def test_credentials_are_refreshed_put_again_and_retried_while_the_job_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner_limits, "TICK_WAIT_S", 30.0)  # mints run on a worker thread
    store, fake, clock, mints, run = runner(tmp_path)
    job_id = submit(store)
    admit(run, job_id)
    fake.start_workers(job_id, 1, 2)
    reconcile(run)
    assert store.get(job_id).state is JobState.RUNNING
    assert len(mints.asked) == 1  # fresh: nothing to do

    clock.now += 1801  # under half of the hour left
    reconcile(run)
    assert len(mints.asked) == 2
    assert fake.credentials[job_id] == (1, creds("ASIA0002", clock.now + 3600))

    del fake.signals[job_id]["credentials_expire_unix_s"]  # the actor restarted
    fake.credentials.pop(job_id)
    clock.now += 60
    reconcile(run)
    assert len(mints.asked) == 2  # the cached ones are still fresh: handed over again
    assert fake.credentials[job_id][1]["access_key_id"] == "ASIA0002"

    clock.now += 1801
    mints.failing = True
    reconcile(run)
    reconcile(run)  # within the retry pause: not asked again
    assert len(mints.asked) == 3
    clock.now += runner_limits.CREDENTIALS_MINT_RETRY_S
    mints.failing = False
    reconcile(run)
    assert len(mints.asked) == 4
    assert fake.credentials[job_id][1]["access_key_id"] == "ASIA0004"
    assert store.get(job_id).state is JobState.RUNNING
