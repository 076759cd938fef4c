"""`rcp submit/status/queue/cancel/events` against an in-process API server (no Ray)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from controlplane.cli import cli
from tests.unit.api.test_api_server import TOKEN, Server, make_invalid


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("cli"))
    yield s
    s.close()


def rcp(srv: Server, *args: str) -> tuple[int, str]:
    env = {"RCP_API_URL": srv.url, "RCP_API_TOKEN": TOKEN}
    result = CliRunner().invoke(cli, list(args), env=env)
    return result.exit_code, result.output


def test_submit_a_command_prints_id_and_state_as_json(srv: Server) -> None:
    code, out = rcp(
        srv, "submit", "--workers", "2", "--gpus-per-worker", "1", "--priority", "high", "--json",
        "--", "python", "train.py", "--lr", "3e-4",
    )  # fmt: skip
    assert code == 0, out
    body = json.loads(out)
    assert body["state"] == "QUEUED"
    job = srv.store.get(body["id"])
    assert job.spec.entrypoint == "python train.py --lr 3e-4"
    assert (job.spec.num_workers, job.spec.priority_class) == (2, "high")


def test_submit_a_yaml_file(srv: Server, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: y\nentrypoint: pkg.mod:train\nnum_workers: 1\nqueue: default\n")
    code, out = rcp(srv, "submit", str(path))
    assert code == 0, out
    assert srv.store.get(out.strip()).spec.name == "y"
    assert srv.store.get(out.strip()).spec.restart_in_place  # the default
    code, out = rcp(srv, "submit", "--no-restart-in-place", str(path))
    assert code == 0, out
    assert not srv.store.get(out.strip()).spec.restart_in_place


@pytest.mark.parametrize(
    "args, needle",
    [
        (("submit", "--workers", "0", "--", "python", "t.py"), "num_workers"),
        (
            ("submit", "--workers", "1", "--priority", "vip", "--", "python", "t.py"),
            "priority_class",
        ),
        (("submit", "--workers", "1", "--queue", "nope", "--", "python", "t.py"), "queue"),
        (("status", "job-none"), "no job with id"),
        (("cancel", "job-none"), "no job with id"),
    ],
    ids=["zero-workers", "unknown-priority", "unknown-queue", "status-unknown", "cancel-unknown"],
)
def test_bad_input_exits_2_with_the_servers_message(
    srv: Server, args: tuple[str, ...], needle: str
) -> None:
    before = srv.num_jobs()
    code, out = rcp(srv, *args)
    assert code == 2
    assert needle in out
    assert srv.num_jobs() == before


def test_bad_yaml_exits_2_naming_the_line(srv: Server, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    code, out = rcp(srv, "submit", str(path))
    assert code == 2 and "not valid YAML at line" in out


def test_status_queue_cancel_and_events(srv: Server) -> None:
    _, out = rcp(srv, "submit", "--workers", "1", "--", "python", "t.py")
    job_id = out.strip()
    code, out = rcp(srv, "status", job_id, "--json")
    assert code == 0 and json.loads(out)["state"] == "QUEUED"
    code, out = rcp(srv, "queue", "--json")
    assert job_id in [j["id"] for j in json.loads(out)]
    code, out = rcp(srv, "cancel", job_id)
    assert code == 0 and "CANCELLED" in out
    code, out = rcp(srv, "events", "--job", job_id, "--json")
    kinds = [(e["kind"], e["data"].get("to")) for e in json.loads(out)]
    assert kinds == [
        ("job.state", "QUEUED"),
        ("audit.jobs.submit", None),
        ("job.state", "CANCELLED"),
        ("audit.jobs.cancel", None),
    ]


def test_wrong_token_exits_1(srv: Server) -> None:
    result = CliRunner().invoke(
        cli, ["queue"], env={"RCP_API_URL": srv.url, "RCP_API_TOKEN": "bad"}
    )
    assert result.exit_code == 1 and "wrong token" in result.output


def test_the_example_job_file_is_accepted(srv: Server) -> None:
    path = Path(__file__).resolve().parents[3] / "jobs" / "examples" / "mnistlike.yaml"
    code, out = rcp(srv, "submit", str(path), "--json")
    assert code == 0, out
    job = srv.store.get(json.loads(out)["id"])
    assert job.spec.entrypoint == "jobs.examples.train_mnistlike:train_loop"
    assert job.spec.checkpoint.preempt_deadline_s == 60


def test_job_commands_find_the_api_through_the_config_up_ran_with(
    srv: Server, tmp_path: Path
) -> None:
    from controlplane.tokens import TOKEN_FILE, write_url

    state = tmp_path / "state"
    state.mkdir()
    (state / TOKEN_FILE).write_text(TOKEN)
    write_url(state, srv.url)
    conf = tmp_path / "rcp.yaml"
    conf.write_text(f"state_dir: {state}\n")
    runner = CliRunner()
    by_flag = runner.invoke(cli, ["queue", "--json", "--config", str(conf)], env={})
    assert by_flag.exit_code == 0, by_flag.output
    assert isinstance(json.loads(by_flag.output), list)
    by_env = runner.invoke(cli, ["queue", "--json"], env={"RCP_CONFIG": str(conf)})
    assert by_env.exit_code == 0, by_env.output
    # A config with a mistake is named, like every other command's.
    conf.write_text("state_dirr: x\n")
    bad = runner.invoke(cli, ["queue", "--config", str(conf)], env={})
    assert bad.exit_code == 2 and "state_dirr" in bad.output


def test_status_shows_rows_that_no_longer_validate_as_invalid(tmp_path: Path) -> None:
    s = Server(tmp_path)
    try:
        good = s.client.submit({"name": "good", "entrypoint": "python t.py"})
        bad = s.client.submit({"name": "bad", "entrypoint": "python t.py"})
        make_invalid(s.store, bad.id)
        result = CliRunner().invoke(
            cli, ["status"], env={"RCP_API_URL": s.url, "RCP_API_TOKEN": TOKEN}
        )
        assert result.exit_code == 0
        assert good.id in result.stdout and bad.id not in result.stdout
        assert f"INVALID {bad.id} (QUEUED)" in result.stderr
    finally:
        s.close()


# -- the attempt's signal token never shows (issue 12) ------------------------------------------

SECRET = "the-attempts-signal-token-xyz"


def test_no_job_view_shows_the_signal_token(srv: Server) -> None:
    job = srv.client.submit(
        {"name": "tok", "entrypoint": "m:f", "num_workers": 1, "gpus_per_worker": 1}
    )
    srv.store.update_info(
        job.id, {"attempt": 1, "submission_id": f"{job.id}-1", "signal_token": SECRET}
    )
    record = srv.store.get(job.id)
    assert record.info["signal_token"] == SECRET  # it is there ...
    assert SECRET not in repr(record) and SECRET not in str(record)  # ... and never printed
    assert SECRET not in repr(srv.store.list_jobs())
    views = [
        srv.raw("GET", f"/v1/jobs/{job.id}")[1],
        srv.raw("GET", "/v1/jobs")[1],
        srv.raw("GET", f"/v1/events?job_id={job.id}")[1],
        repr(srv.client.status(job.id)),
        repr(srv.client.list()),
    ]
    for args in (
        ("status", job.id),
        ("status", job.id, "--json"),
        ("queue",),
        ("queue", "--json", "--all"),
        ("events", "--job", job.id),
    ):
        code, out = rcp(srv, *args)
        assert code == 0, out
        views.append(out)
    views.append(srv.raw("POST", f"/v1/jobs/{job.id}/cancel")[1])
    for view in views:
        assert SECRET not in json.dumps(view) if not isinstance(view, str) else SECRET not in view


def test_the_cancel_view_of_an_invalid_row_never_shows_the_signal_token(srv: Server) -> None:
    job = srv.client.submit(
        {"name": "tok2", "entrypoint": "m:f", "num_workers": 1, "gpus_per_worker": 1}
    )
    srv.store.update_info(job.id, {"attempt": 1, "signal_token": SECRET})
    make_invalid(srv.store, job.id)
    status, body = srv.raw("POST", f"/v1/jobs/{job.id}/cancel")
    assert status == 200 and SECRET not in json.dumps(body)
    code, out = rcp(srv, "queue", "--json", "--all")
    assert SECRET not in out
