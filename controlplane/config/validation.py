"""The checks of a whole `Config` across its fields and sections, and of the fields its
sections embed from the policies' own dataclasses.

Owns: `CONFIG` (the one `policies.validation.Checked` over `Config`: each field's own checks,
then `across_fields`), `validate` (every problem of a `Config` built in code, by full key
path) and the rules across fields.

Must not: raise from `validate` (`load_config` raises `ConfigError` with every message), or
change the config.
"""

from __future__ import annotations

from pydantic import AfterValidator

from controlplane.config.checks import MAX_WAIT_S, MAX_WINDOW_S, is_loopback, waits
from controlplane.config.schema import Config
from jobs.storage_credentials import JobCredentialsMode
from policies.forecast import validate_forecast
from policies.validation import (
    Checked,
    FieldError,
    InvalidInput,
    at_least,
    at_most,
    check_fields,
    join,
    not_below,
)
from serve.config import serving_rules

__all__ = ["CONFIG", "ConfigError", "across_fields", "validate"]


class ConfigError(InvalidInput):
    """A configuration value is unknown, mistyped or impossible. The message names the key."""

    heading = "invalid configuration"


def _under(prefix: str, errors: list[FieldError]) -> list[FieldError]:
    return [FieldError(join(prefix, e.field), e.message) for e in errors]


_ONE = (at_least(1),)
_HEALTH: dict[str, tuple[AfterValidator, ...]] = {
    "gpu_temp_c": _ONE,
    "hot_samples": _ONE,
    "missing_samples": _ONE,
    **{
        k: (at_least(0),)
        for k in ("nvlink_errors_per_s", "ib_errors_per_s", "ib_expected_width", "ib_min_rate_gbps")
    },
    "recover_after_samples": _ONE,
    "stale_after_s": (at_least(0.1), waits()),
    "lemon_count": _ONE,
    "lemon_window_s": (at_least(1), waits(MAX_WINDOW_S)),
}
_BREAKER: dict[str, tuple[AfterValidator, ...]] = {
    "max_nodes": (at_least(0),),
    "max_pool_fraction": (at_least(0), at_most(1, "a fraction of the pool")),
    "window_s": (at_least(1), waits(MAX_WINDOW_S)),
}
_PLACEMENT: dict[str, tuple[AfterValidator, ...]] = {
    "migrate_back_idle_s": (at_least(0),),
    "migrate_back_step": _ONE,
    "migrate_back_interval_s": (at_least(0), waits(MAX_WAIT_S)),
}
_PREEMPTION = {
    k: (at_least(0),) for k in ("max_preemptions_per_hour", "max_preemptions_per_job_per_hour")
}


def _health(cfg: Config) -> list[FieldError]:
    h = cfg.health
    errors = _under("health", check_fields(h, _HEALTH))
    errors += _under("health.breaker", check_fields(h.breaker, _BREAKER))
    return errors + [
        FieldError(f"health.fatal_xids[{i}]", f"must be >= 1 (XIDs are positive), got {xid!r}")
        for i, xid in enumerate(h.fatal_xids)
        if xid < 1
    ]


def _jobs(cfg: Config) -> list[FieldError]:
    j = cfg.jobs
    errors = check_fields(j, _PREEMPTION)
    if not j.priority_classes:
        errors.append(FieldError("priority_classes", "at least one priority class is required"))
    if j.default_priority_class not in j.priority_classes:
        errors.append(
            FieldError(
                "default_priority_class",
                f"{j.default_priority_class!r} is not one of jobs.priority_classes "
                f"({', '.join(j.priority_classes)})",
            )
        )
    if not j.queues:
        errors.append(FieldError("queues", "at least one queue is required"))
    for name, q in j.queues.items():
        if not 0.0 < q.share <= 1.0:
            errors.append(FieldError(f"queues.{name}.share", f"must be in (0, 1], got {q.share!r}"))
        if q.borrowing_limit is not None and q.borrowing_limit < 0:
            errors.append(
                FieldError(
                    f"queues.{name}.borrowing_limit",
                    f"must be >= 0 or null, got {q.borrowing_limit!r}",
                )
            )
    total = sum(q.share for q in j.queues.values())
    if total > 1.0 + 1e-6:
        errors.append(FieldError("queues", f"shares must sum to at most 1, got {total:g}"))
    errors += not_below(j, "backoff_max_s", "backoff_initial_s")
    errors += not_below(j, "stall_timeout_s", "step_report_interval_s")
    errors += not_below(j, "restart_backoff_max_s", "restart_backoff_initial_s")
    return _under("jobs", errors)


