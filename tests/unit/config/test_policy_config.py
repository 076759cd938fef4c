"""One source for every default: the config sections embed the policies' own dataclasses.

Each embedded policy field is inherited, not written again (the section's field *is* the
policy's `dataclasses.Field`), the default `Config` holds the policy's defaults, the adapters
in `controlplane.policy_config` rebuild the policy configs unchanged, the YAML keys users write
are the same as before, and a bad value is still named by its full key.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from controlplane.config import (
    Config,
    ConfigError,
    HealthConfig,
    JobsConfig,
    from_dict,
    load_config,
    to_dict,
)
from controlplane.policy_config import (
    admission_config,
    demand_config,
    placement_config,
    restart_limits,
)
from policies.admission import AdmissionConfig, PreemptionConfig, QueueShare
from policies.health import HealthThresholds, RemovalBudget
from policies.placement import MigrateBackConfig, PlacementConfig
from policies.providers import Provider
from policies.restarts import RestartLimits

EMBEDDED: list[tuple[str, type[Any], type[Any]]] = [
    # (section path in Config, the section's class, the policy dataclass it embeds)
    ("health", HealthConfig, HealthThresholds),
    ("health.breaker", RemovalBudget, RemovalBudget),
    ("placement", MigrateBackConfig, MigrateBackConfig),
    ("jobs", JobsConfig, PreemptionConfig),
    ("jobs.queues.default", QueueShare, QueueShare),
]
IDS = [path for path, _, _ in EMBEDDED]


def section(cfg: Config, path: str) -> Any:
    node: Any = cfg
    for part in path.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def field_defaults(cls: type[Any]) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


@pytest.mark.parametrize(("path", "section_cls", "policy_cls"), EMBEDDED, ids=IDS)
def test_the_section_inherits_every_policy_field_and_declares_none_again(
    path: str, section_cls: type[Any], policy_cls: type[Any]
) -> None:
    assert issubclass(section_cls, policy_cls)
    own = section_cls.__dict__.get("__annotations__", {})
    policy_fields = {f.name: f for f in dataclasses.fields(policy_cls)}
    if section_cls is not policy_cls:
        assert not set(own) & set(policy_fields), f"{path} declares a policy field again"
    section_fields = {f.name: f for f in dataclasses.fields(section_cls)}
    for name, f in policy_fields.items():
        assert section_fields[name] is f, f"{path}.{name} is not the policy's own field"


@pytest.mark.parametrize(("path", "section_cls", "policy_cls"), EMBEDDED, ids=IDS)
def test_the_default_config_holds_the_policy_defaults(
    path: str, section_cls: type[Any], policy_cls: type[Any]
) -> None:
    got = section(Config(), path)
    assert isinstance(got, section_cls)
    for name, default in field_defaults(policy_cls).items():
        assert getattr(got, name) == default, f"{path}.{name}"


INDEPENDENT = {
    "kubernetes.service.window_s": "the kube actuator service's own rate-cap window, which "
    "the caller cannot change (docs/kubernetes-actuator.md); not the breaker's",
}
"""Fields that share a policy field's name and default but are a setting of their own."""


def test_no_section_of_the_config_writes_a_policy_field_twice() -> None:
    """A walk of the whole default `Config`: wherever a dataclass has a field of a policy
    dataclass's name and default, it holds it by inheritance (the same `Field`), not as a
    copy of its own (`INDEPENDENT` names the few that are settings of their own)."""
    policy_classes = [p for _, _, p in EMBEDDED]

    def walk(value: Any, path: str) -> list[str]:
        if isinstance(value, dict):
            return [e for k, v in value.items() for e in walk(v, f"{path}.{k}")]
        if not dataclasses.is_dataclass(value) or isinstance(value, type):
            return []
        errors = []
        fields = {f.name: f for f in dataclasses.fields(value)}
        for policy in policy_classes:
            copied = [
                name
                for name, f in fields.items()
                if name in policy.__dataclass_fields__
                and f is not policy.__dataclass_fields__[name]
                and not isinstance(value, policy)
                and f.default == policy.__dataclass_fields__[name].default
            ]
            errors += [f"{path}.{name} copies {policy.__name__}.{name}" for name in copied]
        for name in fields:
            errors += walk(getattr(value, name), f"{path}.{name}".lstrip("."))
        return errors

    assert [e for e in walk(Config(), "") if e.split()[0] not in INDEPENDENT] == []


def test_the_adapters_rebuild_the_policy_defaults_unchanged() -> None:
    cfg = Config()
    # The pool's size is the one thing the section adds: a lost node's replacement is due.
    assert admission_config(cfg) == AdmissionConfig(cluster_nodes=cfg.pools.cluster.num_nodes)
    assert placement_config(cfg) == PlacementConfig(
        8,
        providers=(
            Provider("rent-a", 4, 2.0, 900.0, 1800.0),
            Provider("rent-b", 4, 3.0, 900.0, 1800.0),
        ),
    )
    assert isinstance(cfg.health, HealthThresholds)
    assert {f.name: getattr(cfg.health, f.name) for f in dataclasses.fields(HealthThresholds)} == (
        dataclasses.asdict(HealthThresholds())
    )
    model = cfg.serving.models[0]
    demand = demand_config(model)
    assert (demand.min_replicas, demand.max_replicas) == (model.min_replicas, model.max_replicas)
    assert demand.target_ongoing_requests_per_replica == model.target_ongoing_requests
    assert demand.target_p99_ms is None and model.slo_p99_ms is None
    model.slo_p99_ms = 250.0
    assert demand_config(model).target_p99_ms == 250.0
    j = cfg.jobs
    assert restart_limits(cfg, 3) == RestartLimits(
        3, j.restart_backoff_initial_s, j.restart_backoff_max_s
    )


