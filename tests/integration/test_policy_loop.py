"""The policy loop end to end (issue 6): training claims the cluster, serving moves to the
external pool make-before-break with zero failed requests, the gang is admitted, and after
the job the replicas come back a step at a time and the external pool scales to zero; the
simulator's replay of that claim and return writes the same plan items as the loop recorded
(issue 17), with the move times measured from the same events. The
claim starts while an operator has paused the policy actor (issue 15): it waits, with the
replicas in place and no request failing, until the resume. Model classes (issue 16): a gang
that needs most of the pool moves the low-priority model out first and the high-priority one
only down to its floor, and they come back in the reverse order; a gang that would need the
floor waits with a reason naming the model.

Real parts: the embedded cluster (`rcp up`: Ray, the autoscaler with its fake multi-node
provider, Serve with the production app), the controller actor (API, admission, serving
loop), a Ray Train gang from the example script, HTTP load on the Serve endpoint.

The cluster pool is one node with 4 logical GPUs. The sample model (the lowest priority
class) runs 2 one-GPU replicas there, and ``ranker`` (priority high, ``min_cluster_replicas``
1) 2 more, so a 2-GPU gang can only run once both sample replicas have moved out (ranker's
stay: it outranks sample), a 3-GPU gang moves sample's 2 and one of ranker's, and a 4-GPU
gang would need ranker's floor.

Marked ``full`` (``bash infra/local/test.sh --full``): the default run plays a claim and a
return under load with zero failed requests on a real cluster once, in test_node_health's
first test (which adds the hot node, its replacement and the gang's resume); the loop's logic
is unit-tested on its fakes (test_loop_claim, test_loop_restart, test_model_classes,
test_loop_guards) and the simulator's replay (test_simulate_replay).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from controlplane.cli import cli
from controlplane.config import Config
from controlplane.ray_connection import connect
from controlplane.sdk import ApiError, Client, Job
from controlplane.simulate.calibrate import calibrate
from controlplane.simulate.replay import claim_and_return, plan_codes
from controlplane.timeline.collect import TimelineInputs
from controlplane.timeline.draw import PNG_SIGNATURE
from tests.integration.conftest import (
    Load,
    free_ports,
    pools_of,
    report_ray_metrics_fast,
    start_local_cluster,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.full]
report_ray_metrics_fast()  # this module reads ray_* series

EXAMPLE = "jobs.examples.train_mnistlike:train_loop"
MIGRATE_BACK_INTERVAL_S = 4.0
RANKER = "ranker"
"""The high-priority model beside the sample model, with a floor of 1 cluster replica."""


def two_model_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample model (lowest class) and ranker (high, floor 1), 2 one-GPU replicas each."""
    conf = tmp_path_factory.mktemp("serving-conf") / "rcp.yaml"
    model = (
        "      min_replicas: 2\n"
        "      max_replicas: 2\n"
        "      num_gpus: 1\n"
        "      num_cpus: 0.5\n"
        "      graceful_shutdown_timeout_s: 5\n"
    )
    conf.write_text(
        "serving:\n  models:\n"
        f"    - name: sample\n{model}"
        f"    - name: {RANKER}\n      priority: high\n      min_cluster_replicas: 1\n{model}"
    )
    return conf


@pytest.fixture(scope="module")
def loop_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Config, Client]]:
    conf = two_model_config(tmp_path_factory)
    cfg, cluster = start_local_cluster(
        tmp_path_factory,
        "pools.cluster.num_nodes=1",
        "pools.cluster.gpus_per_node=4",
        "pools.external.providers=[{name: rent-a, max_nodes: 2}]",
        "pools.external.idle_timeout_s=8",
        "serve.deploy_app=true",
        "placement.migrate_back_idle_s=2",
        "placement.migrate_back_step=1",
        f"placement.migrate_back_interval_s={MIGRATE_BACK_INTERVAL_S}",
        "jobs.gang_start_timeout_s=300",
        # Prometheus for `rcp timeline` (the last test), on a port of the module's own.
        "observability.prometheus=true",
        f"observability.prometheus_port={free_ports(1)[0]}",
        config_file=conf,
    )
    try:
        yield cfg, Client(state_dir=cfg.state_path)
    finally:
        cluster.down(echo=lambda _line: None)


