"""JobSpec validation, dict and YAML round trips: every bad spec names its field."""

from __future__ import annotations

from typing import Any

import pytest

from jobs.spec import CheckpointSpec, JobSpec, SpecError

GOOD: dict[str, Any] = {
    "name": "llama-ft",
    "entrypoint": "python train.py --epochs 3",
    "num_workers": 4,
    "gpus_per_worker": 2,
}


def with_(**changes: Any) -> dict[str, Any]:
    data = dict(GOOD)
    for key, value in changes.items():
        if value is _DROP:
            data.pop(key, None)
        else:
            data[key] = value
    return data


_DROP = object()


BAD_SPECS = [
    pytest.param(with_(num_workers=0), "num_workers", "at least 1 worker", id="zero-workers"),
    pytest.param(with_(num_workers=-3), "num_workers", ">= 1", id="negative-workers"),
    pytest.param(with_(num_workers=2.5), "num_workers", "must be int", id="fractional-workers"),
    pytest.param(with_(num_workers=True), "num_workers", "got a boolean", id="bool-workers"),
    pytest.param(with_(gpus_per_worker=-1), "gpus_per_worker", ">= 0", id="negative-gpus"),
    pytest.param(with_(entrypoint=_DROP), "entrypoint", "required", id="missing-entrypoint"),
    pytest.param(with_(entrypoint="   "), "entrypoint", "non-empty", id="blank-entrypoint"),
    pytest.param(with_(name=_DROP), "name", "required", id="missing-name"),
    pytest.param(with_(name="has space"), "name", "letters, digits", id="bad-name"),
    pytest.param(with_(max_runtime_s=0), "max_runtime_s", "> 0", id="zero-runtime"),
    pytest.param(with_(max_runtime_s="1h"), "max_runtime_s", "got a string", id="string-runtime"),
    pytest.param(with_(num_wrkers=2), "num_wrkers", "did you mean 'num_workers'", id="typo-key"),
    pytest.param(
        with_(checkpoint={"interval_s": -5}), "checkpoint.interval_s", "> 0", id="bad-interval"
    ),
    pytest.param(
        with_(checkpoint={"intervl_s": 5}), "checkpoint.intervl_s", "unknown field", id="ckpt-typo"
    ),
    pytest.param(with_(checkpoint=[1]), "checkpoint", "mapping", id="ckpt-not-mapping"),
    pytest.param(
        with_(checkpoint={"uri": "gs://b"}), "checkpoint.uri", "s3:// or file://", id="bad-uri"
    ),
    pytest.param(
        with_(working_dir="./src", runtime_env={"working_dir": "./other"}),
        "runtime_env.working_dir",
        "not both",
        id="two-working-dirs",
    ),
]


@pytest.mark.parametrize(("data", "field", "message"), BAD_SPECS)
def test_bad_spec_names_the_field(data: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict(data)
    assert field in info.value.fields
    assert message in str(info.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_dict({"name": "x", "num_workers": 0, "gpus_per_worker": -1, "entrypoint": "e"})
    assert set(info.value.fields) == {"num_workers", "gpus_per_worker"}


def test_direct_construction_validates_too() -> None:
    with pytest.raises(SpecError, match="num_workers"):
        JobSpec(name="x", entrypoint="python t.py", num_workers=0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("name: [unclosed\n", "line 2", id="unclosed-list"),
        pytest.param("name: a\n  bad: indent: here\n", "not valid YAML", id="bad-indent"),
        pytest.param("", "empty", id="empty-file"),
        pytest.param("- just\n- a list\n", "must be a mapping, got a list", id="top-level-list"),
    ],
)
def test_malformed_yaml_is_a_spec_error(text: str, message: str) -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_yaml(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        pytest.param(
            {"priority_classes": ("low", "medium", "high")},
            "priority_class",
            "unknown priority class 'urgent'",
            id="unknown-priority-class",
        ),
        pytest.param(
            {"queues": ("research",)}, "queue", "unknown queue 'default'", id="unknown-queue"
        ),
    ],
)
def test_check_against_config(kwargs: dict[str, Any], field: str, message: str) -> None:
    spec = JobSpec.from_dict(with_(priority_class="urgent" if field == "priority_class" else "low"))
    with pytest.raises(SpecError) as info:
        spec.check_against(**kwargs)
    assert info.value.fields == (field,)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("workers", "gpus", "node_gpus", "field"),
    [
        pytest.param(4, 2, [8], None, id="fits-one-node"),
        pytest.param(2, 8, [8, 8], None, id="one-worker-per-node"),
        pytest.param(3, 8, [8, 8], "num_workers", id="more-gpus-than-the-pool-holds"),
        pytest.param(1, 16, [8, 8], "gpus_per_worker", id="worker-bigger-than-any-node"),
        pytest.param(3, 3, [4, 4], "num_workers", id="8-gpus-but-only-2-slots-of-3"),
    ],
)
def test_check_against_live_pool(
    workers: int, gpus: int, node_gpus: list[int], field: str | None
) -> None:
    spec = JobSpec.from_dict(with_(num_workers=workers, gpus_per_worker=gpus))
    if field is None:
        spec.check_against(cluster_node_gpus=node_gpus)
        return
    with pytest.raises(SpecError) as info:
        spec.check_against(cluster_node_gpus=node_gpus)
    assert info.value.fields == (field,)


def test_yaml_round_trip_keeps_every_field() -> None:
    spec = JobSpec(
        name="llama-ft",
        entrypoint="python train.py",
        num_workers=4,
        gpus_per_worker=2,
        cpus_per_worker=3.5,
        working_dir="./src",
        runtime_env={"env_vars": {"A": "1"}},
        queue="research",
        priority_class="high",
        max_runtime_s=7200,
        checkpoint=CheckpointSpec(interval_s=600, keep_last=3, uri="s3://b/ckpt"),
    )
    assert JobSpec.from_yaml(spec.to_yaml()) == spec
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert spec.gpus_total == 8


def test_defaults_from_minimal_yaml() -> None:
    spec = JobSpec.from_yaml("name: t\nentrypoint: python t.py\n")
    assert (spec.num_workers, spec.gpus_per_worker, spec.queue, spec.priority_class) == (
        1,
        1,
        "default",
        "medium",
    )
    assert spec.checkpoint == CheckpointSpec()


def test_type_and_value_problems_are_reported_together() -> None:
    with pytest.raises(SpecError) as info:
        JobSpec.from_yaml("num_workers: 0\ngpus_per_worker: two\n")
    assert set(info.value.fields) == {"name", "entrypoint", "num_workers", "gpus_per_worker"}
