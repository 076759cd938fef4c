"""Serving's forecast (issue 28, item 4), as tables: the daily profile the demand side keeps
(`policies.forecast`), the need per slot it hands admission, and admission keeping a long
gang off the GPUs serving's forecast needs back during its run while shorter work backfills
(`policies.admission.forecast`); the loop's wiring (the profile recorded from demand's
decisions, kept in `ServingPolicyState` through the store) and the config's checks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from controlplane.cli.cluster import forecast_lines
from controlplane.config import Config
from controlplane.config.validation import validate
from controlplane.loop.decide import decide_serving, forecast_now, policies_of
from controlplane.loop.tick import SERVING_STATE_KEY
from controlplane.loop.types import ServingPolicyState
from controlplane.store import JobState
from policies.admission import AdmissionConfig, AdmissionState
from policies.admission import decide as admit
from policies.forecast import (
    DailyProfile,
    ForecastConfig,
    ForecastModel,
    ServingForecast,
    duration,
    profile_ahead,
    record,
    serving_forecast,
)
from policies.plan import AdmitJob, WaitJob
from policies.snapshot import Pool
from serve.config import ModelConfig
from tests.unit.builders import gang, job, node, snapshot
from tests.unit.loop_fakes import make_world

BIN = 900.0
CFG = ForecastConfig()
DAY = 86400.0


def profile(**peaks: float) -> DailyProfile:
    """A profile with `peaks` by slot (``s48=4``: slot 48, 12:00-12:15) and nothing else."""
    slots: list[float | None] = [None] * CFG.slots_per_day
    for name, value in peaks.items():
        slots[int(name[1:])] = value
    return DailyProfile(tuple(slots))


# -- the profile -------------------------------------------------------------------------


@dataclass
class Rec:
    id: str
    steps: list[tuple[float, float]]
    """(now_s, replicas) recorded in order, from an empty profile."""
    slot_12: float | None
    """The memory of the 12:00 slot (48) afterwards."""
    open_peak: float


RECORDS = [
    Rec("a-slot-keeps-its-peak", [(12 * 3600, 2), (12 * 3600 + 300, 5), (12 * 3600 + 600, 3),
                                  (12 * 3600 + 900, 1)], 5, 1),
    Rec("a-higher-day-replaces-at-once", [(12 * 3600, 2), (12 * 3600 + 900, 0),
                                          (DAY + 12 * 3600, 6), (DAY + 12 * 3600 + 900, 0)], 6, 0),
    Rec("a-lower-day-pulls-down-by-the-weight", [(12 * 3600, 4), (12 * 3600 + 900, 0),
                                                 (DAY + 12 * 3600, 2), (DAY + 12 * 3600 + 900, 0)],
        4 - 0.3 * 2, 0),
    Rec("the-open-slot-is-not-folded-yet", [(12 * 3600, 4)], None, 4),
    Rec("a-clock-step-back-stays-in-the-slot", [(12 * 3600 + 600, 2), (12 * 3600, 7)], None, 7),
    Rec("a-bad-reading-changes-nothing", [(12 * 3600, 3), (12 * 3600 + 1, math.nan),
                                          (12 * 3600 + 2, -1), (12 * 3600 + 3, math.inf)], None, 3),
]  # fmt: skip


@pytest.mark.parametrize("case", RECORDS, ids=[c.id for c in RECORDS])
def test_the_profile_keeps_each_slots_peak_rising_fast_and_falling_slowly(case: Rec) -> None:
    p = DailyProfile()
    for now_s, replicas in case.steps:
        p = record(p, now_s, replicas, CFG)
    if case.slot_12 is None:
        assert p.peaks[48] is None
    else:
        assert p.peaks[48] == pytest.approx(case.slot_12)
    assert p.slot_peak == case.open_peak


def test_the_forecast_looks_at_neighbouring_slots_and_wraps_the_day() -> None:
    p = profile(s48=4, s95=2)
    ahead = profile_ahead(p, 11 * 3600, CFG)  # now: slot 44
    assert len(ahead) == CFG.horizon_slots == 192
    # 12:00 (slot 48, offset 4) and its neighbours 47 and 49 foresee 4; 46 and 50 nothing.
    assert ahead[2:7] == (0.0, 4.0, 4.0, 4.0, 0.0)
    # 23:45 (slot 95) wraps onto 00:00 of the next day (slot 0, offset 52).
    assert ahead[51] == 2.0 and ahead[52] == 2.0 and ahead[53] == 0.0
    # Two days ahead: the same day again.
    assert ahead[4 + 96] == 4.0
    assert profile_ahead(DailyProfile(), 0.0, CFG) == (0.0,) * 192


@dataclass
class Need:
    id: str
    models: list[ForecastModel]
    cap: int
    need_at_noon: int | None
    """Cluster GPUs the 12:00 slot needs (None: no forecast at all)."""
    peak_model: str = ""


NEEDS = [
    Need("beyond-the-providers", [ForecastModel("a", profile(s48=4), 2)], 4, 4, "a"),
    Need("the-providers-host-it-all", [ForecastModel("a", profile(s48=4), 2)], 8, None),
    Need("models-add-up", [ForecastModel("a", profile(s48=2), 1),
                           ForecastModel("b", profile(s48=3), 2)], 2, 6, "b"),
    Need("a-yielding-model-holds-nothing-back",
         [ForecastModel("a", profile(s48=4), 2, guaranteed=False)], 0, None),
    Need("never-below-the-floors", [ForecastModel("a", profile(s48=1), 1, floor_gpus=2),
                                    ForecastModel("b", profile(s48=4), 1)], 0, 5, "b"),
    Need("only-floors-foresee-nothing", [ForecastModel("a", profile(s48=1), 1, floor_gpus=2)],
         0, None),
    Need("a-fraction-of-a-replica-is-a-replica", [ForecastModel("a", profile(s48=2.2), 1)], 0, 3,
         "a"),
]  # fmt: skip


@pytest.mark.parametrize("case", NEEDS, ids=[c.id for c in NEEDS])
def test_the_need_is_the_forecast_beyond_what_the_providers_host(case: Need) -> None:
    got = serving_forecast(case.models, 11 * 3600 + 60, case.cap, CFG)
    if case.need_at_noon is None:
        assert got is None
        return
    assert got is not None
    assert got.start_s == 11 * 3600 and got.bin_s == BIN
    assert got.need_gpus[4] == case.need_at_noon
    assert got.peak_model == case.peak_model
    assert serving_forecast(case.models, 0, case.cap, ForecastConfig(enabled=False)) is None


# -- admission -----------------------------------------------------------------------------

NOON_IN_2H = ServingForecast(
    start_s=0.0,
    bin_s=BIN,
    need_gpus=(0,) * 8 + (6,) * 4 + (0,) * 180,
    peak_model="chat",
    idle_hold_s=3 * 3600,
)
"""Slots 8-11 (2 h to 3 h from now) need 6 of the pool's 8 cluster GPUs; GPUs are left idle
for serving up to 3 h before it needs them."""


@dataclass
class Adm:
    id: str
    queued: list
    running: list
    admitted: tuple[str, ...]
    waits: dict[str, tuple[str, ...]]
    """job -> texts its `serving-forecast` WaitJob says."""


ADMS = [
    Adm("a-long-gang-waits-for-the-peak-to-pass", [job("long", 1, 4, max_runtime_s=4 * 3600)], [],
        (), {"long": ("serving-forecast", "of up to 4h00m", "back in 2h00m",
                      "6 cluster GPU(s) (most for model 'chat')", "leaving 2 GPU(s)",
                      "expected to start in about 3h00m")}),
    Adm("a-short-gang-backfills-before-the-peak", [job("long", 1, 4, max_runtime_s=4 * 3600),
                                                   job("short", 1, 4, max_runtime_s=3600)], [],
        ("short",), {"long": ("serving-forecast",)}),
    Adm("a-small-gang-fits-beside-the-peak", [job("small", 1, 2, max_runtime_s=4 * 3600)], [],
        ("small",), {}),
    Adm("admitted-gangs-take-their-room", [job("s1", 1, 2, max_runtime_s=4 * 3600),
                                           job("s2", 1, 2, max_runtime_s=4 * 3600)], [],
        ("s1",), {"s2": ("leaving 0 GPU(s)",)}),
    Adm("a-running-gang-that-ends-before-the-peak-leaves-room",
        [job("small", 1, 2, max_runtime_s=4 * 3600)],
        [gang("r", {"c1": 2}, started_s=0, max_runtime_s=3600)], ("small",), {}),
    Adm("a-running-gang-through-the-peak-holds-its-room",
        [job("small", 1, 2, max_runtime_s=4 * 3600)],
        [gang("r", {"c1": 2}, started_s=0, max_runtime_s=5 * 3600)], (),
        {"small": ("leaving 0 GPU(s)", "expected to start in about 3h00m")}),
    Adm("a-gang-that-can-never-avoid-the-peak-runs", [job("forever", 1, 4)], [], ("forever",), {}),
    Adm("a-gang-without-a-runtime-waits-for-running-ones", [job("forever", 1, 2)],
        [gang("r", {"c1": 2}, started_s=0, max_runtime_s=5 * 3600)], (),
        {"forever": ("with no max runtime", "expected to start in about 3h00m")}),
]  # fmt: skip


@pytest.mark.parametrize("case", ADMS, ids=[c.id for c in ADMS])
def test_admission_keeps_a_gang_off_what_serving_needs_back_during_its_run(case: Adm) -> None:
    snap = snapshot(
        [node("c1", gpus_total=4), node("c2", gpus_total=4)],
        queued=case.queued,
        running=case.running,
        now_s=0.0,
    )
    plan, _ = admit(snap, AdmissionConfig(), AdmissionState(), forecast=NOON_IN_2H)
    assert tuple(a.job_id for a in plan if isinstance(a, AdmitJob)) == case.admitted
    waits = {a.job_id: a.reason for a in plan if isinstance(a, WaitJob)}
    assert all(a.code == "serving-forecast" for a in plan if isinstance(a, WaitJob))
    assert set(waits) == set(case.waits)
    for job_id, texts in case.waits.items():
        assert waits[job_id].startswith("serving-forecast: ")
        for text in texts:
            assert text in waits[job_id], waits[job_id]
    # Without a forecast every gang that fits is admitted, as before.
    plan, _ = admit(snap, AdmissionConfig(), AdmissionState())
    assert not any(isinstance(a, WaitJob) for a in plan)


@dataclass
class Idle:
    id: str
    queued: list
    admitted: dict[str, str]
    """job -> the start of its admission reason."""
    waits: tuple[str, ...] = ()


IDLES = [
    Idle("alone-it-takes-gpus-nobody-wants", [job("long", 1, 4, max_runtime_s=4 * 3600)],
         {"long": "fits: all 1 workers x 4 GPUs fit now; no shorter work wants these GPUs, "
                  "though serving's forecast does (its run of up to 4h00m would hold GPUs that "
                  "serving's forecast needs back in 2h00m"}),
    Idle("shorter-work-goes-first", [job("long", 1, 8, max_runtime_s=4 * 3600),
                                     job("short", 1, 4, max_runtime_s=3600)],
         {"short": "fits"}, ("long",)),
]  # fmt: skip


@pytest.mark.parametrize("case", IDLES, ids=[c.id for c in IDLES])
def test_a_held_gang_takes_what_nobody_wants_when_the_peak_is_far_enough(case: Idle) -> None:
    """Serving needs the GPUs in 2 h, later than ``idle_hold_s`` (30 min): leaving them idle
    until then costs more than the peak's checkpoint and restore, so a held gang gets what
    no shorter work took, and its reason says it will be asked to yield."""
    far = ServingForecast(0.0, BIN, NOON_IN_2H.need_gpus, "chat", idle_hold_s=1800)
    nodes = [node("c1", gpus_total=4), node("c2", gpus_total=4)]
    plan, _ = admit(snapshot(nodes, queued=case.queued, now_s=0.0), AdmissionConfig(),
                    AdmissionState(), forecast=far)  # fmt: skip
    admitted = {a.job_id: a.reason for a in plan if isinstance(a, AdmitJob)}
    assert set(admitted) == set(case.admitted)
    for job_id, text in case.admitted.items():
        assert admitted[job_id].startswith(text), admitted[job_id]
    assert tuple(a.job_id for a in plan if isinstance(a, WaitJob)) == case.waits


def test_a_wait_reason_changes_with_the_slot_not_every_tick() -> None:
    queued = [job("long", 1, 4, max_runtime_s=4 * 3600)]
    reasons = set()
    for now_s in (0.0, 100.0, 899.0):
        snap = snapshot([node("c1", gpus_total=4), node("c2", gpus_total=4)], queued=queued,
                        now_s=now_s)  # fmt: skip
        plan, _ = admit(snap, AdmissionConfig(), AdmissionState(), forecast=NOON_IN_2H)
        reasons |= {a.reason for a in plan if isinstance(a, WaitJob)}
    assert len(reasons) == 1


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (30, "30s"), (900, "15m"), (3 * 3600 + 300, "3h05m")]
)
def test_durations_read_as_people_say_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


# -- the loop ------------------------------------------------------------------------------


def served(**overrides: object) -> Config:
    cfg = Config()
    cfg.serve.deploy_app = True
    cfg.serving.models = [ModelConfig(name="chat", num_gpus=2, min_replicas=0, max_replicas=8)]
    cfg.pools.external.providers[0].max_nodes = 1
    for key, value in overrides.items():
        setattr(cfg.forecast, key, value)
    return cfg


def test_the_loop_records_demand_and_hands_admission_the_forecast() -> None:
    """Yesterday's 12:00 peak (4 replicas x 2 GPUs) is in the stored state; the providers host
    one node's GPUs; at 11:00 admission gets the rest of the peak as cluster need."""
    cfg = served()
    policies = policies_of(cfg)
    stored = ServingPolicyState(forecast={"chat": profile(s48=4)})
    state = ServingPolicyState.from_dict(stored.to_dict())  # through the store's JSON
    assert state.forecast["chat"].peaks[48] == 4
    snap = snapshot([node("c1")], now_s=DAY + 11 * 3600)
    got = forecast_now(snap, policies, state)
    cap = cfg.pools.external.max_gpus
    assert got is not None and got.need_gpus[4] == 8 - cap and got.peak_model == "chat"
    assert forecast_now(snap, policies_of(served(enabled=False)), state) is None


