"""What a user sees of a job's checkpoints and restarts: the API's job view, the SDK's `Job`,
`rcp status`/`rcp queue`, and the controller's per-job gauges, all read from the runner's
info keys (`controlplane.store.job_info`). No Ray: the API runs in-process on loopback.

The info a runner writes is JSON from the store, so every key is also fed in malformed: a
listing must never fail on one job, and nothing that is not a finite number reaches JSON.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from controlplane.api.job_views import job_to_json
from controlplane.cli import cli
from controlplane.config import load_config
from controlplane.loop.act.nodes import Remediator
from controlplane.loop.job_metrics import GpuHoursMeter, job_gauges
from controlplane.store import JobRecord, JobState, Store, reliability
from controlplane.store.job_info import MAX_ATTEMPTS_KEPT, MAX_TEXT_CHARS, job_facts
from jobs.spec import JobSpec
from tests.unit.api.test_api_server import TOKEN, Server
from tests.unit.loop.test_health_actuation import FakeNodes

SECRET = "the-attempts-signal-token-abc"


def info(**over: Any) -> dict[str, Any]:
    """What the runner records for a job on its third attempt, two restarts in (a crash and a
    hang), with step 120 committed at t=1000 and the running attempt at step 130."""
    base: dict[str, Any] = {
        "attempt": 3,
        "submission_id": "j-1-3",
        "signal_token": SECRET,
        "checkpoint_uri": "s3://rcp-checkpoints/jobs/j-1/",
        "checkpoint": {
            "step": 120,
            "uri": "s3://rcp-checkpoints/jobs/j-1/step-000000000120",
            "committed_unix_s": 1000.0,
            "read_s": 1001.0,
        },
        "progress": {"step": 130, "step_at_s": 1030.0, "stall_s": 1.0, "wall_s": 600.0},
        "stall_s_total": 3.0,
        "wall_s_total": 1000.0,
        "restarts": 2,
        "hangs": 1,
        "attempts": [
            {
                "attempt": 1,
                "admitted_s": 10.0,
                "ended_s": 400.0,
                "kind": "crash",
                "reason": "worker 1 exited (SIGKILL)",
                "step": 40,
            },
            {
                "attempt": 2,
                "admitted_s": 420.0,
                "ended_s": 800.0,
                "kind": "hang",
                "reason": "no step for 600s",
                "step": 80,
            },
        ],
    }
    base.update(over)
    return base


def record(
    state: JobState = JobState.RUNNING, job_info: dict[str, Any] | None = None, **spec: Any
) -> JobRecord:
    return JobRecord(
        job_id="j-1",
        spec=JobSpec.from_dict({"name": "llama", "entrypoint": "python t.py", **spec}),
        state=state,
        submitted_s=0.0,
        queued_s=0.0,
        updated_s=900.0,
        info=info() if job_info is None else job_info,
    )


# -- the API's view ------------------------------------------------------------------------


def test_the_view_shows_the_commit_its_age_the_overhead_and_the_restarts() -> None:
    view = job_to_json(record(), history=[], now_s=1060.0)
    assert view["last_checkpoint"] == {
        "step": 120,
        "uri": "s3://rcp-checkpoints/jobs/j-1/step-000000000120",
        "committed_unix_s": 1000.0,
        "age_s": 60.0,
    }
    assert view["checkpoint_uri"] == "s3://rcp-checkpoints/jobs/j-1/"
    # (3 + 1) s stalled of (1000 + 600) s
    assert (view["checkpoint_stall_s"], view["checkpoint_wall_s"]) == (4.0, 1600.0)
    assert view["checkpoint_overhead_pct"] == pytest.approx(0.25)
    assert (view["restarts"], view["max_restarts"], view["hangs"]) == (2, 3, 1)
    assert view["progress"] == {
        "step": 130,
        "step_at_s": 1030.0,
        "step_age_s": 30.0,
        "stall_s": 1.0,
        "wall_s": 600.0,
    }
    assert [(a["attempt"], a["kind"], a["reason"], a["step"]) for a in view["attempts"]] == [
        (1, "crash", "worker 1 exited (SIGKILL)", 40),
        (2, "hang", "no step for 600s", 80),
    ]
    assert SECRET not in json.dumps(view)


def test_a_listing_leaves_the_attempts_out_and_an_ended_job_its_progress() -> None:
    listed = job_to_json(record(JobState.SUCCEEDED), now_s=1060.0)
    assert "attempts" not in listed
    assert listed["progress"] is None
    # the ended attempts' totals only: the last attempt's progress is not counted again
    assert listed["checkpoint_overhead_pct"] == pytest.approx(0.3)
    assert listed["last_checkpoint"]["step"] == 120


def test_a_job_without_a_commit_or_wall_time_says_so() -> None:
    view = job_to_json(record(JobState.QUEUED, {"attempt": 0}), history=[], now_s=5.0)
    assert view["last_checkpoint"] is None
    assert view["checkpoint_overhead_pct"] is None
    assert (view["restarts"], view["hangs"], view["attempts"]) == (0, 0, [])


BAD_VALUES = [
    pytest.param({"checkpoint": "step 5"}, id="checkpoint-a-string"),
    pytest.param({"checkpoint": {"step": -1}}, id="negative-step"),
    pytest.param({"checkpoint": {"step": True}}, id="bool-step"),
    pytest.param({"checkpoint": {"step": 1.5}}, id="float-step"),
    pytest.param({"checkpoint": {"step": 10**400}}, id="huge-step"),
    pytest.param({"checkpoint": {"step": 3, "path": "/ckpt/3"}}, id="the-loops-word-no-read_s"),
    pytest.param({"checkpoint": {"step": 3, "committed_unix_s": math.nan}}, id="nan-time"),
    pytest.param({"checkpoint": {"step": 3, "committed_unix_s": 10**400}}, id="huge-int-time"),
    pytest.param({"progress": [1, 2]}, id="progress-a-list"),
    pytest.param({"progress": {"step": 1, "stall_s": math.inf, "wall_s": -5}}, id="inf-stall"),
    pytest.param({"stall_s_total": "3", "wall_s_total": math.nan}, id="totals-not-numbers"),
    pytest.param({"restarts": "2", "hangs": -1}, id="counts-not-counts"),
    pytest.param({"attempts": {"1": "crash"}}, id="attempts-a-dict"),
    pytest.param({"attempts": [None, 7, {"kind": 3}, {"kind": "crash", "step": "x"}]}, id="junk"),
    pytest.param({"checkpoint_uri": ["s3://x"]}, id="uri-a-list"),
]


@pytest.mark.parametrize("bad", BAD_VALUES)
def test_malformed_info_reads_as_absent_and_the_view_stays_json(bad: dict[str, Any]) -> None:
    job = record(job_info={**info(), **bad})
    view = job_to_json(job, history=[], now_s=1060.0)
    text = json.dumps(view, allow_nan=False)  # NaN or inf would not be JSON
    assert SECRET not in text
    facts = job_facts(job.info)
    assert facts.restarts >= 0 and facts.hangs >= 0
    assert job_gauges(job) is not None


def test_a_step_storage_never_confirmed_is_not_shown_as_committed() -> None:
    loops_word = {"step": 7, "path": "/state/ckpt/7", "at_s": 50.0}  # an older runner's record
    view = job_to_json(record(job_info=info(checkpoint=loops_word)), now_s=60.0)
    assert view["last_checkpoint"] is None
    unread_time = {"step": 7, "read_s": 55.0, "committed_unix_s": math.inf}
    view = job_to_json(record(job_info=info(checkpoint=unread_time)), now_s=60.0)
    assert view["last_checkpoint"] == {
        "step": 7,
        "uri": None,
        "committed_unix_s": None,
        "age_s": None,
    }


def test_long_reasons_are_cut_and_only_the_newest_attempts_kept() -> None:
    many = [{"attempt": i, "kind": "crash", "reason": "x" * 5000} for i in range(300)]
    facts = job_facts({"attempts": many})
    assert len(facts.attempts) == MAX_ATTEMPTS_KEPT
    assert facts.attempts[-1].attempt == 299
    assert len(facts.attempts[0].reason) == MAX_TEXT_CHARS
    assert facts.restarts == MAX_ATTEMPTS_KEPT  # counted from the attempts when not recorded


# -- the SDK and the CLI -------------------------------------------------------------------


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("recovery"))
    yield s
    s.close()


def rcp(srv: Server, *args: str) -> tuple[int, str]:
    env = {"RCP_API_URL": srv.url, "RCP_API_TOKEN": TOKEN}
    result = CliRunner().invoke(cli, list(args), env=env)
    return result.exit_code, result.output


def running_job(srv: Server, job_info: dict[str, Any]) -> str:
    job = srv.client.submit({"name": "llama", "entrypoint": "m:f", "max_restarts": 3})
    srv.store.transition(job.id, JobState.ADMITTED, "admitted")
    srv.store.transition(job.id, JobState.RUNNING, "every worker started")
    srv.store.update_info(job.id, job_info)
    return job.id


def test_the_sdk_job_carries_the_checkpoint_and_restarts(srv: Server) -> None:
    now = time.time()
    job_id = running_job(
        srv,
        info(
            checkpoint={
                "step": 120,
                "uri": "s3://b/step",
                "committed_unix_s": now - 90,
                "read_s": now - 80,
            },
            progress={"step": 130, "step_at_s": now - 5, "stall_s": 1.0, "wall_s": 600.0},
        ),
    )
    job = srv.client.status(job_id)
    assert job.last_committed_step == 120
    assert job.checkpoint_age_s is not None and 90 <= job.checkpoint_age_s < 120
    assert job.checkpoint_overhead_pct == pytest.approx(0.25)
    assert (job.restarts, job.max_restarts, job.hangs) == (2, 3, 1)
    assert [(a.attempt, a.kind, a.reason) for a in job.attempts] == [
        (1, "crash", "worker 1 exited (SIGKILL)"),
        (2, "hang", "no step for 600s"),
    ]
    assert job.progress is not None and job.progress["step"] == 130
    (listed,) = [j for j in srv.client.list() if j.id == job_id]
    assert listed.attempts == () and listed.restarts == 2


def test_rcp_status_shows_the_commit_overhead_restarts_and_each_attempt(srv: Server) -> None:
    now = time.time()
    job_id = running_job(
        srv,
        info(
            checkpoint={
                "step": 120,
                "uri": "s3://b/step",
                "committed_unix_s": now - 90,
                "read_s": now - 80,
            },
            progress={"step": 130, "step_at_s": now - 5, "stall_s": 1.0, "wall_s": 600.0},
        ),
    )
    code, out = rcp(srv, "status", job_id)
    assert code == 0, out
    assert re.search(r"checkpoint:  step 120, committed 1m \d+s ago \(s3://b/step\)", out), out
    assert "overhead:    0.25% of training time stalled on checkpoints (4.0s of 1600s)" in out
    assert "restarts:    2 of 3 used (1 after a hang)" in out
    assert re.search(r"progress:    step 130, last grew \d+s ago", out), out
    rows = out[out.index("attempts:") :].splitlines()
    assert rows[1].split() == ["ATTEMPT", "ENDED", "KIND", "STEP", "REASON"]
    assert rows[2].split()[0] == "1" and "crash  40    worker 1 exited (SIGKILL)" in rows[2]
    assert rows[3].split()[0] == "2" and "hang   80    no step for 600s" in rows[3]
    assert SECRET not in out
    code, out = rcp(srv, "status", job_id, "--json")
    view = json.loads(out)
    assert view["last_checkpoint"]["step"] == 120 and view["restarts"] == 2
    assert SECRET not in out


def test_rcp_status_says_when_nothing_committed_yet(srv: Server) -> None:
    job = srv.client.submit({"name": "fresh", "entrypoint": "m:f"})
    code, out = rcp(srv, "status", job.id)
    assert code == 0, out
    assert "checkpoint:  no checkpoint committed yet" in out
    assert "overhead:    no training time measured yet" in out
    assert "restarts:    0 of 3 used" in out
    assert "attempts:" not in out and "progress:" not in out


def test_listings_show_restarts_and_the_last_committed_step(srv: Server) -> None:
    job_id = running_job(srv, info())
    for args in (("queue",), ("status",)):
        code, out = rcp(srv, *args)
        assert code == 0, out
        header, *rows = out.splitlines()
        assert header.split()[-2:] == ["RESTARTS", "CHECKPOINT"]
        (row,) = [r for r in rows if r.startswith(job_id)]
        assert row.split()[-2:] == ["2/3", "120"]


def test_a_malformed_row_never_breaks_a_listing(srv: Server) -> None:
    job_id = running_job(srv, info(checkpoint={"step": "x"}, restarts=None, attempts="junk"))
    code, out = rcp(srv, "queue", "--json")
    assert code == 0, out
    (view,) = [j for j in json.loads(out) if j["id"] == job_id]
    assert view["last_checkpoint"] is None and view["restarts"] == 0


# -- the controller's gauges ---------------------------------------------------------------


def test_gauges_of_a_running_job() -> None:
    g = job_gauges(record(checkpoint={"interval_s": 600}))
    assert g is not None
    assert g.tags == {"job_id": "j-1", "name": "llama", "queue": "default"}
    assert (g.running_since_s, g.last_commit_s, g.last_committed_step) == (900.0, 1000.0, 120)
    assert g.overhead_ratio == pytest.approx(4 / 1600)
    assert (g.restarts, g.hangs, g.max_restarts, g.checkpoint_interval_s) == (2, 1, 3, 600.0)


@pytest.mark.parametrize(
    ("job", "series"),
    [
        pytest.param(record(JobState.QUEUED, {}), None, id="queued-never-started"),
        pytest.param(record(JobState.SUCCEEDED), None, id="ended"),
        pytest.param(
            record(JobState.QUEUED, info()),
            {"restarts": 2, "hangs": 1, "running_since_s": None, "last_commit_s": None},
            id="requeued-after-a-hang-keeps-its-counts",
        ),
        pytest.param(
            record(JobState.RUNNING, {"attempt": 1}),
            {"last_commit_s": None, "checkpoint_interval_s": 0.0, "overhead_ratio": None},
            id="running-never-committed-young-daly",
        ),
        pytest.param(
            record(JobState.RUNNING, {"attempt": 1}, checkpoint={"enabled": False}),
            {"checkpoint_interval_s": None, "running_since_s": 900.0},
            id="no-checkpointing-no-interval",
        ),
    ],
)
def test_which_gauges_a_job_has(job: JobRecord, series: dict[str, Any] | None) -> None:
    g = job_gauges(job)
    if series is None:
        assert g is None
        return
    assert g is not None
    assert {k: getattr(g, k) for k in series} == series


def test_gpu_hours_are_summed_per_tick_and_written_once_a_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(tmp_path / "db.sqlite")
    cfg = load_config(None, [f"state_dir={tmp_path}", "jobs.gpu_mtbf_prior_hours=1000"])
    writes: list[float] = []
    real = reliability.accrue_gpu_hours

    def counting(s: Store, gpus: int, dt_s: float, now: float) -> None:
        writes.append(gpus * dt_s)
        real(s, gpus, dt_s, now)

    monkeypatch.setattr(reliability, "accrue_gpu_hours", counting)
    meter = GpuHoursMeter(store, cfg, flush_interval_s=60.0)
    meter.tick(8, 0.0)  # the first tick writes nothing but reads the MTBF: the prior
    assert meter.gpu_mtbf_hours == pytest.approx(1000.0)
    for t in range(1, 121):  # 2 minutes of 1 s ticks with 8 GPUs
        meter.tick(8, float(t))
    end = 121.0 + 3600.0
    meter.tick(8, end)  # a tick an hour late adds at most MAX_TICK_GAP_S (60 s)
    meter.flush(end)
    assert len(writes) == 3  # at 60 s, at 120 s, at the last flush: not one a tick
    assert sum(writes) == pytest.approx(8 * 120 + 8 * 60)
    gpu_hours = reliability.fleet_record(store, end)["gpu_hours"]
    assert gpu_hours == pytest.approx(8 * 180 / 3600, rel=1e-3)  # decay over an hour: tiny
    # no failure yet: (0 + 1) failures in (gpu_hours + 1000) GPU-hours
    assert meter.gpu_mtbf_hours == pytest.approx(1000.0 + gpu_hours)
    store.close()


def test_a_node_taken_out_by_health_counts_once_in_the_fleet_record(tmp_path: Path) -> None:
    store = Store(tmp_path / "db.sqlite")
    r = Remediator(
        FakeNodes(),
        drain_deadline_s=600.0,
        replace_drained=True,
        record=lambda k, m: None,
        count_removal=lambda now_s: reliability.record_failure(
            store, "node-removed-by-health", now_s
        ),
    )
    assert r.cordon("a", "unhealthy: xid_fatal", now_s=10.0)
    assert not r.cordon("a", "unhealthy: xid_fatal", now_s=11.0)
    assert reliability.fleet_record(store, 11.0)["by_kind"] == {
        "node-removed-by-health": pytest.approx(1.0, rel=1e-6)
    }
    store.close()


def test_a_failing_failure_record_never_stops_a_cordon() -> None:
    def broken(_now_s: float) -> None:
        raise RuntimeError("store locked")

    nodes = FakeNodes()
    r = Remediator(nodes, 600.0, True, record=lambda k, m: None, count_removal=broken)
    assert r.cordon("a", "unhealthy", now_s=1.0)
    assert nodes.calls == [("drain", "a", "600")] and "a" in r.cordoned


# -- recoveries and ETTR (issue 30) -------------------------------------------------------------


def recovered_info(now: float) -> dict[str, Any]:
    """Admitted 1,000 s ago; a worker crashed at -600 and the run restarted in place (4.5 s
    to the first new step from the memory tier, caught up 10.5 s after the failure); a hang
    at -100 re-queued the job, still recovering."""
    return info(
        first_admitted_s=now - 1000.0,
        stall_s_total=0.0,
        progress=None,
        attempts=[
            {
                "attempt": 1,
                "ended_s": now - 600.0,
                "kind": "crash",
                "reason": "crash: rank 1: its worker process died",
                "step": 40,
                "in_place": 1,
            },
            {"attempt": 1, "ended_s": now - 100.0, "kind": "hang", "reason": "no step", "step": 80},
        ],
        recoveries=[
            {
                "failed_s": now - 600.0,
                "resumed_s": now - 595.5,
                "seconds": 4.5,
                "kind": "crash",
                "in_place": True,
                "step": 40,
                "restored_step": 35,
                "source": "memory",
                "caught_up_s": now - 589.5,
            }
        ],
        recovering={"failed_s": now - 100.0, "kind": "hang", "in_place": False, "step": 80},
    )


def test_the_view_has_each_recovery_and_the_ettr() -> None:
    now = 10_000.0
    view = job_to_json(record(job_info=recovered_info(now)), history=[], now_s=now)
    assert view["recoveries"] == [
        {
            "failed_s": now - 600.0,
            "kind": "crash",
            "in_place": True,
            "seconds": 4.5,
            "source": "memory",
            "restored_step": 35,
        },
        {
            "failed_s": now - 100.0,
            "kind": "hang",
            "in_place": False,
            "seconds": None,
            "source": None,
            "restored_step": None,
        },
    ]
    assert [a["in_place"] for a in view["attempts"]] == [1, None]
    # 1000 s of wall time, 10.5 s lost to the crash, 100 s (so far) to the hang.
    assert view["ettr"] == pytest.approx((1000 - 10.5 - 100) / 1000)
    listed = job_to_json(record(job_info=recovered_info(now)), now_s=now)
    assert "recoveries" not in listed and listed["ettr"] == view["ettr"]


def test_rcp_status_shows_each_recovery_where_it_restored_from_and_the_ettr(srv: Server) -> None:
    job_id = running_job(srv, recovered_info(time.time()))
    job = srv.client.status(job_id)
    assert job.ettr is not None and 0.88 < job.ettr < 0.9
    assert [r["source"] for r in job.recoveries] == ["memory", None]
    assert job.attempts[0].in_place == 1
    code, out = rcp(srv, "status", job_id)
    assert code == 0, out
    assert re.search(r"ettr:        8\d\.\d% of wall time since admission spent training", out)
    rows = out[out.index("attempts:") :].splitlines()
    assert rows[2].startswith("  1 (in place 1)"), rows
    rows = out[out.index("recoveries (failure -> first new step):") :].splitlines()
    assert rows[1].split() == ["FAILED", "KIND", "HOW", "TOOK", "RESTORED", "FROM", "STEP"]
    assert rows[2].split()[2:] == ["crash", "in", "place", "4.5s", "memory", "35"], rows
    assert rows[3].split()[2:] == ["hang", "re-queued", "recovering", "-", "-"], rows
