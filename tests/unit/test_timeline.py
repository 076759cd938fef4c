"""`rcp timeline`: the series it plots (pure, from events and range results), reading
Prometheus (a fake one on loopback), and the command over the API (an in-process server)."""

from __future__ import annotations

import http.server
import json
import shutil
import socket
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from controlplane.cli.timeline import parse_since
from controlplane.timeline.collect import EVENTS_PAGE, TimelineInputs, collect, read_events
from controlplane.timeline.draw import PNG_SIGNATURE
from controlplane.timeline.metrics import MetricsUnavailable, read_metrics, step_for
from controlplane.timeline.series import QUERIES, Series, build_timeline
from tests.unit.api.test_api_server import Server
from tests.unit.cli.test_api_cli import rcp

DATA = Path(__file__).parent / "data"


def event(
    at_s: float, kind: str, data: Mapping[str, Any] | None = None, seq: int = 1
) -> dict[str, Any]:
    return {
        "seq": seq,
        "at_s": at_s,
        "kind": kind,
        "message": f"{kind} at {at_s}",
        "data": dict(data or {}),
    }


def matrix(labels: Mapping[str, str], *points: tuple[float, float]) -> dict[str, Any]:
    return {"metric": dict(labels), "values": [[t, str(v)] for t, v in points]}


# -- the series ------------------------------------------------------------------------------


def test_replicas_per_model_and_pool_relative_to_the_window() -> None:
    metrics = {
        "replicas": [
            matrix({"model": "sample", "pool": "external"}, (100, 0), (105, 1), (110, 2)),
            matrix({"model": "sample", "pool": "cluster"}, (100, 2), (105, 1), (110, 0)),
        ]
    }
    t = build_timeline([], metrics, 100, 130)
    assert t.replicas == (
        Series("sample/cluster", ((0.0, 2.0), (5.0, 1.0), (10.0, 0.0))),
        Series("sample/external", ((0.0, 0.0), (5.0, 1.0), (10.0, 2.0))),
    )


def test_gpus_by_owner_cluster_owners_and_every_external_gpu() -> None:
    gpus = [
        matrix({"pool": "cluster", "owner": "training"}, (0, 0), (10, 2)),
        matrix({"pool": "cluster", "owner": "serving"}, (0, 2), (10, 0)),
        matrix({"pool": "cluster", "owner": "idle"}, (0, 0), (10, 0)),
        matrix({"pool": "external", "owner": "serving"}, (0, 0), (10, 2)),
        matrix({"pool": "external", "owner": "idle"}, (0, 0), (10, 2)),
    ]
    t = build_timeline([], {"gpus": gpus}, 0, 20)
    assert {s.label: s.points for s in t.gpus} == {
        "training": ((0.0, 0.0), (10.0, 2.0)),
        "serving": ((0.0, 2.0), (10.0, 0.0)),
        "idle": ((0.0, 0.0), (10.0, 0.0)),
        "external": ((0.0, 0.0), (10.0, 4.0)),
    }


@pytest.mark.parametrize(
    ("failed", "expected"),
    [
        pytest.param([], ((0.0, 0.0), (5.0, 0.0)), id="no-error-counter-yet-is-zero"),
        pytest.param([matrix({}, (0, 0), (5, 0.5))], ((0.0, 0.0), (5.0, 0.5)), id="errors"),
    ],
)
def test_request_and_failure_rates(failed: list[dict[str, Any]], expected: tuple[Any, ...]) -> None:
    metrics = {"requests": [matrix({}, (0, 10), (5, 12))], "failed": failed}
    t = build_timeline([], metrics, 0, 10)
    assert {s.label: s.points for s in t.requests} == {
        "requests/s": ((0.0, 10.0), (5.0, 12.0)),
        "failed/s": expected,
    }


def test_samples_that_are_not_numbers_are_left_out() -> None:
    metrics = {
        "replicas": [
            {
                "metric": {"model": "m", "pool": "cluster"},
                "values": [[0, "NaN"], [1, "x"], [2, "1"]],
            }
        ]
    }
    assert build_timeline([], metrics, 0, 10).replicas == (Series("m/cluster", ((2.0, 1.0),)),)


