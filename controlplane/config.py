"""The control plane's configuration: typed defaults, a user YAML file, command-line overrides.

Owns: the schema (dataclasses below, each field documented), merging in the order
packaged defaults -> user YAML -> ``key=value`` overrides, and validation of values that a
type cannot express (negative GPUs, max < min, a pool with no nodes, ports out of range).
One source for every default: a section that configures a pure policy embeds the policy's
own dataclass instead of copying its fields (``health`` is `policies.health.HealthThresholds`
plus the control plane's keys, ``health.breaker`` is `RemovalBudget`, ``placement`` is
`policies.placement.MigrateBackConfig`, ``jobs`` embeds `policies.admission.PreemptionConfig`
and `QueueShare`); those fields and defaults are defined and documented there, and
`controlplane.policy_config` builds each policy's config from this one.

Must not: start anything, read the environment for secrets, or log credentials. Storage
credentials come from the usual AWS sources (environment, profile, instance role) and are
never part of this config.

Every error names the key's full path and the reason, e.g.::

    pools.cluster.gpus_per_node: must be >= 0, got -1
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from policies.admission import DEFAULT_QUEUE, PreemptionConfig, QueueShare
from policies.health import HealthThresholds, RemovalBudget
from policies.placement import MigrateBackConfig
from serve.config import ServingConfig, validate_serving

__all__ = [
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
    "PolicyConfig",
    "PoolsConfig",
    "RayConfig",
    "ServeConfig",
    "StorageConfig",
    "TelemetryConfig",
    "load_config",
    "to_yaml",
]

_ = MISSING  # re-exported for schemas that need a required field later


class ConfigError(ValueError):
    """A configuration value is unknown, mistyped or impossible. The message names the key."""


@dataclass
class HeadConfig:
    """The Ray head node: runs the control plane, the Serve proxy and ingress; no GPUs."""

    num_cpus: int = 2
    """Logical CPUs the head advertises (CPU-only work: the Serve ingress, the policy actor)."""


@dataclass
class ClusterPoolConfig:
    """The owned GPU nodes (`pool=cluster`). A fixed-size group: it never scales."""

    num_nodes: int = 2
    """Number of nodes in the pool; must be at least 1."""
    gpus_per_node: int = 4
    """GPUs per node (logical GPUs in local mode)."""
    cpus_per_node: int = 8
    """Logical CPUs per node."""


@dataclass
class ExternalPoolConfig:
    """Rented GPU nodes (`pool=external`), scaled by the Ray autoscaler from `min_nodes`."""

    min_nodes: int = 0
    """Nodes kept even when idle; 0 means the pool scales to zero."""
    max_nodes: int = 4
    """Upper bound the autoscaler may launch; must be >= min_nodes and >= 1."""
    gpus_per_node: int = 2
    """GPUs per node (logical GPUs in local mode)."""
    cpus_per_node: int = 4
    """Logical CPUs per node."""
    idle_timeout_s: float = 30.0
    """An external node idle this long is removed by the autoscaler."""


@dataclass
class PoolsConfig:
    cluster: ClusterPoolConfig = field(default_factory=ClusterPoolConfig)
    external: ExternalPoolConfig = field(default_factory=ExternalPoolConfig)


@dataclass
class RayConfig:
    """How the embedded local Ray cluster listens. Every listener binds to `node_ip`."""

    node_ip: str = "127.0.0.1"
    """Address every node and server binds to; loopback in local mode. Any other address
    (``0.0.0.0``, a pod or host IP, a host name) needs `allow_remote`."""
    allow_remote: bool = False
    """Let `node_ip` be a non-loopback address, so the Ray cluster, its dashboard, the Serve
    proxy and the API are reachable from other machines. Off by default: local mode trusts
    only this machine. Production on KubeRay turns it on (the pod IP) and relies on Ray token
    auth, the API token and the namespace's network policy (docs/operations.md)."""
    gcs_port: int = 6390
    """The head's GCS port (the cluster address is node_ip:gcs_port)."""
    dashboard_port: int = 8265
    """Ray dashboard (Jobs, Serve, Actors, Metrics tabs)."""
    client_port: int = 10001
    """Ray Client server port on the head."""
    metrics_export_port: int = 8090
    """Prometheus endpoint of the head node's metrics agent."""
    autoscaler_update_interval_s: float = 1.0
    """How often the autoscaler reconciles (local mode)."""
    ready_timeout_s: float = 180.0
    """How long `rcp up` waits for the head and the cluster pool before giving up."""


