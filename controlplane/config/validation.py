"""Validation of a whole `Config`: every impossible value, one message each, by full key path.

Owns: `validate` (NaN and Infinity anywhere, loopback binding, pools, ports and their clashes,
storage, the loop's tick, placement) and the checks of the bigger sections (``jobs``,
``telemetry``, ``health``, ``kubernetes``); ``serving`` is checked by `serve.config`'s own
`validate_serving`.

Must not: raise (the caller decides: `load_config` raises `ConfigError` with every message),
or change the config.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from controlplane.config.checks import (
    MAX_BATCH,
    MAX_BODY_BYTES,
    MAX_DEADLINE_S,
    MAX_REQUEST_TIMEOUT_S,
    MAX_RETENTION_DAYS,
    MAX_RETRIES,
    MAX_SCRAPE_TIMEOUT_S,
    MAX_SUBMIT_TIMEOUT_S,
    MAX_WAIT_S,
    MAX_WINDOW_S,
    actuator_url,
    at_least,
    at_most,
    dns_label,
    is_loopback,
    not_below,
    taint_key,
    tcp_port,
    wait_at_most,
)
from controlplane.config.cluster import ExternalPoolConfig
from controlplane.config.health import TELEMETRY_SOURCES, HealthConfig, TelemetryConfig
from controlplane.config.jobs import JobsConfig
from controlplane.config.kube import KubernetesConfig
from controlplane.config.schema import Config
from jobs.storage_credentials import JobCredentialsMode
from jobs.storage_uri import StorageUriError, parse_storage_uri
from policies.forecast import validate_forecast
from policies.providers import PROVIDER_NAME_RE
from serve.config import validate_serving

__all__ = ["validate"]


def _bind_hosts(cfg: Config) -> list[str]:
    """Every key that names an address a local listener binds to (all follow ray.node_ip)."""
    errors = []
    if not cfg.ray.allow_remote and not is_loopback(cfg.ray.node_ip):
        errors.append(
            f"ray.node_ip: {cfg.ray.node_ip!r} is not a loopback address; listeners on it "
            "are reachable from other machines. Use 127.0.0.1, or set ray.allow_remote=true "
            "to bind it on purpose (see docs/operations.md, security model)"
        )
    return errors


MAX_PROVIDERS = 16


def _providers(e: ExternalPoolConfig) -> list[str]:
    """``pools.external.providers``: 1-16, unique valid names, each a valid node group."""
    errors: list[str] = []
    if not 1 <= len(e.providers) <= MAX_PROVIDERS:
        errors.append(
            f"pools.external.providers: 1 to {MAX_PROVIDERS} providers, got {len(e.providers)}"
        )
    seen: set[str] = set()
    for i, p in enumerate(e.providers):
        at = f"pools.external.providers[{i}]"
        if not PROVIDER_NAME_RE.fullmatch(p.name):
            errors.append(f"{at}.name: [a-z0-9-], 1-32 characters, got {p.name!r}")
        elif p.name in seen:
            errors.append(f"{at}.name: {p.name!r} is named twice")
        seen.add(p.name)
        errors += at_least(0, f"{at}.price_per_gpu_hour", p.price_per_gpu_hour)
        errors += at_least(0, f"{at}.min_nodes", p.min_nodes)
        errors += at_least(1, f"{at}.max_nodes", p.max_nodes, "a provider with no nodes")
        errors += not_below(f"{at}.max_nodes", p.max_nodes, f"{at}.min_nodes", p.min_nodes)
        errors += at_least(0, f"{at}.gpus_per_node", p.gpus_per_node)
        errors += at_least(0, f"{at}.cpus_per_node", p.cpus_per_node)
        errors += at_least(1, f"{at}.delivery_deadline_s", p.delivery_deadline_s)
        errors += wait_at_most(MAX_WAIT_S, f"{at}.delivery_deadline_s", p.delivery_deadline_s)
        errors += at_least(1, f"{at}.backoff_s", p.backoff_s)
        errors += wait_at_most(MAX_WAIT_S, f"{at}.backoff_s", p.backoff_s)
    return errors


def _non_finite(value: Any, path: str = "") -> list[str]:
    """Every NaN or Infinity in any float field of any section, by its full key path.

    Checked once for the whole tree (not per field) so that a new float field is covered
    without anyone remembering to: NaN compares false with every bound, so `at_least` alone
    would let ``policy.tick_s=nan`` through.
    """
    if isinstance(value, float):
        return [] if math.isfinite(value) else [f"{path}: must be a finite number, got {value!r}"]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [
            e
            for f in dataclasses.fields(value)
            for e in _non_finite(getattr(value, f.name), f"{path}.{f.name}" if path else f.name)
        ]
    if isinstance(value, dict):
        return [e for k, v in value.items() for e in _non_finite(v, f"{path}.{k}")]
    if isinstance(value, list | tuple):
        return [e for i, v in enumerate(value) for e in _non_finite(v, f"{path}[{i}]")]
    return []


PROXY_LOCATIONS = ("EveryNode", "HeadOnly")
"""Serve's proxy locations `rcp up` offers (Serve's ``Disabled`` would leave no endpoint)."""


def validate(cfg: Config) -> list[str]:
    """Every impossible value in `cfg`, one message each, naming the key's full path."""
    errors: list[str] = _non_finite(cfg)
    if errors:
        return errors  # NaN fails every other check too: name it once, as what it is
    errors += _bind_hosts(cfg)
    errors += at_least(0, "head.num_cpus", cfg.head.num_cpus)
    c = cfg.pools.cluster
    errors += at_least(1, "pools.cluster.num_nodes", c.num_nodes, "a pool with no nodes")
    errors += at_least(0, "pools.cluster.gpus_per_node", c.gpus_per_node)
    errors += at_least(0, "pools.cluster.cpus_per_node", c.cpus_per_node)
    e = cfg.pools.external
    errors += _providers(e)
    errors += at_least(1, "pools.external.idle_timeout_s", e.idle_timeout_s)
    errors += wait_at_most(MAX_WAIT_S, "pools.external.idle_timeout_s", e.idle_timeout_s)
    for name in ("gcs_port", "dashboard_port", "client_port", "metrics_export_port"):
        errors += tcp_port(f"ray.{name}", getattr(cfg.ray, name))
    errors += tcp_port("serve.http_port", cfg.serve.http_port)
    errors += tcp_port("serve.edge_admin_port", cfg.serve.edge_admin_port)
    if cfg.serve.proxy_location not in PROXY_LOCATIONS:
        errors.append(
            f"serve.proxy_location: must be one of {', '.join(PROXY_LOCATIONS)}, "
            f"got {cfg.serve.proxy_location!r}"
        )
    errors += tcp_port("api.port", cfg.api.port)
    errors += at_least(1024, "api.max_body_bytes", cfg.api.max_body_bytes)
    errors += at_most(
        MAX_BODY_BYTES, "api.max_body_bytes", cfg.api.max_body_bytes, "read into memory"
    )
    errors += at_least(0.01, "api.rate_limit_per_s", cfg.api.rate_limit_per_s)
    errors += at_most(1e6, "api.rate_limit_per_s", cfg.api.rate_limit_per_s, "no limit at all")
    errors += at_least(1, "api.rate_burst", cfg.api.rate_burst, "no request could pass")
    errors += at_most(MAX_BATCH, "api.rate_burst", cfg.api.rate_burst, "no limit at all")
    if cfg.api.admin_token_file and not cfg.api.admin_token_file.startswith("/"):
        errors.append(
            f"api.admin_token_file: must be an absolute path (a mounted Secret), got "
            f"{cfg.api.admin_token_file!r}"
        )
    errors += tcp_port("storage.embedded_port", cfg.storage.embedded_port)
    errors += tcp_port("observability.prometheus_port", cfg.observability.prometheus_port)
    errors += at_least(0.5, "observability.scrape_interval_s", cfg.observability.scrape_interval_s)
    errors += wait_at_most(
        MAX_WAIT_S, "observability.scrape_interval_s", cfg.observability.scrape_interval_s
    )
    errors += at_least(
        0.1, "ray.autoscaler_update_interval_s", cfg.ray.autoscaler_update_interval_s
    )
    errors += wait_at_most(
        MAX_WAIT_S, "ray.autoscaler_update_interval_s", cfg.ray.autoscaler_update_interval_s
    )
    errors += at_least(1, "ray.ready_timeout_s", cfg.ray.ready_timeout_s)
    errors += tcp_port("ray.redis_port", cfg.ray.redis_port)
    errors += at_least(5, "ray.gcs_reconnect_timeout_s", cfg.ray.gcs_reconnect_timeout_s)
    errors += wait_at_most(
        MAX_WAIT_S, "ray.gcs_reconnect_timeout_s", cfg.ray.gcs_reconnect_timeout_s
    )
    errors += wait_at_most(MAX_WAIT_S, "ray.ready_timeout_s", cfg.ray.ready_timeout_s)
    errors += at_least(0.05, "policy.tick_s", cfg.policy.tick_s)
    errors += wait_at_most(MAX_WAIT_S, "policy.tick_s", cfg.policy.tick_s)
    errors += _validate_jobs(cfg.jobs)
    errors += _validate_telemetry(cfg.telemetry)
    errors += _validate_health(cfg.health)
    errors += validate_serving(cfg.serving, prefix="serving")
    for i, m in enumerate(cfg.serving.models):
        if m.priority is not None and m.priority not in cfg.jobs.priority_classes:
            errors.append(
                f"serving.models[{i}].priority: {m.priority!r} is not one of "
                f"jobs.priority_classes ({', '.join(cfg.jobs.priority_classes)})"
            )
    errors += at_least(0, "placement.migrate_back_idle_s", cfg.placement.migrate_back_idle_s)
    errors += at_least(1, "placement.migrate_back_step", cfg.placement.migrate_back_step)
    errors += at_least(
        0, "placement.migrate_back_interval_s", cfg.placement.migrate_back_interval_s
    )
    errors += wait_at_most(
        MAX_WAIT_S, "placement.migrate_back_interval_s", cfg.placement.migrate_back_interval_s
    )
    try:
        validate_forecast(cfg.forecast)
    except ValueError as exc:
        errors.append(str(exc))
    errors += _validate_kubernetes(cfg.kubernetes)
    try:
        parse_storage_uri(cfg.storage.uri)
    except StorageUriError as exc:
        errors.append(f"storage.uri: {exc}")
    errors += _validate_job_credentials(cfg)
    ports = {
        "ray.gcs_port": cfg.ray.gcs_port,
        "ray.dashboard_port": cfg.ray.dashboard_port,
        "ray.client_port": cfg.ray.client_port,
        "ray.metrics_export_port": cfg.ray.metrics_export_port,
        "serve.http_port": cfg.serve.http_port,
        "serve.edge_admin_port": cfg.serve.edge_admin_port,
        "api.port": cfg.api.port,
    }
    if cfg.storage.embedded:
        ports["storage.embedded_port"] = cfg.storage.embedded_port
    if cfg.ray.gcs_fault_tolerance:
        ports["ray.redis_port"] = cfg.ray.redis_port
    seen: dict[int, str] = {}
    for key, port in ports.items():
        if port in seen:
            errors.append(f"{key}: port {port} is already used by {seen[port]}")
        seen.setdefault(port, key)
    return errors


