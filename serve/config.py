"""The serving plane's configuration: which models are served, with what resources, and how
the HTTP ingress behaves.

Owns: the schema (plain dataclasses, each field documented, omegaconf-compatible so the
control plane can nest `ServingConfig` as its `serving` field) and `validate_serving`, which
names every impossible value by its full key path (``serving.models[0].max_replicas: ...``).

Must not: import Ray, start anything, or import `controlplane` (an import-linter contract
forbids it). The control plane loads and merges the YAML; this module only describes it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "POOLS",
    "IngressConfig",
    "ModelConfig",
    "ServingConfig",
    "serving_from_dict",
    "validate_serving",
]

BACKEND_ROUTE_ROOT = "/_rcp"
"""Root of the backend apps' internal route prefixes on the Serve proxies
(`serve.spec.backend_route_prefix`); the ingress's route table answer names it
(``routing.backend_root``), and ``serving.route_prefix`` may not be under it."""
POOLS: tuple[str, ...] = ("cluster", "external")
ON_SHORTFALL: tuple[str, ...] = ("reclaim", "yield")
"""The pools a model can have replicas in, in routing-table order."""

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_]{0,47}")


@dataclass
class ModelConfig:
    """One served model. It gets one backend deployment per pool (``cluster``, ``external``)."""

    name: str = "sample"
    """URL name: requests go to ``POST /v1/models/<name>/predict``. Lowercase, digits, '_'."""
    import_path: str = "serve.sample_model:SampleModel"
    """``module:Class`` of the model. The class is built with ``init_kwargs`` once per replica
    and must have ``predict(payload: dict) -> dict``; it raises ValueError for bad input."""
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the model class (JSON-able values)."""
    num_cpus: float = 1.0
    """Logical CPUs per replica."""
    num_gpus: float = 1.0
    """GPUs per replica (logical GPUs in local mode)."""
    min_replicas: int = 1
    """Fewest replicas across both pools; the demand policy never goes below it."""
    max_replicas: int = 4
    """Most replicas across both pools."""
    min_cluster_replicas: int = 0
    """Replicas a training claim never moves off the owned ``cluster`` pool (at most
    ``max_replicas``): a gang that would need them waits, and its reason names the model.
    ``min_replicas`` stays the floor across both pools."""
    priority: str | None = None
    """Priority class, one of ``jobs.priority_classes`` (the classes training jobs use); null
    means the lowest class. When training claims the cluster pool, replicas of the
    lowest-priority model move out first and come back last."""
    on_shortfall: str = "reclaim"
    """What serving does when its demand cannot be placed: ``reclaim`` (the default) keeps
    the model's cluster replicas that no rented GPU can host (a training claim waits for
    them) and grows on the cluster pool when nothing can be rented; ``yield``, for batch
    models that can wait, lets a claim shrink the model to ``min_replicas`` and grows it
    only where there is room."""
    initial_pool: str = "cluster"
    """Pool that receives the ``min_replicas`` when the app is first deployed."""
    max_ongoing_requests: int = 8
    """Requests one replica works on at once; more wait in the replica's router queue."""
    target_ongoing_requests: float = 2.0
    """Ongoing requests per replica that the demand policy aims for."""
    upscale_delay_s: float = 5.0
    """Demand must ask for more replicas this long before the policy adds them."""
    downscale_delay_s: float = 60.0
    """Demand must ask for fewer replicas this long before the policy removes them."""
    slo_p99_ms: float | None = None
    """Latency goal: the model's p99 over both pools' backends, in ms, measured from Serve's
    own processing-latency histogram. Above it the demand policy adds replicas (after
    ``upscale_delay_s``); between half of it and it, latency holds the count; null: replicas
    follow ongoing requests alone (docs/serving.md, "Latency-aware scaling")."""
    user_config: dict[str, Any] = field(default_factory=dict)
    """Settings handed to the model's ``reconfigure(user_config)`` when a replica starts and
    whenever they change, without restarting it (Serve's ``user_config``); the model class
    must have ``reconfigure`` when this is not empty. The sample model takes
    ``{"extra_latency_ms": N}`` (a slow backend, for latency tests)."""
    graceful_shutdown_timeout_s: float = 20.0
    """A stopping replica gets this long to finish in-flight requests."""


