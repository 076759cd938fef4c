"""Prometheus config, alert rules and Grafana dashboards in infra/ are valid and consistent.

promtool (Debian's ``prometheus`` package) checks the scrape config, the rules, and runs the
rules' unit tests (infra/prometheus/rules_test.yml: each alert fires on synthetic series and
stays quiet otherwise). Every dashboard panel's PromQL is parsed by promtool and may only name
metrics in `controlplane.observability.KNOWN_METRICS`, as may the rules and the timeline's
queries (the integration test proves each panel has data on a live cluster). The edge's
metrics are scraped from its admin listener, at the paths its rendered HAProxy config serves,
and every HAProxy proxy they name is one that config has. No Ray here: the checkpoint metrics'
Ray mirror runs against a fake.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane import observability as obs
from controlplane.config import load_config
from controlplane.local.prometheus import LocalPrometheus
from controlplane.loop.job_metrics import JobMetrics
from controlplane.store import JobState
from controlplane.timeline.series import QUERIES
from jobs.checkpoint import metrics as ckpt_metrics
from serve.edge.config import (
    EDGE_METRICS_PATH,
    HAPROXY_METRICS_PATH,
    LUA_SOURCE,
    EdgeSettings,
    StaticProxies,
    render,
)
from tests.unit.api.test_job_recovery_view import info, record

REPO = Path(__file__).resolve().parents[3]
PROM = REPO / "infra" / "prometheus"
GRAFANA = REPO / "infra" / "grafana"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)"
)

REQUIRED_ALERTS = {
    "RcpGpuHot",
    "RcpInfinibandErrors",
    "RcpTrainingCheckpointTooOld",
    "RcpProductionRequestsFailing",
    "RcpExternalPoolAtMax",
    "RcpNodeUnhealthy",
    "RcpTrainingNeverCheckpointed",
    "RcpTrainingJobHung",
    "RcpTrainingRestartsExhausted",
    "RcpEdgeRoutesWithoutTable",
    "RcpExternalProviderOut",
}


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


def dashboards() -> dict[str, dict[str, Any]]:
    found = obs.load_dashboards(GRAFANA)
    assert found, f"no dashboards in {GRAFANA}"
    return found


def all_exprs() -> list[tuple[str, str]]:
    return [
        (f"{name}: {title} [{ref}]", expr)
        for name, d in dashboards().items()
        for title, ref, expr in obs.panel_expressions(d)
    ]


# -- Prometheus ---------------------------------------------------------------------------


def _without_kubernetes_sd(config: dict[str, Any]) -> dict[str, Any]:
    """The config with each kubernetes_sd_configs replaced by an empty static target list."""
    out = json.loads(json.dumps(config))
    for job in out["scrape_configs"]:
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["static_configs"] = [{"targets": []}]
    return out


@needs_promtool
def test_promtool_accepts_the_kubernetes_scrape_config(tmp_path: Path) -> None:
    res = promtool("check", "config", str(PROM / "prometheus.yml"))
    if res.returncode != 0 and "kubernetes_sd_configs not found" in res.stdout + res.stderr:
        # Debian builds Prometheus without Kubernetes discovery. promtool then checks
        # everything else (relabelling, rule files, globals) with the discovery blocks
        # swapped for static ones; the blocks themselves are checked below.
        config = yaml.safe_load((PROM / "prometheus.yml").read_text())
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(_without_kubernetes_sd(config)))
        shutil.copy(PROM / "rules.yml", tmp_path / "rules.yml")
        res = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr


def test_scrape_jobs_cover_ray_telemetry_and_dcgm() -> None:
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert {"ray", "rcp-telemetry", "dcgm-exporter"} <= set(jobs)
    assert config["rule_files"] == ["rules.yml"]
    for name in ("ray", "rcp-telemetry", "dcgm-exporter"):
        (sd,) = jobs[name]["kubernetes_sd_configs"]
        assert set(sd) <= {"role", "namespaces", "selectors", "api_server", "kubeconfig_file"}
        assert sd["role"] in {"pod", "endpoints", "endpointslice", "service", "node"}

    def kept_ports(job: dict[str, Any]) -> str:
        (rule,) = [
            r
            for r in job["relabel_configs"]
            if r.get("action") == "keep"
            and r["source_labels"]
            in (
                ["__meta_kubernetes_pod_container_port_name"],
                ["__meta_kubernetes_endpoint_port_name"],
            )
        ]
        return str(rule["regex"])

    assert kept_ports(jobs["ray"]) == "metrics"  # KubeRay's name for the 8080 metrics port
    assert kept_ports(jobs["rcp-telemetry"]) == "rcp-telemetry"
    assert "gpu-metrics" in kept_ports(jobs["dcgm-exporter"])
    # the edges: their pods (edge.yaml's label), their admin port (never the public one), one
    # scrape config per path, relabelled alike (the path in its own label), the second one's
    # job set to the first's, so a pod's series from both share job and instance
    edge, table = jobs[obs.EDGE_JOB], jobs["rcp-edge-table"]
    assert (edge["metrics_path"], table["metrics_path"]) == (
        HAPROXY_METRICS_PATH,
        EDGE_METRICS_PATH,
    )
    copy_path = {"source_labels": ["__metrics_path__"], "target_label": obs.EDGE_PATH_LABEL}
    set_job = {"target_label": "job", "replacement": obs.EDGE_JOB}
    assert copy_path in edge["relabel_configs"]
    assert table["relabel_configs"] == [*edge["relabel_configs"], set_job]
    assert kept_ports(edge) == _edge_admin_port_name() != _edge_public_port_name()
    (keep_pods,) = [
        r
        for r in edge["relabel_configs"]
        if r["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_name"]
    ]
    assert (keep_pods["action"], keep_pods["regex"]) == ("keep", _edge_pod_label())


def _edge_pod_template() -> dict[str, Any]:
    docs = yaml.safe_load_all((REPO / "infra" / "k8s" / "edge.yaml").read_text())
    (deployment,) = [d for d in docs if d and d["kind"] == "Deployment"]
    template: dict[str, Any] = deployment["spec"]["template"]
    return template


def _edge_pod_label() -> str:
    return str(_edge_pod_template()["metadata"]["labels"]["app.kubernetes.io/name"])


def _edge_port_name(container_port: int) -> str:
    ports = [p for c in _edge_pod_template()["spec"]["containers"] for p in c.get("ports", ())]
    (port,) = [p for p in ports if p["containerPort"] == container_port]
    return str(port["name"])


def _edge_admin_port_name() -> str:
    """The edge pods' admin port (``serve.edge_admin_port``'s default): metrics, health."""
    return _edge_port_name(load_config().serve.edge_admin_port)


def _edge_public_port_name() -> str:
    return _edge_port_name(load_config().serve.http_port)


def _admin_frontend(settings: EdgeSettings) -> str:
    """The ``frontend admin`` section of the rendered ``haproxy.cfg``."""
    cfg = render(settings)["haproxy.cfg"]
    return cfg.split("\nfrontend admin\n", 1)[1].split("\n\n", 1)[0]


def test_the_local_prometheus_scrapes_the_edge_admin_listener_at_both_paths(
    tmp_path: Path,
) -> None:
    cfg = load_config(
        overrides=[f"state_dir={tmp_path}", "serve.http_port=18123", "serve.edge_admin_port=18404"]
    )
    prom = LocalPrometheus.for_cluster(cfg, port=19090)
    config = json.loads(prom.write_config().read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    kubernetes = {
        j["job_name"]
        for j in yaml.safe_load((PROM / "prometheus.yml").read_text())["scrape_configs"]
    }
    assert set(jobs) == {"ray", "rcp-telemetry", obs.EDGE_JOB} and set(jobs) <= kubernetes
    admin = f"{cfg.ray.node_ip}:18404"  # the admin listener, never the public 18123
    edge = jobs[obs.EDGE_JOB]
    assert edge["static_configs"] == [
        {"targets": [admin], "labels": {"__metrics_path__": path}}
        for path in (HAPROXY_METRICS_PATH, EDGE_METRICS_PATH)
    ]
    assert edge["relabel_configs"] == [
        {"source_labels": ["__metrics_path__"], "target_label": obs.EDGE_PATH_LABEL}
    ]
    # ... where the edge `rcp up` renders serves them: HAProxy's exporter and the Lua gauges
    admin_frontend = _admin_frontend(
        EdgeSettings(
            listen_host=cfg.ray.node_ip,
            listen_port=18123,
            admin_host=cfg.ray.node_ip,
            admin_port=18404,
            work_dir=str(tmp_path / "edge"),
            proxies=StaticProxies(nodes=(("127.0.0.1", 8000),)),
        )
    )
    assert f"bind {admin}\n" in admin_frontend
    assert f"use-service prometheus-exporter if {{ path {HAPROXY_METRICS_PATH} }}" in admin_frontend
    assert f"use-service lua.rcp_edge_metrics if {{ path {EDGE_METRICS_PATH} }}" in admin_frontend
    assert 'core.register_service("rcp_edge_metrics", "http"' in LUA_SOURCE.read_text()
    # without an edge (a Prometheus a test starts over Ray's agents alone) there is no such job
    bare = obs.local_prometheus_config(
        ray_sd_file=tmp_path / "ray.json", telemetry_sd_file=tmp_path / "t.json"
    )
    assert [j["job_name"] for j in bare["scrape_configs"]] == ["ray", "rcp-telemetry"]


@needs_promtool
def test_promtool_accepts_the_local_config_with_the_edge(tmp_path: Path) -> None:
    cfg = load_config(overrides=[f"state_dir={tmp_path}"])
    path = LocalPrometheus.for_cluster(cfg, rule_files=(PROM / "rules.yml",)).write_config()
    res = promtool("check", "config", str(path))
    assert res.returncode == 0, res.stdout + res.stderr


def test_operator_monitors_scrape_the_same_ports() -> None:
    docs = list(yaml.safe_load_all((PROM / "podmonitors.yaml").read_text()))
    by_name = {d["metadata"]["name"]: d for d in docs}
    assert {d["apiVersion"] for d in docs} == {"monitoring.coreos.com/v1"}
    assert by_name["rcp-ray"]["kind"] == "PodMonitor"
    assert [e["port"] for e in by_name["rcp-ray"]["spec"]["podMetricsEndpoints"]] == ["metrics"]
    assert [e["port"] for e in by_name["rcp-telemetry"]["spec"]["podMetricsEndpoints"]] == [
        "rcp-telemetry"
    ]
    assert by_name["rcp-dcgm-exporter"]["kind"] == "ServiceMonitor"
    # the edges: the admin port at both paths, under the job and labels prometheus.yml gives
    edge_monitors = [
        d
        for d in docs
        if d["kind"] == "PodMonitor"
        and d["spec"]["selector"].get("matchLabels")
        == {"app.kubernetes.io/name": _edge_pod_label()}
    ]
    assert _edge_pod_label() == obs.EDGE_JOB
    assert {
        (e["port"], e["path"], _operator_job(m, e))
        for m in edge_monitors
        for e in m["spec"]["podMetricsEndpoints"]
    } == {
        (_edge_admin_port_name(), HAPROXY_METRICS_PATH, obs.EDGE_JOB),
        (_edge_admin_port_name(), EDGE_METRICS_PATH, obs.EDGE_JOB),
    }
    copy_path = {"sourceLabels": ["__metrics_path__"], "targetLabel": obs.EDGE_PATH_LABEL}
    for m in edge_monitors:
        for e in m["spec"]["podMetricsEndpoints"]:
            assert copy_path in e.get("relabelings", ()), (m["metadata"]["name"], e["path"])


def _operator_job(monitor: dict[str, Any], endpoint: dict[str, Any]) -> str:
    """The job label prometheus-operator gives an endpoint's series: a relabelling that sets
    ``job``, else the value of the pod label `jobLabel` names (the edge pods': rcp-edge)."""
    for r in endpoint.get("relabelings", ()):
        if r.get("targetLabel") == "job" and r.get("action", "replace") == "replace":
            return str(r["replacement"])
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/name", monitor["metadata"]["name"]
    return _edge_pod_label()


@needs_promtool
def test_promtool_accepts_the_rules() -> None:
    res = promtool("check", "rules", str(PROM / "rules.yml"))
    assert res.returncode == 0, res.stdout + res.stderr


@needs_promtool
def test_every_alert_fires_on_synthetic_series_and_not_otherwise() -> None:
    res = promtool("test", "rules", "rules_test.yml", cwd=PROM)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr


def test_rules_tests_cover_every_alert_both_ways() -> None:
    rules = yaml.safe_load((PROM / "rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert alerts >= REQUIRED_ALERTS
    tests = yaml.safe_load((PROM / "rules_test.yml").read_text())["tests"]
    fires: set[str] = set()
    quiet: set[str] = set()
    for t in tests:
        for case in t.get("alert_rule_test", []):
            (fires if case["exp_alerts"] else quiet).add(case["alertname"])
    assert fires == alerts, f"alerts never shown firing: {alerts - fires}"
    assert quiet == alerts, f"alerts never shown quiet: {alerts - quiet}"
    for g in rules["groups"]:
        for r in g["rules"]:
            if "alert" in r:
                assert r["labels"]["severity"] in {"warning", "critical"}, r["alert"]
                assert r["annotations"]["summary"], r["alert"]
                # No alert reads a recorded series: rule groups run concurrently, so it would
                # see the recording from one evaluation earlier (and the tests would flake).
                assert not any(":" in n for n in obs.metric_names(r["expr"])), r["alert"]


# -- Grafana ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(obs.load_dashboards(GRAFANA)))
def test_dashboard_has_grafanas_shape_and_a_datasource_variable(name: str) -> None:
    d = dashboards()[name]
    for key, kind in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list)):
        assert isinstance(d.get(key), kind), f"{name}: {key}"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["title"] and p.get("description"), p
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["expr"].strip(), p["title"]


def test_dashboard_uids_are_unique_and_cover_the_topics() -> None:
    ds = dashboards()
    uids = [d["uid"] for d in ds.values()]
    assert len(uids) == len(set(uids))
    text = " ".join(e for _, e in all_exprs())
    for needle in (
        "ray_rcp_serve_replicas",  # replicas per pool
        "ray_rcp_gpus",  # GPUs by owner
        "ray_rcp_queue_depth",
        "ray_rcp_admission_wait_seconds",
        "ray_rcp_checkpoint_stall_seconds_bucket",
        "ray_rcp_checkpoint_last_commit_unix_seconds",
        "ray_rcp_node_verdict",
        "ray_rcp_fleet_gpu_mtbf_hours",
        "DCGM_FI_DEV_GPU_TEMP",
        "rcp_ib_port_errors_per_second",
    ):
        assert needle in text, needle


@needs_promtool
def test_promtool_parses_every_panel_expression(tmp_path: Path) -> None:
    exprs = all_exprs()
    rules = {
        "groups": [
            {
                "name": "panels",
                "rules": [
                    {"record": f"panel:{i}", "expr": obs.for_query(expr)}
                    for i, (_label, expr) in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump(rules))
    res = promtool("check", "rules", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in res.stdout


def test_every_panel_names_only_known_metrics() -> None:
    unknown = {
        label: sorted(obs.metric_names(obs.for_query(expr)) - set(obs.KNOWN_METRICS))
        for label, expr in all_exprs()
    }
    unknown = {k: v for k, v in unknown.items() if v}
    assert not unknown, unknown
    assert all(obs.metric_names(obs.for_query(e)) for _, e in all_exprs())


def _rule_exprs() -> list[tuple[str, str]]:
    rules = yaml.safe_load((PROM / "rules.yml").read_text())
    return [
        (f"rules.yml: {r.get('alert') or r.get('record')}", str(r["expr"]))
        for g in rules["groups"]
        for r in g["rules"]
    ]


def _timeline_exprs() -> list[tuple[str, str]]:
    return [(f"timeline: {name}", expr) for name, expr in QUERIES.items()]


def test_every_rule_and_timeline_query_names_only_known_metrics() -> None:
    unknown = {
        label: sorted(obs.metric_names(expr) - set(obs.KNOWN_METRICS))
        for label, expr in _rule_exprs() + _timeline_exprs()
    }
    unknown = {k: v for k, v in unknown.items() if v}
    assert not unknown, unknown


_HAPROXY_SELECTOR = re.compile(r"\b(haproxy_(frontend|backend|server)_\w+)\s*\{([^}]*)\}")
_PROXY_MATCHER = re.compile(r'\bproxy\s*(=~|=)\s*"([^"]*)"')


def _haproxy_proxies(label: str, expr: str, *, required: bool) -> list[tuple[str, str]]:
    """``(kind, proxy)`` for every HAProxy selector in `expr`: kind ``frontend`` or
    ``backend`` (a server's ``proxy`` label is its backend's name)."""
    found = []
    bare = re.findall(r"\bhaproxy_\w+\b(?!\s*\{)", expr)
    assert not (required and bare), f"{label}: {bare} without a proxy matcher"
    for m in _HAPROXY_SELECTOR.finditer(expr):
        kind = "frontend" if m.group(2) == "frontend" else "backend"
        matchers = _PROXY_MATCHER.findall(m.group(3))
        # Every selector names its proxies: the admin listener is a frontend too, and its
        # probes and scrapes are no client's requests.
        assert matchers or not required, f"{label}: {m.group(0)} names no proxy"
        for op, value in matchers:
            assert re.fullmatch(r"[\w-]+(\|[\w-]+)*", value), f"{label}: {value!r}"
            found += [(kind, v) for v in (value.split("|") if op == "=~" else [value])]
    return found


def test_every_haproxy_proxy_named_is_one_the_edge_config_has(tmp_path: Path) -> None:
    cfg = render(
        EdgeSettings(
            listen_host="127.0.0.1",
            listen_port=8000,
            admin_host="127.0.0.1",
            admin_port=8404,
            work_dir=str(tmp_path),
            proxies=StaticProxies(nodes=(("127.0.0.1", 8001),)),
        )
    )["haproxy.cfg"]
    sections = set(re.findall(r"^(frontend|backend) (\S+)$", cfg, re.MULTILINE))
    assert {("frontend", "public"), ("backend", "routed"), ("backend", "ingress")} <= sections
    used: set[tuple[str, str]] = set()
    for label, expr in all_exprs() + _rule_exprs() + _timeline_exprs():
        used |= set(_haproxy_proxies(label, expr, required=True))
    tests = yaml.safe_load((PROM / "rules_test.yml").read_text())["tests"]
    for t in tests:
        for series in t["input_series"]:
            used |= set(_haproxy_proxies(t["name"], series["series"], required=True))
    assert used, "no dashboard, rule or query reads the edge's HAProxy metrics"
    assert used <= sections, sorted(used - sections)
    # what clients got is the public frontend's, in the production alert and the timeline
    alert = dict(_rule_exprs())["rules.yml: RcpProductionRequestsFailing"]
    assert ("frontend", "public") in _haproxy_proxies("alert", alert, required=True)
    for name in ("requests", "failed"):
        assert _haproxy_proxies(name, QUERIES[name], required=True) == [
            ("frontend", "public")
        ] * QUERIES[name].count("haproxy_")


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('sum by (pool) (max by (model, pool) (ray_x{state="running"}))', {"ray_x"}),
        (
            "histogram_quantile(0.99, sum by (le) (rate(ray_lat_ms_bucket[5m])))",
            {"ray_lat_ms_bucket"},
        ),
        ("time() - max by (run) (ray_last_unix_seconds)", {"ray_last_unix_seconds"}),
        ("max(a) >= on() b or vector(8)", {"a", "b"}),
        ('x{l=~"by|on(x)"} offset 5m > 1e3', {"x"}),
        ("absent(DCGM_FI_DEV_GPU_TEMP) and bool rcp:rule", {"DCGM_FI_DEV_GPU_TEMP", "rcp:rule"}),
    ],
    ids=["bare", "nested-by", "histogram", "time", "on-or", "strings-offset", "colons"],
)
def test_metric_names_finds_metrics_and_nothing_else(expr: str, names: set[str]) -> None:
    assert obs.metric_names(expr) == names


def test_grafana_interval_variables_are_replaced_and_others_refused() -> None:
    assert obs.for_query("rate(x[$__rate_interval])") == "rate(x[1m])"
    with pytest.raises(ValueError, match="unresolved Grafana variable"):
        obs.for_query('x{pool="$pool"}')


def test_provisioning_points_grafana_at_prometheus_and_the_dashboards() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (prom,) = ds["datasources"]
    assert (prom["type"], prom["name"]) == ("prometheus", "Prometheus")
    boards = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "rcp.yml").read_text())
    assert {p["type"] for p in boards["providers"]} == {"file"}
    assert all(p["options"]["path"] for p in boards["providers"])


# -- known metrics are real names ----------------------------------------------------------


def _sources(*roots: str) -> str:
    return "\n".join(p.read_text() for root in roots for p in (REPO / root).rglob("*.py"))


def test_known_control_plane_and_telemetry_metrics_are_defined_in_the_code() -> None:
    code = _sources(
        "controlplane/controller", "controlplane/loop", "controlplane/telemetry", "jobs/checkpoint"
    )
    exported = {n for m in ckpt_metrics.ALL for n in m.exported_names}
    lua = LUA_SOURCE.read_text()
    for name, source in obs.KNOWN_METRICS.items():
        if name.startswith("ray_rcp_checkpoint_"):
            assert name in exported, name
        elif name.startswith("rcp_edge_"):
            assert f"# TYPE {name} gauge" in lua, f"{name} ({source})"
        elif name.startswith("haproxy_"):
            # HAProxy's own exporter (promex): the live test reads them; here, the families
            # this repo reads from it, by the proxy kind the name carries
            assert re.fullmatch(r"haproxy_(frontend|backend|server)_[a-z_]+", name), name
        elif name.startswith("ray_rcp_"):
            assert f'"{name.removeprefix("ray_")}"' in code, f"{name} ({source})"
        elif name.startswith(("DCGM_", "rcp_")):
            assert f'"{name}"' in code, f"{name} ({source})"
        else:
            assert name.startswith(("ray_serve_", "ray_node_")), name  # Ray's own: live test


# -- checkpoint metrics: mirrored into Ray's pipeline inside Ray ---------------------------


class _FakeRayMetric:
    calls: list[tuple[str, str, float, dict[str, str]]] = []

    def __init__(self, name: str, description: str = "", **kwargs: Any) -> None:
        self.name = name
        self.kwargs = kwargs

    def _record(self, op: str, value: float, tags: dict[str, str]) -> None:
        if self.name.endswith("_broken"):
            raise RuntimeError("agent gone")
        self.calls.append((op, self.name, value, dict(tags)))

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        self._record("inc", value, tags or {})

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self._record("set", value, tags or {})

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        self._record("observe", value, tags or {})


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, float, dict[str, str]]]:
    ray = types.ModuleType("ray")
    util = types.ModuleType("ray.util")
    metrics = types.ModuleType("ray.util.metrics")
    for kind in ("Counter", "Gauge", "Histogram"):
        setattr(metrics, kind, type(kind, (_FakeRayMetric,), {}))
    util.metrics = metrics  # type: ignore[attr-defined]
    ray.util = util  # type: ignore[attr-defined]
    ray.is_initialized = lambda: True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.util", util)
    monkeypatch.setitem(sys.modules, "ray.util.metrics", metrics)
    _FakeRayMetric.calls = []
    return _FakeRayMetric.calls