JOB_CREDENTIALS_DURATION_S = (1800, 43200)
"""Bounds of ``storage.job_credentials_duration_s``: STS allows 900-43200 s; below 1800 s a
job's boto (refreshing from 15 min before expiry) would find due credentials at the actor."""
_ROLE_ARN_RE = re.compile(r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/[\w+=,.@/-]{1,512}$")


def _validate_job_credentials(cfg: Config) -> list[str]:
    """``storage.job_credentials`` and what ``scoped`` needs: a role to mint from (unless the
    store is the embedded one) and no Ray Train storage on S3, which jobs would reach with the
    node's credentials that ``scoped`` takes away."""
    s = cfg.storage
    modes = [m.value for m in JobCredentialsMode]
    if s.job_credentials not in modes:
        return [
            f"storage.job_credentials: must be one of {', '.join(modes)}, got {s.job_credentials!r}"
        ]
    low, high = JOB_CREDENTIALS_DURATION_S
    errors = at_least(low, "storage.job_credentials_duration_s", s.job_credentials_duration_s)
    errors += at_most(
        high, "storage.job_credentials_duration_s", s.job_credentials_duration_s, "STS's maximum"
    )
    if s.job_role_arn and not _ROLE_ARN_RE.match(s.job_role_arn):
        errors.append(
            f"storage.job_role_arn: must be an IAM role ARN (arn:aws:iam::<12-digit account>:"
            f"role/<name>), got {s.job_role_arn!r}"
        )
    if s.job_credentials != JobCredentialsMode.SCOPED.value:
        return errors
    if not s.embedded and not s.job_role_arn and cfg.storage.uri.lower().startswith("s3://"):
        errors.append(
            "storage.job_role_arn: storage.job_credentials=scoped mints each job's credentials "
            "from an IAM role; name it, or set storage.job_credentials=shared to give jobs the "
            "nodes' own (bucket-wide) credentials"
        )
    if (cfg.jobs.storage_path or "").lower().startswith("s3://"):
        errors.append(
            f"jobs.storage_path: {cfg.jobs.storage_path!r} is on S3, which Ray Train reaches "
            "with the nodes' own credentials, and storage.job_credentials=scoped gives nodes "
            "none; use a shared volume, or storage.job_credentials=shared"
        )
    return errors


def _validate_jobs(j: JobsConfig) -> list[str]:
    errors: list[str] = []
    errors += at_least(0, "jobs.retention_days", j.retention_days, "0 keeps jobs forever")
    errors += at_least(
        0, "jobs.event_retention_days", j.event_retention_days, "0 keeps events forever"
    )
    for key, days in (
        ("jobs.retention_days", j.retention_days),
        ("jobs.event_retention_days", j.event_retention_days),
    ):
        errors += at_most(MAX_RETENTION_DAYS, key, days, "a hundred years")
    errors += at_least(1, "jobs.prune_interval_s", j.prune_interval_s)
    errors += wait_at_most(MAX_WAIT_S, "jobs.prune_interval_s", j.prune_interval_s)
    errors += at_least(1, "jobs.prune_batch_size", j.prune_batch_size)
    errors += at_most(MAX_BATCH, "jobs.prune_batch_size", j.prune_batch_size, "one tick's batch")
    if not j.priority_classes:
        errors.append("jobs.priority_classes: at least one priority class is required")
    if j.default_priority_class not in j.priority_classes:
        errors.append(
            f"jobs.default_priority_class: {j.default_priority_class!r} is not one of "
            f"jobs.priority_classes ({', '.join(j.priority_classes)})"
        )
    if not j.queues:
        errors.append("jobs.queues: at least one queue is required")
    for name, q in j.queues.items():
        if not 0.0 < q.share <= 1.0:
            errors.append(f"jobs.queues.{name}.share: must be in (0, 1], got {q.share!r}")
        if q.borrowing_limit is not None and q.borrowing_limit < 0:
            errors.append(
                f"jobs.queues.{name}.borrowing_limit: must be >= 0 or null, got {q.borrowing_limit!r}"
            )
    total = sum(q.share for q in j.queues.values())
    if total > 1.0 + 1e-6:
        errors.append(f"jobs.queues: shares must sum to at most 1, got {total:g}")
    errors += at_least(0, "jobs.max_preemptions_per_hour", j.max_preemptions_per_hour)
    errors += at_least(
        0, "jobs.max_preemptions_per_job_per_hour", j.max_preemptions_per_job_per_hour
    )
    errors += at_least(1, "jobs.gang_start_timeout_s", j.gang_start_timeout_s)
    errors += wait_at_most(MAX_DEADLINE_S, "jobs.gang_start_timeout_s", j.gang_start_timeout_s)
    errors += at_least(0, "jobs.backoff_initial_s", j.backoff_initial_s)
    errors += wait_at_most(MAX_WAIT_S, "jobs.backoff_max_s", j.backoff_max_s)
    errors += not_below(
        "jobs.backoff_max_s", j.backoff_max_s, "jobs.backoff_initial_s", j.backoff_initial_s
    )
    errors += at_least(1, "jobs.max_start_attempts", j.max_start_attempts)
    errors += at_most(MAX_RETRIES, "jobs.max_start_attempts", j.max_start_attempts, "retries")
    errors += at_least(0.01, "jobs.job_signal_poll_s", j.job_signal_poll_s)
    errors += wait_at_most(MAX_SCRAPE_TIMEOUT_S, "jobs.job_signal_poll_s", j.job_signal_poll_s)
    errors += at_least(0.1, "jobs.submit_timeout_s", j.submit_timeout_s)
    errors += wait_at_most(MAX_SUBMIT_TIMEOUT_S, "jobs.submit_timeout_s", j.submit_timeout_s)
    errors += at_least(0.1, "jobs.step_report_interval_s", j.step_report_interval_s)
    errors += wait_at_most(MAX_WAIT_S, "jobs.step_report_interval_s", j.step_report_interval_s)
    errors += at_least(1, "jobs.stall_timeout_s", j.stall_timeout_s)
    errors += wait_at_most(MAX_DEADLINE_S, "jobs.stall_timeout_s", j.stall_timeout_s)
    errors += not_below(
        "jobs.stall_timeout_s",
        j.stall_timeout_s,
        "jobs.step_report_interval_s",
        j.step_report_interval_s,
    )
    errors += at_least(0, "jobs.restart_backoff_initial_s", j.restart_backoff_initial_s)
    errors += wait_at_most(MAX_WAIT_S, "jobs.restart_backoff_max_s", j.restart_backoff_max_s)
    errors += not_below(
        "jobs.restart_backoff_max_s",
        j.restart_backoff_max_s,
        "jobs.restart_backoff_initial_s",
        j.restart_backoff_initial_s,
    )
    errors += at_least(0.1, "jobs.checkpoint_scan_interval_s", j.checkpoint_scan_interval_s)
    errors += wait_at_most(
        MAX_WAIT_S, "jobs.checkpoint_scan_interval_s", j.checkpoint_scan_interval_s
    )
    errors += at_least(1, "jobs.gpu_mtbf_prior_hours", j.gpu_mtbf_prior_hours)
    errors += at_most(1e9, "jobs.gpu_mtbf_prior_hours", j.gpu_mtbf_prior_hours, "hours")
    return errors


def _validate_telemetry(t: TelemetryConfig) -> list[str]:
    errors: list[str] = []
    errors += at_least(0.05, "telemetry.interval_s", t.interval_s)
    errors += wait_at_most(MAX_WAIT_S, "telemetry.interval_s", t.interval_s)
    if t.source not in TELEMETRY_SOURCES:
        errors.append(
            f"telemetry.source: must be one of {', '.join(TELEMETRY_SOURCES)}, got {t.source!r}"
        )
    if t.source == "dcgm" and not t.dcgm_url.startswith(("http://", "https://")):
        errors.append(f"telemetry.dcgm_url: must be an http(s) URL, got {t.dcgm_url!r}")
    errors += at_least(0.1, "telemetry.dcgm_timeout_s", t.dcgm_timeout_s)
    errors += wait_at_most(MAX_SCRAPE_TIMEOUT_S, "telemetry.dcgm_timeout_s", t.dcgm_timeout_s)
    if t.exporter_port != 0:
        errors += tcp_port("telemetry.exporter_port", t.exporter_port)
    errors += at_least(2, "telemetry.history_samples", t.history_samples)
    errors += at_most(
        MAX_BATCH, "telemetry.history_samples", t.history_samples, "samples kept per node"
    )
    errors += at_least(0, "telemetry.simulated_ib_ports", t.simulated_ib_ports)
    return errors


def _validate_health(h: HealthConfig) -> list[str]:
    errors: list[str] = []
    errors += at_least(1, "health.gpu_temp_c", h.gpu_temp_c)
    errors += at_least(1, "health.hot_samples", h.hot_samples)
    errors += at_least(1, "health.missing_samples", h.missing_samples)
    errors += at_least(0, "health.breaker.max_nodes", h.breaker.max_nodes)
    errors += at_least(0, "health.breaker.max_pool_fraction", h.breaker.max_pool_fraction)
    if h.breaker.max_pool_fraction > 1:
        errors.append(
            "health.breaker.max_pool_fraction: must be <= 1 (a fraction of the pool), "
            f"got {h.breaker.max_pool_fraction!r}"
        )
    errors += at_least(1, "health.breaker.window_s", h.breaker.window_s)
    errors += wait_at_most(MAX_WINDOW_S, "health.breaker.window_s", h.breaker.window_s)
    for i, xid in enumerate(h.fatal_xids):
        errors += at_least(1, f"health.fatal_xids[{i}]", xid, "XIDs are positive")
    errors += at_least(0, "health.nvlink_errors_per_s", h.nvlink_errors_per_s)
    errors += at_least(0, "health.ib_errors_per_s", h.ib_errors_per_s)
    errors += at_least(0, "health.ib_expected_width", h.ib_expected_width)
    errors += at_least(0, "health.ib_min_rate_gbps", h.ib_min_rate_gbps)
    errors += at_least(1, "health.recover_after_samples", h.recover_after_samples)
    errors += at_least(0.1, "health.stale_after_s", h.stale_after_s)
    errors += wait_at_most(MAX_WAIT_S, "health.stale_after_s", h.stale_after_s)
    errors += at_least(1, "health.lemon_count", h.lemon_count)
    errors += at_least(1, "health.lemon_window_s", h.lemon_window_s)
    errors += wait_at_most(MAX_WINDOW_S, "health.lemon_window_s", h.lemon_window_s)
    errors += at_least(1, "health.drain_deadline_s", h.drain_deadline_s)
    errors += wait_at_most(MAX_DEADLINE_S, "health.drain_deadline_s", h.drain_deadline_s)
    return errors


def _validate_kubernetes(k: KubernetesConfig) -> list[str]:
    errors: list[str] = []
    errors += dns_label("kubernetes.namespace", k.namespace)
    errors += dns_label("kubernetes.raycluster", k.raycluster)
    if not k.external_group:
        errors.append("kubernetes.external_group: must name the external worker group, got ''")
    errors += taint_key("kubernetes.taint_key", k.taint_key)
    errors += at_least(0, "kubernetes.conflict_retries", k.conflict_retries)
    errors += at_most(MAX_RETRIES, "kubernetes.conflict_retries", k.conflict_retries, "retries")
    if k.pod_grace_period_s is not None:
        errors += at_least(0, "kubernetes.pod_grace_period_s", k.pod_grace_period_s)
        errors += wait_at_most(
            MAX_DEADLINE_S, "kubernetes.pod_grace_period_s", k.pod_grace_period_s
        )
    errors += at_least(0.1, "kubernetes.request_timeout_s", k.request_timeout_s)
    errors += wait_at_most(
        MAX_REQUEST_TIMEOUT_S, "kubernetes.request_timeout_s", k.request_timeout_s
    )
    if k.actuator_url is not None:
        errors += actuator_url("kubernetes.actuator_url", k.actuator_url)
    if not k.actuator_token_file:
        errors.append("kubernetes.actuator_token_file: must name the token file, got ''")
    s = k.service
    errors += tcp_port("kubernetes.service.port", s.port)
    errors += at_least(0, "kubernetes.service.max_node_actions", s.max_node_actions)
    errors += at_least(1, "kubernetes.service.window_s", s.window_s)
    errors += wait_at_most(MAX_WINDOW_S, "kubernetes.service.window_s", s.window_s)
    errors += at_least(256, "kubernetes.service.max_body_bytes", s.max_body_bytes)
    errors += at_most(
        MAX_BODY_BYTES, "kubernetes.service.max_body_bytes", s.max_body_bytes, "read into memory"
    )
    return errors
