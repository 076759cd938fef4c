"""Tables for the admission policy: pure, no Ray. Each row is a small cluster and a queue."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.admission import (
    PREEMPTION_WINDOW_S,
    AdmissionConfig,
    AdmissionState,
    PreemptionRecord,
    QueueConfig,
    decide,
    gang_fits,
)
from policies.plan import AdmitJob, MoveServeReplicas, PreemptJob, RejectJob
from policies.snapshot import ClusterSnapshot, ReplicaState
from tests.unit.builders import gang, job, node, replica, snapshot

TEAMS = AdmissionConfig(queues=(QueueConfig("a", 0.5), QueueConfig("b", 0.5)))


@dataclass
class Outcome:
    admitted: dict[str, dict[str, int]] = field(default_factory=dict)  # job -> node -> workers
    preempted: list[str] = field(default_factory=list)
    moved: list[MoveServeReplicas] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    state: AdmissionState = field(default_factory=AdmissionState)


def run(
    snap: ClusterSnapshot,
    config: AdmissionConfig | None = None,
    state: AdmissionState | None = None,
) -> Outcome:
    plan, new_state = decide(snap, config or AdmissionConfig(), state or AdmissionState())
    out = Outcome(state=new_state)
    for action in plan:
        if isinstance(action, AdmitJob):
            out.admitted[action.job_id] = {p.node_id: p.num_workers for p in action.placement}
            out.reasons[action.job_id] = action.reason
            if action.gpus_per_worker:
                assert action.num_workers == sum(p.num_workers for p in action.placement)
        elif isinstance(action, PreemptJob):
            out.preempted.append(action.job_id)
            out.reasons[action.job_id] = action.reason
        elif isinstance(action, MoveServeReplicas):
            out.moved.append(action)
        elif isinstance(action, RejectJob):
            out.rejected.append(action.job_id)
            out.reasons[action.job_id] = action.reason
    _check_no_overcommit(snap, plan)
    return out


def _check_no_overcommit(snap: ClusterSnapshot, plan: tuple[object, ...]) -> None:
    """Whatever the row, admissions never take more GPUs than a node has free."""
    free = {n.node_id: n.gpus_free for n in snap.nodes}
    for action in plan:
        if isinstance(action, AdmitJob):
            for p in action.placement:
                free[p.node_id] -= p.num_workers * action.gpus_per_worker
    assert all(v >= 0 for v in free.values()), free


# -- priority order ------------------------------------------------------------------------

PRIORITY_ROWS = [
    pytest.param(
        [job("lo", 1, 8, priority="low"), job("hi", 1, 8, priority="high", submitted_s=2)],
        {"hi"},
        id="high-class-before-earlier-low",
    ),
    pytest.param(
        [
            job("m-late", 1, 8, submitted_s=5),
            job("m-early", 1, 8, submitted_s=3),
            job("lo-first", 1, 8, priority="low", submitted_s=0),
        ],
        {"m-early"},
        id="fifo-within-class",
    ),
    pytest.param(
        [job("m", 1, 4), job("h", 1, 4, priority="high"), job("l", 1, 8, priority="low")],
        {"m", "h"},
        id="two-fit-third-waits",
    ),
]


@pytest.mark.parametrize(("queued", "expected"), PRIORITY_ROWS)
def test_priority_order(queued: list, expected: set[str]) -> None:
    out = run(snapshot([node("a")], queued=queued))
    assert set(out.admitted) == expected


def test_admissions_come_out_in_priority_order() -> None:
    queued = [job("l", priority="low"), job("m"), job("h", priority="high")]
    plan, _ = decide(snapshot([node("a")], queued=queued), AdmissionConfig(), AdmissionState())
    assert [a.job_id for a in plan if isinstance(a, AdmitJob)] == ["h", "m", "l"]


def test_custom_priority_classes_order_the_queue() -> None:
    cfg = AdmissionConfig(priority_classes={"batch": 1, "urgent": 9})
    queued = [job("b", 1, 8, priority="batch"), job("u", 1, 8, priority="urgent", submitted_s=9)]
    assert set(run(snapshot([node("a")], queued=queued), cfg).admitted) == {"u"}


# -- gang all-or-nothing ------------------------------------------------------------------------

GANG_ROWS = [
    pytest.param(
        [node("a", gpus_total=4), node("b", gpus_total=4)],
        job("g", 2, 4),
        {"a": 1, "b": 1},
        id="one-worker-per-node",
    ),
    pytest.param(
        [node("a", gpus_total=3), node("b", gpus_total=3)],
        job("g", 4, 2),
        None,
        id="6-free-but-only-2-slots-of-2",
    ),
    pytest.param(
        [node(n, gpus_total=2) for n in "abcd"],
        job("g", 2, 4),
        None,
        id="8-free-but-no-node-holds-a-4-gpu-worker",
    ),
    pytest.param(
        [node("a", gpus_total=8), node("b", gpus_total=2), node("c", gpus_total=4)],
        job("g", 5, 2),
        {"a": 4, "b": 1},
        id="fewest-nodes-then-best-fit-remainder",
    ),
]


@pytest.mark.parametrize(("nodes", "queued", "placement"), GANG_ROWS)
def test_gang_is_all_or_nothing(nodes: list, queued, placement: dict[str, int] | None) -> None:
    out = run(snapshot(nodes, queued=[queued]))
    if placement is None:
        assert out.admitted == {}
    else:
        assert out.admitted == {"g": placement}


def test_two_half_fitting_gangs_do_not_deadlock() -> None:
    # 8 GPUs; each gang needs 6. One runs whole, the other holds nothing.
    nodes = [node("a", gpus_total=4), node("b", gpus_total=4)]
    out = run(snapshot(nodes, queued=[job("x", 3, 2), job("y", 3, 2, submitted_s=1)]))
    assert list(out.admitted) == ["x"]
    assert sum(out.admitted["x"].values()) == 3
    assert out.state.reservation is not None and out.state.reservation.job_id == "y"


@pytest.mark.parametrize(
    ("gpus", "workers", "fits"),
    [
        pytest.param([8, 8], 4, True, id="4x4-on-two-8s"),
        pytest.param([8, 8], 5, False, id="5x4-on-two-8s"),
        pytest.param([3, 3, 3], 4, False, id="4x2-on-three-3s"),
    ],
)
def test_gang_fits_helper(gpus: list[int], workers: int, fits: bool) -> None:
    gpus_per_worker = 4 if gpus[0] == 8 else 2
    assert gang_fits(workers, gpus_per_worker, gpus) is fits


# -- live capacity ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("b_healthy", "admitted"),
    [pytest.param(True, {"g"}, id="both-healthy"), pytest.param(False, set(), id="b-unhealthy")],
)
def test_unhealthy_node_shrinks_capacity(b_healthy: bool, admitted: set[str]) -> None:
    nodes = [node("a"), node("b", healthy=b_healthy)]
    out = run(snapshot(nodes, queued=[job("g", 2, 8)]))
    assert set(out.admitted) == admitted


@pytest.mark.parametrize(
    ("b_healthy", "admitted"),
    [pytest.param(True, {"g"}, id="share-of-16"), pytest.param(False, set(), id="share-of-8")],
)
def test_share_is_a_fraction_of_live_capacity(b_healthy: bool, admitted: set[str]) -> None:
    # Queue a owns half and may not borrow: 8 GPUs of 16, but only 4 of 8 after b fails.
    cfg = AdmissionConfig(queues=(QueueConfig("a", 0.5, borrowing_limit=0.0),))
    nodes = [node("a"), node("b", healthy=b_healthy)]
    out = run(snapshot(nodes, queued=[job("g", 1, 8, queue="a")]), cfg)
    assert set(out.admitted) == admitted


def test_head_bigger_than_live_capacity_blocks_no_one() -> None:
    nodes = [node("a"), node("b", healthy=False)]
    out = run(snapshot(nodes, queued=[job("big", 2, 8), job("small", 1, 2, submitted_s=1)]))
    assert set(out.admitted) == {"small"}
    assert out.state.reservation is None


# -- shares: borrowing and reclaim ---------------------------------------------------------------

SHARE_ROWS = [
    pytest.param(TEAMS, [], [job("a1", 2, 8, queue="a")], {"a1"}, [], id="borrow-idle-share-of-b"),
    pytest.param(
        AdmissionConfig(queues=(QueueConfig("a", 0.5, 0.25), QueueConfig("b", 0.5))),
        [],
        [job("a16", 2, 8, queue="a"), job("a12", 3, 4, queue="a", submitted_s=1)],
        {"a12"},
        [],
        id="borrowing-limit-caps-at-75pct",
    ),
    pytest.param(
        TEAMS,
        [
            gang("a-old", {"x": 8}, queue="a", priority="high", last_checkpoint_s=50),
            gang("a-new", {"y": 8}, queue="a", priority="high", last_checkpoint_s=95),
        ],
        [job("b1", 1, 8, queue="b", priority="low")],
        set(),
        ["a-new"],
        id="reclaim-preempts-borrower-whatever-its-priority",
    ),
    pytest.param(
        TEAMS,
        [
            gang("a-own", {"x": 8}, queue="a", priority="low"),
            gang("b-own", {"y": 8}, queue="b", priority="low"),
        ],
        [job("a-more", 1, 8, queue="a", priority="high")],
        set(),
        ["a-own"],
        id="own-team-low-preempted-not-other-team-low",
    ),
    pytest.param(
        TEAMS,
        [
            gang("a-own", {"x": 8}, queue="a", priority="high"),
            gang("b-own", {"y": 8}, queue="b", priority="low"),
        ],
        [job("a-more", 1, 8, queue="a", priority="high")],
        set(),
        [],
        id="over-share-high-never-preempts-other-teams-low",
    ),
]


@pytest.mark.parametrize(("cfg", "running", "queued", "admitted", "preempted"), SHARE_ROWS)
def test_shares_borrow_and_reclaim(
    cfg: AdmissionConfig, running: list, queued: list, admitted: set[str], preempted: list[str]
) -> None:
    out = run(snapshot([node("x"), node("y")], running=running, queued=queued), cfg)
    assert set(out.admitted) == admitted
    assert out.preempted == preempted


def test_reclaim_reason_names_the_rule() -> None:
    running = [gang("a1", {"x": 8}, queue="a"), gang("a2", {"y": 8}, queue="a")]
    out = run(
        snapshot([node("x"), node("y")], running=running, queued=[job("b1", 1, 8, queue="b")]),
        TEAMS,
    )
    assert len(out.preempted) == 1
    assert out.reasons[out.preempted[0]].startswith("reclaim-share")


def test_borrowed_admission_says_so() -> None:
    out = run(snapshot([node("x"), node("y")], queued=[job("a1", 2, 8, queue="a")]), TEAMS)
    assert "borrows idle GPUs" in out.reasons["a1"]


# -- reservation and backfill --------------------------------------------------------------------
# Node a: `r` holds 4 of 8 GPUs until t=1000 (started 0, max runtime 1000); 4 are free.
# Head `h` (medium) needs all 8 and cannot preempt a same-priority gang: it reserves a, T=1000.

BACKFILL_ROWS = [
    pytest.param(
        1000.0, job("s", 1, 4, priority="low", max_runtime_s=500), True, id="ends-600-before-T-1000"
    ),
    pytest.param(
        1000.0, job("s", 1, 4, priority="low", max_runtime_s=900), True, id="ends-exactly-at-T"
    ),
    pytest.param(
        1000.0, job("s", 1, 4, priority="low", max_runtime_s=901), False, id="ends-after-T"
    ),
    pytest.param(1000.0, job("s", 1, 4, priority="low"), False, id="no-max-runtime"),
    pytest.param(None, job("s", 1, 4, priority="low", max_runtime_s=1), False, id="T-unknown"),
]


@pytest.mark.parametrize(("r_max_runtime_s", "small", "admitted"), BACKFILL_ROWS)
def test_backfill_only_if_it_ends_before_the_reservation(
    r_max_runtime_s: float | None, small, admitted: bool
) -> None:
    running = [gang("r", {"a": 4}, started_s=0, max_runtime_s=r_max_runtime_s)]
    queued = [job("h", 1, 8, submitted_s=0), small]
    out = run(snapshot([node("a")], running=running, queued=queued))
    assert ("s" in out.admitted) is admitted
    assert "h" not in out.admitted
    assert out.state.reservation is not None and out.state.reservation.job_id == "h"
    assert out.state.reservation.start_by_s == r_max_runtime_s
    assert out.preempted == []


@pytest.mark.parametrize(
    ("small", "admitted"),
    [
        pytest.param(job("s", 1, 2, priority="low"), True, id="long-job-on-unprotected-node"),
        pytest.param(job("s", 1, 4, priority="low"), False, id="long-job-needs-protected-gpus"),
    ],
)
def test_long_backfill_uses_only_gpus_the_head_does_not_need(small, admitted: bool) -> None:
    running = [
        gang("r", {"a": 4}, started_s=0, max_runtime_s=1000),
        gang("q", {"c": 6}, started_s=0, max_runtime_s=9000),
    ]
    out = run(snapshot([node("a"), node("c")], running=running, queued=[job("h", 1, 8), small]))
    assert ("s" in out.admitted) is admitted
    if admitted:
        assert out.admitted["s"] == {"c": 1}
        assert out.reasons["s"].startswith("backfill")


def test_head_reservation_is_not_delayed_by_backfill_at_T() -> None:
    """At T, the GPUs the head was promised are free whatever was backfilled."""
    running = [
        gang("r1", {"a": 6}, started_s=0, max_runtime_s=500),
        gang("r2", {"b": 6}, started_s=0, max_runtime_s=800),
        gang("r3", {"c": 8}, started_s=0, max_runtime_s=5000),
    ]
    queued = [
        job("h", 2, 8),
        job("s1", 1, 2, max_runtime_s=300),
        job("s2", 1, 2, max_runtime_s=650),
        job("s3", 2, 1),
        job("s4", 1, 2, max_runtime_s=10_000),
    ]
    snap = snapshot([node("a"), node("b"), node("c")], running=running, queued=queued)
    plan, state = decide(snap, AdmissionConfig(), AdmissionState())
    reservation = state.reservation
    assert reservation is not None and reservation.start_by_s == 800
    t = reservation.start_by_s
    free_at_t = {n.node_id: n.gpus_total for n in snap.nodes}
    for g in running:
        if g.expected_end_s is None or g.expected_end_s > t:
            for n, k in g.gpus_by_node.items():
                free_at_t[n] -= k
    admitted_jobs = {j.job_id: j for j in queued}
    for a in plan:
        if isinstance(a, AdmitJob):
            j = admitted_jobs[a.job_id]
            if j.max_runtime_s is None or snap.now_s + j.max_runtime_s > t:
                for p in a.placement:
                    free_at_t[p.node_id] -= p.num_workers * a.gpus_per_worker
    for n, gpus in reservation.gpus_by_node:
        assert free_at_t[n] >= gpus, (n, free_at_t)
    assert any(isinstance(a, AdmitJob) for a in plan), "the table should exercise backfill"


# -- victim choice ---------------------------------------------------------------------------------

VICTIM_ROWS = [
    pytest.param(
        [
            gang("ckpt-10s-ago", {"a": 4}, priority="low", last_checkpoint_s=90),
            gang("ckpt-50s-ago", {"a": 4}, priority="low", last_checkpoint_s=50),
        ],
        job("h", 1, 4, priority="high"),
        ["ckpt-10s-ago"],
        id="least-work-lost-first",
    ),
    pytest.param(
        [
            gang("low", {"a": 4}, priority="low", last_checkpoint_s=10),
            gang("medium", {"a": 4}, priority="medium", last_checkpoint_s=99),
        ],
        job("h", 1, 4, priority="high"),
        ["low"],
        id="lowest-priority-first",
    ),
    pytest.param(
        [
            gang("small-recent", {"a": 2}, priority="low", last_checkpoint_s=99),
            gang("big-old", {"a": 6}, priority="low", last_checkpoint_s=10),
        ],
        job("h", 1, 6, priority="high"),
        ["big-old"],
        id="unneeded-victim-spared",
    ),
    pytest.param(
        [gang("same", {"a": 8}, priority="medium")],
        job("h", 1, 8, priority="medium"),
        [],
        id="never-same-priority",
    ),
    pytest.param(
        [
            gang("low-a", {"a": 8}, priority="low", last_checkpoint_s=99),
            gang("low-b", {"b": 8}, priority="low", last_checkpoint_s=98),
        ],
        job("h", 2, 8, priority="high"),
        ["low-a", "low-b"],
        id="as-many-as-the-gang-needs",
    ),
    pytest.param(
        [gang("high", {"a": 8}, priority="high"), gang("low", {"b": 4}, priority="low")],
        job("h", 2, 8, priority="medium"),
        [],
        id="no-partial-preemption-when-it-cannot-fit",
    ),
]


@pytest.mark.parametrize(("running", "head", "victims"), VICTIM_ROWS)
def test_victim_choice(running: list, head, victims: list[str]) -> None:
    node_ids = sorted({n for g in running for n in g.gpus_by_node})
    out = run(snapshot([node(n) for n in node_ids], running=running, queued=[head]))
    assert sorted(out.preempted) == sorted(victims)
    assert "h" not in out.admitted
    for v in out.preempted:
        assert out.reasons[v].startswith("preempt-for-priority")
    if victims:
        assert out.state.reservation is not None and out.state.reservation.start_by_s == 100.0


def test_serve_yields_before_training_is_preempted() -> None:
    running = [gang("low", {"a": 4}, priority="low")]
    replicas = [replica("r1", "a", gpus=2), replica("r2", "a", gpus=2)]
    out = run(snapshot([node("a")], running=running, replicas=replicas, queued=[job("h", 1, 4)]))
    assert out.preempted == []
    assert len(out.moved) == 1
    move = out.moved[0]
    assert (move.model, move.num_replicas, move.node_ids, move.for_job_id) == (
        "m",
        2,
        ("a", "a"),
        "h",
    )


def test_serve_and_training_both_make_room_when_needed() -> None:
    running = [gang("low", {"a": 4}, priority="low")]
    replicas = [replica("r1", "a", gpus=4)]
    out = run(snapshot([node("a")], running=running, replicas=replicas, queued=[job("h", 1, 8)]))
    assert out.preempted == ["low"]
    assert [m.num_replicas for m in out.moved] == [1]


def test_stopping_replicas_and_preempting_gangs_count_as_releasing() -> None:
    running = [
        gang("going", {"a": 4}, priority="low", preempting=True),
        gang("other-low", {"b": 8}, priority="low"),
    ]
    replicas = [replica("r1", "a", gpus=4, state=ReplicaState.STOPPING)]
    out = run(
        snapshot(
            [node("a"), node("b")],
            running=running,
            replicas=replicas,
            queued=[job("h", 1, 8, priority="high")],
        )
    )
    assert out.preempted == [] and out.moved == []
    assert out.state.reservation is not None
    assert out.state.reservation.gpus_by_node == (("a", 8),)


# -- preemption cap ---------------------------------------------------------------------------

NOW = 100.0 + PREEMPTION_WINDOW_S


@pytest.mark.parametrize(
    ("history", "victims"),
    [
        pytest.param((), ["v"], id="no-history"),
        pytest.param(
            (PreemptionRecord("x", NOW - 10), PreemptionRecord("y", NOW - 20)),
            [],
            id="cap-2-reached",
        ),
        pytest.param(
            (PreemptionRecord("x", NOW - PREEMPTION_WINDOW_S - 1), PreemptionRecord("y", NOW - 20)),
            ["v"],
            id="oldest-fell-out-of-the-hour",
        ),
    ],
)
def test_global_preemption_cap(history: tuple[PreemptionRecord, ...], victims: list[str]) -> None:
    cfg = AdmissionConfig(max_preemptions_per_hour=2)
    snap = snapshot(
        [node("a")],
        running=[gang("v", {"a": 8}, priority="low", started_s=NOW - 5)],
        queued=[job("h", 1, 8, priority="high")],
        now_s=NOW,
    )
    out = run(snap, cfg, AdmissionState(preemptions=history))
    assert out.preempted == victims
    assert all(p.at_s > NOW - PREEMPTION_WINDOW_S for p in out.state.preemptions)


def test_per_job_cap_picks_the_next_victim() -> None:
    running = [
        gang("often", {"a": 8}, priority="low", last_checkpoint_s=99, started_s=60),
        gang("fresh", {"b": 8}, priority="low", last_checkpoint_s=40, started_s=30),
    ]
    history = (PreemptionRecord("often", 20), PreemptionRecord("often", 50))
    snap = snapshot(
        [node("a"), node("b")], running=running, queued=[job("h", 1, 8, priority="high")]
    )
    assert run(snap).preempted == ["often"]
    assert run(snap, state=AdmissionState(preemptions=history)).preempted == ["fresh"]


def test_a_victim_is_asked_once() -> None:
    running = [gang("v", {"a": 8}, priority="low")]
    snap = snapshot([node("a")], running=running, queued=[job("h", 1, 8, priority="high")])
    first = run(snap)
    assert first.preempted == ["v"]
    later = snapshot(
        [node("a")], running=running, queued=[job("h", 1, 8, priority="high")], now_s=105
    )
    second = run(later, state=first.state)
    assert second.preempted == []
    assert second.state.reservation is not None and second.state.reservation.job_id == "h"
    assert len(second.state.preemptions) == 1


def test_state_round_trips_through_a_dict() -> None:
    running = [gang("v", {"a": 8}, priority="low")]
    out = run(snapshot([node("a")], running=running, queued=[job("h", 1, 8, priority="high")]))
    assert AdmissionState.from_dict(out.state.to_dict()) == out.state


# -- bad input and config ------------------------------------------------------------------------


def test_unknown_queue_and_class_are_rejected_with_reason() -> None:
    queued = [job("q", queue="nope"), job("c", priority="urgent"), job("ok")]
    out = run(snapshot([node("a")], queued=queued))
    assert sorted(out.rejected) == ["c", "q"]
    assert "queue 'nope'" in out.reasons["q"] and "'urgent'" in out.reasons["c"]
    assert set(out.admitted) == {"ok"}


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        pytest.param(
            {"queues": (QueueConfig("a", 0.7), QueueConfig("b", 0.7))}, "queues", id="shares-over-1"
        ),
        pytest.param({"queues": (QueueConfig("a", 0.0),)}, "queues.a.share", id="zero-share"),
        pytest.param({"priority_classes": {"x": 1.5}}, "priority_classes.x", id="float-priority"),
        pytest.param(
            {"max_preemptions_per_hour": -1}, "max_preemptions_per_hour", id="negative-cap"
        ),
    ],
)
def test_bad_config_names_the_field(kwargs: dict, field_name: str) -> None:
    with pytest.raises(ValueError, match=field_name.replace(".", r"\.")):
        AdmissionConfig(**kwargs)


def test_docstring_worked_example() -> None:
    running = [
        gang("old", {"a": 4}, priority="low", started_s=0, last_checkpoint_s=90),
        gang("big", {"b": 8}, priority="medium", started_s=0, max_runtime_s=1000),
    ]
    queued = [
        job("h", 2, 4, priority="high"),
        job("s", 1, 2, priority="low", max_runtime_s=60, submitted_s=1),
    ]
    out = run(snapshot([node("a"), node("b")], running=running, queued=queued))
    assert out.preempted == ["old"] and out.admitted == {}
    assert out.state.reservation is not None
    assert out.state.reservation.gpus_by_node == (("a", 8),)
    assert out.state.reservation.start_by_s == 100.0


# -- properties over generated clusters (hypothesis) ----------------------------------------------

CLASSES = ("low", "medium", "high")


@st.composite
def clusters(draw: st.DrawFn) -> tuple[ClusterSnapshot, AdmissionConfig]:
    teams = draw(st.booleans())
    cfg = TEAMS if teams else AdmissionConfig()
    queues = ("a", "b") if teams else ("default",)
    sizes = draw(st.lists(st.sampled_from((2, 4, 8)), min_size=1, max_size=5))
    healthy = draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))
    free = {f"n{i}": s for i, s in enumerate(sizes)}
    running = []
    for i in range(draw(st.integers(0, 6))):
        gpw = draw(st.sampled_from((1, 2, 4)))
        placement: dict[str, int] = {}
        for n in free:
            k = draw(st.integers(0, free[n] // gpw))
            if k:
                placement[n] = k * gpw
                free[n] -= k * gpw
        if not placement:
            continue
        running.append(
            gang(
                f"r{i}",
                placement,
                gpus_per_worker=gpw,
                priority=draw(st.sampled_from(CLASSES)),
                queue=draw(st.sampled_from(queues)),
                started_s=draw(st.floats(0, 99)),
                max_runtime_s=draw(st.sampled_from((None, 50.0, 200.0, 500.0))),
                last_checkpoint_s=draw(st.sampled_from((None, 50.0, 90.0))),
                preempting=draw(st.booleans()) and draw(st.booleans()),
            )
        )
    replicas = []
    for i in range(draw(st.integers(0, 3))):
        n = draw(st.sampled_from(sorted(free)))
        if free[n]:
            replicas.append(replica(f"s{i}", n, gpus=1))
            free[n] -= 1
    queued = [
        job(
            f"q{i}",
            draw(st.integers(1, 4)),
            draw(st.sampled_from((0, 1, 2, 4, 8))),
            priority=draw(st.sampled_from(CLASSES)),
            queue=draw(st.sampled_from(queues)),
            submitted_s=float(i),
            max_runtime_s=draw(st.sampled_from((None, 10.0, 150.0, 1000.0))),
        )
        for i in range(draw(st.integers(0, 8)))
    ]
    nodes = [
        node(f"n{i}", gpus_total=s, healthy=h)
        for i, (s, h) in enumerate(zip(sizes, healthy, strict=True))
    ]
    return snapshot(nodes, running=running, replicas=replicas, queued=queued), cfg


@settings(max_examples=300, deadline=None)
@given(
    clusters(),
    st.lists(
        st.tuples(st.sampled_from(("r0", "r1", "r2", "x")), st.floats(-5000, 100)), max_size=4
    ),
    st.integers(0, 3),
)
def test_properties_of_any_decision(
    case: tuple[ClusterSnapshot, AdmissionConfig],
    history: list[tuple[str, float]],
    cap: int,
) -> None:
    snap, base_cfg = case
    cfg = replace(base_cfg, max_preemptions_per_hour=cap, max_preemptions_per_job_per_hour=1)
    before = AdmissionState(
        preemptions=tuple(PreemptionRecord(j, t) for j, t in sorted(history, key=lambda h: h[1]))
    )
    plan, state = decide(snap, cfg, before)
    assert (plan, state) == decide(snap, cfg, before), "deterministic"
    recent = [p for p in before.preemptions if p.at_s > snap.now_s - PREEMPTION_WINDOW_S]
    new = [a.job_id for a in plan if isinstance(a, PreemptJob)]
    assert len(recent) + len(new) <= max(cap, len(recent)), "global cap"
    assert not set(new) & {p.job_id for p in recent}, "per-job cap of 1"
    assert list(state.preemptions) == recent + [PreemptionRecord(j, snap.now_s) for j in new]
    _check_no_overcommit(snap, plan)
    jobs = {j.job_id: j for j in snap.queued}
    gangs = {g.job_id: g for g in snap.running}
    live = {n.node_id for n in snap.nodes if n.healthy}
    admits = [a for a in plan if isinstance(a, AdmitJob)]
    victims = [a for a in plan if isinstance(a, PreemptJob)]
    for a in admits:  # all or nothing, on live nodes only
        assert a.num_workers == jobs[a.job_id].num_workers
        if a.gpus_per_worker:
            assert sum(p.num_workers for p in a.placement) == a.num_workers
            assert {p.node_id for p in a.placement} <= live
    reservation = state.reservation
    if victims:
        assert reservation is not None
        head = jobs[reservation.job_id]
        rank = cfg.priority_classes
        for v in victims:
            g = gangs[v.job_id]
            assert not g.preempting
            if g.queue == head.queue:
                assert rank[g.priority_class] < rank[head.priority_class]
    if reservation is None or reservation.start_by_s is None:
        return
    # At T, the GPUs promised to the head are free whatever was admitted now.
    t = reservation.start_by_s
    # Releasing: asked now, asked earlier (preempting set, or preempted per the state after it
    # started: a victim is asked once), or ending by T.
    preempted = {v.job_id for v in victims}
    asked = {p.job_id: p.at_s for p in recent}
    free_at_t = {n.node_id: n.gpus_total for n in snap.nodes}
    for g in snap.running:
        ends_by_t = g.expected_end_s is not None and g.expected_end_s <= t
        asked_before = g.job_id in asked and asked[g.job_id] >= g.started_s
        if not (g.preempting or asked_before or g.job_id in preempted or ends_by_t):
            for n, k in g.gpus_by_node.items():
                free_at_t[n] -= k
    for a in admits:
        j = jobs[a.job_id]
        if j.max_runtime_s is None or snap.now_s + j.max_runtime_s > t:
            for p in a.placement:
                free_at_t[p.node_id] -= p.num_workers * a.gpus_per_worker
    for n, gpus in reservation.gpus_by_node:
        assert free_at_t[n] >= gpus, (n, gpus, free_at_t)


@pytest.mark.parametrize(
    ("r0_started_s", "asked_at_s", "preempted"),
    [
        pytest.param(0.0, 0.0, [], id="asked-at-its-start-is-releasing-head-reserves-now"),
        pytest.param(0.0, 50.0, [], id="asked-after-it-started-is-releasing-not-asked-again"),
        pytest.param(60.0, 50.0, ["r0"], id="asked-before-a-restart-holds-again-reclaimed"),
    ],
)
def test_victim_asked_per_state_counts_as_releasing_at_T(
    r0_started_s: float, asked_at_s: float, preempted: list[str]
) -> None:
    # Found by the property: n0 (2 GPUs) is full with r0 and r1 of team a (share 1 GPU); r0 was
    # preempted per the state but its snapshot does not say `preempting` yet. b's head q0 needs
    # 1 GPU: r0's GPU is releasing, so q0 reserves it for now without asking r0 again.
    running = [
        gang("r0", {"n0": 1}, queue="a", priority="low", started_s=r0_started_s),
        gang("r1", {"n0": 1}, queue="a", priority="low"),
    ]
    snap = snapshot(
        [node("n0", gpus_total=2)],
        running=running,
        queued=[job("q0", 1, 1, queue="b", priority="low")],
    )
    out = run(snap, TEAMS, AdmissionState(preemptions=(PreemptionRecord("r0", asked_at_s),)))
    assert out.preempted == preempted
    assert out.admitted == {}
    assert out.state.reservation is not None
    assert out.state.reservation.job_id == "q0"
    assert out.state.reservation.start_by_s == 100.0
    assert out.state.reservation.gpus_by_node == (("n0", 1),)


@pytest.mark.parametrize(
    ("freshest", "victims"),
    [
        pytest.param("a3", ["a3"], id="one-reclaim-victim-enough"),
        pytest.param("a1", [], id="second-victim-would-push-a-below-share"),
    ],
)
def test_reclaim_stops_once_the_lender_is_back_within_share(
    freshest: str, victims: list[str]
) -> None:
    # Team a holds 12 of 16 (share 8). b1 needs 8 on one node; only y (a3 + 4 free) can give it
    # with one victim. If a1 on x is the cheapest victim, taking it leaves a at 8 = its share,
    # so a2/a3 are no longer reclaimable and nothing fits: nobody is preempted.
    ckpt = {name: (99.0 if name == freshest else 10.0) for name in ("a1", "a2", "a3")}
    running = [
        gang("a1", {"x": 4}, queue="a", last_checkpoint_s=ckpt["a1"]),
        gang("a2", {"x": 4}, queue="a", last_checkpoint_s=ckpt["a2"]),
        gang("a3", {"y": 4}, queue="a", last_checkpoint_s=ckpt["a3"]),
    ]
    snap = snapshot([node("x"), node("y")], running=running, queued=[job("b1", 1, 8, queue="b")])
    assert run(snap, TEAMS).preempted == victims


def test_cpu_only_gang_is_admitted_without_gpus() -> None:
    out = run(
        snapshot(
            [node("a", gpus_total=1)], running=[gang("r", {"a": 1})], queued=[job("cpu", 3, 0)]
        )
    )
    assert out.admitted == {"cpu": {}}


def test_unhealthy_nodes_are_never_placed_on() -> None:
    nodes = [node("bad", healthy=False), node("good", gpus_total=4)]
    out = run(snapshot(nodes, queued=[job("j", 1, 4), job("k", 1, 4)]))
    assert out.admitted == {"j": {"good": 1}}


@pytest.mark.parametrize(
    ("not_before_s", "admitted"),
    [
        pytest.param(None, ["backoff", "next"], id="no-backoff"),
        pytest.param(99.0, ["backoff", "next"], id="backoff-over"),
        pytest.param(130.0, ["next"], id="backing-off-skipped"),
    ],
)
def test_backoff_after_failed_start(not_before_s: float | None, admitted: list[str]) -> None:
    queued = [job("backoff", 1, 4, not_before_s=not_before_s), job("next", 1, 4, submitted_s=1)]
    out = run(snapshot([node("a")], queued=queued))
    assert list(out.admitted) == admitted
