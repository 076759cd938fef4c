"""What a job's processes find in their environment: the runner's runtime env (shown in the
dashboard: no credentials) and, in local mode, the Ray nodes' own environment (the embedded
store's keys only with storage.job_credentials=shared, py-spy for hang stacks). No Ray is
started.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from controlplane.config import load_config
from controlplane.local.head import node_env
from controlplane.loop.act.jobs.runner import JobRunner
from controlplane.storage import EMBEDDED_ACCESS_KEY, EMBEDDED_SECRET_KEY
from controlplane.store import Store, reliability
from jobs.spec import CheckpointSpec
from jobs.storage_credentials import StorageCredentials
from jobs.storage_uri import StorageUri
from tests.unit.loop.jobs.test_runner import Clock, FakeRay, admit, submit

MINTED = StorageCredentials(
    access_key_id="ASIAMINTEDFORTHEJOB",
    secret_access_key="minted-secret",
    session_token="minted-session-token",
    expires_unix_s=1e10,
)


def mint(_job_id: str, _prefix: StorageUri) -> StorageCredentials:
    return MINTED


def job_env(tmp_path: Path, overrides: list[str], **spec: Any) -> dict[str, str]:
    cfg = load_config(None, [f"state_dir={tmp_path}", *overrides])
    clock = Clock()
    store = Store(tmp_path / "db.sqlite", clock=clock)
    for _ in range(4):  # a fleet that failed: the MTBF follows its record
        reliability.record_failure(store, "gang-crash", clock.now)
    fake = FakeRay()
    job_id = submit(store, **spec)
    admit(JobRunner(store, cfg, fake, clock=clock, mint=mint), job_id)
    env = dict(fake.submitted[0][2]["env_vars"])
    env["_job_id"] = job_id
    env["_mtbf_s"] = str(reliability.job_mtbf_s(store, cfg, 2, clock.now))
    return env


def test_the_job_gets_its_checkpoint_settings_and_no_credentials(tmp_path: Path) -> None:
    env = job_env(tmp_path, ["storage.uri=s3://rcp-checkpoints", "storage.region=eu-west-3"])
    job_id = env["_job_id"]
    assert env["RCP_CHECKPOINT_URI"] == f"s3://rcp-checkpoints/jobs/{job_id}"
    assert env["RCP_STORAGE_ENDPOINT_URL"] == "http://127.0.0.1:9000"  # the embedded store
    assert env["RCP_STORAGE_REGION"] == "eu-west-3"
    assert env["RCP_CHECKPOINT_ENABLED"] == "1" and env["RCP_CHECKPOINT_KEEP_LAST"] == "2"
    assert "RCP_CHECKPOINT_INTERVAL_S" not in env  # Young/Daly in the loop
    assert float(env["RCP_MTBF_S"]) == pytest.approx(float(env["_mtbf_s"]), abs=0.1)
    assert env["RCP_STEP_REPORT_S"] == "5"
    assert env["RCP_JOB_ID"] == job_id and env["RCP_ATTEMPT"] == "1"
    assert env["RCP_SIGNAL_TOKEN"] and env["RCP_SIGNAL_POLL_S"] == "0.5"
    assert env["RCP_NUM_WORKERS"] == "2" and env["RCP_NODE_IDS"] == "n1"
    for gone in ("RCP_CHECKPOINT_PREFIX", "RCP_RESUME_FROM"):
        assert gone not in env
    assert env["RCP_STORAGE_CREDENTIALS"] == "signals"  # scoped: from the signals actor
    shown = " ".join(f"{k}={v}" for k, v in env.items())
    assert "AWS_" not in shown and EMBEDDED_SECRET_KEY not in shown
    assert not [v for v in MINTED.values() if str(v) in shown]


def test_the_spec_checkpoint_settings_reach_the_job(tmp_path: Path) -> None:
    env = job_env(
        tmp_path,
        ["storage.embedded=false", "storage.job_role_arn=arn:aws:iam::123456789012:role/jobs"],
        checkpoint=CheckpointSpec(
            enabled=False, interval_s=90.0, keep_last=5, uri="s3://team-ckpt/llama/run-7/"
        ),
    )
    assert env["RCP_CHECKPOINT_URI"] == "s3://team-ckpt/llama/run-7"
    assert env["RCP_CHECKPOINT_ENABLED"] == "0"
    assert env["RCP_CHECKPOINT_INTERVAL_S"] == "90" and env["RCP_CHECKPOINT_KEEP_LAST"] == "5"
    assert "RCP_STORAGE_ENDPOINT_URL" not in env  # AWS's own endpoint


def test_local_nodes_carry_the_embedded_keys_only_when_jobs_share_them_and_profiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    scoped = node_env(load_config(None, [f"state_dir={tmp_path}"]), "cid")
    assert "AWS_ACCESS_KEY_ID" not in scoped and "AWS_SECRET_ACCESS_KEY" not in scoped
    shared = [f"state_dir={tmp_path}", "storage.job_credentials=shared"]
    env = node_env(load_config(None, shared), "cid")
    assert env["AWS_ACCESS_KEY_ID"] == EMBEDDED_ACCESS_KEY
    assert env["AWS_SECRET_ACCESS_KEY"] == EMBEDDED_SECRET_KEY
    assert env["RAY_DASHBOARD_ENABLE_PROFILING"] == "1"
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert os.path.exists(os.path.join(os.path.dirname(sys.executable), "py-spy"))
    real = load_config(None, [*shared, "storage.embedded=false"])
    assert "AWS_ACCESS_KEY_ID" not in node_env(real, "cid")