def test_checkpoint_metrics_are_mirrored_into_ray_inside_a_ray_worker(
    fake_ray: list[tuple[str, str, float, dict[str, str]]],
) -> None:
    hist = ckpt_metrics.MirroredMetric(
        "histogram", "rcp_test_mirror_seconds", "t", ["run"], buckets=(0.1, 1.0)
    )
    gauge = ckpt_metrics.MirroredMetric("gauge", "rcp_test_mirror_step", "t", ["run"])
    counter = ckpt_metrics.MirroredMetric("counter", "rcp_test_mirror_bytes", "t", ["run"])
    hist.labels("r1").observe(0.5)
    gauge.labels("r1").set(7)
    counter.labels("r1").inc(0)  # Ray rejects non-positive increments: not forwarded
    counter.labels("r1").inc(3)
    assert fake_ray == [
        ("observe", "rcp_test_mirror_seconds", 0.5, {"run": "r1"}),
        ("set", "rcp_test_mirror_step", 7.0, {"run": "r1"}),
        ("inc", "rcp_test_mirror_bytes", 3.0, {"run": "r1"}),
    ]
    assert hist._ray_metric.kwargs["boundaries"] == [0.1, 1.0]
    # the process-local prometheus_client copy records too
    assert gauge.prometheus.labels("r1")._value.get() == 7
    assert counter.exported_names == ("ray_rcp_test_mirror_bytes_total",)
    assert hist.exported_names[0] == "ray_rcp_test_mirror_seconds_bucket"