def submit_gang(
    client: Client, name: str, train_config: dict[str, object], num_workers: int = 2
) -> Job:
    """The example gang, `num_workers` x 1 GPU at high priority (2: the GPUs sample holds)."""
    return client.submit(
        {
            "name": name,
            "entrypoint": EXAMPLE,
            "num_workers": num_workers,
            "gpus_per_worker": 1,
            "priority_class": "high",
            "runtime_env": {"env_vars": {"RCP_TRAIN_CONFIG": json.dumps(train_config)}},
        }
    )


def test_training_claims_the_cluster_and_serving_comes_back(
    loop_cluster: tuple[Config, Client], tmp_path: Path
) -> None:
    cfg, client = loop_cluster
    connect(cfg)
    serve_url = f"http://{cfg.ray.node_ip}:{cfg.serve.http_port}"
    assert pools_of()["cluster"]["running"] == 2
    assert pools_of()["external"]["running"] == 0

    train_config = {
        "num_steps": 6,
        "checkpoint_every": 1000,
        "step_sleep_s": 1.0,
        "log_path": str(tmp_path / "steps.log"),
    }
    with Load(serve_url, threads=2, max_duration_s=280) as load:
        load.wait_for(20)
        # Issue 15: an operator pauses the policy actor before the gang arrives. The claim it
        # would make is held (a policy.held event says so), the gang waits, the replicas stay.
        assert client.pause("integration: hold the claim")["changed"]
        try:  # the module's later tests need the actor running: resume whatever happens
            job = submit_gang(client, "claims-the-cluster", train_config)
            wait_for(
                "the claim held while paused",
                lambda: [
                    e
                    for e in client.events(limit=2000)
                    if e["kind"] == "policy.held"
                    and e["message"].startswith("MoveServeReplicas held")
                ],
                60,
            )
            assert client.status(job.id).state == "QUEUED"
            assert pools_of()["cluster"]["running"] == 2
            assert pools_of()["external"]["target"] == 0
            assert client.serve_status()["policy"]["paused"] is True
        finally:
            resumed = client.resume("integration: let it go")
        assert resumed["was"]["reason"] == "integration: hold the claim"
        # The replicas leave for the external pool (an external node is added for them)...
        wait_for("replicas on external", lambda: pools_of()["external"]["running"] == 2, 180)
        # ...and only then does the gang get the cluster pool.
        wait_for(
            "the gang to run", lambda: client.status(job.id).state in {"RUNNING", "SUCCEEDED"}, 240
        )
        assert pools_of()["cluster"]["running"] == 0
        final = client.wait(job.id, timeout_s=300, poll_s=1.0)
        assert final.state == "SUCCEEDED", final.message
        # After the job, replicas come back one per interval and the external pool empties.
        wait_for(
            "replicas back on the cluster pool",
            lambda: pools_of()["cluster"]["running"] == 2 and pools_of()["external"]["target"] == 0,
            120,
        )
    assert load.total > 50
    assert not load.errors, load.errors[:5]
    assert set(load.statuses) == {200}
    served_by = set(load.pools)
    assert {"cluster", "external"} <= served_by  # traffic followed the replicas both ways

    def moves_ended() -> bool:  # the last move back drains its external replica last
        kinds = [e["kind"] for e in client.events(limit=1000)]
        ends = kinds.count("serve.move.done") + kinds.count("serve.move.unwound")
        return kinds.count("serve.move.start") == ends >= 3

    wait_for("every move ended", moves_ended, 60)
    events = client.events(limit=1000)
    kinds = [e["kind"] for e in events]
    assert "serve.move.done" in kinds
    out = [
        e
        for e in events
        if e["kind"] == "serve.move.start" and "cluster -> external" in e["message"]
    ]
    back = [
        e
        for e in events
        if e["kind"] == "serve.move.start" and "external -> cluster" in e["message"]
    ]
    assert out and "yield_to_training" in out[0]["message"]
    assert len(back) == 2, back  # one replica per step
    gap_s = back[1]["at_s"] - back[0]["at_s"]
    assert gap_s >= MIGRATE_BACK_INTERVAL_S - 0.5, gap_s

    # Issue 17: this run's moves measure the local move times, and the simulator's replay of
    # the same claim and return, with them, writes the plan items the loop recorded here.
    saved = tmp_path / "local-move-events.json"
    saved.write_text(json.dumps(events, indent=1))  # bench/local-move-events.json came so
    measured = calibrate(events)
    assert measured.replica_start_s > 0, measured
    placement = cfg.placement
    replay = claim_and_return(
        {
            "pools.external.providers": [
                dataclasses.asdict(p) for p in cfg.pools.external.providers
            ],
            "placement.migrate_back_idle_s": placement.migrate_back_idle_s,
            "placement.migrate_back_step": placement.migrate_back_step,
            "placement.migrate_back_interval_s": placement.migrate_back_interval_s,
        },
        replica_start_s=measured.replica_start_s,
        provision_s=measured.node_start_s,
    )
    # The replay's world has the sample model only; ranker (it outranks sample) never moved.
    assert not [e for e in events if e["kind"].startswith("serve.move") and RANKER in e["message"]]
    real = plan_codes((e["kind"], e["message"]) for e in events if RANKER not in e["message"])
    assert ("policy.AdmitJob", "fits") in real
    assert replay == real, f"{measured.describe()}; events in {saved}"

    # No rented GPU stays: the external node goes after its idle timeout.
    from controlplane.inventory import list_nodes

    wait_for(
        "external pool at zero", lambda: not any(n.pool == "external" for n in list_nodes()), 90
    )