@dataclass
class StorageConfig:
    """Object storage for checkpoints. The URI's scheme picks the backend (s3:// or file://)."""

    uri: str = "s3://rcp-checkpoints"
    """Where checkpoints live: ``s3://bucket/prefix`` or ``file:///path``."""
    endpoint_url: str | None = None
    """S3 endpoint; None means AWS's own, or the embedded server's when `embedded` is on
    (`Config.storage_endpoint_url`)."""
    region: str = "us-east-1"
    """S3 region name."""
    embedded: bool = True
    """Start an S3-protocol server on loopback with `rcp up` (local mode)."""
    embedded_port: int = 9000
    """Port of the embedded S3-protocol server."""


@dataclass
class ServeConfig:
    """The production Serve HTTP endpoint."""

    http_port: int = 8000
    """Port of the Serve HTTP proxy (bound to ray.node_ip)."""
    deploy_app: bool = True
    """Deploy the production Serve application (the `serving` section) with `rcp up`."""


@dataclass
class ApiConfig:
    """The control plane's HTTP API (used by the SDK and CLI)."""

    port: int = 8080
    """Port of the control-plane API (bound to ray.node_ip)."""
    max_body_bytes: int = 1_048_576
    """Largest request body the API reads; larger ones get 413 (a job spec is a few KiB)."""


@dataclass
class PolicyConfig:
    """The policy actor's loop."""

    tick_s: float = 1.0
    """Seconds between observe -> decide -> act -> record ticks."""


def _default_queues() -> dict[str, QueueShare]:
    return {DEFAULT_QUEUE: QueueShare()}


@dataclass
class JobsConfig(PreemptionConfig):
    """The training queue: priority classes, team queues, preemption caps, the job store.

    Priority classes and preemption caps are the admission policy's own fields
    (`policies.admission.PreemptionConfig`, defined and defaulted there); the queues are its
    `QueueShare` by name. `controlplane.policy_config.admission_config` builds the policy's
    config from this section."""

    db_path: str | None = None
    """The job store (SQLite, WAL); null means ``<state_dir>/controlplane.db``."""
    retention_days: float = 30.0
    """Finished jobs (SUCCEEDED, FAILED, CANCELLED, their Ray Job ended) last changed longer
    ago than this are deleted with their history and events; 0 keeps them forever."""
    event_retention_days: float = 7.0
    """Events older than this are deleted (job state histories follow `retention_days`);
    0 keeps them forever."""
    prune_interval_s: float = 3600.0
    """How often the controller prunes; a backlog larger than one batch is worked off one
    batch per tick until it is gone."""
    prune_batch_size: int = 1000
    """The most jobs, and the most events, one prune deletes (bounds the write it holds)."""
    default_priority_class: str = "medium"
    """Class of a job that names none (must be one of priority_classes)."""
    queues: dict[str, QueueShare] = field(default_factory=_default_queues)
    """Team queues by name with their shares of live capacity."""
    gang_start_timeout_s: float = 120.0
    """An admitted gang not fully running after this long is stopped and re-queued."""
    backoff_initial_s: float = 5.0
    """Backoff after the first failed gang start; doubles with each further failure."""
    backoff_max_s: float = 300.0
    """Upper bound of the gang-start backoff."""
    max_start_attempts: int = 5
    """Failed gang starts after which the job is marked FAILED."""
    storage_path: str | None = None
    """Where Ray Train keeps its runs' own records (shared by all nodes: a local path in local
    mode, a URI such as ``s3://bucket/ray-train`` on a cluster); null: ``<state_dir>/train``.
    The control plane's checkpoints go to ``storage.uri``, not here."""
    job_signal_poll_s: float = 0.5
    """How often a training loop's preemption helper asks the controller (cached in between)."""
    submit_timeout_s: float = 10.0
    """Longest the loop waits for Ray to accept a job submission (it runs on a worker thread);
    past it the start counts as failed and is retried with backoff."""
    stall_timeout_s: float = 600.0
    """A running job that reports no new step for this long is hung (its stacks go to its
    logs, then it restarts from its last checkpoint); a job's ``stall_timeout_s`` overrides."""
    step_report_interval_s: float = 5.0
    """How often a training loop's rank 0 reports its step and checkpoint stall to the control
    plane (`jobs.checkpointing`). A job's stall_timeout_s may not be shorter."""
    restart_backoff_initial_s: float = 10.0
    """Wait before restarting a gang that failed or hung; doubles with each restart."""
    restart_backoff_max_s: float = 600.0
    """Upper bound of the restart backoff."""
    checkpoint_scan_interval_s: float = 30.0
    """How often the controller reads a running job's committed checkpoints from object
    storage (sooner when the job says it committed one, every tick while preempting)."""
    gpu_mtbf_prior_hours: float = 50_000.0
    """Mean GPU-hours between failures a new cluster assumes (gang failures plus node removals
    by health, per GPU-hour); the cluster's own record replaces it as GPU-hours accrue. It
    sets the Young/Daly checkpoint interval of jobs that give no checkpoint.interval_s."""


TELEMETRY_SOURCES = ("simulated", "nvml", "dcgm")


