"""policies.providers as tables: delivery, room, who rents, and the way back to the cheapest."""

from __future__ import annotations

import math

import pytest

from policies.plan import DrainNode
from policies.providers import (
    Provider,
    ProviderState,
    advance,
    allocate,
    ask,
    by_price,
    caps,
    delivered_by_provider,
    live_by_provider,
    migrate_back,
    provider_of,
)
from policies.snapshot import Pool
from tests.unit.builders import node, snapshot

A = Provider("a", 4, 2.0, deadline_s=100, backoff_s=1000)
B = Provider("b", 4, 3.0, deadline_s=100, backoff_s=1000)
C = Provider("c", 8, 2.0, deadline_s=100, backoff_s=1000)
"""``c`` costs what ``a`` does: the config's order breaks the tie."""


def ext(node_id: str, provider: str | None, gpus: int = 2, healthy: bool = True):  # type: ignore[no-untyped-def]
    labels = {"provider": provider} if provider is not None else {}
    return node(node_id, gpus_total=gpus, pool=Pool.EXTERNAL, labels=labels, healthy=healthy)


@pytest.mark.parametrize(
    ("state", "live", "now", "expected"),
    [
        pytest.param(ProviderState(), 0, 50.0, ProviderState(), id="nothing-asked"),
        pytest.param(ProviderState(4), 4, 50.0, ProviderState(4), id="delivered"),
        pytest.param(ProviderState(4), 2, 50.0, ProviderState(4, 50.0), id="short-starts-clock"),
        pytest.param(
            ProviderState(4, 10.0), 2, 109.0, ProviderState(4, 10.0), id="within-deadline"
        ),
        pytest.param(
            ProviderState(4, 10.0), 2, 110.0, ProviderState(4, None, 1110.0), id="past-deadline"
        ),
        pytest.param(ProviderState(4, 10.0), 4, 500.0, ProviderState(4), id="caught-up"),
        pytest.param(
            ProviderState(4, None, 1110.0), 0, 500.0, ProviderState(4, None, 1110.0), id="stays-out"
        ),
        pytest.param(
            ProviderState(4, None, 1110.0), 0, 1110.0, ProviderState(4, 1110.0), id="back-in"
        ),
    ],
)
def test_delivery(state: ProviderState, live: int, now: float, expected: ProviderState) -> None:
    assert advance((A,), {"a": state}, {"a": live}, now) == {"a": expected}


@pytest.mark.parametrize(
    ("state", "gpus", "live", "expected"),
    [
        pytest.param(ProviderState(), 2, 0, ProviderState(2, 7.0), id="new-ask-starts-clock"),
        pytest.param(ProviderState(2, 3.0), 4, 0, ProviderState(4, 3.0), id="more-keeps-start"),
        pytest.param(ProviderState(2, 3.0), 2, 2, ProviderState(2), id="live-owes-nothing"),
        pytest.param(
            ProviderState(0, None, 99.0), 0, 0, ProviderState(0, None, 99.0), id="out-kept"
        ),
    ],
)
def test_ask(state: ProviderState, gpus: int, live: int, expected: ProviderState) -> None:
    assert ask(state, gpus, live, 7.0) == expected


@pytest.mark.parametrize(
    ("states", "live", "expected"),
    [
        pytest.param({}, {}, {"a": 4, "b": 4}, id="all-in"),
        pytest.param(
            {"a": ProviderState(out_until_s=10.0)}, {"a": 2}, {"a": 2, "b": 4}, id="out-keeps-live"
        ),
        pytest.param(
            {"a": ProviderState(out_until_s=10.0)}, {"a": 6}, {"a": 4, "b": 4}, id="never-over-max"
        ),
        pytest.param(
            {"a": ProviderState(out_until_s=5.0)}, {}, {"a": 4, "b": 4}, id="back-off-over"
        ),
    ],
)
def test_room(
    states: dict[str, ProviderState], live: dict[str, int], expected: dict[str, int]
) -> None:
    assert caps((A, B), states, live, 5.0) == expected


