"""The control plane's configuration: typed defaults, a user YAML file, command-line overrides.

Owns: the schema (dataclasses, each field documented), merging in the order
packaged defaults -> user YAML -> ``key=value`` overrides, and validation of values that a
type cannot express. One source for every default: a section that configures a pure policy
embeds the policy's own dataclass instead of copying its fields (``health`` is
`policies.health.HealthThresholds` plus the control plane's keys, ``health.breaker`` is
`RemovalBudget`, ``placement`` is `policies.placement.MigrateBackConfig`, ``jobs`` embeds
`policies.admission.PreemptionConfig` and `QueueShare`).

Must not: start anything, read the environment for secrets, or log credentials (storage
credentials come from the usual AWS sources and are never part of this config).

Every error names the key's full path and the reason, e.g.
``pools.cluster.gpus_per_node: must be >= 0, got -1``.

Modules (every name is importable from ``controlplane.config``): `schema` (`Config` and the
paths derived from it), the sections `cluster`, `jobs`, `health` and `kube`, `checks` (the
bounds and checks of one value), `validation` (the rules across fields, `ConfigError`) and
`loading` (`load_config`, `to_dict`, `from_dict`, `to_yaml`).
"""

from __future__ import annotations

from controlplane.config.cluster import (
    ApiConfig,
    ClusterPoolConfig,
    ExternalPoolConfig,
    HeadConfig,
    PolicyConfig,
    PoolsConfig,
    RayConfig,
    ServeConfig,
    StorageConfig,
)
from controlplane.config.health import (
    TELEMETRY_SOURCES,
    HealthConfig,
    ObservabilityConfig,
    TelemetryConfig,
)
from controlplane.config.jobs import JobsConfig
from controlplane.config.kube import KubeActuatorServiceConfig, KubernetesConfig
from controlplane.config.loading import ConfigError, from_dict, load_config, to_dict, to_yaml
from controlplane.config.schema import Config
from controlplane.config.validation import validate

__all__ = [
    "TELEMETRY_SOURCES",
    "ApiConfig",
    "ClusterPoolConfig",
    "Config",
    "ConfigError",
    "ExternalPoolConfig",
    "HeadConfig",
    "HealthConfig",
    "JobsConfig",
    "KubeActuatorServiceConfig",
    "KubernetesConfig",
    "ObservabilityConfig",
    "PolicyConfig",
    "PoolsConfig",
    "RayConfig",
    "ServeConfig",
    "StorageConfig",
    "TelemetryConfig",
    "from_dict",
    "load_config",
    "to_dict",
    "to_yaml",
    "validate",
]
