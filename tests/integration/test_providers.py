"""Several external providers on a real cluster (issue 28, item 2): the cheapest provider
hosts serving's growth; when it stops delivering, the next one does; when it delivers again,
the dearer provider's node is drained and its replica moves back; a node its provider takes
back with notice (a spot reclaim, `rcp fault reclaim`) has its replica running elsewhere
before it goes. No request fails.

Real parts: the embedded cluster (`rcp up`: Ray, the autoscaler with the fake multi-node
provider playing two providers, ``cheap`` and ``dear``, one node type each), the controller
actor (demand, placement, the capacity requests that name a provider), Serve with the
production app, HTTP load on the serve endpoint, and `rcp fault stockout` (the local
stand-in for a provider out of stock: its node type launches nothing).

The cluster pool is one node with one GPU, which the sample model's first replica holds:
what a gang holding the cluster pool does to placement, so every replica the load adds must
be rented. The model answers after 1 s and wants one replica per request in flight: a client
sending back to back is in flight nearly all the time, so each client reads as about one
replica on the load board.

Marked ``full``: the provider rules are unit tables (test_providers_policy,
test_placement_policy, test_loop_claim); this plays them once on real parts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from click.testing import CliRunner

from controlplane.cli import cli
from controlplane.config import Config
from controlplane.ray_connection import connect
from controlplane.sdk import Client
from tests.integration.conftest import Load, pools_of, start_local_cluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.full]

DEADLINE_S = 45
"""``cheap``'s delivery deadline: past it with a node owed, it is out (a node starts in about
20 s here, up to 40 s on a loaded machine)."""
BACKOFF_S = 60
"""How long ``cheap`` stays out: then it is asked again."""


@pytest.fixture(scope="module")
def providers_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Config, Client]]:
    conf = tmp_path_factory.mktemp("providers-conf") / "rcp.yaml"
    conf.write_text(
        "pools:\n"
        "  external:\n"
        "    idle_timeout_s: 600\n"
        "    providers:\n"
        "      - {name: dear, price_per_gpu_hour: 3.0, max_nodes: 2, gpus_per_node: 1,\n"
        "         cpus_per_node: 2, delivery_deadline_s: 120}\n"
        "      - {name: cheap, price_per_gpu_hour: 1.0, max_nodes: 2, gpus_per_node: 1,\n"
        f"         cpus_per_node: 2, delivery_deadline_s: {DEADLINE_S}, backoff_s: {BACKOFF_S}}}\n"
        "serving:\n"
        "  models:\n"
        "    - name: sample\n"
        "      min_replicas: 1\n"
        "      max_replicas: 4\n"
        "      num_gpus: 1\n"
        "      num_cpus: 0.5\n"
        "      target_ongoing_requests: 1\n"
        "      upscale_delay_s: 1\n"
        "      downscale_delay_s: 3600\n"
        "      graceful_shutdown_timeout_s: 5\n"
        "      init_kwargs: {extra_latency_ms: 1000}\n"
    )
    cfg, cluster = start_local_cluster(
        tmp_path_factory,
        "pools.cluster.num_nodes=1",
        "pools.cluster.gpus_per_node=1",
        "serve.deploy_app=true",
        config_file=conf,
    )
    try:
        yield cfg, Client(state_dir=cfg.state_path)
    finally:
        cluster.down(echo=lambda _line: None)


SERVING_STATES = ("RUNNING", "PENDING_MIGRATION")
"""A replica on a draining node is PENDING_MIGRATION: it serves until its replacement runs."""


def replicas_by_provider() -> dict[str, int]:
    """Serving external replicas of the sample model per provider label of their node."""
    labels = {n["NodeID"]: n.get("Labels") or {} for n in ray.nodes() if n["Alive"]}
    external = pools_of().get("external") or {}
    counts: dict[str, int] = {}
    for r in external.get("replicas") or []:
        if r["state"] in SERVING_STATES:
            name = labels.get(r["node_id"], {}).get("provider", "?")
            counts[name] = counts.get(name, 0) + 1
    return counts


_SEEN: list[dict[str, int]] = []


def reached(expected: dict[str, int]) -> dict[str, int] | None:
    """The replicas per provider once they are `expected`; prints each change until then."""
    now = replicas_by_provider()
    if not _SEEN or _SEEN[-1] != now:
        _SEEN.append(now)
        print(f"replicas by provider: {now}")
    return now if now == expected else None


def events(client: Client, kind: str) -> list[str]:
    return [str(e["message"]) for e in client.events(limit=500) if e["kind"] == kind]


def stockout(cfg: Config, provider: str, end: bool = False) -> None:
    args = [
        "fault",
        "stockout",
        provider,
        *(["--end"] if end else []),
        f"state_dir={cfg.state_dir}",
    ]
    got = CliRunner().invoke(cli, args)
    assert got.exit_code == 0, got.output


def test_a_provider_out_of_stock_hands_over_to_the_next_and_gets_the_load_back(
    providers_cluster: tuple[Config, Client], tmp_path: Path
) -> None:
    cfg, client = providers_cluster
    connect(cfg)
    url = f"http://127.0.0.1:{cfg.serve.http_port}"
    with Load(url, threads=2, pace_s=0.0, max_duration_s=600) as first:
        # Two requests always in flight: the second replica is rented from the cheapest.
        wait_for(
            "a replica running on provider cheap",
            lambda: replicas_by_provider().get("cheap", 0) >= 1 or None,
            timeout_s=300,
        )
        stockout(cfg, "cheap")
        with Load(url, threads=2, pace_s=0.0, max_duration_s=600) as second:
            # Four in flight: two more replicas; cheap has room for one more but delivers
            # nothing, so past its deadline it is out and dear is asked.
            got = wait_for(
                "two replicas running on provider dear",
                lambda: (lambda c: c if c.get("dear", 0) >= 2 else None)(replicas_by_provider()),
                timeout_s=240,
            )
            assert got.get("cheap") == 1, got
            # The autoscaler may start dear's nodes for the pending replicas before cheap's
            # deadline; placement marks cheap out when the deadline passes.
            rows = wait_for(
                "cheap marked out, dear delivering",
                lambda: (lambda r: r if r["cheap"]["out"] and not r["dear"]["out"] else None)(
                    {p["name"]: p for p in client.serve_status()["providers"]}
                ),
                timeout_s=DEADLINE_S + 60,
            )
            assert rows["dear"]["gpus_live"] == 2, rows
            # Stock back: once its back-off ends cheap is asked again and delivers, and one of
            # dear's nodes is drained; Serve starts its replica on cheap before it stops it.
            stockout(cfg, "cheap", end=True)
            back = wait_for(
                "the load back on cheap (2 replicas) and dear down to 1",
                lambda: reached({"cheap": 2, "dear": 1}),
                timeout_s=BACKOFF_S + 240,
            )
            second.wait_for(second.total + 20)
        first.wait_for(first.total + 20)
    assert back == {"cheap": 2, "dear": 1}
    # Make-before-break between providers: all the way back, the 3 external replicas the
    # load asks for were serving (the drained one until its replacement ran).
    assert all(sum(c.values()) >= 3 for c in _SEEN), _SEEN
    for load in (first, second):
        assert load.errors == [], load.errors[:5]
        assert set(load.statuses) == {200}, load.statuses
    asked = events(client, "serve.external_capacity")
    assert any("out: cheap" in m for m in asked), asked
    (drain, *_) = events(client, "serve.provider_drain")
    assert "provider dear" in drain and "cheaper" in drain, drain
    print(f"requests: {sum(first.statuses.values()) + sum(second.statuses.values())}, all 200")
    print("capacity requests:", *asked, sep="\n  ")
    print("drain:", drain)


NOTICE_S = 60
"""The reclaim's notice: time for a new node (about 20 s here) and a replica to start."""


