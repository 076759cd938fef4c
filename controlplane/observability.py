"""Monitoring glue: the metric names the dashboards may use and Prometheus target files.

Owns: `KNOWN_METRICS` (every metric name, as Prometheus stores it, that the Grafana dashboards
in ``infra/grafana``, the alert rules and `rcp timeline`'s queries may reference; the unit
test checks every panel, rule and query against it), PromQL helpers for dashboards, the
file_sd target lists (Ray's own, `ray_metrics_sd_file`, and the telemetry agents',
`write_telemetry_targets`), the local Prometheus's scrape config (`local_prometheus_config`),
and where the monitoring files are (`PROMETHEUS_DIR`, `GRAFANA_DIR`: package data of
``controlplane/monitoring``, in the source tree links to ``infra/prometheus`` and
``infra/grafana``, the one copy users edit).

Must not: change the cluster (it only reads what Ray and the agents publish) or start a process.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from controlplane.config import Config
from controlplane.ray_connection import ray_temp_dir
from controlplane.telemetry import manager
from serve.edge.config import EDGE_METRICS_PATH, HAPROXY_METRICS_PATH

__all__ = [
    "EDGE_JOB",
    "EDGE_PATH_LABEL",
    "GRAFANA_DIR",
    "KNOWN_METRICS",
    "PROMETHEUS_DIR",
    "RAY_SD_FILE",
    "TELEMETRY_SD_FILE",
    "local_prometheus_config",
    "load_dashboards",
    "metric_names",
    "panel_expressions",
    "for_query",
    "prometheus_dir",
    "ray_metrics_sd_file",
    "telemetry_targets_file",
    "write_file_sd",
    "write_telemetry_targets",
]


def _monitoring_dir(name: str) -> Path:
    """``controlplane/monitoring/<name>`` as a directory on disk (the local Prometheus is handed
    its rule file by path)."""
    found = resources.files("controlplane") / "monitoring" / name
    if not isinstance(found, Path) or not found.is_dir():
        raise RuntimeError(
            f"controlplane's monitoring files ({found}) are not a directory on disk: install "
            "ray-controlplane unpacked (pip install), not run from a zip; in a checkout, "
            "controlplane/monitoring/prometheus and grafana must be links into infra/ "
            "(git config core.symlinks true)"
        )
    return found


PROMETHEUS_DIR = _monitoring_dir("prometheus")
"""The alert rules (``rules.yml``) the local Prometheus loads: ``infra/prometheus``'s, shipped in
the package."""
GRAFANA_DIR = _monitoring_dir("grafana")
"""The Grafana dashboards (``*.json``): ``infra/grafana``'s, shipped in the package."""
RAY_SD_FILE = "prom_metrics_service_discovery.json"
"""The file_sd target list Ray's head keeps in its temp dir: every alive node's metrics agent."""
TELEMETRY_SD_FILE = "telemetry-targets.json"
"""The file_sd target list of the telemetry agents' exporters, in the local Prometheus's dir."""
EDGE_JOB = "rcp-edge"
"""The ``job`` label of the edge's series, locally and on Kubernetes: two scrapes of its admin
listener, HAProxy's exporter (``haproxy_*``: what clients got, retries, the Serve proxies'
state) and the route-table gauges (``rcp_edge_route_table_*``, its Lua). Both carry the same
``instance`` (the admin address), so rules join them on it."""
EDGE_PATH_LABEL = "metrics_path"
"""The label that keeps the edge's two scrapes apart (its value: the path scraped), as
``infra/prometheus/prometheus.yml`` and ``podmonitors.yaml`` set it: without it both scrapes'
own series (``up``, ``scrape_duration_seconds``) would be one."""


def _histogram(name: str) -> tuple[str, ...]:
    return (f"{name}_bucket", f"{name}_sum", f"{name}_count")