@dataclass
class TelemetryConfig:
    """The per-node telemetry agents (GPU, NVLink, InfiniBand) and their Prometheus exporters."""

    interval_s: float = 1.0
    """Seconds between two samples on every node."""
    source: str = "simulated"
    """Where GPU readings come from: simulated (local mode), nvml or dcgm (a dcgm-exporter)."""
    dcgm_url: str = "http://127.0.0.1:9400/metrics"
    """The node-local dcgm-exporter endpoint scraped when source is dcgm."""
    dcgm_timeout_s: float = 2.0
    """Timeout of one dcgm-exporter scrape."""
    ib_sysfs_root: str = "/sys/class/infiniband"
    """Where InfiniBand ports are read (nvml and dcgm sources); a missing directory: no IB."""
    exporter_port: int = 0
    """Port of each agent's Prometheus endpoint; 0 picks a free port per agent (needed when
    several simulated nodes share one IP)."""
    history_samples: int = 120
    """Samples each agent keeps for the health policy and `rcp health`."""
    simulated_ib_ports: int = 2
    """InfiniBand ports per simulated GPU node."""
    stop_agents_on_idle_external: bool = True
    """Run no agent on an external node while nothing runs there: Ray counts a node with a
    live actor as busy, so an agent would stop the external pool from scaling to zero."""


@dataclass
class HealthConfig(HealthThresholds):
    """The ``health`` section: when telemetry makes a node degraded or unhealthy (the health
    policy's own `policies.health.HealthThresholds`, each field defined and defaulted there),
    and what the control plane does about it (the fields below)."""

    breaker: RemovalBudget = field(default_factory=RemovalBudget)
    """At most max_nodes (fleet) and max_pool_fraction of a pool (at least 1) newly removed per
    window_s; past it, verdicts are shown and alerted on but not acted on (policies/health
    `RemovalBudget`)."""
    act: bool = True
    """Act on verdicts: cordon, checkpoint-and-restart gangs, move replicas, drain. False only
    reports them (``rcp health``, ``rcp nodes``, metrics)."""
    drain_deadline_s: float = 600.0
    """Ray drain deadline of an unhealthy node: Serve moves its replicas off make-before-break
    before it, and nothing new is scheduled there meanwhile."""
    replace_drained: bool = True
    """Once a drained node holds nothing, stop it so its node group replaces it (local mode:
    its raylet; Kubernetes: the actuator deletes its pod)."""

    def __post_init__(self) -> None:
        # No ValueError here: `validate` checks the whole section and names each key
        # (``health.hot_samples: must be >= 1``), which the policy's own check cannot.
        self.fatal_xids = tuple(self.fatal_xids)


@dataclass
class ObservabilityConfig:
    """Local mode's Prometheus (production runs its own: infra/prometheus)."""

    prometheus: bool = True
    """`rcp up` starts the ``prometheus`` binary on loopback (when installed) scraping every
    node's Ray metrics agent and the telemetry agents, with the alert rules, and points the Ray
    dashboard's Metrics tab at it. Not fatal: without the binary or a free port `up` says so
    and goes on."""
    prometheus_port: int = 9090
    scrape_interval_s: float = 5.0


@dataclass
class KubeActuatorServiceConfig:
    """The ``rcp-kube-actuator`` service's own settings (``python -m controlplane.kube.service``,
    its own Deployment; docs/kubernetes-actuator.md). Read by that service only: the caller
    cannot change them, they bound what a stolen caller token can do."""

    host: str = "0.0.0.0"
    """Address the service listens on (in its pod: every interface; the NetworkPolicy admits
    only the Ray head)."""
    port: int = 8080
    max_node_actions: int = 2
    """Distinct Kubernetes nodes the service cordons (alone or in a node removal) per
    `window_s`; past it a request is 429. Defence in depth beside ``health.breaker``: keep it
    >= ``health.breaker.max_nodes``. 0 refuses every node action."""
    window_s: float = 600.0
    max_body_bytes: int = 4096
    """Larger request bodies are 413."""


