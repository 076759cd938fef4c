"""The sections about the cluster itself and its endpoints: head, pools (with their
providers), ray, storage, serve, api and policy, each field with its default and documentation
and its own checks (``Annotated``, `controlplane.config.checks`).

Must not: load or start anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import AfterValidator

from controlplane.config.checks import MAX_BATCH, MAX_BODY_BYTES, Port, waits
from jobs.storage_credentials import JobCredentialsMode
from jobs.storage_uri import StorageUriError, parse_storage_uri
from policies.admission.borrow import BorrowConfig
from policies.providers import PROVIDER_NAME_RE
from policies.validation import FieldError, Problems, at_least, at_most, one_of

__all__ = [
    "ApiConfig",
    "ClusterPoolConfig",
    "ExternalPoolConfig",
    "HeadConfig",
    "PROXY_LOCATIONS",
    "PolicyConfig",
    "PoolsConfig",
    "ProviderConfig",
    "RayConfig",
    "ServeConfig",
    "StorageConfig",
]

MAX_PROVIDERS = 16
PROXY_LOCATIONS = ("EveryNode", "HeadOnly")
"""Serve's proxy locations `rcp up` offers (Serve's ``Disabled`` would leave no endpoint)."""
_ROLE_ARN_RE = re.compile(r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/[\w+=,.@/-]{1,512}$")


def _provider_name(name: str) -> str:
    if not PROVIDER_NAME_RE.fullmatch(name):
        raise ValueError(f"[a-z0-9-], 1-32 characters, got {name!r}")
    return name


def _providers(providers: list[ProviderConfig]) -> list[ProviderConfig]:
    """1-16 providers, named once each, each at least as many nodes as it keeps."""
    if not 1 <= len(providers) <= MAX_PROVIDERS:
        raise ValueError(f"1 to {MAX_PROVIDERS} providers, got {len(providers)}")
    errors = [
        FieldError(f"[{i}].name", f"{p.name!r} is named twice")
        for i, p in enumerate(providers)
        if p.name in {q.name for q in providers[:i]}
    ]
    errors += [
        FieldError(f"[{i}].max_nodes", f"must be >= min_nodes ({p.min_nodes}), got {p.max_nodes}")
        for i, p in enumerate(providers)
        if p.max_nodes < p.min_nodes
    ]
    if errors:
        raise Problems(*errors)
    return providers


def _storage_uri(uri: str) -> str:
    try:
        parse_storage_uri(uri)
    except StorageUriError as exc:
        raise ValueError(str(exc)) from None
    return uri


def _role_arn(arn: str) -> str:
    if arn and not _ROLE_ARN_RE.match(arn):
        raise ValueError(
            f"must be an IAM role ARN (arn:aws:iam::<12-digit account>:role/<name>), got {arn!r}"
        )
    return arn


def _absolute(path: str) -> str:
    if path and not path.startswith("/"):
        raise ValueError(f"must be an absolute path (a mounted Secret), got {path!r}")
    return path


@dataclass
class HeadConfig:
    """The Ray head node: runs the control plane, the Serve proxy and ingress; no GPUs."""

    num_cpus: Annotated[int, at_least(0)] = 2
    """Logical CPUs the head advertises (CPU-only work: the Serve ingress, the policy actor)."""


@dataclass
class ClusterPoolConfig(BorrowConfig):
    """The owned GPU nodes (`pool=cluster`). A fixed-size group: it never scales, and a node
    that dies is replaced. It embeds `policies.admission.borrow.BorrowConfig` (how long a
    replacement takes, against borrowing a node from serving)."""

    num_nodes: Annotated[int, at_least(1, "a pool with no nodes")] = 2
    gpus_per_node: Annotated[int, at_least(0)] = 4
    """GPUs per node (logical GPUs in local mode)."""
    cpus_per_node: Annotated[int, at_least(0)] = 8


@dataclass
class ProviderConfig:
    """One provider of rented GPU nodes: a node group of the `external` pool (a node type of
    the local autoscaler, a KubeRay worker group), with its price and delivery deadline."""

    name: Annotated[str, AfterValidator(_provider_name)] = "rent-a"
    """[a-z0-9-], 1-32 characters: it names the node type, the worker group
    (``kubernetes.external_group`` + ``-`` + name) and the nodes' ``provider`` label."""
    price_per_gpu_hour: Annotated[float, at_least(0)] = 2.0
    """What one of its GPUs costs an hour: placement rents from the cheapest provider with
    room and empties the most expensive first."""
    min_nodes: Annotated[int, at_least(0)] = 0
    """Nodes kept even when idle; 0 means it scales to zero."""
    max_nodes: Annotated[int, at_least(1, "a provider with no nodes")] = 2
    """Upper bound the autoscaler may launch from it; must be >= min_nodes and >= 1."""
    gpus_per_node: Annotated[int, at_least(0)] = 2
    """GPUs per node (logical GPUs in local mode)."""
    cpus_per_node: Annotated[int, at_least(0)] = 4
    delivery_deadline_s: Annotated[float, at_least(1), waits()] = 900.0
    """Rented GPUs asked of it and not up within this long mark it out (a stock-out, a
    quota, a refusal): its request goes to the next provider, and what none can host to the
    cluster pool, reclaimed from training if it must."""
    backoff_s: Annotated[float, at_least(1), waits()] = 1800.0
    """How long a provider marked out stays out before placement asks it again."""


