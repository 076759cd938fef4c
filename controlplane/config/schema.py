"""The whole configuration: `Config`, one field per section, and the values derived from it.

Must not: check across fields (`controlplane.config.validation`) or load
(`controlplane.config.loading`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from controlplane.config.cluster import (
    ApiConfig,
    HeadConfig,
    PolicyConfig,
    PoolsConfig,
    RayConfig,
    ServeConfig,
    StorageConfig,
)
from controlplane.config.health import HealthConfig, ObservabilityConfig, TelemetryConfig
from controlplane.config.jobs import JobsConfig
from controlplane.config.kube import KubernetesConfig
from policies.forecast import ForecastConfig
from policies.placement import MigrateBackConfig
from policies.validation import FINITE
from serve.config import ServingConfig

__all__ = ["Config"]


@dataclass
class Config:
    """The whole configuration. ``rcp config show`` prints the merged result."""

    __pydantic_config__ = FINITE

    state_dir: str = "~/.rcp"
    """Where the local cluster keeps its state file, logs and the job store."""
    head: HeadConfig = field(default_factory=HeadConfig)
    pools: PoolsConfig = field(default_factory=PoolsConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    jobs: JobsConfig = field(default_factory=JobsConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)
    placement: MigrateBackConfig = field(default_factory=MigrateBackConfig)
    """How serve replicas come back from the external pool (`policies.placement`)."""
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    """Serving's daily demand profile, which admission keeps long gangs clear of
    (`policies.forecast`)."""
    kubernetes: KubernetesConfig = field(default_factory=KubernetesConfig)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir).expanduser()

    @property
    def storage_endpoint_url(self) -> str | None:
        """The S3 endpoint: `storage.endpoint_url`, else the embedded server's on loopback
        when `storage.embedded` is on, else None (AWS's own)."""
        if self.storage.endpoint_url:
            return self.storage.endpoint_url
        if self.storage.embedded:
            return f"http://{self.ray.node_ip}:{self.storage.embedded_port}"
        return None

    @property
    def jobs_db_path(self) -> Path:
        """The job store's file: `jobs.db_path`, else ``<state_dir>/controlplane.db``."""
        if self.jobs.db_path:
            return Path(self.jobs.db_path).expanduser()
        return self.state_path / "controlplane.db"

    @property
    def train_storage_path(self) -> str:
        """Where Ray Train keeps its runs' own records (not the control plane's checkpoints,
        which go to ``storage.uri``): `jobs.storage_path` as given when it is a URI
        (``s3://...``, pyarrow's form), else that local path, else ``<state_dir>/train``."""
        if self.jobs.storage_path:
            if "://" in self.jobs.storage_path:
                return self.jobs.storage_path
            return str(Path(self.jobs.storage_path).expanduser())
        return str(self.state_path / "train")

    @property
    def listener_ports(self) -> dict[str, int]:
        """Every port the cluster listens on (on ``ray.node_ip``), by its key."""
        r = self.ray
        ports = {
            "ray.gcs_port": r.gcs_port,
            "ray.dashboard_port": r.dashboard_port,
            "ray.client_port": r.client_port,
            "ray.metrics_export_port": r.metrics_export_port,
            "serve.http_port": self.serve.http_port,
            "serve.edge_admin_port": self.serve.edge_admin_port,
            "api.port": self.api.port,
        }
        if self.storage.embedded:
            ports["storage.embedded_port"] = self.storage.embedded_port
        if r.gcs_fault_tolerance:
            ports["ray.redis_port"] = r.redis_port
        return ports
