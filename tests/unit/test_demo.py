"""`rcp demo`'s verdict: any failed request (or a job that did not succeed) is a non-zero exit
that says why. No cluster: the run itself is replaced by its result."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from controlplane import demo
from controlplane.cli import cli
from controlplane.demo import DemoResult, Traffic


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
    monkeypatch.setattr(demo, "run_demo", lambda cfg, keep, echo: result)
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