def events_after(client: Client, after: int = 0) -> list[dict[str, Any]]:
    """Every event with a seq past `after`, oldest first (the API pages oldest first)."""
    out: list[dict[str, Any]] = []
    while page := client.events(after=out[-1]["seq"] if out else after, limit=1000):
        out += page
    return out


def last_seq(client: Client) -> int:
    return max((e["seq"] for e in events_after(client)), default=0)


def move_starts(client: Client, after: int, direction: str) -> list[str]:
    """The models of the ``serve.move.start`` events after `after` in `direction`
    (``cluster -> external``), oldest first."""
    return [
        e["message"].split(":", 1)[0]
        for e in events_after(client, after)
        if e["kind"] == "serve.move.start" and direction in e["message"]
    ]


def settled(client: Client) -> bool:
    """No job waits or runs, and both models run all their replicas on the cluster pool."""
    if client.list(state="QUEUED,ADMITTED,RUNNING,PREEMPTED"):
        return False
    return all(
        pools_of(m)["cluster"]["running"] == 2 and pools_of(m)["external"]["target"] == 0
        for m in ("sample", RANKER)
    )


def test_a_claim_moves_the_low_priority_model_first_and_keeps_the_floor(
    loop_cluster: tuple[Config, Client], tmp_path: Path
) -> None:
    """Issue 16: a 3-GPU gang on the 4-GPU pool, both models under load. Sample (lowest class)
    yields both replicas first, ranker one (its floor of 1 stays on the cluster pool); no
    request fails; after the gang ranker comes back first, then sample."""
    cfg, client = loop_cluster
    connect(cfg)
    serve_url = f"http://{cfg.ray.node_ip}:{cfg.serve.http_port}"
    wait_for("both models settled on the cluster pool", lambda: settled(client), 300)
    after = last_seq(client)
    train_config = {
        "num_steps": 4,
        "checkpoint_every": 1000,
        "step_sleep_s": 1.0,
        "log_path": str(tmp_path / "steps.log"),
    }
    loads = [Load(serve_url, model=m, threads=2, max_duration_s=280) for m in ("sample", RANKER)]
    with loads[0] as low, loads[1] as high:
        low.wait_for(10)
        high.wait_for(10)
        job = submit_gang(client, "claims-most", train_config, num_workers=3)
        wait_for(
            "the gang to run", lambda: client.status(job.id).state in {"RUNNING", "SUCCEEDED"}, 240
        )
        # While the gang holds 3 GPUs: sample is all external, ranker keeps its floor.
        assert pools_of()["cluster"]["running"] == 0
        assert pools_of(RANKER)["cluster"]["running"] == 1
        assert pools_of(RANKER)["external"]["running"] == 1
        final = client.wait(job.id, timeout_s=300, poll_s=1.0)
        assert final.state == "SUCCEEDED", final.message
        wait_for(
            "both models back on the cluster pool",
            lambda: all(
                pools_of(m)["cluster"]["running"] == 2 and pools_of(m)["external"]["target"] == 0
                for m in ("sample", RANKER)
            ),
            150,
        )
    out = move_starts(client, after, "cluster -> external")
    back = move_starts(client, after, "external -> cluster")
    moves = [e["message"] for e in events_after(client, after) if e["kind"].startswith("serve.")]
    assert out == ["sample", RANKER], moves  # the low-priority model yields first
    assert back[0] == RANKER and back.count("sample") == 2, back  # back in the reverse order
    for load in (low, high):
        assert load.total > 20
        assert not load.errors, load.errors[:5]
        assert set(load.statuses) == {200}
    assert {"cluster", "external"} <= set(low.pools) and {"cluster", "external"} <= set(high.pools)


