"""Config: defaults -> YAML file -> overrides, and one clear error per bad value."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from omegaconf import OmegaConf

from controlplane.cli import cli
from controlplane.config import Config, ConfigError, load_config, validate


def test_defaults_describe_the_documented_cluster() -> None:
    cfg = load_config()
    assert (cfg.pools.cluster.num_nodes, cfg.pools.cluster.gpus_per_node) == (2, 4)
    assert (cfg.pools.external.min_nodes, cfg.pools.external.max_nodes) == (0, 4)
    assert [
        (p.name, p.price_per_gpu_hour, p.max_nodes, p.gpus_per_node)
        for p in cfg.pools.external.providers
    ] == [("rent-a", 2.0, 2, 2), ("rent-b", 3.0, 2, 2)]
    assert cfg.ray.node_ip == "127.0.0.1"


def test_file_then_overrides_merge_in_order(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("pools:\n  cluster:\n    num_nodes: 3\n    gpus_per_node: 8\n")
    cfg = load_config(f, ["pools.cluster.num_nodes=5"])
    assert cfg.pools.cluster.num_nodes == 5  # override wins over the file
    assert cfg.pools.cluster.gpus_per_node == 8  # the file wins over the default
    assert cfg.pools.external.max_nodes == 4  # the default stays


@pytest.mark.parametrize(
    ("overrides", "key", "reason"),
    [
        pytest.param(["pools.cluster.gpu=4"], "pools.cluster.gpu", "not in", id="unknown-key"),
        pytest.param(["nope.deeper=1"], "nope", "not in", id="unknown-section"),
        pytest.param(
            ["pools.cluster.num_nodes=many"], "pools.cluster.num_nodes", "Integer", id="wrong-type"
        ),
        pytest.param(
            ["pools.cluster.gpus_per_node=-1"],
            "pools.cluster.gpus_per_node",
            ">= 0",
            id="negative-gpus",
        ),
        pytest.param(
            ["pools.external.providers=[{name: a, gpus_per_node: -2}]"],
            "pools.external.providers[0].gpus_per_node",
            ">= 0",
            id="negative-external-gpus",
        ),
        pytest.param(
            ["pools.cluster.num_nodes=0"],
            "pools.cluster.num_nodes",
            "no nodes",
            id="empty-cluster-pool",
        ),
        pytest.param(
            ["pools.external.providers=[{name: a, max_nodes: 0}]"],
            "pools.external.providers[0].max_nodes",
            "no nodes",
            id="empty-external-pool",
        ),
        pytest.param(
            ["pools.external.providers=[{name: a, min_nodes: 3, max_nodes: 2}]"],
            "pools.external.providers[0].max_nodes",
            "min_nodes",
            id="max-below-min",
        ),
        pytest.param(
            ["pools.external.providers=[{name: Rent_A}]"],
            "pools.external.providers[0].name",
            "[a-z0-9-]",
            id="provider-name",
        ),
        pytest.param(
            ["pools.external.providers=[{name: a}, {name: a}]"],
            "pools.external.providers[1].name",
            "named twice",
            id="provider-twice",
        ),
        pytest.param(
            ["pools.external.providers=[]"],
            "pools.external.providers",
            "1 to 16 providers",
            id="no-provider",
        ),
        pytest.param(
            ["pools.external.providers=[{name: a, price_per_gpu_hour: -1}]"],
            "pools.external.providers[0].price_per_gpu_hour",
            ">= 0",
            id="negative-price",
        ),
        pytest.param(
            ["pools.external.providers=[{name: a, delivery_deadline_s: 0}]"],
            "pools.external.providers[0].delivery_deadline_s",
            ">= 1",
            id="provider-deadline",
        ),
        pytest.param(
            ["pools.external.max_nodes=3"],
            "pools.external.max_nodes",
            "now a list of providers",
            id="moved-key",
        ),
        pytest.param(
            ["serve.http_port=70000"], "serve.http_port", "1..65535", id="port-out-of-range"
        ),
        pytest.param(["serve.http_port=8265"], "serve.http_port", "already used", id="port-clash"),
        pytest.param(["storage.uri=gs://bucket"], "storage.uri", "s3://", id="unsupported-storage"),
        pytest.param(
            ["storage.uri=s3://rcp//cluster1"], "storage.uri", "empty path", id="ambiguous-storage"
        ),
        pytest.param(
            ["pools.cluster.num_nodes"], "pools.cluster.num_nodes", "key=value", id="not-key-value"
        ),
    ],
)
def test_bad_values_name_the_key_and_reason(overrides: list[str], key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert key in str(err.value)
    assert reason in str(err.value)


def test_a_model_priority_must_be_a_job_priority_class(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("serving:\n  models:\n    - name: ranker\n      priority: urgent\n")
    with pytest.raises(ConfigError, match=r"serving\.models\[0\]\.priority: 'urgent' is not one"):
        load_config(f)
    f.write_text("serving:\n  models:\n    - name: ranker\n      priority: high\n")
    assert load_config(f).serving.models[0].priority == "high"


def test_bad_values_in_a_file_name_the_key(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("pools:\n  external:\n    providers:\n      - name: a\n        max_nodes: -1\n")
    with pytest.raises(
        ConfigError, match=r"pools\.external\.providers\[0\]\.max_nodes: must be >= 1"
    ):
        load_config(f)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        pytest.param("pools: [1, 2\n", "not valid YAML", id="malformed-yaml"),
        pytest.param("- 1\n- 2\n", "mapping", id="not-a-mapping"),
    ],
)
def test_unreadable_files_are_rejected(tmp_path: Path, text: str, reason: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=reason):
        load_config(f)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.yaml")


def test_config_show_prints_the_merged_result() -> None:
    result = CliRunner().invoke(cli, ["config", "show", "pools.cluster.num_nodes=7"])
    assert result.exit_code == 0, result.output
    assert "num_nodes: 7" in result.output


@pytest.mark.parametrize("command", ["up", "down", "config show"])
def test_bad_config_exits_2_with_one_clear_error_and_starts_nothing(
    tmp_path: Path, command: str
) -> None:
    state_dir = tmp_path / "state"
    args = [*command.split(), f"state_dir={state_dir}", "pools.cluster.gpus_per_node=-4"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert result.output.count("error:") == 1
    assert "pools.cluster.gpus_per_node: must be >= 0, got -4" in result.output
    assert not state_dir.exists()  # nothing was started or written


@pytest.mark.parametrize(
    "command", [[], ["up"], ["down"], ["nodes"], ["config"], ["config", "show"]]
)
def test_every_command_has_help(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage:" in result.output


def _float_fields(value: object, key: str = "", shown: str = "") -> list[tuple[str, str]]:
    """(omegaconf key, reported path) of every float field in the default config's tree."""
    if isinstance(value, float):
        return [(key, shown)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = []
        for f in dataclasses.fields(value):
            sub = getattr(value, f.name)
            out += _float_fields(
                sub, f"{key}.{f.name}".lstrip("."), f"{shown}.{f.name}".lstrip(".")
            )
        return out
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _float_fields(v, f"{key}.{k}", f"{shown}.{k}")]
    if isinstance(value, list):
        return [
            p for i, v in enumerate(value) for p in _float_fields(v, f"{key}.{i}", f"{shown}[{i}]")
        ]
    return []