def test_a_damaged_stored_profile_is_dropped_not_trusted() -> None:
    raw = ServingPolicyState(forecast={"chat": profile(s48=4)}).to_dict()
    for bad in ([math.inf], ["x"], [-1.0], "peaks", [True]):
        raw["forecast"] = {"chat": {"peaks": bad, "slot": 3, "slot_peak": 1.0}}
        assert ServingPolicyState.from_dict(raw).forecast["chat"] == DailyProfile()


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("bin_s", 7.0, "forecast.bin_s: must divide the day and be 60-3600 s"),
        ("bin_s", 1000.0, "forecast.bin_s: must divide the day"),
        ("fall_weight", 1.5, "forecast.fall_weight: must be in [0, 1]"),
        ("horizon_s", math.nan, "forecast.horizon_s: must be a finite number"),
        ("horizon_s", 30 * DAY, "forecast.horizon_s: must be from bin_s to 7 days"),
    ],
)
def test_a_bad_forecast_config_names_the_field(key: str, value: float, text: str) -> None:
    cfg = served(**{key: value})
    assert any(text in e for e in validate(cfg)), validate(cfg)


def test_decide_serving_folds_each_ticks_decision_into_the_profile() -> None:
    from controlplane.adapters.serve import ServeView

    cfg = served()
    policies = policies_of(cfg)
    state = ServingPolicyState()
    snap = snapshot([node("c1")], now_s=12 * 3600)
    _, _, state = decide_serving(snap, ServeView(), {"chat": 3.0}, policies, state)
    assert state.forecast["chat"].slot == 48
    assert state.forecast["chat"].slot_peak >= 0