@pytest.mark.parametrize(
    ("providers", "room", "wanted", "expected"),
    [
        pytest.param((B, A), {"a": 4, "b": 4}, 3, {"a": 3, "b": 0}, id="cheapest-first"),
        pytest.param((B, A), {"a": 4, "b": 4}, 6, {"a": 4, "b": 2}, id="spills-to-dearer"),
        pytest.param((B, A), {"a": 0, "b": 4}, 3, {"a": 0, "b": 3}, id="cheapest-out"),
        pytest.param((B, A), {"a": 4, "b": 4}, 20, {"a": 4, "b": 4}, id="beyond-all-room"),
        pytest.param((B, A), {"a": 4, "b": 4}, 0, {"a": 0, "b": 0}, id="nothing"),
        pytest.param((C, A), {"a": 4, "c": 8}, 5, {"c": 5, "a": 0}, id="tie-config-order"),
    ],
)
def test_allocate(
    providers: tuple[Provider, ...], room: dict[str, int], wanted: int, expected: dict[str, int]
) -> None:
    assert allocate(providers, room, wanted) == expected


def test_price_order_is_stable_and_providers_are_found_by_label() -> None:
    assert [p.name for p in by_price((B, C, A))] == ["c", "a", "b"]
    assert provider_of(ext("n", "b"), (A, B)) == "b"
    assert provider_of(ext("n", None), (A, B)) == "a"  # unlabelled: the first configured
    assert provider_of(ext("n", "gone"), (A, B)) == "a"
    snap = snapshot([ext("n1", "a"), ext("n2", "b"), ext("n3", "b", healthy=False)])
    assert live_by_provider(snap, (A, B)) == {"a": 2, "b": 2}


MIGRATE_NODES = [ext("a1", "a"), ext("a2", "a"), ext("b1", "b"), ext("b2", "b")]


@pytest.mark.parametrize(
    ("allocation", "used", "draining", "expected"),
    [
        pytest.param(
            {"a": 4, "b": 0},
            {"a1": 2, "b1": 1, "b2": 2},
            frozenset(),
            "b1",
            id="least-used-of-dearest",
        ),
        pytest.param(
            {"a": 4, "b": 0}, {"a1": 2, "a2": 1, "b1": 2}, frozenset(), None, id="no-room-cheaper"
        ),
        pytest.param({"a": 4, "b": 0}, {"b1": 2}, frozenset({"x"}), None, id="one-drain-at-a-time"),
        pytest.param(
            {"a": 4, "b": 3}, {"b1": 2, "b2": 1}, frozenset(), None, id="would-be-rented-again"
        ),
        pytest.param({"a": 4, "b": 4}, {"b1": 2}, frozenset(), None, id="allocated-keeps"),
        pytest.param({"a": 4, "b": 0}, {}, frozenset(), None, id="idle-is-the-autoscalers"),
        pytest.param({"a": 4, "b": 2}, {"b1": 2, "b2": 1}, frozenset(), "b2", id="surplus-only"),
    ],
)
def test_migrate_back(
    allocation: dict[str, int], used: dict[str, int], draining: frozenset[str], expected: str | None
) -> None:
    drain = migrate_back((A, B), allocation, MIGRATE_NODES, used, draining)
    if expected is None:
        assert drain is None
    else:
        assert isinstance(drain, DrainNode) and drain.node_id == expected
        assert "provider b" in drain.reason and "cheaper" in drain.reason


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": "A"}, "name"),
        ({"name": "x" * 33}, "name"),
        ({"max_gpus": -1}, "max_gpus"),
        ({"price_per_gpu_hour": math.nan}, "price"),
        ({"price_per_gpu_hour": -1.0}, "price"),
        ({"deadline_s": 0}, "deadline_s"),
    ],
)
def test_a_provider_refuses_bad_values(kwargs: dict[str, object], error: str) -> None:
    args: dict[str, object] = {"name": "a", "max_gpus": 4, "price_per_gpu_hour": 1.0} | kwargs
    with pytest.raises(ValueError, match=error):
        Provider(**args)  # type: ignore[arg-type]


def test_a_node_taken_back_with_notice_counts_as_delivered_not_as_room() -> None:
    """A drained (noticed) node is out of its provider's room at once, so the capacity is
    asked for again, but the provider is not on the clock for it: it delivered that node."""
    snap = snapshot([ext("a1", "a"), ext("a2", "a", healthy=False), ext("b1", "b")])
    assert live_by_provider(snap, (A, B)) == {"a": 2, "b": 2}
    assert delivered_by_provider(snap, (A, B)) == {"a": 4, "b": 2}
    assert advance((A, B), {"a": ProviderState(4)}, delivered_by_provider(snap, (A, B)), 9.0)[
        "a"
    ] == ProviderState(4)
