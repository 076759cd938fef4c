"""Spot reclaims in the simulator: the scenario's fields, the trace's reclaims (seeded, the same
for every scheme), the world taking a rented node back at the end of its notice, our scheme
moving the node's replicas off during the notice, a baseline losing them, and the report."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from controlplane.simulate.engine import EventKind, EventQueue
from controlplane.simulate.nodes import ProviderSpec
from controlplane.simulate.report import summarise, table
from controlplane.simulate.run import SchemeResult, simulate
from controlplane.simulate.scenario import (
    Scenario,
    ScenarioError,
    control_config,
    scenario_from_dict,
    spot_providers,
)
from controlplane.simulate.serving import SimServe
from controlplane.simulate.trace import Reclaim, Trace, make_trace
from controlplane.simulate.world import World
from policies.snapshot import Pool

HOUR = 3600.0
QUIET = {"gpu_mttf_hours": 1e9, "hot_faults_per_node_year": 0, "fabric_faults_per_node_year": 0}
AT = 12 * HOUR
"""When the reclaim of the scheme tests hits: serving's peak, its demand flat around it."""


def provider(name: str, price: float, max_nodes: int) -> dict[str, Any]:
    """One entry of ``pools.external.providers`` (8-GPU nodes)."""
    return {"name": name, "price_per_gpu_hour": price, "max_nodes": max_nodes, "gpus_per_node": 8}


def serving_only(notice_s: float, rate: float = 0.0) -> Scenario:
    """Two 8-GPU owned nodes and one model of 1-GPU replicas, no headroom (target utilisation
    1.0: a replica lost is a replica short): 15 at midnight (the owned nodes hold them), 30 at
    noon, so 14 on two nodes rented from ``spot`` (at most 4)."""
    model = {
        "name": "m",
        "gpus_per_replica": 1,
        "replica_rps": 10,
        "peak_rps": 300,
        "trough_fraction": 0.5,
        "peak_hour": 12.0,
        "min_replicas": 1,
        "max_replicas": 60,
        "target_utilisation": 1.0,
    }
    return scenario_from_dict(
        {
            "nodes": 2,
            "days": 0.55,
            "failures": QUIET,
            "training": {"jobs": 0, "gang_gpus": {"8": 1.0}},
            "serving": {"models": [model], "noise": 0},
            "external": {"reclaim_notice_s": notice_s, "spot_reclaims_per_node_day": rate},
            "config": {"pools.external.providers": [provider("spot", 2.5, 4)]},
        }
    )


def run(
    s: Scenario, scheme: str, reclaims: tuple[Reclaim, ...], on_step: Any = None
) -> SchemeResult:
    cfg = control_config(s)
    trace = dataclasses.replace(make_trace(s, cfg), reclaims=reclaims)
    return simulate(s, scheme, trace, cfg, on_step=on_step)


# --- our scheme moves off during the notice; a baseline without notice handling is short -------


@pytest.mark.parametrize(
    "scheme, notice_s, short",
    [
        ("ours", 900.0, False),
        ("ours", 120.0, True),
        ("evict-first", 900.0, True),
    ],
    ids=[
        "ours-notice-covers-a-node-start",
        "ours-notice-shorter-than-a-node-start",
        "evict-first-has-no-notice-handling",
    ],
)
def test_a_reclaim_with_enough_notice_costs_ours_nothing_and_a_baseline_replicas(
    scheme: str, notice_s: float, short: bool
) -> None:
    """At noon ``spot`` takes back its first node, which holds 8 replicas, and the pool has
    no free GPU. Ours drains it at the notice (it is not healthy in the snapshot), the ask
    stands, so a node is rented in its place at once and the replicas start there: with a
    notice longer than a node start plus a replica start (300 s + 120 s) none is lost and
    serving is never short because of it; with AWS's 120 s the node goes first. Evict-first
    does nothing until the node goes, and rents then. Either way the provider is asked again
    (it is not out of stock) and has two nodes up afterwards."""
    s = serving_only(notice_s)
    before = run(s, scheme, ())
    seen: dict[str, Any] = {}

    def check(w: World, serve: SimServe, _: object) -> None:
        mine = w.external_of["spot"]
        if w.now_s == AT:
            (hit,) = [n for n in mine.values() if n.reclaim_at_s is not None]
            seen["hit"] = hit.node_id
            seen["drained"] = hit.out and not hit.view().healthy
            seen["starting"] = sum(1 for n in mine.values() if not n.up)
        elif w.now_s > AT + notice_s + 1200:
            seen["after"] = sorted(n.node_id for n in mine.values() if n.up)

    after = run(s, scheme, (Reclaim(AT, "spot", 0),), check)
    f, f0 = after.figures, before.figures
    assert f["reclaims"] == 1 and f0["reclaims"] == 0
    assert seen["drained"] is (scheme == "ours")
    assert seen["starting"] == (1 if scheme == "ours" else 0)  # its replacement, at notice
    assert len(seen["after"]) == 2 and seen["hit"] not in seen["after"]
    added = f["shortfall_min"] - f0["shortfall_min"]
    if short:
        assert f["reclaimed_replicas"] > 0
        assert f["shortfall_reclaims_min"] > 0
        assert added == pytest.approx(f["shortfall_reclaims_min"])  # its own category only
    else:
        assert f["reclaimed_replicas"] == 0 and f["shortfall_reclaims_min"] == 0
        assert added == 0.0
    assert f["shortfall_moves_min"] == f0["shortfall_moves_min"]


