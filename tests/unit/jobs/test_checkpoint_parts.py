"""Checkpoint building blocks: layout round trips, retention plans, retry classification,
snapshot flattening and parallel copies, memory tier placement. No Ray, no network."""

from __future__ import annotations

import random
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError

from jobs.checkpoint.capturing import HostBuffer, rebuild_state, take_snapshot
from jobs.checkpoint.copying import CopyPair, copy_host_tensors, plan_copy_chunks
from jobs.checkpoint.layout import (
    CorruptCheckpointError,
    Manifest,
    RankIndex,
    RankRecord,
    ShardEntry,
    TensorEntry,
    index_key,
    keep_key,
    manifest_key,
    shard_key,
    step_of_key,
)
from jobs.checkpoint.memory_tiers import RayMemoryTier, label_matches, peer_nodes
from jobs.checkpoint.payload import plan_layout, tensor_views
from jobs.checkpoint.retention import plan_retention, should_abort_upload
from jobs.checkpoint.retrying import RetryPolicy, call_with_retries, is_retryable
from jobs.checkpoint.snapshot import flatten_state, unflatten_state


def client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


def step_keys(step: int, *, committed: bool, keep: bool = False) -> list[str]:
    keys = [shard_key(step, 0, 0), index_key(step, 0)]
    if committed:
        keys.append(manifest_key(step))
    if keep:
        keys.append(keep_key(step))
    return keys


def test_index_round_trip() -> None:
    index = RankIndex(
        step=7,
        rank=1,
        world_size=2,
        payload_bytes=128,
        tensors=(TensorEntry("float32", (4, 8), 0, 128),),
        shards=(
            ShardEntry(shard_key(7, 1, 0), 0, 100, "0a0b0c0d"),
            ShardEntry(shard_key(7, 1, 1), 100, 28, "01020304"),
        ),
        skeleton=b"\x80\x05pickled",
    )
    assert RankIndex.from_json_bytes(index.to_json_bytes()) == index


def test_manifest_round_trip() -> None:
    manifest = Manifest(
        step=3,
        world_size=2,
        ranks=(RankRecord(0, index_key(3, 0), "aa", 10), RankRecord(1, index_key(3, 1), "bb", 20)),
        created_unix_s=1.5,
        keep=True,
        metadata={"loss": 0.25},
    )
    parsed = Manifest.from_json_bytes(manifest.to_json_bytes())
    assert parsed == manifest and parsed.total_bytes == 30


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b"{", "not valid", id="truncated-json"),
        pytest.param(b"[]", "not an object", id="not-an-object"),
        pytest.param(b'{"format_version": 99}', "format_version 99", id="future-version"),
        pytest.param(
            b'{"format_version":1,"step":1,"world_size":2,"created_unix_s":0,"ranks":'
            b'[{"rank":0,"index_key":"k","index_checksum":"c","payload_bytes":1}]}',
            "expected 0..1",
            id="missing-rank",
        ),
    ],
)
def test_bad_manifest_is_corrupt(data: bytes, message: str) -> None:
    with pytest.raises(CorruptCheckpointError, match=message):
        Manifest.from_json_bytes(data)


@pytest.mark.parametrize(
    ("key", "step"),
    [
        pytest.param(manifest_key(12), 12, id="manifest"),
        pytest.param(shard_key(5, 3, 2), 5, id="shard"),
        pytest.param("notes.txt", None, id="foreign-key"),
        pytest.param("step-12/manifest.json", None, id="short-step"),
    ],
)
def test_step_of_key(key: str, step: int | None) -> None:
    assert step_of_key(key) == step


