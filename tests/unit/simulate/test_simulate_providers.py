"""The simulated external pool of several providers: each provider's nodes, labels, stock-outs,
idle release and bill; the baselines renting cheapest first; our scheme taking the request
to the next provider while the cheapest is out, and draining back to it make-before-break."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.simulate.baselines import cheapest_first
from controlplane.simulate.engine import EventKind, EventQueue
from controlplane.simulate.nodes import ProviderSpec
from controlplane.simulate.report import summarise, table
from controlplane.simulate.run import SchemeResult, simulate
from controlplane.simulate.scenario import Scenario, control_config, scenario_from_dict
from controlplane.simulate.serving import SimServe
from controlplane.simulate.trace import make_trace
from controlplane.simulate.world import World
from policies.providers import Provider, provider_of
from policies.snapshot import Pool, ReplicaState

HOUR = 3600.0
QUIET = {"gpu_mttf_hours": 1e9, "hot_faults_per_node_year": 0, "fabric_faults_per_node_year": 0}


def spec(
    name: str, price: float, max_nodes: int, gpus_per_node: int = 8, **more: Any
) -> ProviderSpec:
    return ProviderSpec(name, gpus_per_node, max_nodes, price, **more)


def provider(name: str, price: float, max_nodes: int) -> dict[str, Any]:
    """One entry of ``pools.external.providers`` (8-GPU nodes)."""
    return {"name": name, "price_per_gpu_hour": price, "max_nodes": max_nodes, "gpus_per_node": 8}


def world(*providers: ProviderSpec, provision_s: float = 300.0) -> World:
    return World(1, 8, providers, provision_s, 30.0, EventQueue())


def run_events(w: World, until_s: float, serve: SimServe | None = None) -> None:
    """Apply the world's (and Serve's) events up to `until_s`, as `run.simulate` does."""
    q = w.events
    while len(q) and (q.peek_time() or 0.0) <= until_s:
        batch = q.pop_instant()
        if serve is not None:
            serve.advance(batch[0].at_s - w.now_s)
        w.advance(batch[0].at_s)
        for ev in batch:
            if ev.kind is EventKind.EXTERNAL_NODE_UP:
                w.external_up(ev.subject)
            elif ev.kind is EventKind.EXTERNAL_IDLE:
                w.release_idle_external()
            elif serve is not None and ev.kind is EventKind.REPLICA_READY:
                serve.ready(ev.subject, ev.version)
            elif serve is not None and ev.kind is EventKind.REPLICA_GONE:
                serve.gone(ev.subject, ev.version)
    if serve is not None:
        serve.advance(until_s - w.now_s)
    w.advance(until_s)


# --- the baselines rent cheapest first ----------------------------------------------------------

CHEAP_DEAR_TIE = (spec("dear", 3.5, 2), spec("cheap", 2.5, 2), spec("also-cheap", 2.5, 1))


@pytest.mark.parametrize(
    "gpus, expected",
    [
        (0, {"cheap": 0, "also-cheap": 0, "dear": 0}),
        (10, {"cheap": 10, "also-cheap": 0, "dear": 0}),
        (20, {"cheap": 16, "also-cheap": 4, "dear": 0}),
        (30, {"cheap": 16, "also-cheap": 8, "dear": 6}),
        (99, {"cheap": 16, "also-cheap": 8, "dear": 16}),
    ],
    ids=["none", "cheapest-only", "tie-in-config-order", "spills-to-dear", "capped-at-the-most"],
)
def test_cheapest_first_fills_the_cheapest_provider_up_to_its_most(
    gpus: int, expected: dict[str, int]
) -> None:
    assert cheapest_first(CHEAP_DEAR_TIE, gpus) == expected


# --- the world: nodes, labels, stock-outs, release, bill ----------------------------------------


@pytest.mark.parametrize(
    "asked, nodes",
    [
        ({"a": 1}, {"a": 1, "b": 0}),
        ({"a": 9, "b": 7}, {"a": 2, "b": 2}),
        ({"a": 99, "b": 99}, {"a": 2, "b": 3}),
        ({"b": 5}, {"a": 0, "b": 2}),
    ],
    ids=["one-node", "rounded-up-per-provider", "capped-per-provider", "own-node-size"],
)
def test_each_provider_gets_its_own_nodes_with_its_label(
    asked: dict[str, int], nodes: dict[str, int]
) -> None:
    w = world(spec("a", 2.5, 2), spec("b", 3.5, 3, gpus_per_node=4))
    w.want_external(asked)
    run_events(w, 400.0)
    assert {k: len(v) for k, v in w.external_of.items()} == nodes
    policy_view = (Provider("a", 16, 2.5), Provider("b", 12, 3.5))
    for name, mine in w.external_of.items():
        for n in mine.values():
            view = n.view()
            assert view.pool is Pool.EXTERNAL and view.healthy
            assert view.gpus_total == w.providers[name].gpus_per_node
            assert provider_of(view, policy_view) == name


@pytest.mark.parametrize(
    "bundles, nodes",
    [
        ([{"GPU": 8.0, "provider_b": 1.0}, {"GPU": 8.0, "provider_b": 1.0}], {"a": 0, "b": 2}),
        ([{"GPU": 4.0, "provider_a": 1.0}, {"GPU": 8.0, "provider_b": 1.0}], {"a": 1, "b": 1}),
        ([{"GPU": 8.0, "pool_external": 1.0}], {"a": 1, "b": 0}),
    ],
    ids=["named", "one-each", "unnamed-to-the-first"],
)
def test_request_resources_rents_from_the_provider_each_bundle_names(
    bundles: list[dict[str, float]], nodes: dict[str, int]
) -> None:
    w = world(spec("a", 2.5, 2), spec("b", 3.5, 2))
    SimServe(w, w.events, {}, {}, {}, 1.0, 1.0).request_external(bundles)
    assert w.external_wanted == nodes


def test_an_unknown_provider_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown provider"):
        world(spec("a", 2.5, 2)).want_external({"b": 8})


def test_a_stocked_out_provider_delivers_nothing_in_its_window_and_bills_nothing() -> None:
    """Provider ``a`` is out from 1 h to 3 h: a node asked of it at 1 h is up at 3 h plus the
    provision time and billed from 3 h; ``b``, asked at the same time, is up after 300 s."""
    w = world(spec("a", 2.5, 2, stockouts_s=((HOUR, 3 * HOUR),)), spec("b", 3.5, 2))
    run_events(w, HOUR)
    w.want_external({"a": 8, "b": 8})
    run_events(w, 2.9 * HOUR)
    up = {name: [n.up for n in mine.values()] for name, mine in w.external_of.items()}
    assert up == {"a": [False], "b": [True]}
    run_events(w, 3 * HOUR + 300.0)
    assert all(n.up for n in w.external.values())
    billed = w.tally.external_gpu_s_by
    assert billed["b"] == pytest.approx(8 * 2 * HOUR + 8 * 300.0)
    assert billed["a"] == pytest.approx(8 * 300.0)
    assert w.tally.external_gpu_s == pytest.approx(billed["a"] + billed["b"])


def test_idle_nodes_beyond_a_providers_ask_go_and_busy_ones_stay_until_idle() -> None:
    w = world(spec("a", 2.5, 2), spec("b", 3.5, 2))
    w.want_external({"a": 16, "b": 16})
    run_events(w, 400.0)
    busy = next(iter(w.external_of["b"]))
    w.take(busy, 2, training=False)
    w.want_external({"a": 16, "b": 0})
    run_events(w, 500.0)
    assert {k: list(v) for k, v in w.external_of.items()} == {
        "a": list(w.external_of["a"]),
        "b": [busy],
    }
    assert len(w.external_of["a"]) == 2
    w.give(busy, 2, training=False)  # idle now: it goes after the idle timeout
    run_events(w, 600.0)
    assert not w.external_of["b"] and len(w.external_of["a"]) == 2


# --- a drained external node: make-before-break -------------------------------------------------


@pytest.mark.parametrize(
    "asked, live, pending",
    [(16, 2, 1), (8, 1, 0), (0, 1, 0)],
    ids=["still-asked-for-replaced", "not-asked-for-not-replaced", "nothing-asked"],
)
def test_a_drained_node_is_replaced_only_while_its_provider_is_asked_for_it(
    asked: int, live: int, pending: int
) -> None:
    """The ask stands (``request_resources``): two nodes up, one drained; a new one is rented
    only if the provider is still asked for two."""
    w = world(spec("a", 2.5, 2))
    w.want_external({"a": 16})
    run_events(w, 400.0)
    first, _ = w.external_of["a"]
    w.take(first, 1, training=False)  # busy: the ask's drop alone does not release it
    w.want_external({"a": asked})
    assert w.drain_external(first)
    mine = w.external_of["a"].values()
    assert w.live_count("a") == live
    assert sum(1 for n in mine if not n.up) == pending


RPS = 10.0


def test_a_drained_external_node_hands_its_replicas_over_before_it_goes() -> None:
    """Four replicas on ``dear``'s node; ``cheap`` has room. Draining the ``dear`` node starts
    four replacements on ``cheap``, stops the drained ones only once those run (never short),
    and the node then goes, its bill with it."""
    w = world(spec("cheap", 2.5, 1), spec("dear", 3.5, 1))
    serve = SimServe(w, w.events, {"m": 2}, {"m": RPS}, {"m": 1.0}, 60.0, 10.0)
    w.want_external({"dear": 8})
    run_events(w, 300.0, serve)
    serve.set_demand("m", 4 * RPS)
    serve.targets[("m", Pool.EXTERNAL)] = 4
    serve.reconcile()
    run_events(w, 400.0, serve)
    assert serve.running("m") == 4 and not serve.short("m")
    short_before = sum(serve.figures["m"].short_s.values())  # the first replicas' start
    (dear_node,) = w.external_of["dear"]
    w.want_external({"cheap": 8, "dear": 0})
    run_events(w, 700.0, serve)  # cheap's node is up; dear's is busy, so it stays
    assert list(w.external_of["dear"]) == [dear_node]
    assert w.drain_external(dear_node) and not w.drain_external(dear_node)
    assert not w.external[dear_node].view().healthy
    serve.reconcile()
    starting = [r for r in serve.by_model["m"] if r.state is ReplicaState.STARTING]
    assert len(starting) == 4 and {r.node_id for r in starting} == set(w.external_of["cheap"])
    run_events(w, 2000.0, serve)
    assert not w.external_of["dear"] and w.draining == 0
    assert {r.node_id for r in serve.by_model["m"]} == set(w.external_of["cheap"])
    assert serve.running("m") == 4
    assert sum(serve.figures["m"].short_s.values()) == short_before
    dear_billed = w.tally.external_gpu_s_by["dear"]
    run_events(w, 3000.0, serve)
    assert w.tally.external_gpu_s_by["dear"] == dear_billed


# --- the schemes on a fleet of two providers, the cheaper one stocked out -----------------------


def two_providers(stockout: tuple[float, float], **serving: Any) -> Scenario:
    """Two 8-GPU owned nodes and serving only, one model of 1-GPU replicas that needs up to
    30 of them: the rest rented from ``dear`` (listed first) or ``cheap`` (4 nodes each);
    ``cheap`` delivers nothing from `stockout` [0] to [1] hours."""
    model = {
        "name": "m",
        "gpus_per_replica": 1,
        "replica_rps": 10,
        "peak_rps": 300,
        "min_replicas": 1,
        "max_replicas": 60,
        **serving,
    }
    return scenario_from_dict(
        {
            "nodes": 2,
            "days": 1,
            "failures": QUIET,
            "training": {"jobs": 0, "gang_gpus": {"8": 1.0}},
            "serving": {"models": [model], "noise": 0},
            "external": {
                "stockout_start_hours": [stockout[0]],
                "stockout_hours": stockout[1] - stockout[0],
            },
            "config": {
                "pools.external.providers": [provider("dear", 3.5, 4), provider("cheap", 2.5, 4)]
            },
        }
    )


def per_provider(w: World) -> dict[str, tuple[int, int]]:
    """(nodes up, GPUs used) per provider."""
    return {
        name: (sum(1 for n in mine.values() if n.up), sum(n.used for n in mine.values()))
        for name, mine in w.external_of.items()
    }


def test_ours_takes_a_stocked_out_providers_share_to_the_next_and_comes_back() -> None:
    """Flat demand of 38 replicas (300 requests/s at 80 % of 10 each), 16 on the owned
    nodes: 22 GPUs rented. ``cheap`` is out
    for the first 3 hours: placement marks it out after its delivery deadline (900 s) and
    asks ``dear``; no ``cheap`` node is up before 3 h; afterwards the load drains back to
    ``cheap`` one node at a time and ``dear`` is released."""
    s = two_providers((0.0, 3.0), trough_fraction=1.0)
    seen: list[tuple[float, dict[str, tuple[int, int]]]] = []

    def check(w: World, serve: SimServe, _: object) -> None:
        seen.append((w.now_s, per_provider(w)))

    r = simulate(s, "ours", make_trace(s), control_config(s), on_step=check)
    window = [p for t, p in seen if t < 3 * HOUR]
    assert window and all(p["cheap"] == (0, 0) for p in window)
    assert any(p["dear"][1] > 0 for p in window)
    first_dear = min(t for t, p in seen if p["dear"][0])
    assert first_dear == pytest.approx(900.0 + 300.0, abs=60.0)
    asked = [m for k, m in r.plan_events if k == "serve.external_capacity"]
    assert "out: cheap" in asked[1] and "dear 22" in asked[1]
    assert seen[-1][1]["dear"] == (0, 0) and seen[-1][1]["cheap"][1] > 0
    assert any(k == "serve.provider_drain" for k, _ in r.plan_events)
    f = r.figures
    assert f["shortfall_moves_min"] == 0.0
    assert f["shortfall_min"] <= 25.0  # the first 20 minutes: the deadline and a node start
    cost = {name: row["cost"] for name, row in r.providers.items()}
    assert cost["dear"] > 0 and cost["cheap"] > 0
    assert sum(cost.values()) == pytest.approx(f["external_cost"])
    gpu_h = sum(row["gpu_h"] for row in r.providers.values())
    assert gpu_h == pytest.approx(f["external_gpu_h"])


def test_evict_first_rents_the_cheapest_and_waits_out_its_stockout() -> None:
    """Demand rises from a trough at midnight to a peak at noon; ``cheap`` is out from 6 h to
    10 h. Evict-first asks ``cheap`` (it has room for all of it) and never ``dear``: the
    replicas it wants rented wait for ``cheap``'s window to end."""
    s = two_providers((6.0, 10.0), trough_fraction=0.1, peak_hour=12.0)
    seen: list[tuple[float, dict[str, tuple[int, int]], int]] = []

    def check(w: World, serve: SimServe, _: object) -> None:
        seen.append((w.now_s, per_provider(w), serve.targets.get(("m", Pool.EXTERNAL), 0)))

    r = simulate(s, "evict-first", make_trace(s), control_config(s), on_step=check)
    assert all(p["dear"] == (0, 0) for _, p, _ in seen)
    window = [(p["cheap"][0], target) for t, p, target in seen if 6 * HOUR + 300 < t < 10 * HOUR]
    up_at_start = window[0][0]
    assert all(up == up_at_start for up, _ in window)  # nothing new comes in the window
    assert max(target for _, target in window) > up_at_start * 8  # while it wants more
    assert max(p["cheap"][0] for t, p, _ in seen if t > 10 * HOUR + 300) > up_at_start
    assert r.providers["dear"]["gpu_h"] == 0.0 and r.providers["cheap"]["gpu_h"] > 0
    assert r.figures["external_cost"] == pytest.approx(r.providers["cheap"]["cost"])