@pytest.mark.parametrize(
    ("ev", "row", "label"),
    [
        pytest.param(event(110, "policy.AdmitJob"), "training", "AdmitJob", id="admission"),
        pytest.param(event(110, "serve.move.start"), "serving", "move.start", id="move"),
        pytest.param(event(110, "policy.ScaleServePool"), "serving", "ScaleServePool", id="scale"),
        pytest.param(event(110, "health.cordon"), "health", "cordon", id="health"),
        pytest.param(
            event(110, "job.state", {"from": "QUEUED", "to": "RUNNING"}), "job", "RUNNING", id="job"
        ),
    ],
)
def test_each_decision_is_a_marker_on_its_row(ev: dict[str, Any], row: str, label: str) -> None:
    (marker,) = build_timeline([ev], None, 100, 130).markers
    assert (marker.at_s, marker.row, marker.label, marker.kind) == (10.0, row, label, ev["kind"])


def test_events_outside_the_window_and_non_decisions_are_left_out() -> None:
    events = [
        event(90, "policy.AdmitJob"),
        event(120, "controller.start"),
        event(125, "policy.PreemptJob"),
        event(140, "policy.AdmitJob"),
    ]
    assert [m.kind for m in build_timeline(events, None, 100, 130).markers] == ["policy.PreemptJob"]


def test_without_metrics_only_the_markers_and_the_note() -> None:
    t = build_timeline([event(110, "policy.AdmitJob")], None, 100, 130, ["metrics unreachable"])
    assert (t.replicas, t.gpus, t.requests) == ((), (), ())
    assert len(t.markers) == 1 and t.notes == ("metrics unreachable",)


def test_a_window_that_ends_before_it_starts_is_refused() -> None:
    with pytest.raises(ValueError, match="end_s"):
        build_timeline([], None, 10, 5)


def test_a_recorded_claim_gives_the_expected_series() -> None:
    """The inputs `rcp timeline --save-inputs` saved after the policy-loop integration test's
    claim (replicas 2 -> external -> back, a 2-GPU gang, steady traffic; trimmed)."""
    inputs = TimelineInputs.from_json(json.loads((DATA / "timeline_claim.json").read_text()))
    t = inputs.timeline()
    most = {s.label: max(v for _, v in s.points) for s in t.replicas}
    least = {s.label: min(v for _, v in s.points) for s in t.replicas}
    assert most == {"sample/cluster": 2.0, "sample/external": 2.0}
    assert least == {"sample/cluster": 0.0, "sample/external": 0.0}
    gpus = {s.label: max(v for _, v in s.points) for s in t.gpus}
    assert gpus["training"] == 2.0 and gpus["external"] >= 2.0
    rates = {s.label: s.points for s in t.requests}
    assert max(v for _, v in rates["requests/s"]) > 0
    assert all(v == 0.0 for _, v in rates["failed/s"])
    kinds = [m.kind for m in t.markers]
    assert kinds.index("serve.move.start") < kinds.index("policy.AdmitJob")  # make room first
    assert {"serve.move.done", "job.state"} <= set(kinds)
    # Make-before-break, as the series show it: both external replicas ran no later than the
    # cluster pool emptied, and within the metrics' lag (report + scrape, 10 s) of admission.
    series = {s.label: s.points for s in t.replicas}
    external_full_s = next(at for at, v in series["sample/external"] if v == 2.0)
    cluster_empty_s = next(at for at, v in series["sample/cluster"] if v == 0.0)
    assert external_full_s <= cluster_empty_s
    admit_s = next(m.at_s for m in t.markers if m.kind == "policy.AdmitJob")
    assert external_full_s <= admit_s + 10


