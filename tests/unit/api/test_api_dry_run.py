"""`POST /v1/jobs/dry-run` and `rcp submit --dry-run`: what the control loop would do with a
job were it submitted now, from the loop's own decide phase on its last observation
(`controlplane.loop.what_if`), over a real loopback API on the loop's fakes. Nothing is
stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from controlplane.api.jobs import JobService
from controlplane.api.routes import ApiServer
from controlplane.cli import cli
from controlplane.loop.what_if import what_if
from controlplane.sdk import ApiError, Client
from policies.admission import AdmissionState
from policies.snapshot import Pool, QueuedJob
from tests.unit.loop.test_loop_claim import world
from tests.unit.loop_fakes import make_world

ADMIN_TOKEN = "dry-run-admin-token"


def spec(workers: int = 1, gpus: int = 1, **more: Any) -> dict[str, Any]:
    return {"name": "t", "entrypoint": "python t.py", "num_workers": workers,
            "gpus_per_worker": gpus, **more}  # fmt: skip


def test_a_dry_run_says_what_admission_would_do_and_stores_nothing(tmp_path: Path) -> None:
    w = world(tmp_path)  # c1: 2 GPUs, both held by the sample model's 2 replicas
    service = JobService(w.store, w.cfg, what_if=w.loop.what_if)
    server = ApiServer(service, ADMIN_TOKEN, "127.0.0.1", 0).start()
    try:
        client = Client(server.url, ADMIN_TOKEN)
        with pytest.raises(ApiError, match="has not observed the cluster yet") as early:
            client.dry_run(spec())
        assert early.value.status == 503
        w.tick()
        before = len(w.store.list_jobs())
        # A 1-GPU job heads the queue, and its claim moves a replica out for it now.
        answer = client.dry_run(spec())
        assert answer["admitted"] is False and answer["code"] == "head", answer
        observed = w.loop.last_observed
        assert observed is not None
        assert answer["start_by_s"] == pytest.approx(observed.snapshot.now_s)
        assert answer["ahead"] == 0
        assert [r.split(":")[0] for r in answer["makes_room"]] == ["serve-yields-to-training"]
        # A queued job of higher priority comes first: this one waits behind it.
        first = client.submit({**spec(), "priority_class": "high", "name": "first"})
        w.tick()
        # The real head's estimate is in its view and in `rcp queue` (the claim: now).
        head = client.status(first.id)
        assert head.state == "QUEUED" and head.estimated_start_s is not None
        env = {"RCP_API_URL": server.url, "RCP_API_TOKEN": ADMIN_TOKEN}
        listed = CliRunner().invoke(cli, ["queue"], env=env)
        assert f"  {first.id}  " in listed.output and "starts by " in listed.output
        behind = client.dry_run({**spec(), "priority_class": "low"})
        assert (behind["admitted"], behind["code"], behind["ahead"]) == (False, "queued-behind", 1)
        assert behind["start_by_s"] is None
        assert len(w.store.list_jobs()) == before + 1  # only the real submission
        # A bad spec is refused as a submission is.
        with pytest.raises(ApiError, match="num_workers") as bad:
            client.dry_run(spec(workers=0))
        assert bad.value.status == 400
        # The CLI says it in words.
        command = ["submit", "--dry-run", "--priority", "low", "--", "python", "t.py"]
        out = CliRunner().invoke(cli, command, env=env)
        assert out.exit_code == 0, out.output
        assert out.output.startswith("would wait (queued-behind): queued-behind: 1 job(s)")
        assert "estimated start: unknown" in out.output
        assert len(w.store.list_jobs()) == before + 1
    finally:
        server.stop()
        w.store.close()


def test_what_if_admits_a_job_that_fits_and_reserves_for_a_head_until_a_gang_ends(
    tmp_path: Path,
) -> None:
    """The pure read-back on a loop's observation: free GPUs admit (``fits``, now); a head
    that must wait for a gang with a max runtime gets the reservation's time."""
    w = make_world(tmp_path)  # the sample model's 1 replica holds 1 of c1's 4 GPUs
    w.cluster.add("c1", Pool.CLUSTER, gpus=4)
    w.tick()
    observed = w.loop.last_observed
    assert observed is not None
    now = observed.snapshot.now_s
    job = QueuedJob("probe", "default", "medium", 1, 2, submitted_s=0.0)
    state, serving = w.loop._states()
    fits = what_if(observed, w.loop.policies, state, serving, job)
    assert (fits.admitted, fits.code, fits.start_by_s) == (True, "fits", now)
    # A gang holds the other 3 until its max runtime ends; a 2 x 2 GPU job then heads the
    # queue (same priority: no preemption) and is reserved for at that time.
    running = w.jobs.submit("holder", workers=1, gpus=3, max_runtime_s=600.0)
    for _ in range(5):
        w.tick()
    assert w.store.get(running).state.value in ("ADMITTED", "RUNNING")
    observed = w.loop.last_observed
    assert observed is not None
    admitted_s = float(w.store.get(running).info["admitted_s"])
    big = QueuedJob("probe", "default", "high", 2, 2, submitted_s=0.0)
    head = what_if(observed, w.loop.policies, AdmissionState(), serving, big)
    assert (head.admitted, head.code) == (False, "head")
    assert head.start_by_s == pytest.approx(admitted_s + 600.0)
    assert "expected to start in" in head.reason