def test_a_claim_that_would_cross_a_floor_waits_naming_the_model(
    loop_cluster: tuple[Config, Client],
) -> None:
    """Issue 16: a 4-GPU gang needs ranker's floor replica: nothing moves, the gang waits, and
    its reason (`rcp queue`, the job, the event log) names ranker and the floor."""
    cfg, client = loop_cluster
    connect(cfg)
    wait_for("both models settled on the cluster pool", lambda: settled(client), 300)
    after = last_seq(client)
    job = submit_gang(client, "needs-the-floor", {"num_steps": 1}, num_workers=4)
    try:
        floor = f"model '{RANKER}' keeps 1 replica(s) on the cluster pool (min_cluster_replicas)"

        def waits_for_the_floor() -> str | None:
            message = client.status(job.id).message or ""
            return message if floor in message else None

        message = wait_for("the floor reason", waits_for_the_floor, 60)
        assert message.startswith("serving-floor:"), message
        assert client.status(job.id).state == "QUEUED"
        shown = CliRunner().invoke(cli, ["queue", "--state-dir", str(cfg.state_path)])
        assert shown.exit_code == 0 and floor in shown.output, shown.output

        # The job's message is set in the act phase; the event is written in the record phase
        # after it, so the event may come a moment later than the message.
        def floor_event() -> list[dict[str, Any]] | None:
            waits = [
                e
                for e in events_after(client, after)
                if e["kind"] == "policy.WaitJob" and floor in e["message"]
            ]
            return waits or None

        wait_for("the floor's policy.WaitJob event", floor_event, 30)
        assert not move_starts(client, after, "cluster -> external")  # nothing was claimed
        assert pools_of(RANKER)["cluster"]["running"] == 2
    finally:
        client.cancel(job.id)


def resumed(client: Client, after: int) -> bool:
    """The restarted controller answers and has said it resumed the move (``serve.resume``);
    the killed one may still answer for a moment after `ray.kill` returns."""
    try:
        return any(e["kind"] == "serve.resume" for e in events_after(client, after))
    except ApiError:
        return False


def test_controller_killed_mid_move_resumes_without_double_scaling_or_errors(
    loop_cluster: tuple[Config, Client], tmp_path: Path
) -> None:
    import threading

    import ray

    from controlplane.controller.actor import get_controller

    cfg, client = loop_cluster
    connect(cfg)
    serve_url = f"http://{cfg.ray.node_ip}:{cfg.serve.http_port}"
    wait_for("replicas on the cluster pool", lambda: pools_of()["cluster"]["running"] == 2, 120)
    after = last_seq(client)  # the API pages oldest first: not the first 1000's last

    most_external_target = 0
    watched = 0
    watch_errors: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        """Serve's target for the external pool, every 0.3 s (Serve's status, read from
        Serve's controller, does not depend on ours being up)."""
        nonlocal most_external_target, watched
        while not stop.is_set():
            try:
                target = int(pools_of()["external"]["target"])
            except Exception as exc:  # recorded: the test fails on it below
                watch_errors.append(repr(exc))
            else:
                most_external_target = max(most_external_target, target)
                watched += 1
            time.sleep(0.3)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    train_config = {
        "num_steps": 3,
        "checkpoint_every": 1000,
        "step_sleep_s": 1.0,
        "log_path": str(tmp_path / "steps.log"),
    }
    try:
        with Load(serve_url, threads=2, max_duration_s=280) as load:
            load.wait_for(20)
            job = submit_gang(client, "claims-again", train_config)
            wait_for(
                "a move to start",
                lambda: any(e["kind"] == "serve.move.start" for e in events_after(client, after)),
                120,
            )
            ray.kill(get_controller(), no_restart=False)  # the actor restarts (max_restarts=-1)
            # The SDK retries an unreachable API for ~8 s; on a busy machine the restarted
            # actor may take longer to open its port.
            wait_for("the restarted controller", lambda: resumed(client, after), 180)
            final = client.wait(job.id, timeout_s=400, poll_s=1.0)
            assert final.state == "SUCCEEDED", final.message
            wait_for(
                "replicas back",
                lambda: (
                    pools_of()["cluster"]["running"] == 2 and pools_of()["external"]["target"] == 0
                ),
                150,
            )
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert not load.errors, load.errors[:5]
    assert set(load.statuses) == {200}
    assert not watch_errors, watch_errors[:5]
    assert watched >= 10, f"the external pool's target was read only {watched} times"
    assert most_external_target <= 2, "the restarted controller scaled the external pool twice"
    kinds = [e["kind"] for e in events_after(client, after)]
    assert "serve.resume" in kinds