def _default_providers() -> list[ProviderConfig]:
    return [
        ProviderConfig(name="rent-a", price_per_gpu_hour=2.0),
        ProviderConfig(name="rent-b", price_per_gpu_hour=3.0),
    ]


@dataclass
class ExternalPoolConfig:
    """Rented GPU nodes (`pool=external`) from one or more providers, each scaled by the Ray
    autoscaler from its `min_nodes`."""

    providers: Annotated[list[ProviderConfig], AfterValidator(_providers)] = field(
        default_factory=_default_providers
    )
    """The providers, each a node group; their order breaks ties of price."""
    idle_timeout_s: Annotated[float, at_least(1), waits()] = 30.0
    """An external node idle this long is removed by the autoscaler."""

    @property
    def max_nodes(self) -> int:
        return sum(p.max_nodes for p in self.providers)

    @property
    def max_gpus(self) -> int:
        return sum(p.max_nodes * p.gpus_per_node for p in self.providers)

    @property
    def min_nodes(self) -> int:
        return sum(p.min_nodes for p in self.providers)


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
    gcs_port: Port = 6390
    """The head's GCS port (the cluster address is node_ip:gcs_port)."""
    dashboard_port: Port = 8265
    """Ray dashboard (Jobs, Serve, Actors, Metrics tabs)."""
    client_port: Port = 10001
    metrics_export_port: Port = 8090
    """Prometheus endpoint of the head node's metrics agent."""
    autoscaler_update_interval_s: Annotated[float, at_least(0.1), waits()] = 1.0
    """How often the autoscaler reconciles (local mode)."""
    ready_timeout_s: Annotated[float, at_least(1), waits()] = 180.0
    """How long `rcp up` waits for the head and the cluster pool before giving up."""
    gcs_fault_tolerance: bool = True
    """Keep the head's GCS tables in a Redis server `rcp up` starts on loopback
    (``controlplane.local.redis``), so a head that dies and comes back finds the cluster
    where it was: worker nodes, Serve replicas and proxies, running gangs. Off: the GCS keeps
    them in memory and a head restart is a new cluster (docs/operations.md)."""
    redis_port: Port = 6380
    """Port of that Redis server (bound to node_ip, password in ``<state_dir>/redis-password``)."""
    gcs_reconnect_timeout_s: Annotated[float, at_least(5), waits()] = 60.0
    """How long a worker node's raylet waits for a lost GCS before it exits (Ray's
    ``gcs_rpc_server_reconnect_timeout_s``): the window for the head to come back."""


