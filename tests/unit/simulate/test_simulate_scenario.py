"""Scenario and trace files: bad input gets a clear error naming the field; the CLI runs
one small scenario end to end and loads without matplotlib, Ray or torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from controlplane.cli import cli
from controlplane.simulate import trace as trace_module
from controlplane.simulate.checks import MAX_SCENARIO_DEPTH
from controlplane.simulate.engine import EventQueue
from controlplane.simulate.run import providers
from controlplane.simulate.scenario import (
    MAX_SCENARIO_BYTES,
    MAX_SIM_EVENTS,
    FailureSpec,
    Scenario,
    ScenarioError,
    control_config,
    implied_events,
    load_scenario,
    scenario_from_dict,
    stockout_provider,
    with_stockouts,
)
from controlplane.simulate.trace import make_trace
from controlplane.simulate.world import World


@pytest.mark.parametrize(
    "raw, field",
    [
        ({"nodes": "many"}, "nodes: must be an integer, got a string"),
        ({"nodes": 0}, "nodes: must be in [1, 100000]"),
        ({"days": float("nan")}, "days: must be a finite number"),
        ({"seed": 1.5}, "seed: must be an integer, got a number"),
        ({"bogus": 1}, "bogus: unknown field"),
        (
            {"training": {"offered_load": float("inf")}},
            "training.offered_load: must be a finite number",
        ),
        (
            {"training": {"gang_gpus": {"12": 1.0}}},
            "training.gang_gpus.12: a gang bigger than a node",
        ),
        ({"training": {"priorities": {}}}, "training.priorities: at least one entry"),
        (
            {"serving": {"models": [{"name": "a", "gpus_per_replica": 16}]}},
            "serving.models[0].gpus_per_replica",
        ),
        (
            {"serving": {"models": [{"name": "a"}, {"name": "a"}]}},
            "serving.models[1].name: must be a unique",
        ),
        (
            {"serving": {"models": [{"name": "a", "min_replicas": 5, "max_replicas": 2}]}},
            "serving.models[0].max_replicas",
        ),
        (
            {"serving": {"models": [{"nmae": "a"}]}},
            "serving.models[0].nmae: unknown field; did you mean 'name'?",
        ),
        (
            {"failures": {"fault_escalation_probability": 2}},
            "failures.fault_escalation_probability: must be in [0, 1]",
        ),
        (
            {"schemes": {"static_serving_share": "half"}},
            "schemes.static_serving_share: must be a number",
        ),
        (
            {"config": {"placement.migrate_back_step": {"a": 1}}},
            "config.placement.migrate_back_step: must be a plain value or a list",
        ),
        (
            {"config": {"pools.external.providers": [[{"name": "a"}]]}},
            "config.pools.external.providers[0]: must be a plain value or a list",
        ),
        (
            {"config": {"pools.external.providers": [{"price_per_gpu_hour": float("nan")}]}},
            "config.pools.external.providers[0].price_per_gpu_hour: must be a finite number",
        ),
        ([1, 2], "scenario: must be a mapping"),
        (
            {"external": {"stockout_start_hours": [12, -1]}},
            "external.stockout_start_hours[1]: must be an hour >= 0",
        ),
        ({"external": {"stockout_hours": 0}}, "external.stockout_hours"),
        ({"training": {"gang_gpus": {"x": 1.0}}}, "training.gang_gpus.x: a gang size must be"),
        ({"training": {"gang_gpus": {"8192": 1.0}}}, "training.gang_gpus.8192: bigger than"),
        ({"training": {"priorities": {"low": -1}}}, "training.priorities.low: must be a share"),
        ({"training": {"priorities": {"low": 0}}}, "training.priorities: the shares must not"),
        ({"training": {"max_hours": 1}}, "training.max_hours: must be >= median_hours"),
        ({"training": {"jobs": True}}, "training.jobs: must be an integer, got a boolean"),
        ({"external": {"stockout_start_hours": [1] * 1001}}, "at most 1000 stock-outs"),
        ({"external": {"spot_providers": ["a", "a"]}}, "external.spot_providers[1]: 'a' is named"),
        ({"serving": {"models": [{"name": ""}]}}, "serving.models[0].name: must be a unique"),
        ({"serving": {"models": [{"peak_hour": 25}]}}, "serving.models[0].peak_hour: must be in"),
        ({"source": "x"}, "source: unknown field"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_bad_scenario_names_the_field(raw: object, field: str) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(raw)
    assert field in str(info.value)


@pytest.mark.parametrize(
    "override, key",
    [
        ({"pools.external.max_nodes": 4}, "pools.external.max_nodes"),
        (
            {"pools.external.providers": [{"name": "a", "max_nodes": -1}]},
            "pools.external.providers[0].max_nodes",
        ),
        ({"pools.external.providers": [{"name": "a", "bogus": 1}]}, "bogus"),
    ],
    ids=["moved-key", "provider-field", "provider-unknown-key"],
)
def test_a_bad_control_plane_override_names_its_key(override: dict[str, object], key: str) -> None:
    s = scenario_from_dict({"config": override})
    with pytest.raises(ScenarioError) as info:
        control_config(s)
    assert key in str(info.value)


def test_a_list_override_is_given_whole() -> None:
    """``pools.external.providers`` replaces the packaged list: the default scenario's two."""
    providers = control_config(Scenario()).pools.external.providers
    assert [(p.name, p.price_per_gpu_hour, p.max_nodes, p.gpus_per_node) for p in providers] == [
        ("cheap", 2.5, 64, 8),
        ("dear", 3.5, 64, 8),
    ]
    assert control_config(Scenario()).pools.external.max_gpus == 128 * 8


