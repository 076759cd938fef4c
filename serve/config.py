"""The serving plane's configuration: which models are served, with what resources, and how
the HTTP ingress behaves.

Owns: the schema (plain dataclasses, each field documented and carrying its checks as
``Annotated`` validators, omegaconf-compatible so the control plane can nest `ServingConfig`
as its `serving` field), the rules across fields (`serving_rules`) and `SERVING`, the pydantic
check of the whole section (`policies.validation`), behind `validate_serving` and
`serving_from_dict`, which name every impossible value by its full key path
(``serving.models[0].max_replicas: ...``).

Must not: import Ray, start anything, or import `controlplane` (an import-linter contract
forbids it). The control plane loads and merges the YAML; this module only describes it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import AfterValidator

from policies.validation import (
    FINITE,
    Checked,
    FieldError,
    InvalidInput,
    at_least,
    bound,
    one_of,
)

__all__ = [
    "POOLS",
    "IngressConfig",
    "ModelConfig",
    "SERVING",
    "ServingConfig",
    "ServingError",
    "serving_from_dict",
    "serving_rules",
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
MAX_SLO_P99_MS = 600_000.0
"""The largest latency goal accepted (10 minutes): anything longer is a typo."""

_Name = Annotated[
    str,
    bound(
        _NAME_RE.fullmatch,
        "must be 1-48 of lowercase letters, digits and '_', starting with a letter or digit",
    ),
]
_ImportPath = Annotated[
    str,
    bound(lambda p: p.count(":") == 1 and all(p.split(":")), "must be 'module:Class'"),
]


def _route_prefix(prefix: str) -> str:
    if not prefix.startswith("/"):
        raise ValueError(f"must start with '/', got {prefix!r}")
    for taken in (BACKEND_ROUTE_ROOT, "/-"):
        if prefix.rstrip("/") == taken or prefix.startswith(taken + "/"):
            raise ValueError(
                f"{taken}/ is taken (the backends' own routes, Serve's and the edge's "
                f"endpoints), got {prefix!r}"
            )
    return prefix


@dataclass
class ModelConfig:
    """One served model. It gets one backend deployment per pool (``cluster``, ``external``)."""

    name: _Name = "sample"
    """URL name: requests go to ``POST /v1/models/<name>/predict``. Lowercase, digits, '_'."""
    import_path: _ImportPath = "serve.sample_model:SampleModel"
    """``module:Class`` of the model. The class is built with ``init_kwargs`` once per replica
    and must have ``predict(payload: dict) -> dict``; it raises ValueError for bad input."""
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the model class (JSON-able values)."""
    num_cpus: Annotated[float, at_least(0)] = 1.0
    """Logical CPUs per replica."""
    num_gpus: Annotated[float, at_least(0)] = 1.0
    """GPUs per replica (logical GPUs in local mode)."""
    min_replicas: Annotated[int, at_least(0)] = 1
    """Fewest replicas across both pools; the demand policy never goes below it."""
    max_replicas: Annotated[int, at_least(1)] = 4
    """Most replicas across both pools."""
    min_cluster_replicas: Annotated[int, at_least(0)] = 0
    """Replicas a training claim never moves off the owned ``cluster`` pool (at most
    ``max_replicas``): a gang that would need them waits, and its reason names the model.
    ``min_replicas`` stays the floor across both pools."""
    priority: str | None = None
    """Priority class, one of ``jobs.priority_classes`` (the classes training jobs use); null
    means the lowest class. When training claims the cluster pool, replicas of the
    lowest-priority model move out first and come back last."""
    on_shortfall: Annotated[str, one_of(ON_SHORTFALL)] = "reclaim"
    """What serving does when its demand cannot be placed: ``reclaim`` (the default) keeps
    the model's cluster replicas that no rented GPU can host (a training claim waits for
    them) and grows on the cluster pool when nothing can be rented; ``yield``, for batch
    models that can wait, lets a claim shrink the model to ``min_replicas`` and grows it
    only where there is room."""
    initial_pool: Annotated[str, one_of(POOLS)] = "cluster"
    """Pool that receives the ``min_replicas`` when the app is first deployed."""
    max_ongoing_requests: Annotated[int, at_least(1)] = 8
    """Requests one replica works on at once; more wait in the replica's router queue."""
    target_ongoing_requests: Annotated[float, at_least(0.01)] = 2.0
    """Ongoing requests per replica that the demand policy aims for."""
    upscale_delay_s: Annotated[float, at_least(0)] = 5.0
    """Demand must ask for more replicas this long before the policy adds them."""
    downscale_delay_s: Annotated[float, at_least(0)] = 60.0
    """Demand must ask for fewer replicas this long before the policy removes them."""
    slo_p99_ms: Annotated[
        float | None,
        bound(lambda v: 0 < v <= MAX_SLO_P99_MS, f"must be > 0 and <= {MAX_SLO_P99_MS:g} ms"),
    ] = None
    """Latency goal: the model's p99 over both pools' backends, in ms, measured from Serve's
    own processing-latency histogram. Above it the demand policy adds replicas (after
    ``upscale_delay_s``); between half of it and it, latency holds the count; null: replicas
    follow ongoing requests alone (docs/serving.md, "Latency-aware scaling")."""
    user_config: dict[str, Any] = field(default_factory=dict)
    """Settings handed to the model's ``reconfigure(user_config)`` when a replica starts and
    whenever they change, without restarting it (Serve's ``user_config``); the model class
    must have ``reconfigure`` when this is not empty. The sample model takes
    ``{"extra_latency_ms": N}`` (a slow backend, for latency tests)."""
    graceful_shutdown_timeout_s: Annotated[float, at_least(0)] = 20.0
    """A stopping replica gets this long to finish in-flight requests."""