def test_a_failing_ray_mirror_never_reaches_training(
    fake_ray: list[tuple[str, str, float, dict[str, str]]],
) -> None:
    broken = ckpt_metrics.MirroredMetric("gauge", "rcp_test_mirror_broken", "t", ["run"])
    broken.labels("r1").set(1)  # raises inside the fake: logged, mirror switched off
    broken.labels("r1").set(2)
    assert broken._ray_disabled
    assert broken.prometheus.labels("r1")._value.get() == 2


def test_checkpoint_metrics_do_not_import_ray_outside_ray() -> None:
    code = (
        "import sys\n"
        "from jobs.checkpoint import metrics as m\n"
        "m.LAST_COMMITTED_STEP.labels('r').set(3)\n"
        "m.UPLOADED_BYTES.labels('r').inc(10)\n"
        "m.STALL_SECONDS.labels('r').observe(0.2)\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
        "print('ok')\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_the_controller_exports_recovery_gauges_per_active_job(
    fake_ray: list[tuple[str, str, float, dict[str, str]]],
) -> None:
    recovered = {"failed_s": 500.0, "seconds": 4.5, "caught_up_s": 510.0, "kind": "crash"}
    running = record(
        job_info=info(first_admitted_s=0.0, recoveries=[recovered]), checkpoint={"interval_s": 600}
    )
    never_started = dataclasses.replace(record(JobState.QUEUED, {}), job_id="j-2")
    JobMetrics().export([running, never_started], gpu_mtbf_hours=5000.0, now_s=2000.0)
    tags = {"job_id": "j-1", "name": "llama", "queue": "default"}
    assert {(name, value) for op, name, value, t in fake_ray if t == tags} == {
        ("rcp_job_restarts", 2.0),
        ("rcp_job_hangs", 1.0),
        ("rcp_job_max_restarts", 3.0),
        ("rcp_job_running_since_timestamp_seconds", 900.0),
        ("rcp_job_checkpoint_last_commit_timestamp_seconds", 1000.0),
        ("rcp_job_checkpoint_last_committed_step", 120.0),
        ("rcp_job_checkpoint_overhead_ratio", 4 / 1600),
        ("rcp_job_checkpoint_interval_seconds", 600.0),
        # 2000 s since admission, 10 s lost to the crash, 4 s stalled on checkpoints.
        ("rcp_job_ettr_ratio", (2000 - 10 - 4) / 2000),
        ("rcp_job_last_recovery_seconds", 4.5),
    }
    assert ("set", "rcp_fleet_gpu_mtbf_hours", 5000.0, {}) in fake_ray
    assert not [c for c in fake_ray if c[3].get("job_id") == "j-2"]  # no series: never ran
    exported = {f"ray_{name}" for _, name, _, _ in fake_ray}
    assert exported <= set(obs.KNOWN_METRICS)
    rules = (PROM / "rules.yml").read_text()
    for name in (
        "ray_rcp_job_checkpoint_last_commit_timestamp_seconds",
        "ray_rcp_job_running_since_timestamp_seconds",
        "ray_rcp_job_checkpoint_interval_seconds",
        "ray_rcp_job_hangs",
        "ray_rcp_job_restarts",
        "ray_rcp_job_max_restarts",
    ):
        assert name in exported and name in rules, name


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Any]:
    """The controller's body, not started (no Ray): built before `fake_ray` swaps Ray out."""
    from controlplane.config import load_config, to_dict
    from controlplane.controller.actor import Controller

    cfg = load_config(None, [f"state_dir={tmp_path}", "serve.deploy_app=false"])
    ctrl = Controller(to_dict(cfg), "token", start=False)
    yield ctrl
    ctrl.store.close()