@dataclass
class KubernetesConfig:
    """The Kubernetes actuator (production on KubeRay; see docs/kubernetes-actuator.md).

    Local mode has no Kubernetes: `enabled` stays false and nothing here is used.
    """

    enabled: bool = False
    """Build the Kubernetes actuator (cordon and taint bad nodes, delete their Ray pods)."""
    namespace: str = "default"
    """Namespace of the RayCluster and its pods."""
    raycluster: str = "rcp"
    """Name of the KubeRay RayCluster the control plane runs on."""
    external_group: str = "gpu-external"
    """`groupName` of the RayCluster worker group on rented nodes (the `external` pool)."""
    autoscaler_owns_external: bool = True
    """The KubeRay autoscaler sizes the external group; the actuator never writes its replicas."""
    taint_key: str = "rcp.dev/unhealthy"
    """Key of the NoSchedule taint put on a removed node's Kubernetes node; the value is the
    reason as a slug. An operator's uncordon removes exactly this key."""
    in_cluster: bool = True
    """Authenticate with the pod's service account; false: use `kubeconfig`."""
    kubeconfig: str | None = None
    """Kubeconfig file when in_cluster is false; null: $KUBECONFIG or ~/.kube/config."""
    context: str | None = None
    """Kubeconfig context; null: the file's current context."""
    conflict_retries: int = 5
    """Re-reads after a 409 Conflict (a concurrent writer) before giving up with an error."""
    pod_grace_period_s: int | None = None
    """Grace period when deleting a removed node's pod; null: the pod's own."""
    request_timeout_s: float = 10.0
    """Timeout of one request to the Kubernetes API."""
    actuator_url: str | None = None
    """``http(s)://host:port`` of the ``rcp-kube-actuator`` service. Set: the controller
    holds no Kubernetes credential and asks that service (which holds it and checks every
    request); null: the controller calls the Kubernetes API itself (dev and tests)."""
    actuator_token_file: str = "/etc/rcp/kube-actuator/token"
    """The bearer token shared by the controller and the actuator service (a Secret)."""
    service: KubeActuatorServiceConfig = field(default_factory=KubeActuatorServiceConfig)


@dataclass
class Config:
    """The whole configuration. ``rcp config show`` prints the merged result."""

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


MAX_WAIT_S = 3600.0
"""Upper bound of the intervals and timeouts the control plane waits on (`_wait_at_most`)."""
MAX_SUBMIT_TIMEOUT_S = 600.0
"""Upper bound of ``jobs.submit_timeout_s``: the tick waits this long on a submission."""
MAX_SCRAPE_TIMEOUT_S = 60.0
"""Upper bound of ``telemetry.dcgm_timeout_s`` (a socket timeout per scrape)."""
MAX_REQUEST_TIMEOUT_S = 300.0
"""Upper bound of ``kubernetes.request_timeout_s`` (a socket timeout per Kubernetes call, in
the tick)."""
MAX_DEADLINE_S = 7 * 86400.0
"""Upper bound of deadlines and grace periods (``health.drain_deadline_s`` becomes an int64
millisecond deadline in Ray's GCS; ``jobs.gang_start_timeout_s``; a pod's grace period)."""
MAX_WINDOW_S = 90 * 86400.0
"""Upper bound of the sliding windows counted over (health lemons, the breaker, the kube
service's rate cap)."""
MAX_RETENTION_DAYS = 36500.0
"""Upper bound of ``jobs.*retention_days`` (a cutoff time computed from it)."""
MAX_RETRIES = 100
"""Upper bound of retry counts (``kubernetes.conflict_retries``, ``jobs.max_start_attempts``):
each retry is another round trip in the tick."""
MAX_BATCH = 100_000
"""Upper bound of batch and history sizes (an SQL LIMIT, samples kept per node)."""
MAX_BODY_BYTES = 64 * 1024 * 1024
"""Upper bound of the request bodies a server reads into memory."""


def _at_least(minimum: float, path: str, value: float, why: str = "") -> list[str]:
    if value < minimum:
        reason = f" ({why})" if why else ""
        return [f"{path}: must be >= {minimum:g}{reason}, got {value!r}"]
    return []


def _wait_at_most(maximum: float, path: str, value: float) -> list[str]:
    """An upper bound for a value that becomes a wait (`Thread.join`, `Event.wait`, a socket
    timeout): past ``threading.TIMEOUT_MAX`` those raise OverflowError, and long before that
    the loop would just hang."""
    if value > maximum:
        return [
            f"{path}: must be <= {maximum:g} (it is how long the control plane waits or "
            f"sleeps), got {value!r}"
        ]
    return []


def _at_most(maximum: float, path: str, value: float, why: str) -> list[str]:
    """An upper bound for a count or size (retries, a batch, a body): past it the control
    plane would hang, run out of memory, or overflow a 64-bit field."""
    if value > maximum:
        return [f"{path}: must be <= {maximum:g} ({why}), got {value!r}"]
    return []


def _port(path: str, value: int) -> list[str]:
    if not 1 <= value <= 65535:
        return [f"{path}: must be a TCP port in 1..65535, got {value!r}"]
    return []


def _is_loopback(host: str) -> bool:
    """Whether `host` binds loopback only: 127.0.0.0/8, ::1 (or ::ffff:127.x) or localhost."""
    if host.strip().lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host.strip().strip("[]"))
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere
    mapped = getattr(addr, "ipv4_mapped", None)
    return bool((mapped or addr).is_loopback)