@pytest.mark.parametrize(
    "text, suffix, field",
    [
        ('{"days": NaN}', ".json", "NaN is not a JSON number"),
        ("days: [\n", ".yaml", "not valid YAML"),
        ("days: .inf\n", ".yaml", "days: must be a finite number"),
    ],
    ids=["json-nan", "broken-yaml", "yaml-inf"],
)
def test_a_bad_file_is_refused_with_its_problem(
    tmp_path: Path, text: str, suffix: str, field: str
) -> None:
    path = tmp_path / f"scenario{suffix}"
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert field in str(info.value)


def test_a_file_too_big_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("#" * (MAX_SCENARIO_BYTES + 1))
    with pytest.raises(ScenarioError, match="more than"):
        load_scenario(path)


GOOD_JOB = {"submit_h": 1, "num_workers": 1, "gpus_per_worker": 8, "hours": 2}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"submit_h": -1}, "training.trace[0].submit_h: must be >= 0"),
        ({"hours": float("nan")}, "training.trace[0].hours: must be a finite number"),
        ({"gpus_per_worker": 16}, "training.trace[0].gpus_per_worker: more than one node has"),
        ({"priority": 3}, "training.trace[0].priority: must be a string"),
        ({"user": "x"}, "training.trace[0].user: unknown field"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_every_trace_rule_names_the_entry_and_field(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    (tmp_path / "jobs.yaml").write_text(yaml.safe_dump([{**GOOD_JOB, **change}]))
    (tmp_path / "s.yaml").write_text("training:\n  trace: jobs.yaml\n")
    with pytest.raises(ScenarioError) as info:
        make_trace(load_scenario(tmp_path / "s.yaml"))
    assert message in str(info.value)


def test_a_bad_trace_names_the_entry_and_field(tmp_path: Path) -> None:
    (tmp_path / "jobs.json").write_text(
        json.dumps([{"submit_h": 1, "num_workers": 0, "gpus_per_worker": 8, "hours": 2}])
    )
    (tmp_path / "s.yaml").write_text("training:\n  trace: jobs.json\n")
    with pytest.raises(ScenarioError, match=r"training.trace\[0\].num_workers"):
        make_trace(load_scenario(tmp_path / "s.yaml"))


def test_a_trace_file_replaces_the_generator(tmp_path: Path) -> None:
    jobs = [
        {"submit_h": 0.5, "num_workers": 2, "gpus_per_worker": 8, "hours": 3, "priority": "high"}
    ]
    (tmp_path / "jobs.yaml").write_text(json.dumps(jobs))
    (tmp_path / "s.yaml").write_text("nodes: 4\ntraining:\n  trace: jobs.yaml\n")
    trace = make_trace(load_scenario(tmp_path / "s.yaml"))
    assert [(j.submit_s, j.gpus, j.work_s, j.priority) for j in trace.jobs] == [
        (1800.0, 16, 10800.0, "high")
    ]


SMALL = """
nodes: 8
days: 0.5
training: {jobs: 20, gang_gpus: {"8": 1.0}, median_hours: 1, max_hours: 3}
serving:
  models:
    - {name: m, gpus_per_replica: 1, replica_rps: 10, peak_rps: 50, min_replicas: 1, max_replicas: 20}
config:
  pools.external.providers:
    - {name: a, price_per_gpu_hour: 2.5, max_nodes: 1, gpus_per_node: 8}
    - {name: b, price_per_gpu_hour: 3.5, max_nodes: 1, gpus_per_node: 8}
"""


def test_rcp_simulate_prints_the_table_and_one_json_object(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(SMALL)
    result = CliRunner().invoke(
        cli,
        [
            "simulate",
            "--scenario",
            str(tmp_path / "s.yaml"),
            "-o",
            str(tmp_path / "out"),
            "--no-png",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(summary["schemes"]) == {
        "ours",
        "ours-requeue",
        "static-split",
        "evict-first",
        "time-of-day",
    }
    assert {g["goal"].split(" ")[0] for g in summary["goals"]} >= {"training", "zero", "external"}
    assert summary["decision_cost"]["decisions"] > 0
    assert set(summary["external_by_provider"]["ours"]) == {"a", "b"}
    assert (tmp_path / "out" / "report.md").read_text().startswith("# Fleet simulation")


def test_rcp_simulate_exits_2_naming_the_field(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text("nodes: -3\n")
    result = CliRunner().invoke(cli, ["simulate", "--scenario", str(tmp_path / "s.yaml")])
    assert result.exit_code == 2
    assert "nodes: must be in" in result.output


def test_the_cli_loads_without_matplotlib_ray_or_torch() -> None:
    code = (
        "import sys, controlplane.cli, controlplane.simulate.report; "
        "print(sorted(m for m in ('matplotlib', 'ray', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_days_and_nodes_keep_the_fleets_proportions() -> None:
    base = load_scenario(None)
    big = base.resized(1.0, base.nodes * 8, 5)
    assert big.training.jobs == round(base.training.jobs / 30 * 8)
    assert [m.peak_rps for m in big.serving.models] == [m.peak_rps * 8 for m in base.serving.models]
    key = "pools.external.providers"
    assert [p["max_nodes"] for p in big.config[key]] == [
        p["max_nodes"] * 8 for p in base.config[key]
    ]
    assert control_config(big).pools.external.max_gpus == 8 * 128 * 8
    assert (big.seed, big.days) == (5, 1.0)
    with pytest.raises(ScenarioError, match="nodes: must be in"):
        base.resized(None, 0, None)


# --- bounds on what a scenario implies (issue 26, finding 5) -----------------------------------

ISSUE_EXAMPLE = "nodes: 100000\ndays: 366\nfailures:\n  gpu_mttf_hours: 1\n"


@pytest.mark.parametrize(
    ("raw", "needles"),
    [
        pytest.param(
            {"nodes": 100000, "days": 366, "failures": {"gpu_mttf_hours": 1}},
            ["node failures 7,027,200,000", "nodes 100000", "days 366", "gpu_mttf_hours 1"],
            id="failures",
        ),
        pytest.param(
            {"nodes": 100000, "days": 366, "failures": {"hot_faults_per_node_year": 365}},
            ["faults 36,800,548", "nodes 100000", "hot_faults_per_node_year 365", "days 366"],
            id="faults",
        ),
        pytest.param(
            {"days": 366, "serving": {"demand_step_s": 10}},
            ["demand steps 12,648,960", "days 366", "demand_step_s 10", "serving.models 3"],
            id="demand-steps",
        ),
        pytest.param(
            {"days": 366, "training": {"jobs": 1000000}, "serving": {"demand_step_s": 60}},
            ["jobs 1,000,000 (training.jobs)", "demand steps 2,108,160"],
            id="jobs-and-steps",
        ),
    ],
)
def test_a_scenario_implying_too_many_events_is_refused_naming_its_fields(
    raw: dict[str, object], needles: list[str]
) -> None:
    with pytest.raises(ScenarioError) as info:
        scenario_from_dict(raw)
    message = str(info.value)
    assert f"more than the simulator's limit of {MAX_SIM_EVENTS:,}" in message
    for needle in needles:
        assert needle in message


@pytest.mark.parametrize(
    ("days", "nodes"),
    [
        pytest.param(None, None, id="default-4096-gpus-30-days"),
        pytest.param(1.0, 4096, id="bench-fleet-large-1-day"),
        pytest.param(3.0, 64, id="bench-fleet-quick"),
        pytest.param(366.0, 512, id="default-for-a-year"),
        pytest.param(30.0, 100_000, id="100000-nodes-30-days"),
    ],
)
def test_the_documented_scenarios_stay_within_the_bound(
    days: float | None, nodes: int | None
) -> None:
    scenario = load_scenario(None).resized(days, nodes, None)
    assert sum(implied_events(scenario).values()) <= MAX_SIM_EVENTS


def test_implied_events_of_the_default_scenario() -> None:
    """The worked example in `implied_events`' docstring."""
    got = {k: round(v) for k, v in implied_events(Scenario()).items()}
    assert got == {
        "node failures": 365,
        "faults": 168,
        "jobs": 5000,
        "demand steps": 34560,
        "samples": 721,
        "reclaims": 96,
    }


def test_the_issues_75_byte_file_is_refused_before_the_trace_is_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*_args: object) -> None:
        raise AssertionError("the trace was drawn")

    monkeypatch.setattr(trace_module, "_poisson_times", never)
    path = tmp_path / "huge.yaml"
    path.write_text(ISSUE_EXAMPLE)
    result = CliRunner().invoke(cli, ["simulate", "--scenario", str(path), "--no-png"])
    assert result.exit_code == 2, result.output
    assert "node failures 7,027,200,000" in result.output
    with pytest.raises(ScenarioError, match="more than the simulator's limit"):
        make_trace(Scenario(nodes=100000, days=366, failures=FailureSpec(gpu_mttf_hours=1)))


def test_days_and_nodes_options_are_bounded_too() -> None:
    with pytest.raises(ScenarioError, match=r"jobs 11,914,062 \(training.jobs\)"):
        load_scenario(None).resized(366.0, 100_000, None)


def _deep(kind: str, depth: int) -> str:
    if kind == "json-lists":
        return '{"config": ' + "[" * depth + "]" * depth + "}"
    if kind == "json-objects":
        return '{"config": ' + '{"a": ' * depth + "1" + "}" * depth + "}"
    if kind == "yaml-flow":
        return "config: " + "[" * depth + "]" * depth + "\n"
    if kind == "yaml-compact-lists":
        return "config:\n  " + "- " * depth + "1\n"
    assert kind == "yaml-block-mappings"
    keys = "".join(" " * i + "a:\n" for i in range(1, depth + 1))
    return "config:\n" + keys + " " * depth + " 1\n"


@pytest.mark.parametrize(
    ("kind", "suffix"),
    [
        pytest.param("json-lists", ".json", id="json-lists"),
        pytest.param("json-objects", ".json", id="json-objects"),
        pytest.param("yaml-flow", ".yaml", id="yaml-flow"),
        pytest.param("yaml-compact-lists", ".yaml", id="yaml-compact-lists"),
        pytest.param("yaml-block-mappings", ".yaml", id="yaml-block-mappings"),
    ],
)
def test_deep_nesting_is_a_clear_error_not_a_recursion_error(
    tmp_path: Path, kind: str, suffix: str
) -> None:
    depth = 1000 if kind == "yaml-block-mappings" else 100_000
    path = tmp_path / f"deep{suffix}"
    path.write_text(_deep(kind, depth))
    with pytest.raises(ScenarioError, match=f"deeper than {MAX_SCENARIO_DEPTH} levels"):
        load_scenario(path)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_nesting_within_the_bound_reaches_the_field_check(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"ok{suffix}"
    path.write_text(_deep("json-lists", MAX_SCENARIO_DEPTH - 1))
    with pytest.raises(ScenarioError, match="config: must be a mapping"):
        load_scenario(path)


def test_an_alias_bomb_gets_a_short_message(tmp_path: Path) -> None:
    """Six levels of ten aliases: a million items behind 300 bytes; the error shows a few."""
    lines = ["x:", "  a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, 7):
        lines.append(f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join([*lines, "nodes: *a6", ""]))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert "nodes: must be an integer, got a list" in str(info.value)
    assert len(str(info.value)) < 2000


def test_the_stockout_scenario_keeps_the_trace_and_stops_deliveries_in_its_windows() -> None:
    """`with_stockouts`: 6 hours from 08:00 on the days the horizon holds, on the cheapest
    provider only; the trace is the same; a node of that provider due inside a window comes
    up `provision_s` after it ends (and is billed from its end), one due outside it on time;
    the other provider delivers on time throughout."""
    base = scenario_from_dict({"nodes": 64, "days": 10})
    s = with_stockouts(base)
    assert s.external.stockout_start_hours == [5 * 24 + 8.0]
    assert s.external.stockout_hours == 6.0
    assert make_trace(s) == make_trace(base)
    assert with_stockouts(load_scenario(None)).external.stockout_start_hours == [
        128.0,
        368.0,
        608.0,
    ]
    start, end = 128 * 3600.0, 134 * 3600.0
    cfg = control_config(s)
    assert stockout_provider(s, cfg) == "cheap"
    cheap, dear = providers(s, cfg)
    assert (cheap.name, cheap.stockouts_s, dear.name, dear.stockouts_s) == (
        "cheap",
        ((start, end),),
        "dear",
        (),
    )
    world = World(4, 8, (cheap, dear), 300.0, 60.0, EventQueue())
    for now, due in (
        (start - 400.0, start - 100.0),
        (start - 100.0, end + 300.0),
        (end, end + 300.0),
    ):
        world.now_s = now
        world.want_external({"cheap": 8 * (len(world.external) + 1)})
        newest = world.external[max(world.external)]
        assert (newest.provider, newest.ready_s) == ("cheap", due), (now, newest.ready_s, due)
        assert newest.billed_from_s == due - 300.0
    world.now_s = start
    world.want_external({"cheap": 8 * len(world.external), "dear": 8})
    newest = world.external[max(world.external)]
    assert (newest.provider, newest.ready_s) == ("dear", start + 300.0)


@pytest.mark.parametrize(
    "provider, hit",
    [(None, "cheap"), ("dear", "dear"), ("nope", "external.stockout_provider: 'nope'")],
    ids=["default-the-cheapest", "named", "unknown"],
)
def test_the_stockouts_hit_one_provider(provider: str | None, hit: str) -> None:
    s = with_stockouts(scenario_from_dict({"nodes": 64, "days": 10}), provider=provider)
    cfg = control_config(s)
    if hit.startswith("external."):
        with pytest.raises(ScenarioError, match=hit):
            providers(s, cfg)
        return
    assert stockout_provider(s, cfg) == hit
    assert [p.name for p in providers(s, cfg) if p.stockouts_s] == [hit]