def test_on_the_loop_a_long_gang_waits_for_the_forecast_peak_and_a_short_one_backfills(
    tmp_path: Path,
) -> None:
    """Two 2-GPU cluster nodes; ``sample`` runs its 2 replicas on c1; the provider hosts 2
    GPUs. The stored profile says sample peaks at 5 replicas at 12:00; it is 11:30: 3 cluster GPUs
    beyond the provider. A 2-GPU gang running 3 h would hold c2 through the peak and waits,
    saying when it may start; a 2-GPU gang of 10 min ends first and is admitted. `rcp serve
    status` shows the peak and the need, and so do the metrics."""
    w = make_world(
        tmp_path,
        "serve.deploy_app=true",
        "pools.external.providers=[{name: rent-a, max_nodes: 1, gpus_per_node: 2}]",
        config_text="serving:\n  models:\n    - {name: sample, min_replicas: 2, max_replicas: 8}\n",
    )
    w.cluster.add("c1", Pool.CLUSTER, gpus=2)
    w.cluster.add("c2", Pool.CLUSTER, gpus=2)
    w.serve.deploy("sample", cluster=2)
    w.clock.now_s = DAY + 11 * 3600 + 1800  # 11:30; the peak slot is 12:00 (48)
    w.store.put(
        SERVING_STATE_KEY, ServingPolicyState(forecast={"sample": profile(s48=5)}).to_dict()
    )
    long = w.jobs.submit("long", workers=1, gpus=2, max_runtime_s=3 * 3600)
    short = w.jobs.submit("short", workers=1, gpus=2, max_runtime_s=600)
    w.tick(3)

    assert w.store.get(long).state is JobState.QUEUED
    assert w.store.get(short).state in (JobState.ADMITTED, JobState.RUNNING)
    message = str(w.store.get(long).info.get("message"))
    assert message.startswith("serving-forecast: its run of up to 3h00m"), message
    assert "3 cluster GPU(s) (most for model 'sample')" in message, message
    assert "expected to start in about" in message, message
    (waited,) = w.events("policy.WaitJob")
    assert waited.startswith("serving-forecast")
    assert w.metrics.gauges[("rcp_serving_forecast_cluster_gpus", ())] == 3.0
    assert w.metrics.gauges[("rcp_serving_forecast_peak_replicas", (("model", "sample"),))] == 5.0
    assert forecast_lines(w.loop.tick_metrics.forecast_rows) == [
        "forecast:     sample peaks at 5 replica(s) in 15m (next 24 h, from its daily profile)",
        "forecast:     serving needs 3 cluster GPU(s) the providers cannot host in 15m: gangs "
        "whose run would overlap it wait (serving-forecast)",
    ]