def _bind_hosts(cfg: Config) -> list[str]:
    """Every key that names an address a local listener binds to (all follow ray.node_ip)."""
    errors = []
    if not cfg.ray.allow_remote and not _is_loopback(cfg.ray.node_ip):
        errors.append(
            f"ray.node_ip: {cfg.ray.node_ip!r} is not a loopback address; listeners on it "
            "are reachable from other machines. Use 127.0.0.1, or set ray.allow_remote=true "
            "to bind it on purpose (see docs/operations.md, security model)"
        )
    return errors


def _non_finite(value: Any, path: str = "") -> list[str]:
    """Every NaN or Infinity in any float field of any section, by its full key path.

    Checked once for the whole tree (not per field) so that a new float field is covered
    without anyone remembering to: NaN compares false with every bound, so `_at_least` alone
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


def validate(cfg: Config) -> list[str]:
    """Every impossible value in `cfg`, one message each, naming the key's full path."""
    errors: list[str] = _non_finite(cfg)
    if errors:
        return errors  # NaN fails every other check too: name it once, as what it is
    errors += _bind_hosts(cfg)
    errors += _at_least(0, "head.num_cpus", cfg.head.num_cpus)
    c = cfg.pools.cluster
    errors += _at_least(1, "pools.cluster.num_nodes", c.num_nodes, "a pool with no nodes")
    errors += _at_least(0, "pools.cluster.gpus_per_node", c.gpus_per_node)
    errors += _at_least(0, "pools.cluster.cpus_per_node", c.cpus_per_node)
    e = cfg.pools.external
    errors += _at_least(0, "pools.external.min_nodes", e.min_nodes)
    errors += _at_least(1, "pools.external.max_nodes", e.max_nodes, "a pool with no nodes")
    if e.max_nodes < e.min_nodes:
        errors.append(
            f"pools.external.max_nodes: must be >= pools.external.min_nodes "
            f"({e.min_nodes}), got {e.max_nodes}"
        )
    errors += _at_least(0, "pools.external.gpus_per_node", e.gpus_per_node)
    errors += _at_least(0, "pools.external.cpus_per_node", e.cpus_per_node)
    errors += _at_least(1, "pools.external.idle_timeout_s", e.idle_timeout_s)
    errors += _wait_at_most(MAX_WAIT_S, "pools.external.idle_timeout_s", e.idle_timeout_s)
    for name in ("gcs_port", "dashboard_port", "client_port", "metrics_export_port"):
        errors += _port(f"ray.{name}", getattr(cfg.ray, name))
    errors += _port("serve.http_port", cfg.serve.http_port)
    errors += _port("api.port", cfg.api.port)
    errors += _at_least(1024, "api.max_body_bytes", cfg.api.max_body_bytes)
    errors += _at_most(
        MAX_BODY_BYTES, "api.max_body_bytes", cfg.api.max_body_bytes, "read into memory"
    )
    errors += _port("storage.embedded_port", cfg.storage.embedded_port)
    errors += _port("observability.prometheus_port", cfg.observability.prometheus_port)
    errors += _at_least(0.5, "observability.scrape_interval_s", cfg.observability.scrape_interval_s)
    errors += _wait_at_most(
        MAX_WAIT_S, "observability.scrape_interval_s", cfg.observability.scrape_interval_s
    )
    errors += _at_least(
        0.1, "ray.autoscaler_update_interval_s", cfg.ray.autoscaler_update_interval_s
    )
    errors += _wait_at_most(
        MAX_WAIT_S, "ray.autoscaler_update_interval_s", cfg.ray.autoscaler_update_interval_s
    )
    errors += _at_least(1, "ray.ready_timeout_s", cfg.ray.ready_timeout_s)
    errors += _wait_at_most(MAX_WAIT_S, "ray.ready_timeout_s", cfg.ray.ready_timeout_s)
    errors += _at_least(0.05, "policy.tick_s", cfg.policy.tick_s)
    errors += _wait_at_most(MAX_WAIT_S, "policy.tick_s", cfg.policy.tick_s)
    errors += _validate_jobs(cfg.jobs)
    errors += _validate_telemetry(cfg.telemetry)
    errors += _validate_health(cfg.health)
    errors += validate_serving(cfg.serving, prefix="serving")
    errors += _at_least(0, "placement.migrate_back_idle_s", cfg.placement.migrate_back_idle_s)
    errors += _at_least(1, "placement.migrate_back_step", cfg.placement.migrate_back_step)
    errors += _at_least(
        0, "placement.migrate_back_interval_s", cfg.placement.migrate_back_interval_s
    )
    errors += _wait_at_most(
        MAX_WAIT_S, "placement.migrate_back_interval_s", cfg.placement.migrate_back_interval_s
    )
    errors += _validate_kubernetes(cfg.kubernetes)
    if not (cfg.storage.uri.startswith("s3://") or cfg.storage.uri.startswith("file://")):
        errors.append(f"storage.uri: must start with s3:// or file://, got {cfg.storage.uri!r}")
    ports = {
        "ray.gcs_port": cfg.ray.gcs_port,
        "ray.dashboard_port": cfg.ray.dashboard_port,
        "ray.client_port": cfg.ray.client_port,
        "ray.metrics_export_port": cfg.ray.metrics_export_port,
        "serve.http_port": cfg.serve.http_port,
        "api.port": cfg.api.port,
    }
    if cfg.storage.embedded:
        ports["storage.embedded_port"] = cfg.storage.embedded_port
    seen: dict[int, str] = {}
    for key, port in ports.items():
        if port in seen:
            errors.append(f"{key}: port {port} is already used by {seen[port]}")
        seen.setdefault(port, key)
    return errors