def test_loop_metrics_reach_the_heads_prometheus_endpoint(
    loop_cluster: tuple[Config, Client],
) -> None:
    """The controller's gauges go through Ray's metrics pipeline to the `metrics` endpoint
    `rcp up` prints (what Prometheus scrapes and the dashboard's Metrics tab shows)."""
    import urllib.request

    cfg, _ = loop_cluster
    url = f"http://{cfg.ray.node_ip}:{cfg.ray.metrics_export_port}/metrics"
    wanted = ("rcp_serve_replicas", "rcp_queue_depth", "rcp_gpus", "rcp_serve_route_weight")

    def cluster_running(text: str) -> float | None:
        # One series per reporting process: the controller killed in the previous test may
        # still have its last value exported next to the restarted one's.
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("ray_rcp_serve_replicas{")
            and 'pool="cluster"' in line
            and 'state="running"' in line
        ]
        return max(values) if values else None

    def exported() -> bool:
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        # Both replicas are back on the cluster pool after the previous tests; the gauge
        # follows within a metrics report interval.
        return all(name in text for name in wanted) and cluster_running(text) == 2.0

    wait_for(f"{wanted} on {url} with 2 running cluster replicas", exported, 90)


def test_rcp_timeline_draws_the_claim_from_events_and_prometheus(
    loop_cluster: tuple[Config, Client], tmp_path: Path
) -> None:
    """`rcp timeline` after the claims above (through the API and the cluster's Prometheus):
    a PNG whose panels hold the replicas leaving for the external pool and coming back, the
    gang's GPUs, the traffic, and the admission and the moves as markers."""
    cfg, _ = loop_cluster
    png, inputs = tmp_path / "timeline.png", tmp_path / "inputs.json"
    prometheus = f"http://{cfg.ray.node_ip}:{cfg.observability.prometheus_port}"
    args = [
        "timeline", "--since", "1h", "-o", str(png), "--json", "--prometheus", prometheus,
        "--state-dir", str(cfg.state_path), "--save-inputs", str(inputs),
    ]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    summary = json.loads(result.output)
    assert summary["notes"] == []  # Prometheus answered
    assert {"policy.AdmitJob", "serve.move.start", "serve.move.done", "job.state"} <= set(
        summary["marker_kinds"]
    )
    drawn = TimelineInputs.from_json(json.loads(inputs.read_text())).timeline()
    most = {s.label: max((v for _, v in s.points), default=0.0) for s in drawn.replicas}
    assert most.get("sample/external") == 2.0 and most.get("sample/cluster") == 2.0, most
    gpus = {s.label: max((v for _, v in s.points), default=0.0) for s in drawn.gpus}
    # The module's largest gang: 3 GPUs (the model-class test's claim).
    assert gpus["training"] == 3.0 and gpus["external"] >= 3.0, gpus
    rate = {s.label: max((v for _, v in s.points), default=0.0) for s in drawn.requests}
    assert rate["requests/s"] > 0 and rate["failed/s"] == 0.0, rate