@dataclass
class StorageConfig:
    """Object storage for checkpoints. The URI's scheme picks the backend (s3:// or file://)."""

    uri: Annotated[str, AfterValidator(_storage_uri)] = "s3://rcp-checkpoints"
    """Where checkpoints live: ``s3://bucket/prefix`` or ``file:///path``."""
    endpoint_url: str | None = None
    """S3 endpoint; None means AWS's own, or the embedded server's when `embedded` is on
    (`Config.storage_endpoint_url`)."""
    region: str = "us-east-1"
    embedded: bool = True
    """Start an S3-protocol server on loopback with `rcp up` (local mode)."""
    embedded_port: Port = 9000
    job_credentials: Annotated[str, one_of(m.value for m in JobCredentialsMode)] = "scoped"
    """How a job's checkpoint code reaches S3 (`jobs.storage_credentials.JobCredentialsMode`).
    ``scoped``: per job and attempt the controller calls STS ``AssumeRole`` on `job_role_arn`
    with a session policy that allows only the job's checkpoint prefix
    (`jobs.storage_uri.job_storage_policy`), hands the credentials to the job through the
    signals actor and mints new ones before they expire; the nodes carry no storage key.
    ``shared``: jobs use the node's own AWS credentials (bucket-wide). See
    docs/operations.md, "Checkpoint ownership and storage credentials"."""
    job_role_arn: Annotated[str, AfterValidator(_role_arn)] = ""
    """The IAM role scoped credentials are minted from (``arn:aws:iam::<account>:role/<name>``):
    read, write and list on the checkpoint buckets; the controller's own credentials must be
    allowed ``sts:AssumeRole`` on it. Empty with the embedded store: a fixed local ARN (its
    STS accepts any and enforces no policy)."""
    job_credentials_duration_s: Annotated[int, at_least(1800), at_most(43200, "STS's maximum")] = (
        3600
    )
    """Lifetime of each job's minted credentials (STS ``DurationSeconds``), 1800-43200 and at
    most the role's maximum session (3600 when the controller's own credentials are a role's:
    role chaining). The controller mints anew when half is left (at least 20 min:
    `policies.credentials`)."""
    sts_endpoint_url: str | None = None
    """STS endpoint for minting job credentials; None: the S3 endpoint when one is set (the
    embedded store and MinIO answer STS there), else AWS's own."""


@dataclass
class ServeConfig:
    """The production Serve HTTP endpoint."""

    http_port: Port = 8000
    """The serve endpoint: the edge (HAProxy, `serve.edge`) listens here, on ray.node_ip."""
    edge_admin_port: Port = 8404
    """The edge's admin listener (its Prometheus metrics and health), on ray.node_ip; never
    answered on the serve endpoint."""
    deploy_app: bool = True
    """Deploy the production Serve application (the `serving` section) with `rcp up`."""
    proxy_location: Annotated[str, one_of(PROXY_LOCATIONS)] = "EveryNode"
    """Where Serve runs HTTP proxies: ``EveryNode`` (the head and every node that holds a
    replica, so traffic outlives the head; docs/serving.md) or ``HeadOnly`` (one proxy, on
    the head: the behaviour before issue 18, kept for the head-loss benchmark's baseline)."""


@dataclass
class ApiConfig:
    """The control plane's HTTP API (used by the SDK and CLI)."""

    port: Port = 8080
    """Port of the control-plane API (bound to ray.node_ip)."""
    max_body_bytes: Annotated[int, at_least(1024), at_most(MAX_BODY_BYTES, "read into memory")] = (
        1_048_576
    )
    """Largest request body the API reads; larger ones get 413 (a job spec is a few KiB)."""
    rate_limit_per_s: Annotated[float, at_least(0.01), at_most(1e6, "no limit at all")] = 50.0
    """Requests per second each user may make (a token bucket per user; the same bucket per
    client address limits requests that fail authentication). Past it: 429 with Retry-After."""
    rate_burst: Annotated[
        int, at_least(1, "no request could pass"), at_most(MAX_BATCH, "no limit at all")
    ] = 100
    """Requests a user may make at once before `rate_limit_per_s` paces them (bucket size)."""
    admin_token_file: Annotated[str, AfterValidator(_absolute)] = ""
    """A file that holds the first admin's API token: on KubeRay, Secret ``rcp-api-admin``
    mounted into the controller's container only. Empty: ``<state_dir>/api-token``, created
    on first use (``rcp up``)."""


@dataclass
class PolicyConfig:
    """The policy actor's loop."""

    tick_s: Annotated[float, at_least(0.05), waits()] = 1.0
    """Seconds between observe -> decide -> act -> record ticks."""
