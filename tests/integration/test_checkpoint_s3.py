"""Checkpoint engine against a real S3 server on loopback (moto), through a fault proxy.

The fakes live here (and are imported by the other checkpoint integration tests):
`MotoS3` runs moto's S3 server on 127.0.0.1 at a free port; `FaultProxy` sits between the
engine and that server and fails, throttles, resets or truncates a seeded share of
requests. Under every fault mix, restore must return a committed checkpoint bit-exact,
the newest committed one whenever storage holds it intact, and never a partial one.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import socket
import subprocess
import sys
import textwrap
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch

from jobs.checkpoint import CheckpointEngine, RetryPolicy
from jobs.checkpoint.layout import index_key, manifest_key, shard_key
from tests.integration.conftest import REGION, MotoS3
from tests.unit.jobs.test_checkpoint_engine import assert_state_equal, make_state

pytestmark = pytest.mark.integration

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class FaultRates:
    """Share of requests that get each fault (the rest pass through untouched)."""

    fail: float = 0.0
    """Answer 500 InternalError without forwarding."""
    throttle: float = 0.0
    """Answer 503 SlowDown without forwarding."""
    reset_before: float = 0.0
    """Close the connection without forwarding (the request never happened)."""
    reset_after: float = 0.0
    """Forward, then close without answering (the request happened; the client can't know)."""
    truncate: float = 0.0
    """Forward, then send the headers and only half the body, then close."""


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "content-length"}