def test_the_metrics_phase_feeds_the_fleet_record_and_exports_job_gauges(
    controller: Any, fake_ray: list[tuple[str, str, float, dict[str, str]]]
) -> None:
    from controlplane.store import reliability
    from policies.snapshot import Pool
    from tests.unit.builders import node, snapshot

    nodes = [node("c1"), node("c2"), node("c3", healthy=False), node("e1", pool=Pool.EXTERNAL)]
    for t in range(0, 61):  # a minute of 1 s ticks; two live cluster nodes of 8 GPUs
        controller._export_job_metrics(snapshot(nodes, now_s=1000.0 + t), (record(),))
    # flushed at the first tick (nothing yet) and at 60 s: 16 GPUs x 60 s
    gpu_hours = reliability.fleet_record(controller.store, 1060.0)["gpu_hours"]
    assert gpu_hours == pytest.approx(16 * 60 / 3600, rel=1e-6)
    mtbf = [v for _, name, v, _ in fake_ray if name == "rcp_fleet_gpu_mtbf_hours"]
    prior = controller.cfg.jobs.gpu_mtbf_prior_hours
    assert mtbf[0] == pytest.approx(prior) and mtbf[-1] == pytest.approx(prior + gpu_hours)
    assert (
        "set",
        "rcp_job_restarts",
        2.0,
        {"job_id": "j-1", "name": "llama", "queue": "default"},
    ) in fake_ray