def _job_credentials(cfg: Config) -> list[FieldError]:
    """What ``scoped`` job credentials need: a role to mint from (unless the store is the
    embedded one) and no Ray Train storage on S3, which jobs would reach with the node's
    credentials that ``scoped`` takes away."""
    s = cfg.storage
    if s.job_credentials != JobCredentialsMode.SCOPED.value:
        return []
    errors = []
    if not s.embedded and not s.job_role_arn and s.uri.lower().startswith("s3://"):
        errors.append(
            FieldError(
                "storage.job_role_arn",
                "storage.job_credentials=scoped mints each job's credentials from an IAM role; "
                "name it, or set storage.job_credentials=shared to give jobs the nodes' own "
                "(bucket-wide) credentials",
            )
        )
    if (cfg.jobs.storage_path or "").lower().startswith("s3://"):
        errors.append(
            FieldError(
                "jobs.storage_path",
                f"{cfg.jobs.storage_path!r} is on S3, which Ray Train reaches with the nodes' "
                "own credentials, and storage.job_credentials=scoped gives nodes none; use a "
                "shared volume, or storage.job_credentials=shared",
            )
        )
    return errors


def _ports(cfg: Config) -> list[FieldError]:
    """No two listeners on one port."""
    errors, seen = [], dict[int, str]()
    for key, port in cfg.listener_ports.items():
        if port in seen:
            errors.append(FieldError(key, f"port {port} is already used by {seen[port]}"))
        seen.setdefault(port, key)
    return errors


def across_fields(cfg: Config) -> list[FieldError]:
    """Every problem across `cfg`'s fields and sections (each field's own checks passed)."""
    errors: list[FieldError] = []
    if not cfg.ray.allow_remote and not is_loopback(cfg.ray.node_ip):
        errors.append(
            FieldError(
                "ray.node_ip",
                f"{cfg.ray.node_ip!r} is not a loopback address; listeners on it are reachable "
                "from other machines. Use 127.0.0.1, or set ray.allow_remote=true to bind it on "
                "purpose (see docs/operations.md, security model)",
            )
        )
    t = cfg.telemetry
    if t.source == "dcgm" and not t.dcgm_url.startswith(("http://", "https://")):
        errors.append(
            FieldError("telemetry.dcgm_url", f"must be an http(s) URL, got {t.dcgm_url!r}")
        )
    errors += _jobs(cfg) + _health(cfg)
    errors += _under("serving", serving_rules(cfg.serving))
    for i, m in enumerate(cfg.serving.models):
        if m.priority is not None and m.priority not in cfg.jobs.priority_classes:
            errors.append(
                FieldError(
                    f"serving.models[{i}].priority",
                    f"{m.priority!r} is not one of jobs.priority_classes "
                    f"({', '.join(cfg.jobs.priority_classes)})",
                )
            )
    errors += _under("placement", check_fields(cfg.placement, _PLACEMENT))
    try:
        validate_forecast(cfg.forecast)
    except ValueError as exc:
        key, _, reason = str(exc).partition(": ")
        errors.append(FieldError(key, reason))
    return errors + _job_credentials(cfg) + _ports(cfg)


CONFIG = Checked(Config, ConfigError, across_fields)


def validate(cfg: Config) -> list[str]:
    """Every impossible value in `cfg`, one message each, naming the key's full path."""
    return [str(e) for e in CONFIG.problems(cfg)]
