"""Desired state <-> Serve application configs, and the serving config's validation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from omegaconf import OmegaConf

from serve.config import ModelConfig, ServingConfig, serving_from_dict, validate_serving
from serve.spec import (
    INGRESS_APP,
    DesiredState,
    app_name,
    backend_route_prefix,
    build_app_configs,
    declarative_configs,
    desired_from_app_configs,
    initial_state,
    parse_app_name,
)


def make_serving(*names: str, **model_kwargs: Any) -> ServingConfig:
    return ServingConfig(models=[ModelConfig(name=n, **model_kwargs) for n in names or ("sample",)])


def by_name(apps: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in apps}


def test_initial_state_puts_min_replicas_in_initial_pool_with_zero_weights() -> None:
    state = initial_state(make_serving("a", "b", min_replicas=2, initial_pool="external"))
    assert state.target("a", "external") == 2 and state.target("a", "cluster") == 0
    assert state.weight("b", "external") == 0.0


@pytest.mark.parametrize(
    ("targets", "apps"),
    [
        pytest.param(
            {("sample", "cluster"): 2}, {INGRESS_APP, "rcp-sample-cluster"}, id="one-pool"
        ),
        pytest.param(
            {("sample", "cluster"): 1, ("sample", "external"): 3},
            {INGRESS_APP, "rcp-sample-cluster", "rcp-sample-external"},
            id="both-pools",
        ),
        pytest.param(
            {("sample", "cluster"): 0, ("sample", "external"): 2},
            {INGRESS_APP, "rcp-sample-external"},
            id="pool-at-zero-has-no-app",
        ),
    ],
)
def test_build_app_configs_apps(targets: dict[tuple[str, str], int], apps: set[str]) -> None:
    state = DesiredState(serving=make_serving(), targets=targets)
    assert set(by_name(build_app_configs(state))) == apps


def test_backend_app_pins_pool_and_carries_target() -> None:
    serving = make_serving(num_gpus=1.0, num_cpus=2.0, max_ongoing_requests=5)
    state = DesiredState(serving=serving, targets={("sample", "external"): 3})
    app = by_name(build_app_configs(state))["rcp-sample-external"]
    dep = app["deployments"][0]
    assert dep["num_replicas"] == 3
    assert dep["max_ongoing_requests"] == 5
    assert dep["ray_actor_options"] == {
        "num_cpus": 2.0,
        "num_gpus": 1.0,
        "resources": {"pool_external": 1},
    }
    assert (
        app["route_prefix"] == "/_rcp/sample/external" == backend_route_prefix("sample", "external")
    )
    assert "autoscaling_config" not in dep
    assert dep["user_config"] == {}


def test_a_models_user_config_is_a_lightweight_update() -> None:
    """`ModelConfig.user_config` reaches the backend as Serve's user_config, never its args:
    changing it reconfigures the running replicas instead of restarting them."""
    slow = make_serving()
    slow.models[0].user_config = {"extra_latency_ms": 200}
    targets = {("sample", "cluster"): 2}
    before = by_name(build_app_configs(DesiredState(serving=make_serving(), targets=targets)))
    after = by_name(build_app_configs(DesiredState(serving=slow, targets=targets)))
    app = "rcp-sample-cluster"
    assert after[app]["args"] == before[app]["args"]
    assert after[app]["deployments"][0]["user_config"] == {"extra_latency_ms": 200}
    assert validate_serving(slow) == []


def test_ingress_runs_on_the_head_and_cluster_nodes_never_external() -> None:
    """Beside the proxies of the head and the cluster nodes, never on a rented node (the
    autoscaler must be free to remove it). Ray's own schema accepts the selector."""
    from ray._private.label_utils import validate_label_selector  # deferred: ray is heavy
    from ray.serve.schema import ServeDeploySchema  # deferred: ray is heavy

    apps = build_app_configs(DesiredState(serving=make_serving(), targets={}))
    dep = by_name(apps)[INGRESS_APP]["deployments"][0]
    assert "resources" not in dep["ray_actor_options"]  # not pinned to the head any more
    selector = dep["ray_actor_options"]["label_selector"]
    assert selector == {"pool": "in(head,cluster)"}
    assert validate_label_selector(selector) is None
    ServeDeploySchema.model_validate({"applications": apps})


def test_target_and_weight_changes_keep_code_version_inputs() -> None:
    """Serve hashes import_path and args into the code version: they must not change when
    targets or weights change, so every change is a lightweight update."""
    base = initial_state(make_serving())
    changed = base.with_target("sample", "cluster", 4).with_weights("sample", {"cluster": 4})
    before, after = by_name(build_app_configs(base)), by_name(build_app_configs(changed))
    for name in before:
        assert (before[name]["import_path"], before[name]["args"]) == (
            after[name]["import_path"],
            after[name]["args"],
        )
        assert before[name]["route_prefix"] == after[name]["route_prefix"]
        if name != INGRESS_APP:  # a backend: only its replica count changed
            before_dep, after_dep = before[name]["deployments"][0], after[name]["deployments"][0]
            assert {**before_dep, "num_replicas": 0} == {**after_dep, "num_replicas": 0}
    ingress_before = before[INGRESS_APP]["deployments"][0]["user_config"]
    ingress_after = after[INGRESS_APP]["deployments"][0]["user_config"]
    assert ingress_after["generation"] == ingress_before["generation"] + 1
    assert ingress_after["weights"]["sample"] == {"cluster": 4.0, "external": 0.0}


