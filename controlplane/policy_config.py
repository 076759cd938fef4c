"""The policies' configs as the control plane builds them from its own `Config`.

Owns: every adapter from a config section to a pure policy's config, in one place. Most
sections need none: a section embeds its policy's dataclass, so every field and default is
defined once, in the policy. What is left here is what a section cannot hold as is (the
queues by name, the external pool's size and providers, a served model's keys, ...).

Must not: hold a default of its own, validate (``controlplane.config.validate`` names the
key), or do I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from controlplane.config import Config
from policies.admission import AdmissionConfig, BorrowConfig, PreemptionConfig, QueueConfig
from policies.attempts import AttemptConfig
from policies.demand import DemandConfig
from policies.ingress import IngressScaling
from policies.model_classes import ModelClass
from policies.placement import MigrateBackConfig, PlacementConfig
from policies.providers import Provider
from policies.restarts import RestartLimits
from serve.config import IngressConfig, ModelConfig

__all__ = [
    "admission_config",
    "demand_config",
    "ingress_scaling",
    "model_class",
    "placement_config",
    "attempt_config",
    "restart_limits",
]


def _fields_of(section: Any, policy_class: type[Any]) -> dict[str, Any]:
    """The values of `policy_class`'s fields as `section` (which embeds that class) holds them."""
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(policy_class)}


def admission_config(cfg: Config) -> AdmissionConfig:
    """The admission policy's config from the ``jobs`` section and the cluster pool's size
    and replacement time."""
    j = cfg.jobs
    return AdmissionConfig(
        **_fields_of(j, PreemptionConfig),
        queues=tuple(QueueConfig(name, q.share, q.borrowing_limit) for name, q in j.queues.items()),
        cluster_nodes=cfg.pools.cluster.num_nodes,
        borrow=BorrowConfig(**_fields_of(cfg.pools.cluster, BorrowConfig)),
    )


def placement_config(cfg: Config) -> PlacementConfig:
    """The placement policy's config: the ``placement`` section and the external pool's size."""
    return PlacementConfig(
        external_max_gpus=cfg.pools.external.max_gpus,
        providers=providers(cfg),
        **_fields_of(cfg.placement, MigrateBackConfig),
    )


def providers(cfg: Config) -> tuple[Provider, ...]:
    """The external pool's providers as placement sees them (``pools.external.providers``)."""
    return tuple(
        Provider(
            name=p.name,
            max_gpus=p.max_nodes * p.gpus_per_node,
            price_per_gpu_hour=p.price_per_gpu_hour,
            deadline_s=p.delivery_deadline_s,
            backoff_s=p.backoff_s,
        )
        for p in cfg.pools.external.providers
    )


def demand_config(model: ModelConfig) -> DemandConfig:
    """The demand policy's config for one served model."""
    return DemandConfig(
        target_ongoing_requests_per_replica=model.target_ongoing_requests,
        min_replicas=model.min_replicas,
        max_replicas=model.max_replicas,
        upscale_delay_s=model.upscale_delay_s,
        downscale_delay_s=model.downscale_delay_s,
        target_p99_ms=model.slo_p99_ms,
    )


def model_class(cfg: Config, model: ModelConfig) -> ModelClass:
    """A served model's class: its priority class's value (the ``jobs`` classes; none named:
    the lowest) and its cluster floor. Whether its SLO is at risk is the loop's, per tick."""
    classes = cfg.jobs.priority_classes
    value = classes[model.priority] if model.priority is not None else min(classes.values())
    return ModelClass(
        priority=value,
        min_cluster_replicas=model.min_cluster_replicas,
        yields_on_shortfall=model.on_shortfall == "yield",
    )


def attempt_config(cfg: Config) -> AttemptConfig:
    """The ``jobs`` section's bounds on starting a gang, for `policies.attempts`."""
    j = cfg.jobs
    return AttemptConfig(
        gang_start_timeout_s=j.gang_start_timeout_s,
        max_start_attempts=j.max_start_attempts,
        backoff_initial_s=j.backoff_initial_s,
        backoff_max_s=j.backoff_max_s,
    )


def restart_limits(cfg: Config, max_restarts: int) -> RestartLimits:
    """The restart policy's limits for a job that allows `max_restarts` restarts."""
    j = cfg.jobs
    return RestartLimits(max_restarts, j.restart_backoff_initial_s, j.restart_backoff_max_s)


def ingress_scaling(ingress: IngressConfig) -> IngressScaling:
    """The ingress scaling policy's config: ``num_replicas`` is its floor."""
    return IngressScaling(
        min_replicas=ingress.num_replicas,
        max_replicas=ingress.max_replicas,
        target_utilization=ingress.target_utilization,
        downscale_delay_s=ingress.downscale_delay_s,
    )