def test_a_node_given_notice_has_its_replica_running_elsewhere_before_it_goes(
    providers_cluster: tuple[Config, Client],
) -> None:
    """Four requests in flight: sample runs 1 replica on the cluster pool and 3 rented, 2 of
    them on cheap (as the first test leaves it). Cheap takes back one of its nodes with 60 s
    of notice: the node is drained at once, so placement asks for the capacity again and
    Serve starts the replica elsewhere (dear, which has room, or a new cheap node once the
    noticed one is gone) before it stops the one on the noticed node; then the node goes."""
    cfg, client = providers_cluster
    connect(cfg)
    stockout(cfg, "cheap", end=True)  # whatever the first test left
    url = f"http://127.0.0.1:{cfg.serve.http_port}"
    with Load(url, threads=4, pace_s=0.0, max_duration_s=600) as load:
        wait_for(
            "3 external replicas serving, 2 of them on cheap",
            lambda: (lambda c: c if sum(c.values()) >= 3 and c.get("cheap", 0) >= 2 else None)(
                replicas_by_provider()
            ),
            timeout_s=300,
        )
        labels = {n["NodeID"]: n.get("Labels") or {} for n in ray.nodes() if n["Alive"]}
        victim = next(
            r["node_id"]
            for r in (pools_of().get("external") or {}).get("replicas") or []
            if r["state"] == "RUNNING" and labels.get(r["node_id"], {}).get("provider") == "cheap"
        )
        seen: list[tuple[dict[str, int], bool]] = []
        result: list[Any] = []
        args = [
            "fault",
            "reclaim",
            victim,
            "--notice-s",
            str(NOTICE_S),
            f"state_dir={cfg.state_dir}",
        ]
        reclaim = threading.Thread(target=lambda: result.append(CliRunner().invoke(cli, args)))

        def moved() -> dict[str, int] | None:
            external = (pools_of().get("external") or {}).get("replicas") or []
            on_victim = any(
                r["node_id"] == victim and r["state"] in SERVING_STATES for r in external
            )
            now = replicas_by_provider()
            if not seen or seen[-1] != (now, on_victim):
                seen.append((now, on_victim))
                print(f"replicas by provider: {now}; one on the noticed node: {on_victim}")
            return (
                now if not reclaim.is_alive() and not on_victim and sum(now.values()) >= 3 else None
            )

        reclaim.start()
        got = wait_for("the noticed node gone, its replica elsewhere", moved, timeout_s=240)
        load.wait_for(load.total + 20)
    reclaim.join(timeout=5)
    (done,) = result
    assert done.exit_code == 0, done.output
    assert "taken back" in done.output, done.output
    assert victim not in {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    # Elsewhere: a new cheap node once the noticed one is gone, or dear, which had room.
    assert sum(got.values()) >= 3, got
    # Before the node went, the replacement was serving: never fewer than 3 external replicas.
    assert all(sum(c.values()) >= 3 for c, _ in seen), seen
    assert load.errors == [], load.errors[:5]
    assert set(load.statuses) == {200}, load.statuses
    print(f"requests: {sum(load.statuses.values())}, all 200; {done.output.strip()}")