class FaultProxy:
    """A loopback HTTP proxy in front of an S3 endpoint that injects seeded faults."""

    def __init__(self, upstream_url: str, rates: FaultRates, *, seed: int = 0) -> None:
        self.rates = rates
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts: dict[str, int] = {}
        host, port = upstream_url.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: Any) -> None:
                pass

            def do_GET(self) -> None:
                proxy.handle(self)

            do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint_url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def pick(self) -> str:
        with self.lock:
            draw = self.rng.random()
            fault = "pass"
            for name in ("fail", "throttle", "reset_before", "reset_after", "truncate"):
                share = getattr(self.rates, name)
                if draw < share:
                    fault = name
                    break
                draw -= share
            self.counts[fault] = self.counts.get(fault, 0) + 1
            return fault

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = request.rfile.read(length) if length else b""
        fault = self.pick()
        if fault in ("fail", "throttle"):
            code, status = ("InternalError", 500) if fault == "fail" else ("SlowDown", 503)
            payload = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
            request.send_response(status)
            request.send_header("Content-Type", "application/xml")
            request.send_header("Content-Length", str(len(payload)))
            request.end_headers()
            request.wfile.write(payload)
            return
        if fault == "reset_before":
            self._reset(request)
            return
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        conn.request(request.command, request.path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        if fault == "reset_after":
            self._reset(request)
            return
        request.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in _HOP_BY_HOP:
                request.send_header(key, value)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if request.command == "HEAD":
            return
        if fault == "truncate" and len(data) > 1:
            request.wfile.write(data[: len(data) // 2])
            request.wfile.flush()
            self._reset(request)
            return
        request.wfile.write(data)

    @staticmethod
    def _reset(request: BaseHTTPRequestHandler) -> None:
        request.close_connection = True
        with contextlib.suppress(OSError):
            request.connection.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[MotoS3]:
    server = MotoS3()
    yield server
    server.stop()


_bucket_counter = iter(range(1_000_000))


@pytest.fixture
def bucket(moto_s3: MotoS3) -> str:
    return moto_s3.create_bucket(f"ckpt-{next(_bucket_counter)}")


FAST_RETRY = RetryPolicy(max_attempts=10, base_delay_s=0.001, max_delay_s=0.02)


def s3_engine(endpoint_url: str, bucket: str, **kwargs: Any) -> CheckpointEngine:
    kwargs.setdefault("shard_size_bytes", 6 * 1024 * 1024)
    kwargs.setdefault("part_size_bytes", 5 * 1024 * 1024)
    kwargs.setdefault("max_concurrency", 4)
    kwargs.setdefault("retry", FAST_RETRY)
    return CheckpointEngine(
        f"s3://{bucket}/run", endpoint_url=endpoint_url, region=REGION, **kwargs
    )


def big_state(seed: int) -> dict[str, Any]:
    """~8.5 MiB: two shards, the first a 2-part multipart upload."""
    state = make_state(seed)
    state["model"]["big"] = torch.randn(
        (8 * 1024 * 1024 + 4096) // 4, generator=torch.Generator().manual_seed(seed)
    )
    return state


def test_round_trip_through_multipart_upload(moto_s3: MotoS3, bucket: str) -> None:
    with s3_engine(moto_s3.endpoint_url, bucket) as engine:
        handle = engine.save(big_state(1), 1)
        assert handle is not None
        outcome = handle.result(60)
    assert outcome.committed and outcome.payload_bytes > 8 * 1024 * 1024
    keys = [o["Key"] for o in moto_s3.client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert f"run/{shard_key(1, 0, 1)}" in keys and f"run/{manifest_key(1)}" in keys
    restored = s3_engine(moto_s3.endpoint_url, bucket).restore()
    assert restored is not None and restored.step == 1
    assert_state_equal(restored.state, big_state(1))


# name: (fault shares, attempts per storage call). The "heavy" mixes outrun the retry
# budget on purpose, so some saves fail halfway and leave partial data behind.
FAULT_MIXES: dict[str, tuple[FaultRates, int]] = {
    "fail-500": (FaultRates(fail=0.25), 4),
    "throttle-503": (FaultRates(throttle=0.3), 4),
    "reset-before": (FaultRates(reset_before=0.2), 4),
    "reset-after": (FaultRates(reset_after=0.2), 4),
    "truncate": (FaultRates(truncate=0.25), 4),
    "everything": (
        FaultRates(fail=0.08, throttle=0.08, reset_before=0.06, reset_after=0.06, truncate=0.08),
        4,
    ),
    "everything-heavy": (
        FaultRates(fail=0.1, throttle=0.1, reset_before=0.1, reset_after=0.1, truncate=0.1),
        2,
    ),
    "reset-after-heavy": (FaultRates(reset_after=0.4), 2),
}


@pytest.mark.parametrize("mix", list(FAULT_MIXES), ids=list(FAULT_MIXES))
def test_restore_under_faults_is_committed_and_bit_exact(
    moto_s3: MotoS3, bucket: str, mix: str
) -> None:
    rates, attempts = FAULT_MIXES[mix]
    proxy = FaultProxy(moto_s3.endpoint_url, rates, seed=zlib.crc32(mix.encode()))
    try:
        engine = s3_engine(
            proxy.endpoint_url, bucket, retry=RetryPolicy(attempts, 0.001, 0.01), keep_last=10
        )
        succeeded = []
        for step in range(1, 7):
            handle = engine.save(big_state(step) if step % 3 == 0 else make_state(step), step)
            assert handle is not None
            try:
                handle.result(120)
                succeeded.append(step)
            except Exception:  # noqa: BLE001 - a failed save is allowed; a bad restore is not
                pass
        engine.close()
        print(f"{mix}: faults {proxy.counts}, saves that succeeded {succeeded}")
        injected = sum(n for fault, n in proxy.counts.items() if fault != "pass")
        assert injected > 0, f"the proxy injected no faults: {proxy.counts}"

        committed = {
            int(o["Key"].split("/")[1].removeprefix("step-"))
            for o in moto_s3.client.list_objects_v2(Bucket=bucket).get("Contents", [])
            if o["Key"].endswith("/manifest.json")
        }
        assert set(succeeded) <= committed
        if mix.endswith("-heavy"):
            assert len(succeeded) < 6, "the heavy mix was meant to make some saves fail"

        for endpoint in (proxy.endpoint_url, moto_s3.endpoint_url):
            restored = s3_engine(endpoint, bucket).restore()
            if not committed:
                assert restored is None
                continue
            assert restored is not None and restored.step in committed
            expected = big_state(restored.step) if restored.step % 3 == 0 else None
            assert_state_equal(restored.state, expected or make_state(restored.step))
            if endpoint == moto_s3.endpoint_url:
                # Data went up with retries until acknowledged, so the newest commit is intact.
                assert restored.step == max(committed)
    finally:
        proxy.stop()


def _flip_a_bit(data: bytes) -> bytes | None:
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0x01
    return bytes(flipped)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(_flip_a_bit, id="bit-flip"),
        pytest.param(lambda data: data[: 1024 * 1024], id="truncated-object"),
        pytest.param(lambda data: b"", id="empty-object"),
        pytest.param(lambda data: None, id="deleted-object"),
    ],
)
def test_restore_skips_a_newest_checkpoint_damaged_in_storage(
    moto_s3: MotoS3, bucket: str, damage: Any
) -> None:
    with s3_engine(moto_s3.endpoint_url, bucket) as engine:
        engine.save(make_state(1), 1)
        engine.save(big_state(2), 2)
    key = f"run/{shard_key(2, 0, 0)}"
    damaged = damage(moto_s3.client.get_object(Bucket=bucket, Key=key)["Body"].read())
    if damaged is None:
        moto_s3.client.delete_object(Bucket=bucket, Key=key)
    else:
        moto_s3.client.put_object(Bucket=bucket, Key=key, Body=damaged)
    restored = s3_engine(moto_s3.endpoint_url, bucket).restore()
    assert restored is not None and restored.step == 1
    assert_state_equal(restored.state, make_state(1))


CRASH_SCRIPT = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {root!r})
    from jobs.checkpoint import CheckpointEngine
    from tests.unit.jobs.test_checkpoint_engine import make_state

    def die(step):
        if step == 2:
            os._exit(17)  # the process dies after the data is durable, before the manifest

    engine = CheckpointEngine("s3://{bucket}/run", endpoint_url={endpoint!r},
                              region="us-east-1", before_commit=die)
    engine.save(make_state(1), 1)
    engine.save(make_state(2), 2)
    engine.wait()
    """
)


def test_crash_between_data_and_manifest_leaves_nothing_restore_picks(
    moto_s3: MotoS3, bucket: str
) -> None:
    script = CRASH_SCRIPT.format(root=str(REPO_ROOT), bucket=bucket, endpoint=moto_s3.endpoint_url)
    result = subprocess.run(
        [sys.executable, "-c", script], env=dict(os.environ), capture_output=True, timeout=120
    )
    assert result.returncode == 17, result.stderr.decode()[-2000:]
    keys = {o["Key"] for o in moto_s3.client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert f"run/{index_key(2, 0)}" in keys  # step 2's data made it ...
    assert f"run/{manifest_key(2)}" not in keys  # ... its commit did not
    engine = s3_engine(moto_s3.endpoint_url, bucket)
    restored = engine.restore()
    assert restored is not None and restored.step == 1
    assert_state_equal(restored.state, make_state(1))
    # The next commit's retention removes the orphaned step 2 data.
    engine.save(make_state(3), 3)
    engine.close()
    keys = {o["Key"] for o in moto_s3.client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert not any(k.startswith("run/step-000000000002/") for k in keys)


def test_retention_aborts_abandoned_multipart_uploads(moto_s3: MotoS3, bucket: str) -> None:
    stale = moto_s3.client.create_multipart_upload(Bucket=bucket, Key=f"run/{shard_key(1, 0, 0)}")
    with s3_engine(moto_s3.endpoint_url, bucket, keep_last=1) as engine:
        engine.save(make_state(2), 2)
        engine.save(make_state(3), 3)
    uploads = moto_s3.client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert stale["UploadId"] not in {u["UploadId"] for u in uploads}
    assert engine.committed_steps() == [3]