@pytest.mark.parametrize(
    ("layout", "keep_last", "kept", "deleted_committed", "deleted_partial"),
    [
        pytest.param({1: True, 2: True, 3: True, 4: True}, 2, (3, 4), (1, 2), (), id="keep-last-2"),
        pytest.param(
            {1: True, 2: False, 3: True, 4: False}, 1, (3,), (1,), (2,), id="partial-below-newest"
        ),
        pytest.param({1: True, 5: False}, 3, (1,), (), (), id="newer-partial-may-be-uploading"),
        pytest.param({2: False, 3: False}, 1, (), (), (), id="nothing-committed-keeps-all"),
    ],
)
def test_plan_retention(
    layout: dict[int, bool],
    keep_last: int,
    kept: tuple[int, ...],
    deleted_committed: tuple[int, ...],
    deleted_partial: tuple[int, ...],
) -> None:
    keys = [k for step, done in layout.items() for k in step_keys(step, committed=done)]
    plan = plan_retention(keys, keep_last=keep_last)
    assert plan.kept_steps == kept
    assert plan.deleted_committed_steps == deleted_committed
    assert plan.deleted_partial_steps == deleted_partial


def test_retention_deletes_manifest_before_data_and_honours_keep() -> None:
    keys = step_keys(1, committed=True, keep=True) + step_keys(2, committed=True)
    keys += step_keys(3, committed=True)
    plan = plan_retention(keys, keep_last=1)
    assert plan.kept_steps == (1, 3)
    assert plan.keys_in_order[0] == manifest_key(2)
    assert set(plan.keys_in_order) == set(step_keys(2, committed=True))


@pytest.mark.parametrize(
    ("key", "age_s", "newest", "abort"),
    [
        pytest.param(shard_key(1, 0, 0), 1.0, 2, True, id="older-than-newest-commit"),
        pytest.param(shard_key(3, 0, 0), 1.0, 2, False, id="newer-fresh"),
        pytest.param(shard_key(3, 0, 0), 7200.0, 2, True, id="newer-but-stale"),
        pytest.param(shard_key(3, 0, 0), 1.0, None, False, id="nothing-committed"),
    ],
)
def test_should_abort_upload(key: str, age_s: float, newest: int | None, abort: bool) -> None:
    assert (
        should_abort_upload(key, age_s, newest_committed_step=newest, max_upload_age_s=3600)
        is abort
    )


@pytest.mark.parametrize(
    ("exc", "retryable"),
    [
        pytest.param(client_error("SlowDown", 503), True, id="slowdown"),
        pytest.param(client_error("InternalError", 500), True, id="internal-error"),
        pytest.param(client_error("Whatever", 502), True, id="bad-gateway"),
        pytest.param(client_error("TooManyRequests", 429), True, id="429"),
        pytest.param(client_error("AccessDenied", 403), False, id="access-denied"),
        pytest.param(client_error("NoSuchBucket", 404), False, id="no-such-bucket"),
        pytest.param(ConnectionClosedError(endpoint_url="http://x"), True, id="reset"),
        pytest.param(EndpointConnectionError(endpoint_url="http://x"), True, id="refused"),
        pytest.param(ValueError("bug"), False, id="programming-error"),
    ],
)
def test_is_retryable(exc: BaseException, retryable: bool) -> None:
    assert is_retryable(exc) is retryable


def test_retries_until_success_and_reports_each_retry() -> None:
    failures = [client_error("SlowDown", 503), ConnectionClosedError(endpoint_url="http://x")]
    seen: list[str] = []

    def flaky() -> str:
        if failures:
            raise failures.pop(0)
        return "ok"

    delays: list[float] = []
    result = call_with_retries(
        flaky,
        what="put k",
        policy=RetryPolicy(max_attempts=5, base_delay_s=0.1, max_delay_s=1.0),
        on_retry=lambda what, exc: seen.append(type(exc).__name__),
        sleep=delays.append,
        rng=random.Random(0),
    )
    assert result == "ok"
    assert seen == ["ClientError", "ConnectionClosedError"]
    assert 0 <= delays[0] <= 0.1 and 0 <= delays[1] <= 0.2


def test_gives_up_after_max_attempts_and_never_retries_fatal_errors() -> None:
    calls = {"n": 0}

    def always_throttled() -> None:
        calls["n"] += 1
        raise client_error("SlowDown", 503)

    with pytest.raises(ClientError):
        call_with_retries(
            always_throttled, what="x", policy=RetryPolicy(max_attempts=3), sleep=lambda _s: None
        )
    assert calls["n"] == 3

    calls["n"] = 0

    def denied() -> None:
        calls["n"] += 1
        raise client_error("AccessDenied", 403)

    with pytest.raises(ClientError):
        call_with_retries(denied, what="x", policy=RetryPolicy(), sleep=lambda _s: None)
    assert calls["n"] == 1