# Counters sampled every 10 s for 2 minutes, growing linearly (so rates are exact): the edge's
# answers (HAProxy's frontends), the tries Serve saw behind it, and Serve's counts on a cluster
# without the edge.
_EDGE_OK = 'haproxy_frontend_http_responses_total{proxy="public",code="2xx"}'
_EDGE_5XX = 'haproxy_frontend_http_responses_total{proxy="public",code="5xx"}'
_EDGE_PROBE_503 = 'haproxy_frontend_http_responses_total{proxy="admin",code="5xx"}'
_EDGE_RETRIED = 'haproxy_backend_http_responses_total{proxy="routed",code="5xx"}'
_SERVE_OK = 'ray_serve_num_http_requests_total{application="rcp-sample-cluster",status_code="200"}'
_SERVE_500 = (
    'ray_serve_num_http_error_requests_total{application="rcp-sample-cluster",error_code="500"}'
)
_SERVE_422 = 'ray_serve_num_http_error_requests_total{application="rcp-ingress",error_code="422"}'


@pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (Debian: apt-get install prometheus)",
)
@pytest.mark.parametrize(
    ("per_10s", "requests", "failed"),
    [
        pytest.param(
            # Serve answered 2 tries per 10 s itself (a dead replica); the edge sent them
            # again and they got answers: 6 requests/s, none failed. The admin listener's
            # readiness 503s are no client's.
            {
                _EDGE_OK: 60,
                _EDGE_5XX: 0,
                _SERVE_OK: 58,
                _SERVE_500: 2,
                _EDGE_RETRIED: 2,
                _EDGE_PROBE_503: 1,
            },
            6.0,
            0.0,
            id="edge-retried-serve-500",
        ),
        pytest.param(
            # no 5xx series from the edge (HAProxy exports it at 0; a gap): still 0, not Serve's
            {_EDGE_OK: 60, _SERVE_OK: 58, _SERVE_500: 2},
            6.0,
            0.0,
            id="edge-5xx-series-missing",
        ),
        pytest.param(
            {_EDGE_OK: 50, _EDGE_5XX: 10, _SERVE_OK: 50, _EDGE_PROBE_503: 1},
            6.0,
            1.0,
            id="edge-answered-503",
        ),
        pytest.param(
            {_SERVE_OK: 40, _SERVE_500: 10, _SERVE_422: 10},
            4.0,
            1.0,
            id="no-edge-serves-counts",
        ),
    ],
)
def test_requests_and_failed_are_what_clients_got(
    tmp_path: Path, per_10s: dict[str, int], requests: float, failed: float
) -> None:
    """The `requests` and `failed` queries, run by promtool over synthetic series."""
    (tmp_path / "none.yml").write_text("groups: []\n")
    series = [{"series": name, "values": f"0+{n}x12"} for name, n in per_10s.items()]
    checks = [
        {"expr": QUERIES[name], "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": v}]}
        for name, v in (("requests", requests), ("failed", failed))
    ]
    test = {"interval": "10s", "input_series": series, "promql_expr_test": checks}
    spec = {"rule_files": ["none.yml"], "tests": [test]}
    (tmp_path / "test.yml").write_text(json.dumps(spec))
    res = subprocess.run(
        ["promtool", "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr


# -- reading Prometheus -------------------------------------------------------------------------


class _FakePrometheus(http.server.BaseHTTPRequestHandler):
    answers: dict[str, tuple[int, bytes]] = {}
    seen: list[dict[str, list[str]]] = []

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        type(self).seen.append(query)
        status, body = type(self).answers.get(query["query"][0], (200, _ok([])))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _ok(result: list[dict[str, Any]]) -> bytes:
    return json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": result}}
    ).encode()


@pytest.fixture
def prometheus() -> Iterator[str]:
    _FakePrometheus.answers, _FakePrometheus.seen = {}, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakePrometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_each_query_is_a_range_query_over_the_window(prometheus: str) -> None:
    replicas = [matrix({"model": "sample", "pool": "cluster"}, (100, 2))]
    _FakePrometheus.answers[QUERIES["replicas"]] = (200, _ok(replicas))
    got = read_metrics(prometheus, QUERIES, 100.0, 3700.0)
    assert got["replicas"] == replicas and got["gpus"] == []
    assert {q["query"][0] for q in _FakePrometheus.seen} == set(QUERIES.values())
    assert {(q["start"][0], q["end"][0], q["step"][0]) for q in _FakePrometheus.seen} == {
        ("100.000", "3700.000", "5.0")
    }


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        pytest.param(
            (400, b'{"status": "error", "error": "parse error"}'), "parse error", id="refused"
        ),
        pytest.param((200, b"<html>"), "not JSON", id="not-json"),
        pytest.param(
            (200, b'{"status": "success", "data": {"resultType": "vector", "result": []}}'),
            "no matrix",
            id="not-a-matrix",
        ),
        pytest.param(
            (
                200,
                b'{"status": "success", "data": {"resultType": "matrix", "result": [{"values": [1]}]}}',
            ),
            "malformed",
            id="malformed",
        ),
    ],
)
def test_a_bad_answer_names_the_query_and_what_is_wrong(
    prometheus: str, answer: tuple[int, bytes], says: str
) -> None:
    _FakePrometheus.answers[QUERIES["gpus"]] = answer
    with pytest.raises(MetricsUnavailable, match=says):
        read_metrics(prometheus, {"gpus": QUERIES["gpus"]}, 0, 60)