@dataclass
class IngressConfig:
    """The CPU-only HTTP ingress that routes requests to pool backends: replicas spread over
    the head and the owned cluster nodes (never rented external nodes)."""

    num_replicas: int = 2
    """The fewest ingress replicas, spread over the head and the cluster nodes; each applies
    the same route weights. Two or more keep an ingress running while a node is lost; one per
    such node keeps every request on the node whose proxy it entered (docs/serving.md). The
    control loop adds replicas as the request rate asks (`policies.ingress`)."""
    max_replicas: int = 8
    """The most ingress replicas the control loop scales to."""
    target_utilization: float = 0.5
    """Share of one core each ingress replica is sized for: the loop runs
    ``ceil(cores the ingress uses / target_utilization)`` replicas (headroom for bursts)."""
    downscale_delay_s: float = 60.0
    """The request rate must ask for fewer ingress replicas this long before one is removed
    (a scale-up is at once)."""
    num_cpus: float = 0.25
    """Logical CPUs per ingress replica."""
    max_ongoing_requests: int = 1000
    """Concurrent requests one ingress replica accepts."""
    max_body_bytes: int = 1_048_576
    """Largest request body accepted; larger bodies get 413."""
    max_attempts: int = 3
    """Tries per request across ready replicas when a replica dies or stops (>= 1)."""
    attempt_timeout_s: float = 10.0
    """Longest one try may take before the ingress gives up on it and tries elsewhere."""
    request_timeout_s: float = 30.0
    """Longest a request may take in total, retries included; then 503 with Retry-After."""
    retry_after_s: int = 1
    """Value of the Retry-After header on a 503."""
    edge_table_max_age_s: float = 5.0
    """Longest the edge routes predicts by a route table it fetched from the ingress
    (``GET v1/models?format=edge``, asked once a second: at least 2 s, so one missed fetch
    does not drop it); an older table sends them through the
    ingress. Make-before-break waits this long after every ingress replica applied a new
    table before it lowers a pool's target (`serve.control.operations.route_applied`). Between 2
    and 30 s. 5 s: a table fetch may take over a second while a node or the head is lost on a
    loaded machine, and predicts that fall back to the ingress then meet the same trouble."""


@dataclass
class ServingConfig:
    """The production Serve application: an ingress and the declared models."""

    route_prefix: str = "/"
    """Route prefix of the ingress on the Serve HTTP proxy."""
    ready_timeout_s: float = 180.0
    """How long deploy/scale/move wait for replicas to become RUNNING."""
    access_log: bool = False
    """Per-request access log lines in ingress and backend replicas (costs CPU on the hot
    path; the HTTP proxy logs every request either way)."""
    latency_window_s: float = 30.0
    """Each model's p99 (for ``slo_p99_ms``) is over the requests of this many last seconds;
    at least four of Prometheus's scrape intervals, so the window holds enough scrapes."""
    ingress: IngressConfig = field(default_factory=IngressConfig)
    models: list[ModelConfig] = field(default_factory=lambda: [ModelConfig()])
    """Models to serve; `rcp up` serves the sample model by default."""


def _check_min(errors: list[str], path: str, value: float, minimum: float) -> None:
    if value < minimum:
        errors.append(f"{path}: must be >= {minimum:g}, got {value!r}")


MAX_SLO_P99_MS = 600_000.0
"""The largest latency goal accepted (10 minutes): anything longer is a typo."""