def test_round_trip_through_app_configs() -> None:
    state = (
        initial_state(make_serving("a", "b"))
        .with_target("a", "external", 2)
        .with_weights("a", {"cluster": 1, "external": 2})
    )
    configs = {a["name"]: a for a in build_app_configs(state)}
    back = desired_from_app_configs(configs)
    assert back is not None
    assert back.targets == {k: v for k, v in state.targets.items() if v > 0}
    assert back.weights == state.weights
    assert back.generation == state.generation
    assert back.serving == state.serving


def test_not_deployed_when_ingress_app_missing() -> None:
    assert desired_from_app_configs({"someone-else": {"name": "someone-else"}}) is None


def test_declarative_configs_skip_deleting_and_imperative_apps() -> None:
    details = {
        "applications": {
            "a": {"status": "RUNNING", "deployed_app_config": {"name": "a"}},
            "b": {"status": "DELETING", "deployed_app_config": {"name": "b"}},
            "c": {"status": "RUNNING", "deployed_app_config": None},
        }
    }
    assert set(declarative_configs(details)) == {"a"}


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        pytest.param(app_name("sample", "cluster"), ("sample", "cluster"), id="backend"),
        pytest.param(
            app_name("my_model", "external"), ("my_model", "external"), id="underscore-model"
        ),
        pytest.param(INGRESS_APP, None, id="ingress"),
        pytest.param("rcp-sample-gpu", None, id="unknown-pool"),
        pytest.param("other-app", None, id="foreign-app"),
    ],
)
def test_parse_app_name(name: str, parsed: tuple[str, str] | None) -> None:
    assert parse_app_name(name) == parsed


@pytest.mark.parametrize(
    ("change", "error"),
    [
        pytest.param(lambda s: s.with_target("sample", "gpu", 1), "unknown pool", id="bad-pool"),
        pytest.param(lambda s: s.with_target("sample", "cluster", -1), ">= 0", id="negative"),
        pytest.param(
            lambda s: s.with_target("nope", "cluster", 1), "unknown model", id="bad-model"
        ),
        pytest.param(
            lambda s: s.with_weights("sample", {"cluster": -1}), ">= 0", id="negative-weight"
        ),
    ],
)
def test_desired_state_rejects_bad_changes(change: Any, error: str) -> None:
    with pytest.raises((ValueError, KeyError), match=error):
        change(initial_state(make_serving()))


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        pytest.param(
            lambda c: setattr(c.models[0], "max_replicas", 0),
            "serving.models[0].max_replicas",
            id="max-below-min",
        ),
        pytest.param(
            lambda c: setattr(c.models[0], "min_cluster_replicas", 5),
            "serving.models[0].min_cluster_replicas: must be <= max_replicas (4)",
            id="cluster-floor-above-max",
        ),
        pytest.param(
            lambda c: setattr(c.models[0], "min_cluster_replicas", -1),
            "serving.models[0].min_cluster_replicas: must be >= 0",
            id="negative-cluster-floor",
        ),
        pytest.param(
            lambda c: setattr(c.models[0], "name", "Bad-Name"),
            "serving.models[0].name",
            id="bad-name",
        ),
        pytest.param(
            lambda c: setattr(c.models[0], "import_path", "nocolon"),
            "serving.models[0].import_path",
            id="bad-import-path",
        ),
        pytest.param(
            lambda c: setattr(c.models[0], "initial_pool", "gpu"),
            "serving.models[0].initial_pool",
            id="bad-pool",
        ),
        pytest.param(
            lambda c: c.models.append(ModelConfig()), "declared twice", id="duplicate-model"
        ),
        pytest.param(
            lambda c: setattr(c.ingress, "max_body_bytes", 0),
            "serving.ingress.max_body_bytes",
            id="zero-body-limit",
        ),
        pytest.param(lambda c: setattr(c, "models", []), "serving.models", id="no-models"),
        pytest.param(
            lambda c: setattr(c.ingress, "edge_table_max_age_s", 1.5),
            "serving.ingress.edge_table_max_age_s: must be between 2 and 30",
            id="edge-table-age-too-short",
        ),
        pytest.param(
            lambda c: setattr(c.ingress, "edge_table_max_age_s", 31.0),
            "serving.ingress.edge_table_max_age_s: must be between 2 and 30",
            id="edge-table-age-too-long",
        ),
        pytest.param(
            lambda c: setattr(c.ingress, "edge_table_max_age_s", float("nan")),
            "serving.ingress.edge_table_max_age_s: must be a finite number, got nan",
            id="nan-edge-table-age",
        ),
        pytest.param(
            lambda c: setattr(c, "latency_window_s", float("nan")),
            "serving.latency_window_s: must be a finite number, got nan",
            id="nan-latency-window",
        ),
        pytest.param(
            lambda c: setattr(c.models[0], "slo_p99_ms", 0.0),
            "serving.models[0].slo_p99_ms: must be > 0",
            id="zero-slo",
        ),
        pytest.param(
            lambda c: setattr(c.models[0], "slo_p99_ms", float("nan")),
            "serving.models[0].slo_p99_ms: must be a finite number, got nan",
            id="nan-slo",
        ),
        pytest.param(
            lambda c: setattr(c.models[0], "slo_p99_ms", float("inf")),
            "serving.models[0].slo_p99_ms: must be a finite number, got inf",
            id="infinite-slo",
        ),
        pytest.param(
            lambda c: setattr(c.models[0], "slo_p99_ms", 600_001.0),
            "serving.models[0].slo_p99_ms: must be > 0 and <= 600000 ms",
            id="slo-above-bound",
        ),
        pytest.param(
            lambda c: setattr(c.models[0], "slo_p99_ms", "fast"),
            "serving.models[0].slo_p99_ms: must be a number",
            id="slo-not-a-number",
        ),
        pytest.param(
            lambda c: setattr(c, "route_prefix", "/_rcp/api"),
            "serving.route_prefix: /_rcp/ is taken",
            id="prefix-under-the-backends",
        ),
        pytest.param(
            lambda c: setattr(c, "route_prefix", "/-/"),
            "serving.route_prefix: /-/ is taken",
            id="prefix-under-serve-and-edge",
        ),
    ],
)
def test_validate_serving_names_the_key(mutate: Any, key: str) -> None:
    cfg = ServingConfig()
    mutate(cfg)
    errors = validate_serving(cfg)
    assert any(key in e for e in errors), errors