def test_an_unreachable_prometheus_says_where_it_looked() -> None:
    url = closed_port_url()
    with pytest.raises(MetricsUnavailable, match=f"cannot reach Prometheus at {url}"):
        read_metrics(url, QUERIES, 0, 60, timeout_s=2)


@pytest.mark.parametrize(
    ("window_s", "step_s"), [(60, 5.0), (3600, 5.0), (6 * 3600, 30.0), (7 * 86400, 840.0)]
)
def test_the_step_keeps_a_series_short(window_s: float, step_s: float) -> None:
    assert step_for(0, window_s) == step_s


# -- collecting -------------------------------------------------------------------------------


def test_events_are_read_page_by_page_and_cut_to_the_window() -> None:
    log = [event(float(i), "policy.AdmitJob", seq=i + 1) for i in range(2 * EVENTS_PAGE + 10)]
    calls: list[tuple[int, int]] = []

    def page(after: int, limit: int) -> list[dict[str, Any]]:
        calls.append((after, limit))
        return [e for e in log if e["seq"] > after][:limit]

    found, cut = read_events(page, 100.0, 200.0)
    assert [e["at_s"] for e in found] == [float(i) for i in range(100, 201)]
    assert not cut
    assert calls == [(0, EVENTS_PAGE), (EVENTS_PAGE, EVENTS_PAGE), (2 * EVENTS_PAGE, EVENTS_PAGE)]


def test_collect_without_prometheus_notes_why() -> None:
    inputs = collect(lambda after, limit: [], closed_port_url(), 0, 60)
    assert inputs.metrics is None
    assert inputs.notes and inputs.notes[0].startswith("metrics unreachable, events only")


# -- the command ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("timeline"))
    s.store.record_event("policy.AdmitJob", "admit job-1: fits")
    s.store.record_event("serve.move.start", "sample: cluster -> external x2")
    yield s
    s.close()


def test_rcp_timeline_over_the_api_and_prometheus(
    srv: Server, prometheus: str, tmp_path: Path
) -> None:
    now_replicas = [matrix({"model": "sample", "pool": "cluster"}, (1, 2))]
    _FakePrometheus.answers[QUERIES["replicas"]] = (200, _ok(now_replicas))
    png = tmp_path / "t.png"
    code, out = rcp(
        srv, "timeline", "--since", "10m", "-o", str(png), "--prometheus", prometheus, "--json"
    )
    assert code == 0, out
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    summary = json.loads(out)
    assert summary["markers"] == {"training": 1, "serving": 1}
    assert summary["notes"] == []
    assert summary["end_s"] - summary["start_s"] == pytest.approx(600.0)


def test_rcp_timeline_draws_the_events_alone_when_metrics_are_unreachable(
    srv: Server, tmp_path: Path
) -> None:
    png = tmp_path / "t.png"
    code, out = rcp(srv, "timeline", "-o", str(png), "--prometheus", closed_port_url())
    assert code == 0, out
    assert "2 decision markers" in out and "note: metrics unreachable, events only" in out
    assert png.read_bytes()[:8] == PNG_SIGNATURE