def _check_slo(errors: list[str], path: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        errors.append(f"{path}: must be a number of milliseconds or null, got {value!r}")
    elif not math.isfinite(value) or not 0 < value <= MAX_SLO_P99_MS:
        errors.append(f"{path}: must be > 0 and <= {MAX_SLO_P99_MS:g} ms, got {value!r}")


def validate_serving(cfg: ServingConfig, prefix: str = "serving") -> list[str]:
    """Every impossible value in `cfg`, one message each, naming the key's full path."""
    errors: list[str] = []
    if not cfg.route_prefix.startswith("/"):
        errors.append(f"{prefix}.route_prefix: must start with '/', got {cfg.route_prefix!r}")
    for taken in (BACKEND_ROUTE_ROOT, "/-"):
        if cfg.route_prefix.rstrip("/") == taken or cfg.route_prefix.startswith(taken + "/"):
            errors.append(
                f"{prefix}.route_prefix: {taken}/ is taken (the backends' own routes, Serve's "
                f"and the edge's endpoints), got {cfg.route_prefix!r}"
            )
    _check_min(errors, f"{prefix}.ready_timeout_s", cfg.ready_timeout_s, 1)
    if not 1 <= cfg.latency_window_s <= 3600:  # NaN fails too
        errors.append(
            f"{prefix}.latency_window_s: must be between 1 and 3600 s, got {cfg.latency_window_s!r}"
        )
    ing = cfg.ingress
    _check_min(errors, f"{prefix}.ingress.num_replicas", ing.num_replicas, 1)
    _check_min(errors, f"{prefix}.ingress.max_replicas", ing.max_replicas, ing.num_replicas)
    if not 0 < ing.target_utilization <= 1:
        errors.append(
            f"{prefix}.ingress.target_utilization: must be > 0 and <= 1, "
            f"got {ing.target_utilization!r}"
        )
    _check_min(errors, f"{prefix}.ingress.downscale_delay_s", ing.downscale_delay_s, 0)
    _check_min(errors, f"{prefix}.ingress.num_cpus", ing.num_cpus, 0)
    _check_min(errors, f"{prefix}.ingress.max_ongoing_requests", ing.max_ongoing_requests, 1)
    _check_min(errors, f"{prefix}.ingress.max_body_bytes", ing.max_body_bytes, 1)
    _check_min(errors, f"{prefix}.ingress.max_attempts", ing.max_attempts, 1)
    _check_min(errors, f"{prefix}.ingress.attempt_timeout_s", ing.attempt_timeout_s, 0.01)
    _check_min(errors, f"{prefix}.ingress.request_timeout_s", ing.request_timeout_s, 0.01)
    _check_min(errors, f"{prefix}.ingress.retry_after_s", ing.retry_after_s, 0)
    if not 2 <= ing.edge_table_max_age_s <= 30:  # NaN fails too
        errors.append(
            f"{prefix}.ingress.edge_table_max_age_s: must be between 2 and 30 s, "
            f"got {ing.edge_table_max_age_s!r}"
        )
    if not cfg.models:
        errors.append(f"{prefix}.models: at least one model must be declared")
    seen: set[str] = set()
    for i, m in enumerate(cfg.models):
        p = f"{prefix}.models[{i}]"
        if not _NAME_RE.fullmatch(m.name):
            errors.append(
                f"{p}.name: must be 1-48 of lowercase letters, digits and '_', "
                f"starting with a letter or digit, got {m.name!r}"
            )
        if m.name in seen:
            errors.append(f"{p}.name: model {m.name!r} is declared twice")
        seen.add(m.name)
        if m.import_path.count(":") != 1 or not all(m.import_path.split(":")):
            errors.append(f"{p}.import_path: must be 'module:Class', got {m.import_path!r}")
        _check_min(errors, f"{p}.num_cpus", m.num_cpus, 0)
        _check_min(errors, f"{p}.num_gpus", m.num_gpus, 0)
        _check_min(errors, f"{p}.min_replicas", m.min_replicas, 0)
        _check_min(errors, f"{p}.max_replicas", m.max_replicas, 1)
        if m.max_replicas < m.min_replicas:
            errors.append(
                f"{p}.max_replicas: must be >= {p}.min_replicas ({m.min_replicas}), "
                f"got {m.max_replicas}"
            )
        _check_min(errors, f"{p}.min_cluster_replicas", m.min_cluster_replicas, 0)
        if m.min_cluster_replicas > m.max_replicas:
            errors.append(
                f"{p}.min_cluster_replicas: must be <= {p}.max_replicas ({m.max_replicas}), "
                f"got {m.min_cluster_replicas}"
            )
        if m.on_shortfall not in ON_SHORTFALL:
            errors.append(
                f"{p}.on_shortfall: must be one of {list(ON_SHORTFALL)}, got {m.on_shortfall!r}"
            )
        if m.initial_pool not in POOLS:
            errors.append(f"{p}.initial_pool: must be one of {list(POOLS)}, got {m.initial_pool!r}")
        _check_min(errors, f"{p}.max_ongoing_requests", m.max_ongoing_requests, 1)
        _check_min(errors, f"{p}.target_ongoing_requests", m.target_ongoing_requests, 0.01)
        _check_min(errors, f"{p}.upscale_delay_s", m.upscale_delay_s, 0)
        _check_min(errors, f"{p}.downscale_delay_s", m.downscale_delay_s, 0)
        _check_slo(errors, f"{p}.slo_p99_ms", m.slo_p99_ms)
        _check_min(errors, f"{p}.graceful_shutdown_timeout_s", m.graceful_shutdown_timeout_s, 0)
    return errors


_Section = TypeVar("_Section", IngressConfig, ModelConfig, ServingConfig)


def serving_from_dict(data: dict[str, Any]) -> ServingConfig:
    """Rebuild a ServingConfig from `dataclasses.asdict` output (as stored in Serve's config).

    Unknown keys raise ValueError naming the key, so a stale stored config is not silently
    half-read.
    """

    def build(cls: type[_Section], raw: dict[str, Any], path: str) -> _Section:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - names)
        if unknown:
            raise ValueError(f"{path}.{unknown[0]}: unknown key")
        return cls(**raw)

    raw = dict(data)
    ingress = build(IngressConfig, dict(raw.pop("ingress", {})), "serving.ingress")
    models = [
        build(ModelConfig, dict(m), f"serving.models[{i}]")
        for i, m in enumerate(raw.pop("models", []))
    ]
    return build(ServingConfig, {**raw, "ingress": ingress, "models": models}, "serving")