FLOAT_FIELDS = _float_fields(Config())


def test_the_float_field_walk_sees_every_section() -> None:
    shown = {path for _key, path in FLOAT_FIELDS}
    for path in ("policy.tick_s", "health.gpu_temp_c", "serving.ingress.attempt_timeout_s"):
        assert path in shown
    assert "serving.models[0].num_gpus" in shown and "jobs.queues.default.share" in shown


NON_FINITE = (float("nan"), float("inf"), float("-inf"))
FLOAT_FIELD_CASES = [
    (key, path, NON_FINITE[i % len(NON_FINITE)]) for i, (key, path) in enumerate(FLOAT_FIELDS)
]
"""Every float field with one non-finite value each, the three taking turns: the check is
one rule for every field (`math.isfinite`), and each value is still met in a third of them;
every field times every value was 3 times the loads for nothing more."""


@pytest.mark.parametrize(
    ("key", "path", "bad"), FLOAT_FIELD_CASES, ids=[f"{p}-{b}" for _k, p, b in FLOAT_FIELD_CASES]
)
def test_non_finite_numbers_are_refused_in_every_float_field(
    tmp_path: Path, key: str, path: str, bad: float
) -> None:
    tree = OmegaConf.structured(Config)
    OmegaConf.update(tree, key, bad)
    f = tmp_path / "c.yaml"
    OmegaConf.save(tree, f)
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert f"{path}: must be a finite number, got {bad!r}" in str(err.value)


@pytest.mark.parametrize(
    "override", ["policy.tick_s=nan", "health.gpu_temp_c=nan", "jobs.submit_timeout_s=inf"]
)
def test_non_finite_overrides_name_the_key_once(override: str) -> None:
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert str(err.value).count(f"{key}:") == 1
    assert "must be a finite number" in str(err.value)