@dataclass
class IngressConfig:
    """The CPU-only HTTP ingress that routes requests to pool backends: replicas spread over
    the head and the owned cluster nodes (never rented external nodes)."""

    num_replicas: Annotated[int, at_least(1)] = 2
    """The fewest ingress replicas, spread over the head and the cluster nodes; each applies
    the same route weights. Two or more keep an ingress running while a node is lost; one per
    such node keeps every request on the node whose proxy it entered (docs/serving.md). The
    control loop adds replicas as the request rate asks (`policies.ingress`)."""
    max_replicas: int = 8
    """The most ingress replicas the control loop scales to."""
    target_utilization: Annotated[float, bound(lambda v: 0 < v <= 1, "must be > 0 and <= 1")] = 0.5
    """Share of one core each ingress replica is sized for: the loop runs
    ``ceil(cores the ingress uses / target_utilization)`` replicas (headroom for bursts)."""
    downscale_delay_s: Annotated[float, at_least(0)] = 60.0
    """The request rate must ask for fewer ingress replicas this long before one is removed
    (a scale-up is at once)."""
    num_cpus: Annotated[float, at_least(0)] = 0.25
    """Logical CPUs per ingress replica."""
    max_ongoing_requests: Annotated[int, at_least(1)] = 1000
    """Concurrent requests one ingress replica accepts."""
    max_body_bytes: Annotated[int, at_least(1)] = 1_048_576
    """Largest request body accepted; larger bodies get 413."""
    max_attempts: Annotated[int, at_least(1)] = 3
    """Tries per request across ready replicas when a replica dies or stops (>= 1)."""
    attempt_timeout_s: Annotated[float, at_least(0.01)] = 10.0
    """Longest one try may take before the ingress gives up on it and tries elsewhere."""
    request_timeout_s: Annotated[float, at_least(0.01)] = 30.0
    """Longest a request may take in total, retries included; then 503 with Retry-After."""
    retry_after_s: Annotated[int, at_least(0)] = 1
    """Value of the Retry-After header on a 503."""
    edge_table_max_age_s: Annotated[
        float, bound(lambda v: 2 <= v <= 30, "must be between 2 and 30 s")
    ] = 5.0
    """Longest the edge routes predicts by a route table it fetched from the ingress
    (``GET v1/models?format=edge``, asked once a second: at least 2 s, so one missed fetch
    does not drop it); an older table sends them through the
    ingress. Make-before-break waits this long after every ingress replica applied a new
    table before it lowers a pool's target (`serve.control.waiting.route_applied`). Between 2
    and 30 s. 5 s: a table fetch may take over a second while a node or the head is lost on a
    loaded machine, and predicts that fall back to the ingress then meet the same trouble."""


@dataclass
class ServingConfig:
    """The production Serve application: an ingress and the declared models."""

    __pydantic_config__ = FINITE

    route_prefix: Annotated[str, AfterValidator(_route_prefix)] = "/"
    """Route prefix of the ingress on the Serve HTTP proxy."""
    ready_timeout_s: Annotated[float, at_least(1)] = 180.0
    """How long deploy/scale/move wait for replicas to become RUNNING."""
    access_log: bool = False
    """Per-request access log lines in ingress and backend replicas (costs CPU on the hot
    path; the HTTP proxy logs every request either way)."""
    latency_window_s: Annotated[
        float, bound(lambda v: 1 <= v <= 3600, "must be between 1 and 3600 s")
    ] = 30.0
    """Each model's p99 (for ``slo_p99_ms``) is over the requests of this many last seconds;
    at least four of Prometheus's scrape intervals, so the window holds enough scrapes."""
    ingress: IngressConfig = field(default_factory=IngressConfig)
    models: list[ModelConfig] = field(default_factory=lambda: [ModelConfig()])
    """Models to serve; `rcp up` serves the sample model by default."""


def serving_rules(cfg: ServingConfig) -> list[FieldError]:
    """The rules across `cfg`'s fields (each field's own checks passed), by path in it."""
    errors: list[FieldError] = []
    ing = cfg.ingress
    if ing.max_replicas < ing.num_replicas:
        errors.append(
            FieldError(
                "ingress.max_replicas",
                f"must be >= num_replicas ({ing.num_replicas}), got {ing.max_replicas}",
            )
        )
    if not cfg.models:
        errors.append(FieldError("models", "at least one model must be declared"))
    for i, m in enumerate(cfg.models):
        if m.name in {n.name for n in cfg.models[:i]}:
            errors.append(FieldError(f"models[{i}].name", f"model {m.name!r} is declared twice"))
        if m.max_replicas < m.min_replicas:
            errors.append(
                FieldError(
                    f"models[{i}].max_replicas",
                    f"must be >= min_replicas ({m.min_replicas}), got {m.max_replicas}",
                )
            )
        if m.min_cluster_replicas > m.max_replicas:
            errors.append(
                FieldError(
                    f"models[{i}].min_cluster_replicas",
                    f"must be <= max_replicas ({m.max_replicas}), got {m.min_cluster_replicas}",
                )
            )
    return errors


class ServingError(InvalidInput):
    heading = "invalid serving configuration"


SERVING = Checked(ServingConfig, ServingError, serving_rules, prefix="serving")


def validate_serving(cfg: ServingConfig) -> list[str]:
    """Every impossible value in `cfg`, one message each, naming the key's full path."""
    return [str(e) for e in SERVING.problems(cfg)]


def serving_from_dict(data: dict[str, Any]) -> ServingConfig:
    """Rebuild a ServingConfig from `dataclasses.asdict` output (as stored in Serve's config),
    checked. Unknown keys raise `ServingError` (a ValueError) naming the key, so a stale stored
    config is not silently half-read."""
    return SERVING.load(data)