_CONTROLLER = "control loop (controlplane/loop) via ray.util.metrics"
_SERVING = "control loop, serving phases (controlplane/loop) via ray.util.metrics"
_CHECKPOINT = "checkpoint engine (jobs/checkpoint/metrics.py) mirrored into ray.util.metrics"
_SERVE = "Ray Serve (proxy and replicas)"
_RAY_NODE = "Ray's metrics agent (per node)"
_TELEMETRY = "telemetry agents' exporters (controlplane/telemetry/exporter.py)"
_EDGE_HAPROXY = "the edge: HAProxy's own exporter (serve/edge/config.py), job rcp-edge, /metrics"
_EDGE_TABLE = "the edge's route-table task (serve/edge/rcp_edge.lua), job rcp-edge, /rcp/metrics"

KNOWN_METRICS: dict[str, str] = {
    # the control plane (Ray adds the ray_ prefix; counters get _total)
    "ray_rcp_queue_depth": _CONTROLLER,
    "ray_rcp_gpus": _CONTROLLER,
    "ray_rcp_admission_wait_seconds": _CONTROLLER,
    "ray_rcp_tick_phase_seconds": _CONTROLLER,
    "ray_rcp_tick_phase_errors": _CONTROLLER,
    "ray_rcp_node_verdict": _CONTROLLER,
    "ray_rcp_nodes_cordoned": _CONTROLLER,
    "ray_rcp_node_serving_only": _CONTROLLER,
    "ray_rcp_health_breaker_open": _CONTROLLER,
    "ray_rcp_health_removals_held": _CONTROLLER,
    "ray_rcp_policy_paused": _CONTROLLER,
    # each active job's recovery, from what the controller recorded (controlplane/loop/
    # job_metrics.py): present while a job runs (restarts and hangs: while it is active)
    "ray_rcp_job_running_since_timestamp_seconds": _CONTROLLER,
    "ray_rcp_job_checkpoint_last_commit_timestamp_seconds": _CONTROLLER,
    "ray_rcp_job_checkpoint_last_committed_step": _CONTROLLER,
    "ray_rcp_job_checkpoint_overhead_ratio": _CONTROLLER,
    "ray_rcp_job_checkpoint_interval_seconds": _CONTROLLER,
    "ray_rcp_job_ettr_ratio": _CONTROLLER,
    "ray_rcp_job_last_recovery_seconds": _CONTROLLER,
    "ray_rcp_job_restarts": _CONTROLLER,
    "ray_rcp_job_hangs": _CONTROLLER,
    "ray_rcp_job_max_restarts": _CONTROLLER,
    "ray_rcp_fleet_gpu_mtbf_hours": _CONTROLLER,
    "ray_rcp_serve_replicas": _SERVING,
    "ray_rcp_serve_route_weight": _SERVING,
    "ray_rcp_model_p99_ms": _SERVING,
    "ray_rcp_model_slo_p99_ms": _SERVING,
    "ray_rcp_external_gpus_requested": _SERVING,
    "ray_rcp_external_gpus_max": _SERVING,
    "ray_rcp_external_provider_price_per_gpu_hour": _SERVING,
    "ray_rcp_external_provider_gpus_max": _SERVING,
    "ray_rcp_external_provider_gpus_live": _SERVING,
    "ray_rcp_external_provider_gpus_requested": _SERVING,
    "ray_rcp_external_provider_out": _SERVING,
    "ray_rcp_training_claim_gpus": _SERVING,
    "ray_rcp_serving_phase_seconds": _SERVING,
    "ray_rcp_serving_errors_total": _SERVING,
    # the checkpoint engine inside training workers
    **{n: _CHECKPOINT for n in _histogram("ray_rcp_checkpoint_stall_seconds")},
    **{n: _CHECKPOINT for n in _histogram("ray_rcp_checkpoint_upload_seconds")},
    "ray_rcp_checkpoint_upload_bytes_per_second": _CHECKPOINT,
    "ray_rcp_checkpoint_last_commit_unix_seconds": _CHECKPOINT,
    "ray_rcp_checkpoint_last_committed_step": _CHECKPOINT,
    "ray_rcp_checkpoint_uploaded_bytes_total": _CHECKPOINT,
    # Ray Serve
    "ray_serve_num_http_requests_total": _SERVE,
    "ray_serve_num_http_error_requests_total": _SERVE,
    "ray_serve_num_deployment_http_error_requests_total": _SERVE,
    "ray_serve_deployment_request_counter_total": _SERVE,
    **{n: _SERVE for n in _histogram("ray_serve_deployment_processing_latency_ms")},
    **{n: _SERVE for n in _histogram("ray_serve_http_request_latency_ms")},
    # the edge (HAProxy) in front of the Serve proxies. Its proxies, the ``proxy`` label:
    # frontend ``public`` (what clients got, the edge's own refusals included), backends
    # ``routed`` (predicts sent straight to a pool's backend app by the route table) and
    # ``ingress`` (everything else, to the ingress deployment); servers: the Serve proxies.
    "haproxy_frontend_http_requests_total": _EDGE_HAPROXY,
    "haproxy_frontend_http_responses_total": _EDGE_HAPROXY,
    "haproxy_frontend_current_sessions": _EDGE_HAPROXY,
    "haproxy_backend_http_requests_total": _EDGE_HAPROXY,
    "haproxy_backend_http_responses_total": _EDGE_HAPROXY,
    "haproxy_backend_retry_warnings_total": _EDGE_HAPROXY,
    "haproxy_backend_redispatch_warnings_total": _EDGE_HAPROXY,
    "haproxy_backend_active_servers": _EDGE_HAPROXY,
    "haproxy_backend_backup_servers": _EDGE_HAPROXY,
    "haproxy_server_status": _EDGE_HAPROXY,
    "rcp_edge_route_table_generation": _EDGE_TABLE,
    "rcp_edge_route_table_age_seconds": _EDGE_TABLE,
    # Ray nodes
    "ray_node_cpu_utilization": _RAY_NODE,
    "ray_node_mem_used": _RAY_NODE,
    "ray_node_mem_total": _RAY_NODE,
    # telemetry agents (dcgm-exporter names where one exists)
    "DCGM_FI_DEV_GPU_TEMP": _TELEMETRY,
    "DCGM_FI_DEV_POWER_USAGE": _TELEMETRY,
    "DCGM_FI_DEV_GPU_UTIL": _TELEMETRY,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": _TELEMETRY,
    "DCGM_FI_DEV_XID_ERRORS": _TELEMETRY,
    "rcp_gpu_nvlink_errors_per_second": _TELEMETRY,
    "rcp_ib_port_up": _TELEMETRY,
    "rcp_ib_port_errors_per_second": _TELEMETRY,
}
"""Metric name (as stored in Prometheus) -> who exports it. Dashboards, alert rules and the
timeline's queries may use only these."""


