"""The job API against an in-process server with a temp store: auth, bad input, idempotency,
cancel, listing, and a hypothesis fuzz of the submit body. No Ray.

Every request goes over real HTTP on loopback (`ApiServer` on port 0), through the SDK or raw
urllib, so the JSON error shape and the status codes are what a client really sees.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.api.jobs import MAX_LOG_CHUNK_BYTES, JobService
from controlplane.api.routes import LOG_RETRY_AFTER_S, MAX_CONCURRENT_LOG_READS, ApiServer
from controlplane.config import Config, load_config
from controlplane.sdk import (
    AuthError,
    Client,
    ConflictError,
    JobNotFound,
    NotConfigured,
    SpecRejected,
)
from controlplane.store import JobState, Store
from controlplane.tokens import ensure_token
from jobs.spec import JobSpec
from tests.unit.moto_s3 import moto_s3

TOKEN = "test-token-123"


def whole_log(logs: Callable[[Any], str]) -> Callable[[Any, int, int], tuple[str, int]]:
    """A `JobService` log window over a function that returns a job's whole log."""

    def window(job: Any, offset: int, limit: int) -> tuple[str, int]:
        text = logs(job)
        return text[offset : offset + limit], len(text)

    return window


class Server:
    def __init__(self, tmp: Path) -> None:
        # No rate limit to speak of: the fuzz tests send hundreds of requests a second.
        self.cfg: Config = load_config(None, [f"state_dir={tmp}", "api.rate_burst=100000"])
        self.store = Store(tmp / "controlplane.db")
        self.service = JobService(
            self.store, self.cfg, log_window=whole_log(lambda job: "line 1\nline 2\n")
        )
        self.server = ApiServer(self.service, TOKEN, "127.0.0.1", 0).start()
        self.url = self.server.url
        self.client = Client(self.url, TOKEN)

    def raw(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        token: str | None = TOKEN,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        req = urllib.request.Request(self.url + path, data=body, method=method)
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def num_jobs(self) -> int:
        return len(self.store.list_jobs())

    def close(self) -> None:
        self.server.stop()
        self.store.close()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("api"))
    yield s
    s.close()


def spec(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "t", "entrypoint": "python train.py", "num_workers": 2}
    base.update(over)
    return base


# -- auth -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token, message",
    [(None, "missing token"), ("nope", "wrong token"), ("", "missing token")],
    ids=["no-header", "wrong", "empty"],
)
def test_requests_without_the_right_token_are_401_and_queue_nothing(
    srv: Server, token: str | None, message: str
) -> None:
    before = srv.num_jobs()
    status, body = srv.raw("POST", "/v1/jobs", json.dumps(spec()).encode(), token=token)
    assert status == 401
    assert message in body["error"] and body["field"] == "Authorization"
    assert srv.num_jobs() == before
    status, _ = srv.raw("GET", "/v1/jobs", token=token)
    assert status == 401


def test_sdk_raises_auth_error_with_the_server_message(srv: Server) -> None:
    with pytest.raises(AuthError, match="wrong token"):
        Client(srv.url, "bad").list()