@pytest.mark.parametrize("scheme", ["static-split", "time-of-day"])
def test_a_scheme_that_rents_nothing_meets_no_reclaim(scheme: str) -> None:
    r = run(serving_only(900.0), scheme, (Reclaim(AT, "spot", 0),))
    assert r.figures["reclaims"] == 0 and r.figures["shortfall_reclaims_min"] == 0


# --- the world: which node a reclaim hits, and the node going ------------------------------------


def test_a_reclaims_slot_is_the_rank_of_a_node_up_and_not_given_notice() -> None:
    """Three nodes up, the first drained (its replacement on its way): slots 0 and 1 are the
    two in service in rental order, slot 2 the drained one, slot 3 nothing (a node not up
    cannot be taken back); a node given notice leaves the ranks."""
    w = World(1, 8, (ProviderSpec("a", 8, 3, 2.5),), 300.0, 30.0, EventQueue())
    w.want_external({"a": 24})
    w.advance(300.0)
    for node_id in list(w.external):
        w.external_up(node_id)
    first, second, third = w.external
    w.take(first, 1, training=False)
    assert w.drain_external(first)
    assert [getattr(w.reclaim_target("a", slot), "node_id", None) for slot in range(4)] == [
        second,
        third,
        first,
        None,
    ]
    w.reclaim_notice(second, 120.0)
    assert w.reclaim_target("a", 0) is w.external[third]


def test_a_reclaimed_node_goes_at_the_end_of_its_notice_and_its_provider_rents_again() -> None:
    """The node is billed and keeps its replicas through the notice; at its end the replicas
    are gone (blamed on reclaims), the node and its bill go, and the provider, still asked
    for two nodes, rents one in its place."""
    w = World(1, 8, (ProviderSpec("a", 8, 2, 2.5),), 300.0, 30.0, EventQueue())
    serve = SimServe(w, w.events, {"m": 8}, {"m": 10.0}, {"m": 1.0}, 60.0, 10.0)
    w.want_external({"a": 16})
    w.advance(300.0)
    for node_id in list(w.external):
        w.external_up(node_id)
    serve.set_demand("m", 20.0)
    serve.targets[("m", Pool.EXTERNAL)] = 2
    serve.reconcile()
    for r in serve.replicas.values():
        serve.ready(r.replica_id, r.version)
    target = w.reclaim_target("a", 0)
    assert target is not None
    w.reclaim_notice(target.node_id, 120.0)
    ev = [e for e in w.events.pop_instant() if e.kind is EventKind.NODE_RECLAIMED]
    while not ev:
        ev = [e for e in w.events.pop_instant() if e.kind is EventKind.NODE_RECLAIMED]
    assert ev[0].at_s == 420.0 and ev[0].subject == target.node_id
    w.advance(420.0)
    billed = w.tally.external_gpu_s_by["a"]
    assert billed == pytest.approx(2 * 8 * 420.0)
    assert serve.node_lost(target.node_id, "reclaims") == 1
    assert serve.figures["m"].cause == "reclaims"
    assert w.reclaimed(target.node_id) and not w.reclaimed(target.node_id)
    assert target.node_id not in w.external and w.live_count("a") == 2
    (new,) = [n for n in w.external.values() if not n.up]
    assert new.ready_s == 420.0 + 300.0 and w.tally.reclaims == 1