WAITS = [
    # (key, largest accepted): each value becomes a join/wait/sleep/socket timeout
    ("jobs.submit_timeout_s", 600),
    ("policy.tick_s", 3600),
    ("ray.ready_timeout_s", 3600),
    ("ray.gcs_reconnect_timeout_s", 3600),
    ("telemetry.interval_s", 3600),
    ("telemetry.dcgm_timeout_s", 60),
    ("kubernetes.request_timeout_s", 300),
    ("health.drain_deadline_s", 7 * 86400),  # an int64 ms deadline in Ray's GCS
    ("jobs.gang_start_timeout_s", 7 * 86400),
    ("jobs.backoff_max_s", 3600),
    ("jobs.prune_interval_s", 3600),
    ("jobs.job_signal_poll_s", 60),
    ("jobs.retention_days", 36500),
    ("jobs.event_retention_days", 36500),
    ("health.stale_after_s", 3600),
    ("health.lemon_window_s", 90 * 86400),
    ("health.breaker.window_s", 90 * 86400),
    ("kubernetes.service.window_s", 90 * 86400),
    ("pools.external.idle_timeout_s", 3600),
    ("ray.autoscaler_update_interval_s", 3600),
    ("observability.scrape_interval_s", 3600),
    ("placement.migrate_back_interval_s", 3600),
]

COUNTS = [
    # (key, largest accepted): a retry count, batch or size; past it a hang, OOM or overflow
    ("kubernetes.conflict_retries", 100),
    ("jobs.max_start_attempts", 100),
    ("jobs.prune_batch_size", 100_000),
    ("telemetry.history_samples", 100_000),
    ("api.max_body_bytes", 64 << 20),
    ("kubernetes.service.max_body_bytes", 64 << 20),
    ("kubernetes.pod_grace_period_s", 7 * 86400),
]