def test_checkpoint_metrics_the_dashboards_use_are_exported() -> None:
    exported = {n for m in ckpt_metrics.ALL for n in m.exported_names}
    used = {n for _, e in all_exprs() for n in obs.metric_names(obs.for_query(e))}
    assert {n for n in used if n.startswith("ray_rcp_checkpoint_")} <= exported


# -- Kubernetes: the Prometheus and Grafana the Ray head points at ---------------------------


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


@pytest.mark.parametrize("directory", [PROM, GRAFANA], ids=["prometheus", "grafana"])
def test_kubernetes_objects_pass_the_client_models(directory: Path) -> None:
    from tests.unit.kube.test_k8s_manifests import Doc, core_errors

    path = directory / "kubernetes.yaml"
    errors = [e for i, body in enumerate(_docs(path)) for e in core_errors(Doc(path, i, body))]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("directory", [PROM, GRAFANA], ids=["prometheus", "grafana"])
def test_kustomization_lists_files_that_exist_in_the_ray_namespace(directory: Path) -> None:
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    ray_ns = yaml.safe_load((REPO / "infra" / "k8s" / "kustomization.yaml").read_text())
    assert kust["namespace"] == ray_ns["namespace"]
    files = list(kust["resources"]) + [
        f for gen in kust.get("configMapGenerator", []) for f in gen["files"]
    ]
    for f in files:
        assert (directory / f).is_file(), f