# --- the scenario's fields ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, field",
    [
        (
            {"external": {"spot_reclaims_per_node_day": -0.1}},
            "external.spot_reclaims_per_node_day: must be in [0, 24]",
        ),
        (
            {"external": {"spot_reclaims_per_node_day": float("nan")}},
            "external.spot_reclaims_per_node_day: must be a finite number",
        ),
        ({"external": {"reclaim_notice_s": "2m"}}, "external.reclaim_notice_s: must be a number"),
        (
            {"external": {"reclaim_notice_s": 7200}},
            "external.reclaim_notice_s: must be in [0, 3600]",
        ),
        ({"external": {"spot_providers": "cheap"}}, "external.spot_providers: must be a list"),
        ({"external": {"spot_providers": [3]}}, "external.spot_providers[0]: must be a string"),
        (
            {"external": {"spot_providers": ["cheap", "cheap"]}},
            "external.spot_providers[1]: 'cheap' is named twice",
        ),
        (
            {
                "days": 366,
                "external": {"spot_reclaims_per_node_day": 24},
                "config": {"pools.external.providers": [provider("a", 2.5, 1000)]},
            },
            "reclaims 8,784,000 (external.spot_reclaims_per_node_day 24 x days 366 x max_nodes",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_bad_reclaim_field_is_named(raw: object, field: str) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(raw)
    assert field in str(info.value)


@pytest.mark.parametrize(
    "names, hit",
    [
        (None, ("cheap",)),
        (["dear", "cheap"], ("cheap", "dear")),
        ([], ()),
        (["cheap", "nope"], "external.spot_providers[1]: 'nope' is not one of"),
    ],
    ids=["default-the-cheapest", "named-in-config-order", "none", "unknown"],
)
def test_the_reclaims_hit_the_spot_providers(
    names: list[str] | None, hit: tuple[str, ...] | str
) -> None:
    s = scenario_from_dict({"nodes": 64, "days": 10, "external": {"spot_providers": names}})
    cfg = control_config(s)
    if isinstance(hit, str):
        with pytest.raises(ScenarioError, match=hit.replace("[", r"\[").replace("]", r"\]")):
            make_trace(s, cfg)
        return
    assert spot_providers(s, cfg) == hit
    trace = make_trace(s, cfg)
    assert {r.provider for r in trace.reclaims} == set(hit)
    assert all(0 <= r.slot < 64 for r in trace.reclaims)


# --- determinism --------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_reclaims_and_the_rest_of_the_trace_is_unchanged() -> None:
    """The default rate on ``cheap``'s 64 nodes over 10 days: about 32 reclaims, in time
    order, the same on every draw of seed 1, others with seed 2; with no reclaims (or a
    longer notice) the jobs, failures, faults and demand are the same."""
    s = scenario_from_dict({"nodes": 64, "days": 10})
    a, b, c = make_trace(s), make_trace(s), make_trace(dataclasses.replace(s, seed=2))
    assert a.reclaims == b.reclaims and a.reclaims != c.reclaims
    assert 15 <= len(a.reclaims) <= 50
    assert [r.at_s for r in a.reclaims] == sorted(r.at_s for r in a.reclaims)
    none = scenario_from_dict(
        {"nodes": 64, "days": 10, "external": {"spot_reclaims_per_node_day": 0}}
    )
    longer = scenario_from_dict({"nodes": 64, "days": 10, "external": {"reclaim_notice_s": 600}})
    rest = dataclasses.replace(a, reclaims=())
    assert make_trace(none) == rest
    assert make_trace(longer) == a


def test_the_same_seed_gives_the_same_reclaims_in_the_run() -> None:
    """Two reclaims a node-day on ``spot``: the same figures on every run, reclaims among them."""
    s = serving_only(120.0, rate=2.0)
    trace: Trace = make_trace(s)
    assert trace.reclaims
    first = simulate(s, "ours", trace, control_config(s)).figures
    second = simulate(s, "ours", make_trace(s), control_config(s)).figures
    assert first == second and first["reclaims"] >= 1


# --- the report ---------------------------------------------------------------------------------


def test_the_report_gives_reclaims_and_their_shortfall_per_scheme() -> None:
    s = serving_only(120.0)
    results = {name: run(s, name, (Reclaim(AT, "spot", 0),)) for name in ("ours", "evict-first")}
    summary = summarise(s, results, 1.0)
    for name, r in results.items():
        row = summary["schemes"][name]
        assert row["reclaims"] == 1
        assert row["shortfall_reclaims_min"] == round(r.figures["shortfall_reclaims_min"], 4) > 0
        assert row["reclaimed_replicas"] > 0
    (moves_goal,) = [g for g in summary["goals"] if "caused by moves" in g["goal"]]
    assert moves_goal["beside"]["spot_reclaims"] > 0
    lines = table(summary).splitlines()
    assert [line.split()[-2:] for line in lines if "spot reclaims of rented nodes" in line] == [
        ["1", "1"]
    ]
    assert any(line.startswith("  (e) spot reclaims (notice ran out)") for line in lines)