# -- dashboards and PromQL -----------------------------------------------------------------

# Grafana's built-in interval variables, replaced by a fixed window to run a panel's query.
_GRAFANA_INTERVALS = ("$__rate_interval", "$__interval", "$__range")
_PROMQL_WORDS = frozenset(
    {
        "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
        "and", "or", "unless", "offset", "inf", "nan", "atan2",
    }
)  # fmt: skip


def load_dashboards(directory: Path = GRAFANA_DIR) -> dict[str, dict[str, Any]]:
    """Every ``*.json`` dashboard in `directory`, by file name."""
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def _walk_panels(panels: Iterable[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    for panel in panels:
        yield panel
        yield from _walk_panels(panel.get("panels") or ())  # collapsed rows hold panels


def panel_expressions(dashboard: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(panel title, refId, expr)`` for every Prometheus target of every panel."""
    out = []
    for panel in _walk_panels(dashboard.get("panels") or ()):
        for target in panel.get("targets") or ():
            if "expr" in target:
                out.append(
                    (str(panel.get("title", "")), str(target.get("refId", "")), target["expr"])
                )
    return out


def for_query(expr: str, window: str = "1m") -> str:
    """`expr` with Grafana's interval variables replaced by `window`, ready for Prometheus."""
    for var in _GRAFANA_INTERVALS:
        expr = expr.replace(var, window)
    if "$" in expr:
        raise ValueError(f"unresolved Grafana variable in {expr!r}")
    return expr


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads (a PromQL-aware scan, not a full parser).

    Drops string literals, label matchers ``{...}``, range and subquery brackets, grouping
    label lists (``by (...)``, ``on (...)``, ...), function calls, keywords and numbers;
    what is left are metric names. Example::

        >>> sorted(metric_names('sum by (pool) (rate(ray_x_total{a="b"}[1m])) / on() y'))
        ['ray_x_total', 'y']
    """
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = m.group(0)
        rest = s[m.end() :].lstrip()
        if rest.startswith("("):
            continue  # a function or an aggregation
        if word.lower() in _PROMQL_WORDS:
            continue
        before = s[: m.start()]
        if re.search(r"[0-9.]$", before):
            continue  # a unit of a duration or an exponent (1e3)
        names.add(word)
    return names


# -- target files ----------------------------------------------------------------------------


def ray_metrics_sd_file(cfg: Config) -> Path:
    """Ray's file_sd list of every node's metrics agent (the head rewrites it as nodes change)."""
    return ray_temp_dir(cfg) / RAY_SD_FILE


def prometheus_dir(cfg: Config) -> Path:
    """The local Prometheus's files (config, target lists, data) for the cluster of `cfg`."""
    return cfg.state_path / "prometheus"


def telemetry_targets_file(cfg: Config) -> Path:
    """The telemetry agents' file_sd list the local Prometheus of `cfg` watches."""
    return prometheus_dir(cfg) / TELEMETRY_SD_FILE


def write_file_sd(path: Path, groups: list[dict[str, Any]]) -> None:
    """Write a file_sd target list atomically (Prometheus never reads half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(groups, indent=2, sort_keys=True))
    os.replace(tmp, path)


def write_telemetry_targets(path: Path, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Write the telemetry agents' exporters as a file_sd list and return it; needs a Ray
    connection."""
    groups = manager.prometheus_file_sd(manager.agent_endpoints(timeout_s=timeout_s))
    write_file_sd(path, groups)
    return groups


def local_prometheus_config(
    *,
    ray_sd_file: Path,
    telemetry_sd_file: Path,
    rule_files: Iterable[Path] = (PROMETHEUS_DIR / "rules.yml",),
    scrape_interval_s: float = 5.0,
    edge_target: str | None = None,
) -> dict[str, Any]:
    """Prometheus config for the local cluster: Ray's metrics agents, the telemetry agents and,
    given `edge_target` (``host:port`` of the edge's admin listener), the edge's metrics: job
    `EDGE_JOB` scrapes that address at ``HAPROXY_METRICS_PATH`` and ``EDGE_METRICS_PATH``,
    each scrape's path in the label `EDGE_PATH_LABEL`. The job names and labels match
    ``infra/prometheus/prometheus.yml``, so the same dashboards and rules work on Kubernetes.
    """
    interval = f"{scrape_interval_s:g}s"
    jobs: list[dict[str, Any]] = [
        {"job_name": name, "file_sd_configs": [{"files": [str(f)], "refresh_interval": "5s"}]}
        for name, f in (("ray", ray_sd_file), ("rcp-telemetry", telemetry_sd_file))
    ]
    if edge_target is not None:
        jobs.append(
            {
                "job_name": EDGE_JOB,
                # one target per path: a target's own __metrics_path__ wins over the job's
                "static_configs": [
                    {"targets": [edge_target], "labels": {"__metrics_path__": path}}
                    for path in (HAPROXY_METRICS_PATH, EDGE_METRICS_PATH)
                ],
                "relabel_configs": [
                    {"source_labels": ["__metrics_path__"], "target_label": EDGE_PATH_LABEL}
                ],
            }
        )
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": jobs,
    }