def test_rcp_timeline_redraws_saved_inputs(srv: Server, tmp_path: Path) -> None:
    saved, png = tmp_path / "in.json", tmp_path / "again.png"
    code, out = rcp(
        srv,
        "timeline",
        "-o",
        str(tmp_path / "t.png"),
        "--prometheus",
        closed_port_url(),
        "--save-inputs",
        str(saved),
    )
    assert code == 0, out
    code, out = rcp(srv, "timeline", "--from-inputs", str(saved), "-o", str(png), "--json")
    assert code == 0, out
    assert json.loads(out)["markers"] == {"training": 1, "serving": 1}
    assert png.read_bytes()[:8] == PNG_SIGNATURE


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(("--since", "yesterday"), "--since", id="since-not-a-duration"),
        pytest.param(("--since", "40d"), "at most 30d", id="since-too-long"),
        pytest.param(("--since", "0s"), "more than 0", id="since-zero"),
    ],
)
def test_bad_options_exit_2_naming_the_option(
    srv: Server, args: tuple[str, ...], says: str
) -> None:
    code, out = rcp(srv, "timeline", *args)
    assert code == 2 and says in out, out


def test_a_file_that_is_not_saved_inputs_is_refused(srv: Server, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"events": []}')
    code, out = rcp(srv, "timeline", "--from-inputs", str(bad))
    assert code == 2 and "--from-inputs" in out, out


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("30m", 1800.0), ("1h", 3600.0), ("2d", 172800.0), ("1.5h", 5400.0)],
)
def test_since_durations(text: str, seconds: float) -> None:
    assert parse_since(text) == seconds


# -- the picture: from its first data, labels that never overlap -------------------------------


@pytest.mark.parametrize(
    ("starts", "widths", "levels"),
    [
        ([0.0, 1.0, 2.0], [0.5, 0.5, 0.5], [0, 0, 0]),  # apart: one line
        ([0.0, 0.1, 0.2], [1.0, 1.0, 1.0], [0, 1, 2]),  # close: stacked
        ([0.0, 0.1, 0.2, 0.3], [1.0, 1.0, 1.0, 1.0], [0, 1, 2, None]),  # no line left: out
        ([0.0, 0.1, 1.0], [1.0, 1.0, 1.0], [0, 1, 0]),  # the first line is clear again
        ([], [], []),
    ],
)
def test_each_label_takes_the_lowest_line_it_clears(
    starts: list[float], widths: list[float], levels: list[int | None]
) -> None:
    from controlplane.timeline.draw import label_levels

    assert label_levels(starts, widths) == levels


def test_the_picture_starts_at_its_first_data_and_no_two_labels_overlap() -> None:
    from controlplane.timeline.draw import draw_figure
    from controlplane.timeline.series import Marker, Timeline

    # A 30-minute window whose data starts 12 minutes in, with a burst of decisions.
    markers = tuple(
        Marker(720.0 + 3.0 * i, "serving", "serve.move.start", f"move.start {i}", "")
        for i in range(12)
    ) + tuple(Marker(725.0 + 2.0 * i, "job", "job.state", "RUNNING", "") for i in range(4))
    replicas = (Series("sample/cluster", ((730.0, 2.0), (1500.0, 1.0))),)
    fig = draw_figure(Timeline(1000.0, 2800.0, replicas=replicas, markers=markers))
    decisions = fig.axes[3]
    assert decisions.get_xlim()[0] == pytest.approx(12.0)  # minutes: the first marker's
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    labels = [t for t in decisions.texts if t.get_text() and "left out" not in t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert len(boxes) >= 3  # stacked, not all left out
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            assert not a.overlaps(b), (a, b)
    # Those that fit nowhere are counted, not drawn over each other.
    notes = [t.get_text() for t in decisions.texts if "left out" in t.get_text()]
    assert len(labels) + sum(int(n.split()[0]) for n in notes) == len(markers)