def _validate_jobs(j: JobsConfig) -> list[str]:
    errors: list[str] = []
    errors += _at_least(0, "jobs.retention_days", j.retention_days, "0 keeps jobs forever")
    errors += _at_least(
        0, "jobs.event_retention_days", j.event_retention_days, "0 keeps events forever"
    )
    for key, days in (
        ("jobs.retention_days", j.retention_days),
        ("jobs.event_retention_days", j.event_retention_days),
    ):
        errors += _at_most(MAX_RETENTION_DAYS, key, days, "a hundred years")
    errors += _at_least(1, "jobs.prune_interval_s", j.prune_interval_s)
    errors += _wait_at_most(MAX_WAIT_S, "jobs.prune_interval_s", j.prune_interval_s)
    errors += _at_least(1, "jobs.prune_batch_size", j.prune_batch_size)
    errors += _at_most(MAX_BATCH, "jobs.prune_batch_size", j.prune_batch_size, "one tick's batch")
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
    errors += _at_least(0, "jobs.max_preemptions_per_hour", j.max_preemptions_per_hour)
    errors += _at_least(
        0, "jobs.max_preemptions_per_job_per_hour", j.max_preemptions_per_job_per_hour
    )
    errors += _at_least(1, "jobs.gang_start_timeout_s", j.gang_start_timeout_s)
    errors += _wait_at_most(MAX_DEADLINE_S, "jobs.gang_start_timeout_s", j.gang_start_timeout_s)
    errors += _at_least(0, "jobs.backoff_initial_s", j.backoff_initial_s)
    errors += _wait_at_most(MAX_WAIT_S, "jobs.backoff_max_s", j.backoff_max_s)
    if j.backoff_max_s < j.backoff_initial_s:
        errors.append(
            f"jobs.backoff_max_s: must be >= jobs.backoff_initial_s ({j.backoff_initial_s:g}), "
            f"got {j.backoff_max_s!r}"
        )
    errors += _at_least(1, "jobs.max_start_attempts", j.max_start_attempts)
    errors += _at_most(MAX_RETRIES, "jobs.max_start_attempts", j.max_start_attempts, "retries")
    errors += _at_least(0.01, "jobs.job_signal_poll_s", j.job_signal_poll_s)
    errors += _wait_at_most(MAX_SCRAPE_TIMEOUT_S, "jobs.job_signal_poll_s", j.job_signal_poll_s)
    errors += _at_least(0.1, "jobs.submit_timeout_s", j.submit_timeout_s)
    errors += _wait_at_most(MAX_SUBMIT_TIMEOUT_S, "jobs.submit_timeout_s", j.submit_timeout_s)
    errors += _at_least(0.1, "jobs.step_report_interval_s", j.step_report_interval_s)
    errors += _wait_at_most(MAX_WAIT_S, "jobs.step_report_interval_s", j.step_report_interval_s)
    errors += _at_least(1, "jobs.stall_timeout_s", j.stall_timeout_s)
    errors += _wait_at_most(MAX_DEADLINE_S, "jobs.stall_timeout_s", j.stall_timeout_s)
    if j.stall_timeout_s < j.step_report_interval_s:
        errors.append(
            f"jobs.stall_timeout_s: must be >= jobs.step_report_interval_s "
            f"({j.step_report_interval_s:g}), got {j.stall_timeout_s!r}"
        )
    errors += _at_least(0, "jobs.restart_backoff_initial_s", j.restart_backoff_initial_s)
    errors += _wait_at_most(MAX_WAIT_S, "jobs.restart_backoff_max_s", j.restart_backoff_max_s)
    if j.restart_backoff_max_s < j.restart_backoff_initial_s:
        errors.append(
            "jobs.restart_backoff_max_s: must be >= jobs.restart_backoff_initial_s "
            f"({j.restart_backoff_initial_s:g}), got {j.restart_backoff_max_s!r}"
        )
    errors += _at_least(0.1, "jobs.checkpoint_scan_interval_s", j.checkpoint_scan_interval_s)
    errors += _wait_at_most(
        MAX_WAIT_S, "jobs.checkpoint_scan_interval_s", j.checkpoint_scan_interval_s
    )
    errors += _at_least(1, "jobs.gpu_mtbf_prior_hours", j.gpu_mtbf_prior_hours)
    errors += _at_most(1e9, "jobs.gpu_mtbf_prior_hours", j.gpu_mtbf_prior_hours, "hours")
    return errors