# --- the report: cost per provider for every scheme ---------------------------------------------


def test_the_report_gives_each_providers_hours_and_cost_for_every_scheme() -> None:
    s = scenario_from_dict({"nodes": 64, "days": 1})

    def result(name: str, cheap_h: float, dear_h: float) -> SchemeResult:
        rows = {
            "cheap": {"price_per_gpu_hour": 2.5, "gpu_h": cheap_h, "cost": 2.5 * cheap_h},
            "dear": {"price_per_gpu_hour": 3.5, "gpu_h": dear_h, "cost": 3.5 * dear_h},
        }
        figures = dict.fromkeys(
            ("goodput_gpu_h", "idle_while_queued_gpu_h", "lost_to_failures_gpu_h",
             "checkpoint_stall_gpu_h", "restore_gpu_h", "utilisation", "training_share",
             "shortfall_moves_min", "jobs_submitted"),
            1.0,
        )  # fmt: skip
        figures["external_gpu_h"] = cheap_h + dear_h
        figures["external_cost"] = 2.5 * cheap_h + 3.5 * dear_h
        return SchemeResult(name, figures, {}, decide_s=[0.001], wall_s=1.0, providers=rows)

    results = {"ours": result("ours", 100.0, 10.0), "evict-first": result("evict-first", 90.0, 0.0)}
    summary = summarise(s, results, 1.0)
    by = summary["external_by_provider"]
    assert by["ours"]["dear"] == {"price_per_gpu_hour": 3.5, "gpu_h": 10.0, "cost": 35.0}
    assert by["evict-first"]["cheap"]["cost"] == 225.0
    lines = table(summary).splitlines()
    cheap = [line for line in lines if line.startswith("  cheap ($2.5/GPU-h)")]
    dear = [line for line in lines if line.startswith("  dear ($3.5/GPU-h)")]
    assert [line.split()[-2:] for line in cheap] == [["100", "90"], ["250", "225"]]
    assert [line.split()[-2:] for line in dear] == [["10", "0"], ["35", "0"]]