def test_default_config_is_valid_and_omegaconf_compatible() -> None:
    assert validate_serving(ServingConfig()) == []
    merged = OmegaConf.merge(
        OmegaConf.structured(ServingConfig),
        {"models": [{"name": "mine", "import_path": "pkg.mod:Model", "init_kwargs": {"k": 1}}]},
    )
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, ServingConfig)
    assert cfg.models[0].name == "mine" and cfg.models[0].init_kwargs == {"k": 1}
    assert isinstance(cfg.models[0], ModelConfig)


def test_serving_from_dict_round_trip_and_unknown_key() -> None:
    cfg = make_serving("a", "b")
    assert serving_from_dict(dataclasses.asdict(cfg)) == cfg
    with pytest.raises(ValueError, match=r"serving.models\[0\].bogus"):
        serving_from_dict({"models": [{"name": "a", "bogus": 1}]})


ONE_FIELD_RULES = [
    # (section, field, bad value, the reason): every field's own check, one row each
    ("", "route_prefix", "api", "must start with '/'"),
    ("", "ready_timeout_s", 0.5, "must be >= 1"),
    ("ingress", "num_replicas", 0, "must be >= 1"),
    ("ingress", "max_replicas", 1, "must be >= num_replicas (2)"),
    ("ingress", "target_utilization", 0.0, "must be > 0 and <= 1"),
    ("ingress", "downscale_delay_s", -1.0, "must be >= 0"),
    ("ingress", "num_cpus", -1.0, "must be >= 0"),
    ("ingress", "max_ongoing_requests", 0, "must be >= 1"),
    ("ingress", "max_attempts", 0, "must be >= 1"),
    ("ingress", "attempt_timeout_s", 0.0, "must be >= 0.01"),
    ("ingress", "request_timeout_s", 0.0, "must be >= 0.01"),
    ("ingress", "retry_after_s", -1, "must be >= 0"),
    ("models[0]", "num_cpus", -1.0, "must be >= 0"),
    ("models[0]", "num_gpus", -1.0, "must be >= 0"),
    ("models[0]", "min_replicas", -1, "must be >= 0"),
    ("models[0]", "max_replicas", 0, "must be >= 1"),
    ("models[0]", "on_shortfall", "wait", "must be one of reclaim, yield"),
    ("models[0]", "max_ongoing_requests", 0, "must be >= 1"),
    ("models[0]", "target_ongoing_requests", 0.0, "must be >= 0.01"),
    ("models[0]", "upscale_delay_s", -1.0, "must be >= 0"),
    ("models[0]", "downscale_delay_s", -1.0, "must be >= 0"),
    ("models[0]", "graceful_shutdown_timeout_s", -1.0, "must be >= 0"),
    ("models[0]", "num_gpus", float("inf"), "must be a finite number"),
]


@pytest.mark.parametrize(
    ("section", "name", "value", "reason"),
    ONE_FIELD_RULES,
    ids=[f"{s}.{n}={v}" for s, n, v, _ in ONE_FIELD_RULES],
)
def test_every_serving_rule_names_the_key_and_reason(
    section: str, name: str, value: object, reason: str
) -> None:
    cfg = ServingConfig()
    target = {"": cfg, "ingress": cfg.ingress, "models[0]": cfg.models[0]}[section]
    setattr(target, name, value)
    key = ".".join(p for p in ("serving", section, name) if p)
    assert any(e.startswith(f"{key}: {reason}") for e in validate_serving(cfg)), validate_serving(
        cfg
    )