def _head_env() -> dict[str, str]:
    rc = _one(_docs(REPO / "infra" / "k8s" / "raycluster.yaml"), "RayCluster", "rcp")
    (container,) = rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][:1]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def _service_url(docs: list[dict[str, Any]], name: str) -> str:
    svc = _one(docs, "Service", name)
    (port,) = svc["spec"]["ports"]
    return f"http://{name}:{port['port']}"


def test_the_ray_head_points_at_these_services() -> None:
    env = _head_env()
    prom = _docs(PROM / "kubernetes.yaml")
    graf = _docs(GRAFANA / "kubernetes.yaml")
    assert env["RAY_PROMETHEUS_HOST"] == _service_url(prom, "prometheus")
    assert env["RAY_GRAFANA_HOST"] == _service_url(graf, "grafana")
    # Grafana's datasource is the same Prometheus
    grafana = _one(graf, "Deployment", "grafana")["spec"]["template"]["spec"]["containers"][0]
    genv = {e["name"]: e["value"] for e in grafana["env"]}
    assert genv["PROMETHEUS_URL"] == env["RAY_PROMETHEUS_HOST"]
    assert genv["GF_SECURITY_ALLOW_EMBEDDING"] == "true"  # the Metrics tab's iframe


def test_prometheus_pod_reads_the_generated_config_and_may_only_discover() -> None:
    docs = _docs(PROM / "kubernetes.yaml")
    spec = _one(docs, "Deployment", "prometheus")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "prometheus-config"
    assert f"--config.file={mounts['config']}/prometheus.yml" in container["args"]
    assert spec["serviceAccountName"] == "prometheus"
    role = _one(docs, "ClusterRole", "rcp-prometheus")
    assert {v for r in role["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
    binding = _one(docs, "ClusterRoleBinding", "rcp-prometheus")
    assert [s["name"] for s in binding["subjects"]] == ["prometheus"]


def test_grafana_pod_mounts_the_provisioning_and_the_dashboards_where_they_point() -> None:
    docs = _docs(GRAFANA / "kubernetes.yaml")
    spec = _one(docs, "Deployment", "grafana")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    # ConfigMaps only: the writable emptyDirs (data, logs, tmp) are test_k8s_security's.
    volumes = {v["name"]: v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v}
    kust = yaml.safe_load((GRAFANA / "kustomization.yaml").read_text())
    generated = {g["name"]: set(g["files"]) for g in kust["configMapGenerator"]}
    assert volumes[mounts["/etc/grafana/provisioning/datasources"]] == "grafana-datasources"
    assert volumes[mounts["/etc/grafana/provisioning/dashboards"]] == "grafana-dashboard-providers"
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "rcp.yml").read_text())
    paths = {p["name"]: p["options"]["path"] for p in providers["providers"]}
    assert volumes[mounts[paths["rcp"]]] == "grafana-dashboards-rcp"
    assert generated["grafana-dashboards-rcp"] == set(obs.load_dashboards(GRAFANA))
    assert paths["ray"] in mounts