def test_the_adapters_carry_overrides() -> None:
    cfg = load_config(
        overrides=[
            "jobs.max_preemptions_per_hour=7",
            "jobs.priority_classes.urgent=500",
            "jobs.queues.default.share=0.5",
            "jobs.queues.b.share=0.25",
            "jobs.queues.b.borrowing_limit=0.1",
            "placement.migrate_back_step=3",
            "pools.external.providers=[{name: a, max_nodes: 5, price_per_gpu_hour: 4}, "
            "{name: b, max_nodes: 1, gpus_per_node: 8, price_per_gpu_hour: 1.5}]",
        ]
    )
    adm = admission_config(cfg)
    assert adm.max_preemptions_per_hour == 7
    assert adm.priority_classes["urgent"] == 500
    assert [(q.name, q.share, q.borrowing_limit) for q in adm.queues] == [
        ("default", 0.5, None),
        ("b", 0.25, 0.1),
    ]
    placement = placement_config(cfg)
    assert placement.migrate_back_step == 3
    assert placement.external_max_gpus == 5 * 2 + 8
    assert [(p.name, p.max_gpus, p.price_per_gpu_hour) for p in placement.providers] == [
        ("a", 10, 4.0),
        ("b", 8, 1.5),
    ]


# The keys users write in YAML and as key=value overrides, as they were before the sections
# embedded the policies' dataclasses.
USER_KEYS = {
    "health": {
        "gpu_temp_c", "hot_samples", "missing_samples", "breaker", "fatal_xids",
        "nvlink_errors_per_s", "ib_errors_per_s", "ib_expected_width", "ib_min_rate_gbps",
        "recover_after_samples", "stale_after_s", "lemon_count", "lemon_window_s", "act",
        "drain_deadline_s", "replace_drained",
    },
    "health.breaker": {"max_nodes", "max_pool_fraction", "window_s"},
    "placement": {"migrate_back_idle_s", "migrate_back_step", "migrate_back_interval_s"},
    "jobs": {
        "db_path", "retention_days", "event_retention_days", "prune_interval_s",
        "prune_batch_size", "priority_classes", "default_priority_class", "queues",
        "preemption_enabled", "max_preemptions_per_hour", "max_preemptions_per_job_per_hour",
        "gang_start_timeout_s", "backoff_initial_s", "backoff_max_s", "max_start_attempts",
        "storage_path", "job_signal_poll_s", "submit_timeout_s", "stall_timeout_s",
        "step_report_interval_s", "restart_backoff_initial_s", "restart_backoff_max_s",
        "checkpoint_scan_interval_s", "gpu_mtbf_prior_hours",
    },
    "jobs.queues.default": {"share", "borrowing_limit"},
}  # fmt: skip


@pytest.mark.parametrize("path", sorted(USER_KEYS))
def test_the_yaml_keys_stay_the_same(path: str) -> None:
    node: Any = to_dict(Config())
    for part in path.split("."):
        node = node[part]
    assert set(node) == USER_KEYS[path]


def test_the_config_round_trips_through_json() -> None:
    cfg = load_config(overrides=["health.fatal_xids=[79,48]", "health.gpu_temp_c=80"])
    assert cfg.health.fatal_xids == (79, 48)
    back = from_dict(json.loads(json.dumps(to_dict(cfg))))
    assert back == cfg


@pytest.mark.parametrize(
    ("override", "message"),
    [
        pytest.param("health.hot_samples=0", "health.hot_samples: must be >= 1", id="health"),
        pytest.param("health.lemon_count=0", "health.lemon_count: must be >= 1", id="lemon"),
        pytest.param("health.fatal_xids=[79,-1]", "health.fatal_xids[1]: must be >= 1", id="xid"),
        pytest.param(
            "health.breaker.max_nodes=-1", "health.breaker.max_nodes: must be >= 0", id="breaker"
        ),
        pytest.param(
            "placement.migrate_back_step=0", "placement.migrate_back_step: must be >= 1", id="step"
        ),
        pytest.param(
            "jobs.max_preemptions_per_hour=-1",
            "jobs.max_preemptions_per_hour: must be >= 0",
            id="preemptions",
        ),
        pytest.param(
            "jobs.queues.default.share=0",
            "jobs.queues.default.share: must be in (0, 1]",
            id="share",
        ),
        pytest.param("health.bogus=1", "health.bogus", id="unknown-key"),
        pytest.param("placement.hot_samples=1", "placement.hot_samples", id="wrong-section"),
    ],
)
def test_a_bad_value_is_named_by_its_full_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    assert message in str(err.value)


def test_the_policies_still_check_their_own_configs() -> None:
    with pytest.raises(ValueError, match="hot_samples"):
        HealthThresholds(hot_samples=0)
    with pytest.raises(ValueError, match="migrate_back_step"):
        PlacementConfig(8, migrate_back_step=0)
    with pytest.raises(ValueError, match="max_preemptions_per_hour"):
        AdmissionConfig(max_preemptions_per_hour=-1)