def _validate_telemetry(t: TelemetryConfig) -> list[str]:
    errors: list[str] = []
    errors += _at_least(0.05, "telemetry.interval_s", t.interval_s)
    errors += _wait_at_most(MAX_WAIT_S, "telemetry.interval_s", t.interval_s)
    if t.source not in TELEMETRY_SOURCES:
        errors.append(
            f"telemetry.source: must be one of {', '.join(TELEMETRY_SOURCES)}, got {t.source!r}"
        )
    if t.source == "dcgm" and not t.dcgm_url.startswith(("http://", "https://")):
        errors.append(f"telemetry.dcgm_url: must be an http(s) URL, got {t.dcgm_url!r}")
    errors += _at_least(0.1, "telemetry.dcgm_timeout_s", t.dcgm_timeout_s)
    errors += _wait_at_most(MAX_SCRAPE_TIMEOUT_S, "telemetry.dcgm_timeout_s", t.dcgm_timeout_s)
    if t.exporter_port != 0:
        errors += _port("telemetry.exporter_port", t.exporter_port)
    errors += _at_least(2, "telemetry.history_samples", t.history_samples)
    errors += _at_most(
        MAX_BATCH, "telemetry.history_samples", t.history_samples, "samples kept per node"
    )
    errors += _at_least(0, "telemetry.simulated_ib_ports", t.simulated_ib_ports)
    return errors


def _validate_health(h: HealthConfig) -> list[str]:
    errors: list[str] = []
    errors += _at_least(1, "health.gpu_temp_c", h.gpu_temp_c)
    errors += _at_least(1, "health.hot_samples", h.hot_samples)
    errors += _at_least(1, "health.missing_samples", h.missing_samples)
    errors += _at_least(0, "health.breaker.max_nodes", h.breaker.max_nodes)
    errors += _at_least(0, "health.breaker.max_pool_fraction", h.breaker.max_pool_fraction)
    if h.breaker.max_pool_fraction > 1:
        errors.append(
            "health.breaker.max_pool_fraction: must be <= 1 (a fraction of the pool), "
            f"got {h.breaker.max_pool_fraction!r}"
        )
    errors += _at_least(1, "health.breaker.window_s", h.breaker.window_s)
    errors += _wait_at_most(MAX_WINDOW_S, "health.breaker.window_s", h.breaker.window_s)
    for i, xid in enumerate(h.fatal_xids):
        errors += _at_least(1, f"health.fatal_xids[{i}]", xid, "XIDs are positive")
    errors += _at_least(0, "health.nvlink_errors_per_s", h.nvlink_errors_per_s)
    errors += _at_least(0, "health.ib_errors_per_s", h.ib_errors_per_s)
    errors += _at_least(0, "health.ib_expected_width", h.ib_expected_width)
    errors += _at_least(0, "health.ib_min_rate_gbps", h.ib_min_rate_gbps)
    errors += _at_least(1, "health.recover_after_samples", h.recover_after_samples)
    errors += _at_least(0.1, "health.stale_after_s", h.stale_after_s)
    errors += _wait_at_most(MAX_WAIT_S, "health.stale_after_s", h.stale_after_s)
    errors += _at_least(1, "health.lemon_count", h.lemon_count)
    errors += _at_least(1, "health.lemon_window_s", h.lemon_window_s)
    errors += _wait_at_most(MAX_WINDOW_S, "health.lemon_window_s", h.lemon_window_s)
    errors += _at_least(1, "health.drain_deadline_s", h.drain_deadline_s)
    errors += _wait_at_most(MAX_DEADLINE_S, "health.drain_deadline_s", h.drain_deadline_s)
    return errors


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _dns_label(path: str, value: str) -> list[str]:
    if len(value) > 63 or not _DNS_LABEL.fullmatch(value):
        return [
            f"{path}: must be a DNS-1123 label (lower-case letters, digits and '-', at most "
            f"63 characters, starting and ending with a letter or digit), got {value!r}"
        ]
    return []


def _taint_key(path: str, value: str) -> list[str]:
    prefix, slash, name = value.rpartition("/")
    bad_prefix = bool(slash) and (
        not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)
    )
    if bad_prefix or len(name) > 56 or not _QUALIFIED_NAME.fullmatch(name):
        return [
            f"{path}: must be a Kubernetes qualified name ([prefix/]name: an optional DNS "
            f"subdomain prefix, then a name of at most 56 letters, digits, '-', '_', '.'; 56 "
            f"because the actuator's annotations append '-reason'), got {value!r}"
        ]
    return []