@pytest.mark.parametrize("value", ["1000000000", "9223372036854775808"], ids=str)
@pytest.mark.parametrize(("key", "largest"), COUNTS, ids=[k for k, _ in COUNTS])
def test_counts_and_sizes_past_their_bound_are_refused_naming_the_key(
    key: str, largest: int, value: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{key}={value}"])
    assert f"{key}: must be <= {largest:g}" in str(err.value)


@pytest.mark.parametrize(("key", "largest"), COUNTS, ids=[k for k, _ in COUNTS])
def test_the_largest_count_is_accepted(key: str, largest: int) -> None:
    load_config(None, [f"{key}={largest}"])


@pytest.mark.parametrize("value", ["1e10", "9223372037", "1e300"], ids=str)
@pytest.mark.parametrize(("key", "largest"), WAITS, ids=[k for k, _ in WAITS])
def test_waits_past_their_bound_are_refused_naming_the_key(
    key: str, largest: float, value: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{key}={value}"])
    assert f"{key}: must be <= {largest:g}" in str(err.value)


@pytest.mark.parametrize(("key", "largest"), WAITS, ids=[k for k, _ in WAITS])
def test_the_largest_wait_is_accepted_and_usable(key: str, largest: float) -> None:
    load_config(None, [f"{key}={largest}"])
    assert largest < threading.TIMEOUT_MAX


RULES = [
    # (overrides, the key named, the reason): one row per rule of the config's validation
    (["head.num_cpus=-1"], "head.num_cpus", "must be >= 0"),
    (["pools.cluster.cpus_per_node=-1"], "pools.cluster.cpus_per_node", "must be >= 0"),
    (["ray.node_ip=0.0.0.0"], "ray.node_ip", "not a loopback address"),
    (["ray.gcs_port=0"], "ray.gcs_port", "1..65535"),
    (["ray.redis_port=6390"], "ray.redis_port", "already used by ray.gcs_port"),
    (["serve.proxy_location=Disabled"], "serve.proxy_location", "must be one of EveryNode"),
    (["api.max_body_bytes=10"], "api.max_body_bytes", "must be >= 1024"),
    (["api.rate_limit_per_s=0"], "api.rate_limit_per_s", "must be >= 0.01"),
    (["api.rate_limit_per_s=1e7"], "api.rate_limit_per_s", "no limit at all"),
    (["api.rate_burst=0"], "api.rate_burst", "no request could pass"),
    (["api.admin_token_file=token"], "api.admin_token_file", "absolute path"),
    (["policy.tick_s=0.001"], "policy.tick_s", "must be >= 0.05"),
    (["storage.job_credentials=open"], "storage.job_credentials", "must be one of"),
    (["storage.job_credentials_duration_s=900"], "storage.job_credentials_duration_s", ">= 1800"),
    (
        ["storage.job_credentials_duration_s=50000"],
        "storage.job_credentials_duration_s",
        "STS's maximum",
    ),
    (["storage.job_role_arn=role"], "storage.job_role_arn", "IAM role ARN"),
    (["storage.embedded=false"], "storage.job_role_arn", "mints each job's credentials"),
    (["jobs.storage_path=s3://b/train"], "jobs.storage_path", "is on S3"),
    (["jobs.retention_days=-1"], "jobs.retention_days", "0 keeps jobs forever"),
    (["jobs.default_priority_class=top"], "jobs.default_priority_class", "is not one of"),
    (["jobs.queues={a: {share: 0.7}, b: {share: 0.7}}"], "jobs.queues", "sum to at most 1"),
    (["jobs.queues.default.borrowing_limit=-1"], "jobs.queues.default.borrowing_limit", ">= 0"),
    (["jobs.max_preemptions_per_job_per_hour=-1"], "jobs.max_preemptions_per_job_per_hour", ">= 0"),
    (["jobs.backoff_max_s=1"], "jobs.backoff_max_s", "must be >= backoff_initial_s (5)"),
    (["jobs.stall_timeout_s=3", "jobs.step_report_interval_s=4"], "jobs.stall_timeout_s", "step_"),
    (["jobs.restart_backoff_max_s=1"], "jobs.restart_backoff_max_s", "restart_backoff_initial_s"),
    (["jobs.checkpoint_scan_interval_s=0"], "jobs.checkpoint_scan_interval_s", ">= 0.1"),
    (["jobs.gpu_mtbf_prior_hours=1e10"], "jobs.gpu_mtbf_prior_hours", "<= 1e+09"),
    (["telemetry.source=ipmi"], "telemetry.source", "must be one of simulated"),
    (["telemetry.source=dcgm", "telemetry.dcgm_url=x"], "telemetry.dcgm_url", "http(s) URL"),
    (["telemetry.exporter_port=70000"], "telemetry.exporter_port", "1..65535"),
    (["telemetry.history_samples=1"], "telemetry.history_samples", "must be >= 2"),
    (["telemetry.simulated_ib_ports=-1"], "telemetry.simulated_ib_ports", "must be >= 0"),
    (["health.gpu_temp_c=0"], "health.gpu_temp_c", "must be >= 1"),
    (["health.missing_samples=0"], "health.missing_samples", "must be >= 1"),
    (["health.ib_min_rate_gbps=-1"], "health.ib_min_rate_gbps", "must be >= 0"),
    (["health.recover_after_samples=0"], "health.recover_after_samples", "must be >= 1"),
    (["health.stale_after_s=0"], "health.stale_after_s", "must be >= 0.1"),
    (["health.breaker.max_pool_fraction=2"], "health.breaker.max_pool_fraction", "<= 1"),
    (["health.drain_deadline_s=0"], "health.drain_deadline_s", "must be >= 1"),
    (["placement.migrate_back_idle_s=-1"], "placement.migrate_back_idle_s", "must be >= 0"),
    (["forecast.idle_hold_s=-1"], "forecast.idle_hold_s", "from 0 to 7 days"),
    (["kubernetes.namespace=Bad_NS"], "kubernetes.namespace", "DNS-1123 label"),
    (["kubernetes.taint_key=a/b/c"], "kubernetes.taint_key", "qualified name"),
    (["kubernetes.external_group=''"], "kubernetes.external_group", "must not be empty"),
    (["kubernetes.actuator_url=http://h/x"], "kubernetes.actuator_url", "no path"),
    (["kubernetes.actuator_token_file=''"], "kubernetes.actuator_token_file", "must not be empty"),
    (["kubernetes.service.port=0"], "kubernetes.service.port", "1..65535"),
    (["kubernetes.service.max_node_actions=-1"], "kubernetes.service.max_node_actions", ">= 0"),
    (["kubernetes.pod_grace_period_s=-1"], "kubernetes.pod_grace_period_s", "must be >= 0"),
]


@pytest.mark.parametrize(
    ("overrides", "key", "reason"), RULES, ids=[f"{k}-{r}" for _o, k, r in RULES]
)
def test_every_rule_names_the_key_and_reason(overrides: list[str], key: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert f"{key}: " in str(err.value)
    assert reason in str(err.value)
    assert key in err.value.fields


@pytest.mark.parametrize(
    ("section", "key", "reason"),
    [
        pytest.param("priority_classes", "jobs.priority_classes", "at least one", id="classes"),
        pytest.param("queues", "jobs.queues", "at least one queue", id="queues"),
    ],
)
def test_an_empty_mapping_built_in_code_is_refused(section: str, key: str, reason: str) -> None:
    """A merge cannot empty a mapping (omegaconf merges into it); a config built in code can."""
    cfg = Config()
    setattr(cfg.jobs, section, {})
    assert any(e.startswith(f"{key}: ") and reason in e for e in validate(cfg)), validate(cfg)