def test_backoff_is_capped() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=2.0)
    rng = random.Random(1)
    assert all(policy.delay_s(attempt, rng) <= 2.0 for attempt in range(20))


def test_flatten_keeps_container_types_and_order() -> None:
    state = OrderedDict(b=torch.ones(2), a=[1, (torch.zeros(1), "x")])
    skeleton, tensors = flatten_state(state)
    assert len(tensors) == 2
    rebuilt = unflatten_state(skeleton, tensors)
    assert type(rebuilt) is OrderedDict and list(rebuilt) == ["b", "a"]
    assert rebuilt["a"][1][1] == "x" and rebuilt["a"][1][0] is tensors[1]


def test_layout_offsets_are_aligned_and_cover_every_tensor() -> None:
    entries, total = plan_layout(
        [torch.zeros(3, dtype=torch.uint8), torch.zeros(5), torch.zeros(0)]
    )
    assert [e.offset_bytes % 64 for e in entries] == [0, 0, 0]
    assert [e.nbytes for e in entries] == [3, 20, 0]
    assert total == 128


def test_host_buffer_is_reused_across_snapshots() -> None:
    buffer = HostBuffer(pin_memory=False)
    first = take_snapshot({"w": torch.arange(100.0)}, buffer)
    pointer = first.payload.data_ptr()
    second = take_snapshot({"w": torch.arange(100.0) * 2}, buffer)
    assert second.payload.data_ptr() == pointer
    rebuilt = rebuild_state(second.skeleton, second.tensors, second.payload)
    assert torch.equal(rebuilt["w"], torch.arange(100.0) * 2)
    assert rebuilt["w"].data_ptr() != pointer  # restored tensors own their memory


MIB = 1024 * 1024


def copy_pairs(sizes_bytes: list[int], *, strided: bool = False) -> list[CopyPair]:
    """(destination view, source) pairs like take_snapshot's: fp32 sources of the given sizes
    (a transposed, non-contiguous source when `strided`), each destination a view of one
    zeroed buffer."""
    sources = []
    for i, nbytes in enumerate(sizes_bytes):
        n = nbytes // 4
        if strided:
            src = torch.arange(n, dtype=torch.float32).add_(i).reshape(-1, 64).t()
        else:
            src = torch.arange(n, dtype=torch.float32).add_(i)
        sources.append(src)
    entries, total = plan_layout(sources)
    buffer = torch.zeros(total, dtype=torch.uint8)
    return list(zip(tensor_views(buffer, entries), sources, strict=True))


@pytest.mark.parametrize(
    ("sizes_mib", "threads", "num_chunks"),
    [
        pytest.param([64] * 16, 1, 1, id="one-thread-one-chunk"),
        pytest.param([4, 4, 4], 4, 1, id="under-two-min-chunks-stays-whole"),
        pytest.param([64] * 16, 2, 8, id="1GiB-2-threads-8-chunks"),
        pytest.param([1024], 4, 16, id="one-big-tensor-is-split"),
        pytest.param([1] * 40, 2, 5, id="small-tensors-grouped-8MiB-chunks"),
    ],
)
def test_copy_chunks_are_about_equal_and_cover_every_byte(
    sizes_mib: list[int], threads: int, num_chunks: int
) -> None:
    pairs = copy_pairs([s * MIB for s in sizes_mib])
    chunks = plan_copy_chunks(pairs, threads=threads)
    assert len(chunks) == num_chunks
    sizes = [sum(s.numel() * s.element_size() for _, s in chunk) for chunk in chunks]
    assert sum(sizes) == sum(sizes_mib) * MIB
    assert max(sizes) - min(sizes) <= max(sizes) // 2 or len(chunks) == 1


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_copy_host_tensors_with_a_pool_is_exact(strided: bool, threads: int) -> None:
    pairs = copy_pairs([5 * MIB, 13 * MIB, 256, 7 * MIB + 256], strided=strided)
    with ThreadPoolExecutor(2) as pool:
        before = torch.get_num_threads()
        copy_host_tensors(pairs, pool=pool, threads=threads)
        assert torch.get_num_threads() == before
    for dst, src in pairs:
        assert torch.equal(dst, src)