def _validate_kubernetes(k: KubernetesConfig) -> list[str]:
    errors: list[str] = []
    errors += _dns_label("kubernetes.namespace", k.namespace)
    errors += _dns_label("kubernetes.raycluster", k.raycluster)
    if not k.external_group:
        errors.append("kubernetes.external_group: must name the external worker group, got ''")
    errors += _taint_key("kubernetes.taint_key", k.taint_key)
    errors += _at_least(0, "kubernetes.conflict_retries", k.conflict_retries)
    errors += _at_most(MAX_RETRIES, "kubernetes.conflict_retries", k.conflict_retries, "retries")
    if k.pod_grace_period_s is not None:
        errors += _at_least(0, "kubernetes.pod_grace_period_s", k.pod_grace_period_s)
        errors += _wait_at_most(
            MAX_DEADLINE_S, "kubernetes.pod_grace_period_s", k.pod_grace_period_s
        )
    errors += _at_least(0.1, "kubernetes.request_timeout_s", k.request_timeout_s)
    errors += _wait_at_most(
        MAX_REQUEST_TIMEOUT_S, "kubernetes.request_timeout_s", k.request_timeout_s
    )
    if k.actuator_url is not None:
        errors += _actuator_url("kubernetes.actuator_url", k.actuator_url)
    if not k.actuator_token_file:
        errors.append("kubernetes.actuator_token_file: must name the token file, got ''")
    s = k.service
    errors += _port("kubernetes.service.port", s.port)
    errors += _at_least(0, "kubernetes.service.max_node_actions", s.max_node_actions)
    errors += _at_least(1, "kubernetes.service.window_s", s.window_s)
    errors += _wait_at_most(MAX_WINDOW_S, "kubernetes.service.window_s", s.window_s)
    errors += _at_least(256, "kubernetes.service.max_body_bytes", s.max_body_bytes)
    errors += _at_most(
        MAX_BODY_BYTES, "kubernetes.service.max_body_bytes", s.max_body_bytes, "read into memory"
    )
    return errors


def _actuator_url(path: str, value: str) -> list[str]:
    """``http(s)://host[:port]``, nothing else: no credentials, path, query or fragment."""
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        return [f"{path}: not a URL ({exc}), got {value!r}"]
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.password is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or (port is not None and not 1 <= port <= 65535)
    ):
        return [
            f"{path}: must be http(s)://host[:port] with no path, query or credentials "
            f"(e.g. http://rcp-kube-actuator.rcp.svc:8080), got {value!r}"
        ]
    return []


def _list_keys(layer: Any) -> str:
    """The top-level keys of a merge layer, for an error message."""
    try:
        return ", ".join(str(k) for k in layer) or "<empty>"
    except AttributeError:
        return "<config>"


def _describe(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None) or "<config>"
    msg = getattr(exc, "msg", None) or str(exc)
    # omegaconf appends a "full_key: ..., object_type=..." trailer; the first line is the reason.
    reason = msg.splitlines()[0].strip()
    return f"{key}: {reason}"


def _parse_overrides(overrides: list[str]) -> DictConfig:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(
                f"override {item!r}: expected key=value, e.g. pools.cluster.num_nodes=3"
            )
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as exc:
        raise ConfigError(f"overrides: {_describe(exc)}") from exc


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()
) -> Config:
    """Merge packaged defaults, the YAML file at `path` (if any) and `overrides`; validate.

    Raises ConfigError naming every offending key. Nothing is started or written.
    """
    schema = OmegaConf.structured(Config)
    layers: list[Any] = [schema]
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r}: no such file")
        try:
            user = OmegaConf.load(p)
        except Exception as exc:  # yaml errors come in several types
            raise ConfigError(f"config file {str(p)!r}: not valid YAML: {exc}") from exc
        if not isinstance(user, DictConfig):
            raise ConfigError(f"config file {str(p)!r}: must be a mapping of keys to values")
        layers.append(user)
    if overrides:
        layers.append(_parse_overrides(list(overrides)))
    merged = schema
    for layer in layers[1:]:
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as exc:
            raise ConfigError(_describe(exc)) from exc
        except (TypeError, ValueError) as exc:
            # omegaconf raises these when a mapping meets a list, e.g. `models.0.x=1`
            # on the command line: list entries are set in the YAML file.
            raise ConfigError(
                f"cannot merge {_list_keys(layer)}: a list and a mapping met ({exc}); set list "
                "entries (e.g. serving.models) in the YAML file, not as key=value overrides"
            ) from exc
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(_describe(exc)) from exc
    assert isinstance(cfg, Config)
    errors = validate(cfg)
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    return cfg


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a Config saved with `to_dict` (e.g. in the local cluster's state file)."""
    merged = OmegaConf.merge(OmegaConf.structured(Config), data)
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, Config)
    return cfg