def test_healthz_needs_no_token(srv: Server) -> None:
    assert srv.raw("GET", "/healthz", token=None) == (200, {"ok": True})


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, field",
    [
        (spec(num_workers=0), "num_workers"),
        (spec(num_workers=-3), "num_workers"),
        (spec(priority_class="urgent"), "priority_class"),
        (spec(queue="nobody"), "queue"),
        (spec(num_workers=9, gpus_per_worker=1), "num_workers"),
        (spec(num_workers=1, gpus_per_worker=5), "gpus_per_worker"),
        ({"name": "t", "num_workers": 1}, "entrypoint"),
        (spec(num_wrkers=2), "num_wrkers"),
        (spec(num_workers="two"), "num_workers"),
        ([1, 2, 3], "<spec>"),
    ],
    ids=[
        "zero-workers",
        "negative-workers",
        "unknown-priority",
        "unknown-queue",
        "more-gpus-than-pool",
        "worker-bigger-than-node",
        "missing-entrypoint",
        "typo-field",
        "wrong-type",
        "not-an-object",
    ],
)
def test_invalid_specs_are_400_naming_the_field_and_queue_nothing(
    srv: Server, body: Any, field: str
) -> None:
    before = srv.num_jobs()
    status, resp = srv.raw("POST", "/v1/jobs", json.dumps(body).encode())
    assert status == 400, resp
    assert resp["field"] == field
    assert field in resp["error"]
    assert srv.num_jobs() == before


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real S3-protocol server (moto) on loopback with the cluster's bucket and a team's."""
    with moto_s3(("rcp-checkpoints", "team-a-ckpt")) as url:
        yield url


@pytest.mark.parametrize(
    ("uri", "accepted", "says"),
    [
        pytest.param("s3://rcp-checkpoints/team-a/run-7", True, "", id="the-cluster-bucket"),
        pytest.param("s3://team-a-ckpt/llama/run-7", True, "", id="a-team-bucket"),
        pytest.param("s3://no-such-bucket/x", False, "does not exist", id="missing-bucket"),
        pytest.param(
            "s3://rcp-checkpoints/jobs/j-123", False, "each job's own", id="another-jobs-prefix"
        ),
        pytest.param("s3://rcp-checkpoints/jobs", False, "each job's own", id="the-jobs-area"),
        pytest.param("file:///var/lib/rcp/ckpt", False, "file://", id="file-uri"),
        pytest.param("gs://bucket/ckpt", False, "gs:// is not supported", id="unknown-scheme"),
    ],
)
def test_checkpoint_uri_is_checked_at_submission(
    tmp_path_factory: pytest.TempPathFactory, s3_server: str, uri: str, accepted: bool, says: str
) -> None:
    tmp = tmp_path_factory.mktemp("api-s3")
    s = Server(tmp)
    try:
        s.service.cfg.storage.endpoint_url = s3_server
        status, resp = s.raw("POST", "/v1/jobs", json.dumps(spec(checkpoint={"uri": uri})).encode())
        if accepted:
            assert status == 201, resp
            return
        assert status == 400, resp
        assert resp["field"] == "checkpoint.uri"
        assert says in resp["error"]
        assert s.num_jobs() == 0
    finally:
        s.close()


def test_unreachable_storage_is_503_not_a_spec_error(tmp_path: Path) -> None:
    s = Server(tmp_path)
    try:
        s.service.cfg.storage.endpoint_url = "http://127.0.0.1:9"  # discard: nothing listens
        status, resp = s.raw(
            "POST", "/v1/jobs", json.dumps(spec(checkpoint={"uri": "s3://b/x"})).encode()
        )
        assert status == 503, resp
        assert resp["field"] == "checkpoint.uri"
        assert s.num_jobs() == 0
    finally:
        s.close()


@pytest.mark.parametrize(
    "raw", [b"{not json", b"", b"\xff\xfe", b"null"], ids=["broken", "empty", "binary", "null"]
)
def test_malformed_bodies_are_400(srv: Server, raw: bytes) -> None:
    before = srv.num_jobs()
    status, resp = srv.raw("POST", "/v1/jobs", raw)
    assert status == 400
    assert resp["error"] and "field" in resp
    assert srv.num_jobs() == before


def test_sdk_raises_spec_rejected_with_the_field(srv: Server) -> None:
    with pytest.raises(SpecRejected) as info:
        srv.client.submit(spec(priority_class="urgent"))
    assert info.value.field == "priority_class"
    assert "unknown priority class 'urgent'" in info.value.message


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/v1/jobs/job-nope"),
        ("POST", "/v1/jobs/job-nope/cancel"),
        ("GET", "/v1/jobs/job-nope/logs"),
        ("GET", "/v1/no-such-route"),
    ],
    ids=["status", "cancel", "logs", "route"],
)
def test_unknown_ids_and_routes_are_404(srv: Server, method: str, path: str) -> None:
    status, body = srv.raw(method, path)
    assert status == 404
    assert "error" in body


def test_bad_query_parameters_are_400_naming_them(srv: Server) -> None:
    assert srv.raw("GET", "/v1/jobs?state=SLEEPING")[1]["field"] == "state"
    assert srv.raw("GET", "/v1/jobs?limit=x")[1]["field"] == "limit"
    assert srv.raw("GET", "/v1/events?after=-1")[1]["field"] == "after"


# -- the happy paths --------------------------------------------------------------------------


def test_submit_status_list_cancel_round_trip(srv: Server) -> None:
    job = srv.client.submit(spec(name="roundtrip", priority_class="high"))
    assert job.state == "QUEUED" and job.priority_class == "high"
    assert srv.store.get(job.id).state is JobState.QUEUED
    got = srv.client.status(job.id)
    assert got.id == job.id and got.history[0]["to"] == "QUEUED"
    assert job.id in [j.id for j in srv.client.list(state="QUEUED")]
    cancelled = srv.client.cancel(job.id)
    assert cancelled.state == "CANCELLED"
    with pytest.raises(ConflictError, match="already CANCELLED"):
        srv.client.cancel(job.id)
    kinds = [e["kind"] for e in srv.client.events(job_id=job.id)]
    assert kinds.count("job.state") == 2


def test_missing_priority_class_gets_the_configured_default(srv: Server) -> None:
    body = spec(name="defaulted")
    body.pop("priority_class", None)
    job = srv.client.submit(body)
    assert job.priority_class == srv.cfg.jobs.default_priority_class


def test_idempotency_key_returns_the_same_job_and_conflicts_on_another_spec(srv: Server) -> None:
    first = srv.client.submit(spec(name="idem"), idempotency_key="k-1")
    before = srv.num_jobs()
    again = srv.client.submit(spec(name="idem"), idempotency_key="k-1")
    assert again.id == first.id and srv.num_jobs() == before
    with pytest.raises(ConflictError) as info:
        srv.client.submit(spec(name="other"), idempotency_key="k-1")
    assert info.value.field == "Idempotency-Key"
    assert srv.num_jobs() == before


def test_logs_come_through(srv: Server) -> None:
    job = srv.client.submit(spec(name="logs"))
    srv.store.update_info(job.id, {"submission_id": f"{job.id}-1"})
    assert srv.client.logs(job.id) == "line 1\nline 2\n"
    status, body = srv.raw("GET", f"/v1/jobs/{job.id}/logs?offset=7")
    assert status == 200 and body["logs"] == "line 2\n" and body["next_offset"] == 14


def test_unknown_job_raises_job_not_found(srv: Server) -> None:
    with pytest.raises(JobNotFound, match="no job with id"):
        srv.client.status("job-missing")


# -- fuzz -------------------------------------------------------------------------------------

_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-10, 100)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_fields = st.sampled_from(
    [
        "name",
        "entrypoint",
        "num_workers",
        "gpus_per_worker",
        "cpus_per_worker",
        "queue",
        "priority_class",
        "max_runtime_s",
        "checkpoint",
        "runtime_env",
        "bogus",
    ]
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=st.dictionaries(_fields, _values, max_size=6) | _values)
def test_fuzzed_submit_bodies_never_crash_the_server(srv: Server, body: Any) -> None:
    before = srv.num_jobs()
    status, resp = srv.raw("POST", "/v1/jobs", json.dumps(body).encode())
    assert status in (200, 201, 400), resp
    if status == 400:
        assert isinstance(resp["error"], str) and resp["error"]
        assert srv.num_jobs() == before
    else:
        assert srv.store.get(resp["id"]).state is JobState.QUEUED
    assert srv.raw("GET", "/healthz", token=None)[0] == 200


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=st.binary(max_size=64))
def test_fuzzed_raw_bytes_are_rejected_cleanly(srv: Server, raw: bytes) -> None:
    status, resp = srv.raw("POST", "/v1/jobs", raw)
    assert status in (200, 201, 400)
    assert srv.raw("GET", "/healthz", token=None)[0] == 200


# -- token and client discovery -----------------------------------------------------------------


def test_token_file_is_created_once_with_mode_0600(tmp_path: Path) -> None:
    token = ensure_token(tmp_path)
    path = tmp_path / "api-token"
    assert path.stat().st_mode & 0o777 == 0o600
    assert ensure_token(tmp_path) == token == path.read_text().strip()


def test_client_finds_url_and_token_in_the_state_dir(
    srv: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RCP_API_URL", raising=False)
    monkeypatch.delenv("RCP_API_TOKEN", raising=False)
    (tmp_path / "api-url").write_text(srv.url + "\n")
    (tmp_path / "api-token").write_text(TOKEN + "\n")
    assert Client(state_dir=tmp_path).healthy()
    assert isinstance(Client(state_dir=tmp_path).list(), list)
    with pytest.raises(NotConfigured, match="no control-plane API URL"):
        Client(state_dir=tmp_path / "empty")


def test_logs_follow_yields_until_the_job_ends(srv: Server) -> None:
    job = srv.client.submit(spec(name="follow"))
    srv.store.update_info(job.id, {"submission_id": f"{job.id}-1"})
    srv.client.cancel(job.id)
    chunks = list(srv.client.logs(job.id, follow=True, poll_s=0.01))
    assert "".join(chunks) == "line 1\nline 2\n"


def make_invalid(store: Store, job_id: str) -> None:
    """Rewrite a stored spec the way an older, laxer validation might have let it in."""
    raw = sqlite3.connect(store.path)
    raw.execute(
        "UPDATE jobs SET spec_json = ? WHERE job_id = ?",
        ('{"name": "x", "entrypoint": "e", "num_workers": 0}', job_id),
    )
    raw.commit()
    raw.close()


def test_rows_that_no_longer_validate_are_listed_apart_never_fatal(tmp_path: Path) -> None:
    s = Server(tmp_path)
    try:
        good = s.client.submit(spec(name="good"))
        bad = s.client.submit(spec(name="bad"))
        make_invalid(s.store, bad.id)
        status, body = s.raw("GET", "/v1/jobs")
        assert status == 200 and [j["id"] for j in body["jobs"]] == [good.id]
        assert [(r["id"], r["state"]) for r in body["invalid"]] == [(bad.id, "QUEUED")]
        assert "num_workers" in body["invalid"][0]["error"]
        status, body = s.raw("GET", f"/v1/jobs/{bad.id}")
        assert status == 422 and bad.id in body["error"]
        listed = s.client.list()
        assert [j.id for j in listed] == [good.id] and [r["id"] for r in listed.invalid] == [bad.id]
    finally:
        s.close()


def test_log_reads_are_bounded_chunks_from_an_offset(tmp_path: Path) -> None:
    big = "".join(f"line {i}\n" for i in range(250_000))  # about 3 MiB
    assert len(big) > 2 * MAX_LOG_CHUNK_BYTES
    fetches: list[int] = []

    def logs(_job: Any) -> str:
        fetches.append(1)
        return big

    store = Store(tmp_path / "db.sqlite")
    service = JobService(
        store, load_config(None, [f"state_dir={tmp_path}"]), log_window=whole_log(logs)
    )
    job_id = store.submit(JobSpec.from_dict(spec(name="big"))).job.job_id
    store.update_info(job_id, {"submission_id": f"{job_id}-1"})
    first = service.logs(job_id)
    assert len(first["logs"]) == MAX_LOG_CHUNK_BYTES == first["next_offset"]
    assert first["size"] == len(big) and not first["done"]
    assert service.logs(job_id, "5", "10")["logs"] == big[5:15]
    assert service.logs(job_id, str(len(big) + 9))["next_offset"] == len(big) + 9
    server = ApiServer(service, TOKEN, "127.0.0.1", 0).start()
    try:
        client = Client(server.url, TOKEN)
        assert client.logs(job_id) == big  # read on from next_offset, chunk by chunk
        store.transition(job_id, JobState.CANCELLED, "user")
        fetches.clear()
        assert "".join(client.logs(job_id, follow=True, poll_s=0.01)) == big
        assert len(fetches) == 3  # one request per chunk, none repeated after the end
    finally:
        server.stop()
        store.close()


# -- untrusted bodies and error bodies (issue 12) -----------------------------------------------


def raw_with_headers(
    srv: Server, method: str, path: str, body: bytes | None = None, token: str | None = TOKEN
) -> tuple[int, dict[str, str], Any]:
    req = urllib.request.Request(srv.url + path, data=body, method=method)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def _spec_with(raw_value: bytes) -> bytes:
    return b'{"name": "n", "entrypoint": "python t.py", "gpus_per_worker": 0, "x": ' + (
        raw_value + b"}"
    )


@pytest.mark.parametrize(
    ("raw", "hint"),
    [
        pytest.param(_spec_with(b"NaN"), "NaN is not a JSON number", id="nan"),
        pytest.param(_spec_with(b"-Infinity"), "-Infinity", id="neg-infinity"),
        pytest.param(
            b'{"name": "n", "entrypoint": "e", "max_runtime_s": 1e999}', "overflows", id="1e999"
        ),
        pytest.param(_spec_with(b"[" * 65 + b"]" * 65), "deeper than 64", id="too-deep"),
        pytest.param(b"[" * 100_000, "deeper than 64", id="recursion-bomb"),
        pytest.param(_spec_with(b"9" * 5000), "4300 digits", id="huge-int"),
    ],
)
def test_hostile_bodies_are_400_never_500(srv: Server, raw: bytes, hint: str) -> None:
    before = srv.num_jobs()
    status, headers, resp = raw_with_headers(srv, "POST", "/v1/jobs", raw)
    assert status == 400, resp
    assert hint in resp["error"] and resp["field"] == "<body>"
    assert resp["request_id"] == headers["X-Request-Id"]
    assert srv.num_jobs() == before


def test_a_body_over_the_limit_is_413(srv: Server) -> None:
    limit = srv.cfg.api.max_body_bytes
    status, headers, resp = raw_with_headers(srv, "POST", "/v1/jobs", b" " * (limit + 1))
    assert status == 413
    assert str(limit) in resp["error"] and resp["request_id"] == headers["X-Request-Id"]


def test_every_response_carries_a_request_id(srv: Server) -> None:
    ok = raw_with_headers(srv, "GET", "/v1/jobs")
    unauth = raw_with_headers(srv, "GET", "/v1/jobs", token="nope")
    missing = raw_with_headers(srv, "GET", "/v1/jobs/job-nope")
    assert ok[0] == 200 and ok[1]["X-Request-Id"]
    for status, headers, body in (unauth, missing):
        assert status in (401, 404)
        assert body["request_id"] == headers["X-Request-Id"]
    assert len({ok[1]["X-Request-Id"], unauth[1]["X-Request-Id"], missing[1]["X-Request-Id"]}) == 3


def test_a_failing_handler_answers_500_with_an_id_and_no_exception_text(
    srv: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("db password is hunter2")

    monkeypatch.setattr(srv.service, "get", broken)
    with caplog.at_level("ERROR", logger="controlplane.api.routes"):
        status, headers, resp = raw_with_headers(srv, "GET", "/v1/jobs/job-x")
    assert status == 500
    assert "hunter2" not in json.dumps(resp) and "RuntimeError" not in json.dumps(resp)
    rid = headers["X-Request-Id"]
    assert resp["request_id"] == rid
    assert any(rid in r.getMessage() and r.exc_info for r in caplog.records)
    assert srv.raw("GET", "/healthz", token=None)[0] == 200


# -- headers and query parameters of any bytes (issue 12) ----------------------------------------


@pytest.mark.parametrize(
    "token",
    ["é", "\xff\xfe", "é" * 300],
    ids=["latin1-e-acute", "invalid-utf8", "long-non-ascii"],
)
def test_a_non_ascii_bearer_token_is_a_json_401_with_a_request_id(srv: Server, token: str) -> None:
    # http.client sends header text as latin-1 bytes: "é" arrives as the lone byte 0xE9.
    for method, path in [("GET", "/v1/jobs"), ("POST", "/v1/jobs/job-x/cancel")]:
        status, body = srv.raw(method, path, token=token)
        assert status == 401, body
        assert body["error"] == "wrong token" and body["field"] == "Authorization"
        assert body["request_id"]


def test_a_non_utf8_idempotency_key_is_400_and_queues_nothing(srv: Server) -> None:
    before = srv.num_jobs()
    status, body = srv.raw(
        "POST", "/v1/jobs", json.dumps(spec()).encode(), headers={"Idempotency-Key": "k\xe9\xff"}
    )
    assert status == 400 and body["field"] == "Idempotency-Key" and body["request_id"]
    assert srv.num_jobs() == before


@pytest.mark.parametrize(
    "query, field",
    [
        ("offset=abc", "offset"),
        ("offset=-1", "offset"),
        ("offset=1.5", "offset"),
        ("offset=" + "9" * 5000, "offset"),
        ("offset=99999999999999999999999999", "offset"),
        ("offset=1_000", "offset"),
        ("offset=%D9%A1", "offset"),  # ARABIC-INDIC DIGIT ONE: int() would take it
        ("offset=%201", "offset"),
        ("limit=0", "limit"),
        ("limit=-5", "limit"),
        ("limit=" + "1" * 40, "limit"),
        ("limit=%FF", "limit"),
        ("limit=", "limit"),
    ],
    ids=lambda v: v[:24] if isinstance(v, str) else v,
)
def test_bad_log_offsets_and_limits_are_400_naming_them(
    srv: Server, query: str, field: str
) -> None:
    job = srv.client.submit(spec(name="logs"))
    srv.store.update_info(job.id, {"submission_id": f"{job.id}-1"})
    status, body = srv.raw("GET", f"/v1/jobs/{job.id}/logs?{query}")
    assert status == 400, body
    assert body["field"] == field and body["request_id"]
    assert len(body["error"]) < 200  # a 5000-digit value is not echoed back whole


@pytest.mark.parametrize(
    "path, field",
    [
        ("/v1/jobs?limit=1e3", "limit"),
        ("/v1/jobs?limit=" + "9" * 5000, "limit"),
        ("/v1/events?after=-1", "after"),
        ("/v1/events?after=%FF", "after"),
        ("/v1/events?limit=99999999999999999999", "limit"),
        ("/v1/jobs?state=%FF", "state"),
    ],
    ids=lambda v: v[:30] if isinstance(v, str) else v,
)
def test_bad_listing_parameters_are_400_naming_them(srv: Server, path: str, field: str) -> None:
    status, body = srv.raw("GET", path)
    assert status == 400, body
    assert body["field"] == field and body["request_id"]


def test_log_reads_over_the_cap_are_429_with_retry_after(tmp_path: Path) -> None:
    release = threading.Event()
    started: list[int] = []

    def slow_logs(_job: Any) -> str:
        started.append(1)
        release.wait(10)
        return "log\n"

    store = Store(tmp_path / "db.sqlite")
    service = JobService(
        store, load_config(None, [f"state_dir={tmp_path}"]), log_window=whole_log(slow_logs)
    )
    job_id = store.submit(JobSpec.from_dict(spec(name="logs"))).job.job_id
    store.update_info(job_id, {"submission_id": f"{job_id}-1"})
    server = ApiServer(service, TOKEN, "127.0.0.1", 0).start()
    results: list[int] = []

    def read() -> None:
        req = urllib.request.Request(f"{server.url}/v1/jobs/{job_id}/logs")
        req.add_header("Authorization", f"Bearer {TOKEN}")
        with urllib.request.urlopen(req, timeout=20) as resp:
            results.append(resp.status)

    try:
        readers = [threading.Thread(target=read) for _ in range(MAX_CONCURRENT_LOG_READS)]
        for t in readers:
            t.start()
        deadline = time.monotonic() + 10
        while len(started) < MAX_CONCURRENT_LOG_READS and time.monotonic() < deadline:
            time.sleep(0.01)
        req = urllib.request.Request(f"{server.url}/v1/jobs/{job_id}/logs")
        req.add_header("Authorization", f"Bearer {TOKEN}")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        assert info.value.code == 429
        assert info.value.headers["Retry-After"] == str(LOG_RETRY_AFTER_S)
        body = json.loads(info.value.read())
        assert "too many log reads" in body["error"] and body["request_id"]
        release.set()
        for t in readers:
            t.join(10)
        assert results == [200] * MAX_CONCURRENT_LOG_READS
        assert len(started) == MAX_CONCURRENT_LOG_READS  # the refused read fetched nothing
    finally:
        release.set()
        server.stop()
        store.close()


def test_a_row_that_no_longer_validates_can_be_cancelled_by_id(tmp_path: Path) -> None:
    s = Server(tmp_path)
    try:
        bad = s.client.submit(spec(name="bad"))
        make_invalid(s.store, bad.id)
        cancelled = s.client.cancel(bad.id)  # the SDK reads the view of an invalid row too
        assert cancelled.state == "CANCELLED" and cancelled.raw["invalid"] is True
        status, body = s.raw("POST", f"/v1/jobs/{bad.id}/cancel")
        assert status == 409 and "already CANCELLED" in body["error"]
    finally:
        s.close()


def test_listing_is_paged_by_default_and_the_sdk_follows_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from controlplane.api import jobs as queueing
    from controlplane.sdk import client as sdk_client

    monkeypatch.setattr(queueing, "DEFAULT_LIST_LIMIT", 4)
    monkeypatch.setattr(sdk_client, "LIST_PAGE", 3)
    s = Server(tmp_path)
    try:
        ids = [s.client.submit(spec(name=f"p{i}")).id for i in range(10)]
        code, body = s.raw("GET", "/v1/jobs")  # no limit: one bounded page, and a cursor
        assert code == 200 and len(body["jobs"]) == 4 and body["next"]
        code, rest = s.raw("GET", "/v1/jobs?limit=100&after=" + urllib.parse.quote(body["next"]))
        assert code == 200 and rest["next"] is None
        assert [j["id"] for j in body["jobs"] + rest["jobs"]] == ids
        assert [j.id for j in s.client.list()] == ids  # 4 pages of 3
        assert [j.id for j in s.client.list(limit=5)] == ids[:5]
        code, bad = s.raw("GET", "/v1/jobs?after=garbage")
        assert code == 400 and bad["field"] == "after"
    finally:
        s.close()