def test_copy_pool_failure_is_raised() -> None:
    pairs = copy_pairs([16 * MIB, 16 * MIB])

    class Broken(ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            def boom() -> None:
                raise RuntimeError("copy thread died")

            return super().submit(boom)

    with Broken(1) as pool, pytest.raises(RuntimeError, match="copy thread died"):
        copy_host_tensors(pairs, pool=pool, threads=2)


@pytest.mark.parametrize(
    ("labels", "selector", "matches"),
    [
        pytest.param({"pool": "cluster"}, {"pool": "cluster"}, True, id="equal"),
        pytest.param({"pool": "head"}, {"pool": "cluster"}, False, id="other-pool"),
        pytest.param({}, {"pool": "cluster"}, False, id="unlabelled"),
        pytest.param({"ray.io/node-id": "aa"}, {"ray.io/node-id": "!aa"}, False, id="not-self"),
        pytest.param({"ray.io/node-id": "bb"}, {"ray.io/node-id": "!aa"}, True, id="peer"),
        pytest.param({"zone": "b"}, {"zone": "in(a, b)"}, True, id="in"),
        pytest.param({"zone": "b"}, {"zone": "!in(a,b)"}, False, id="not-in"),
    ],
)
def test_label_matches(labels: dict[str, str], selector: dict[str, str], matches: bool) -> None:
    assert label_matches(labels, selector) is matches


def ray_node(node_id: str, pool: str, *, alive: bool = True) -> dict[str, Any]:
    """One entry of `ray.nodes()` as Ray 2.60 lists it."""
    return {"NodeID": node_id, "Alive": alive, "Labels": {"pool": pool, "ray.io/node-id": node_id}}


def test_peer_nodes_exclude_the_writer_the_head_and_dead_nodes() -> None:
    nodes = [
        ray_node("head", "head"),
        ray_node("a", "cluster"),
        ray_node("b", "cluster"),
        ray_node("c", "cluster", alive=False),
        ray_node("x", "external"),
    ]
    assert peer_nodes(nodes, {"pool": "cluster"}, "a") == ["b"]
    assert peer_nodes(nodes[:2], {"pool": "cluster"}, "a") == []


def test_holder_is_created_detached_cpu_free_and_off_the_writers_node() -> None:
    tier = RayMemoryTier("job-7")
    options = tier.actor_options(3, "ab" * 28)
    assert options == {
        "name": "job-7/rank-00003",
        "namespace": "rcp-checkpoints",
        "lifetime": "detached",
        "get_if_exists": True,
        "num_cpus": 0,
        "max_restarts": 0,
        "label_selector": {"pool": "cluster", "ray.io/node-id": "!" + "ab" * 28},
    }
    zoned = RayMemoryTier("job-7", label_selector={"pool": "cluster", "zone": "a"})
    assert zoned.actor_options(0, "n1")["label_selector"] == {
        "pool": "cluster",
        "zone": "a",
        "ray.io/node-id": "!n1",
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"name_prefix": ""}, "non-empty name_prefix", id="no-name"),
        pytest.param(
            {"name_prefix": "j", "label_selector": {"ray.io/node-id": "x"}},
            "must not set 'ray.io/node-id'",
            id="node-id-in-selector",
        ),
        pytest.param({"name_prefix": "j", "put_timeout_s": 0}, "put_timeout_s", id="no-timeout"),
    ],
)
def test_bad_ray_memory_tier_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RayMemoryTier(**kwargs)


def test_host_buffer_payload_views_are_contiguous_per_tensor() -> None:
    ((dst, src),) = copy_pairs([3 * MIB], strided=True)
    assert dst.is_contiguous() and not src.is_contiguous()
