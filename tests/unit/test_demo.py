"""`rcp demo`'s verdict: any failed request (or a job that did not succeed) is a non-zero exit
that says why. No cluster: the run itself is replaced by its result."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from controlplane import demo
from controlplane.cli import cli
from controlplane.demo import (
    DemoResult,
    StoredObject,
    Traffic,
    committed_steps,
    format_checkpoint_objects,
    list_checkpoint_objects,
)
from tests.unit.moto_s3 import client, moto_s3


@pytest.mark.parametrize(
    ("result", "failures"),
    [
        pytest.param(DemoResult(120, 0, "SUCCEEDED"), [], id="clean-run"),
        pytest.param(DemoResult(), [], id="serving-off-nothing-measured"),
        pytest.param(
            DemoResult(118, 2, "SUCCEEDED"), ["2 of 120 requests failed"], id="failed-requests"
        ),
        pytest.param(
            DemoResult(120, 0, "FAILED"),
            ["the training job ended FAILED, not SUCCEEDED"],
            id="job-failed",
        ),
        pytest.param(
            DemoResult(0, 5, "CANCELLED"),
            ["5 of 5 requests failed", "the training job ended CANCELLED, not SUCCEEDED"],
            id="both",
        ),
        pytest.param(
            DemoResult(120, 0, "SUCCEEDED", checkpoints_committed=0),
            ["the training job committed no checkpoint to object storage"],
            id="no-checkpoint",
        ),
        pytest.param(
            DemoResult(120, 0, "SUCCEEDED", checkpoints_committed=2), [], id="checkpointed"
        ),
    ],
)
def test_failures_name_each_miss(result: DemoResult, failures: list[str]) -> None:
    assert result.failures() == failures


@pytest.mark.parametrize(
    ("result", "exit_code", "says"),
    [
        pytest.param(DemoResult(50, 0, "SUCCEEDED"), 0, "demo passed", id="passes"),
        pytest.param(DemoResult(48, 2, "SUCCEEDED"), 1, "2 of 50 requests failed", id="fails"),
        pytest.param(DemoResult(50, 0, "FAILED"), 1, "ended FAILED", id="job-fails"),
    ],
)
def test_demo_exit_code_follows_the_result(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    result: DemoResult,
    exit_code: int,
    says: str,
) -> None:
    monkeypatch.setattr(demo, "run_demo", lambda cfg, keep, echo, timeline_path: result)
    out = CliRunner().invoke(cli, ["demo", f"state_dir={tmp_path}"])
    assert out.exit_code == exit_code, out.output
    assert says in out.output


def test_demo_help_describes_the_current_demo() -> None:
    text = CliRunner().invoke(cli, ["demo", "--help"]).output
    for step in ("traffic", "training job", "external", "make-before-break", "Exit status"):
        assert step in text
    assert "burst of work" not in text  # the demo before serving and training


class _Flaky(http.server.BaseHTTPRequestHandler):
    """Answers 200, except every third request, which gets a 503."""

    calls = 0

    def do_POST(self) -> None:
        type(self).calls += 1
        status = 503 if type(self).calls % 3 == 0 else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flaky_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_traffic_counts_every_non_200_as_failed(flaky_server: str) -> None:
    traffic = Traffic(flaky_server, "sample", threads=1).start()
    deadline = time.monotonic() + 10
    while sum(traffic.counts()) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    traffic.stop()
    served, failed = traffic.counts()
    assert failed >= 2 and served >= 4
    assert "503=" in traffic.summary()


# -- the checkpoint objects the job wrote ---------------------------------------------------

PREFIX = "s3://rcp-checkpoints/jobs/job-1/"


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    """The embedded store's stand-in: a real S3-protocol server on loopback, holding what a
    two-rank job leaves: step 4 committed, step 9 committed, step 14 cut off before its
    manifest, a preemption request, and a neighbouring job's step that must not show."""
    with moto_s3(["rcp-checkpoints"]) as url:
        s3 = client(url)
        objects = {
            "jobs/job-1/step-000000000004/rank-00000/shard-00000.bin": 3000,
            "jobs/job-1/step-000000000004/rank-00001/shard-00000.bin": 3000,
            "jobs/job-1/step-000000000004/rank-00000.index.json": 200,
            "jobs/job-1/step-000000000004/rank-00001.index.json": 200,
            "jobs/job-1/step-000000000004/manifest.json": 500,
            "jobs/job-1/step-000000000009/rank-00000/shard-00000.bin": 3000,
            "jobs/job-1/step-000000000009/rank-00000.index.json": 200,
            "jobs/job-1/step-000000000009/manifest.json": 500,
            "jobs/job-1/step-000000000014/rank-00000/shard-00000.bin": 1500,
            "jobs/job-1/PREEMPT": 0,
            "jobs/job-10/step-000000000004/manifest.json": 500,
        }
        for key, size in objects.items():
            s3.put_object(Bucket="rcp-checkpoints", Key=key, Body=b"x" * size)
        yield s3


def test_the_jobs_objects_are_listed_by_step_with_the_manifest_marked(s3: Any) -> None:
    objects, truncated = list_checkpoint_objects(s3, PREFIX)
    assert not truncated
    assert [o.key for o in objects][:2] == [
        "PREEMPT",
        "step-000000000004/manifest.json",
    ]
    assert not any("job-10" in o.key for o in objects)
    assert committed_steps(objects) == [4, 9]
    lines = format_checkpoint_objects(PREFIX, objects)
    assert lines[0] == f"{PREFIX}: 10 objects, 11.8 KiB"  # 12100 bytes
    steps = [line.strip() for line in lines if line.startswith("  step ")]
    assert steps == [
        "step 4: committed, 5 objects, 6.7 KiB",
        "step 9: committed, 3 objects, 3.6 KiB",
        "step 14: not committed (no manifest), 1 object, 1.5 KiB",
    ]
    manifests = [line for line in lines if "<- manifest" in line]
    assert [m.split()[0] for m in manifests] == [
        "step-000000000004/manifest.json",
        "step-000000000009/manifest.json",
    ]
    assert lines[-2] == "  outside any step:"
    assert lines[-1].split() == ["PREEMPT", "0", "B"]


def test_a_listing_is_bounded_and_says_so(s3: Any) -> None:
    objects, truncated = list_checkpoint_objects(s3, PREFIX, max_objects=3)
    assert len(objects) == 3 and truncated
    assert "more not listed (over 3)" in format_checkpoint_objects(PREFIX, objects, truncated)[0]


def test_an_empty_prefix_says_nothing_was_written(s3: Any) -> None:
    objects, truncated = list_checkpoint_objects(s3, "s3://rcp-checkpoints/jobs/job-2/")
    assert (objects, truncated) == ([], False)
    assert committed_steps(objects) == []
    assert format_checkpoint_objects("s3://rcp-checkpoints/jobs/job-2/", objects) == [
        "no checkpoint objects under s3://rcp-checkpoints/jobs/job-2/"
    ]


def test_committed_steps_need_a_manifest_in_the_step_dir() -> None:
    objects = [
        StoredObject("step-000000000001/rank-00000.index.json", 1),
        StoredObject("manifest.json", 1),
        StoredObject("step-000000000002/manifest.json", 1),
    ]
    assert committed_steps(objects) == [2]
