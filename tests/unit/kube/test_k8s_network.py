"""Network isolation of the Kubernetes install (issue 12): the NetworkPolicies of
infra/k8s/networkpolicy.yaml, read the way Kubernetes reads them.

Owns the checks that:

* every pod the install creates (and any other pod in the namespace) is selected by a
  default-deny ingress policy;
* every port a Service exposes, KubeRay's head Service included, is admitted from a named
  source, and the head's GCS is open to no one outside the RayCluster;
* the flows the install needs are admitted and the ones it does not are refused (a table of
  source, target, port, read from the config);
* policies select pods by labels those pods carry: the template labels of the manifests and
  the ones KubeRay sets on its pods (ray.io/cluster, ray.io/node-type, ...), and name only ports
  those pods declare;
* the edge's pods (the one egress the install restricts) reach the Serve proxies and DNS, and
  nothing else.

Must not: talk to a Kubernetes API server. The evaluator below is the NetworkPolicy semantics
of the Kubernetes API, both directions (policies are additive; a pod selected by none is open
that way; a connection needs its source's egress and its target's ingress); a CNI that
enforces them differently is not modelled. Egress is restricted for the edge's pods only
(docs/operations.md, *Network*).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.unit.kube.test_k8s_manifests import Doc, applied, kustomization, rcp_config
from tests.unit.kube.test_k8s_security import installed_docs

NAMESPACE = "rcp"
POLICY_FILE = "networkpolicy.yaml"
# Namespace labels a policy may select on. kubernetes.io/metadata.name is set by the API
# server on every namespace; the rcp.dev/ ones are opt-in labels an admin puts on client
# namespaces (docs/operations.md, *Network*). Anything else is a label nobody promised.
NAMESPACE_LABEL_KEYS = {"kubernetes.io/metadata.name", "rcp.dev/api-client", "rcp.dev/serve-client"}
INGRESS_NAMESPACE = "ingress-nginx"
MONITORING_NAMESPACE = "monitoring"
DNS_NAMESPACE = "kube-system"


# --- the pods, as KubeRay and the Deployments create them --------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """A pod that sends or receives traffic: one of the install's, or one from elsewhere."""

    id: str
    labels: dict[str, str]
    namespace: str = NAMESPACE
    namespace_labels: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    """Container ports by name, as a named port in a policy resolves them."""

    @property
    def ns_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace, **self.namespace_labels}


def kuberay_labels(cluster: str, node_type: str, group: str) -> dict[str, str]:
    """The labels KubeRay puts on every pod of a RayCluster (its labelPod), over the
    template's own."""
    return {
        "ray.io/cluster": cluster,
        "ray.io/node-type": node_type,
        "ray.io/group": group,
        "ray.io/is-ray-node": "yes",
        "ray.io/identifier": f"{cluster}-{node_type}",
    }


def _ports(spec: dict[str, Any]) -> dict[str, int]:
    return {
        p["name"]: int(p["containerPort"])
        for c in spec.get("containers") or []
        for p in c.get("ports") or []
        if "name" in p
    }


def installed_endpoints(docs: list[Doc], metrics_port: int) -> list[Endpoint]:
    """Every pod the install creates, with its labels and container ports. KubeRay adds the
    `metrics` port (ray.metrics_export_port) to a Ray container that does not declare it."""
    found: list[Endpoint] = []
    for doc in docs:
        body = doc.body
        if doc.kind == "RayCluster":
            cluster = doc.name
            groups = [("head", "headgroup", body["spec"]["headGroupSpec"])]
            groups += [("worker", g["groupName"], g) for g in body["spec"]["workerGroupSpecs"]]
            for node_type, group, spec in groups:
                template = spec["template"]
                labels = {**(template.get("metadata") or {}).get("labels", {})}
                labels.update(kuberay_labels(cluster, node_type, group))
                ports = {"metrics": metrics_port, **_ports(template["spec"])}
                name = f"{doc.kind}/{cluster} {node_type}" + (
                    "" if node_type == "head" else f" {group}"
                )
                found.append(Endpoint(name, labels, ports=ports))
        elif isinstance((body.get("spec") or {}).get("template"), dict):
            template = body["spec"]["template"]
            labels = dict((template.get("metadata") or {}).get("labels") or {})
            found.append(Endpoint(f"{doc.kind}/{doc.name}", labels, ports=_ports(template["spec"])))
    return found


def policies(docs: list[Doc]) -> list[dict[str, Any]]:
    return [d.body for d in docs if d.kind == "NetworkPolicy"]


def services(docs: list[Doc], cfg: Any) -> list[tuple[str, dict[str, str], list[dict[str, Any]]]]:
    """(name, selector, ports) of every Service: the manifests' and the head Service KubeRay
    creates for the RayCluster (<name>-head-svc: GCS, dashboard, client, metrics)."""
    found = [
        (d.name, d.body["spec"]["selector"], d.body["spec"]["ports"])
        for d in docs
        if d.kind == "Service"
    ]
    for d in docs:
        if d.kind == "RayCluster":
            ports = [
                {"name": "gcs-server", "port": cfg.ray.gcs_port, "targetPort": cfg.ray.gcs_port},
                {
                    "name": "dashboard",
                    "port": cfg.ray.dashboard_port,
                    "targetPort": cfg.ray.dashboard_port,
                },
                {"name": "client", "port": cfg.ray.client_port, "targetPort": cfg.ray.client_port},
                {"name": "metrics", "port": cfg.ray.metrics_export_port, "targetPort": "metrics"},
            ]
            selector = {"ray.io/cluster": d.name, "ray.io/node-type": "head"}
            found.append((f"{d.name}-head-svc (KubeRay)", selector, ports))
    return found


# --- NetworkPolicy ingress semantics ----------------------------------------------------------


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector; {} selects everything."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _policy_ns(policy: dict[str, Any]) -> str:
    return str((policy.get("metadata") or {}).get("namespace") or NAMESPACE)


def isolates_ingress(policy: dict[str, Any]) -> bool:
    types = policy["spec"].get("policyTypes")
    return types is None or "Ingress" in types


def isolates_egress(policy: dict[str, Any]) -> bool:
    """policyTypes names Egress, or is absent and the policy has egress rules."""
    types = policy["spec"].get("policyTypes")
    return "Egress" in types if types is not None else bool(policy["spec"].get("egress"))


def peer_admits(peer: dict[str, Any], policy_ns: str, source: Endpoint) -> bool:
    """Whether `peer` (a rule's `from`, or its `to`) names the pod `source`."""
    if "ipBlock" in peer:
        return False  # pod IPs are not modelled; the install uses no ipBlock
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], source.ns_labels):
            return False
    elif source.namespace != policy_ns:
        return False
    return selects(peer.get("podSelector"), source.labels)


def port_admits(
    rule_port: dict[str, Any], target: Endpoint, port: int, protocol: str = "TCP"
) -> bool:
    if rule_port.get("protocol", "TCP") != protocol:
        return False
    if "port" not in rule_port:
        return True
    first = rule_port["port"]
    if isinstance(first, str):
        resolved = target.ports.get(first)
        return resolved == port
    return int(first) <= port <= int(rule_port.get("endPort", first))


def rule_admits(
    rule: dict[str, Any],
    policy_ns: str,
    target: Endpoint,
    port: int,
    source: Endpoint | None,
    protocol: str = "TCP",
) -> bool:
    """An ingress rule. `source` None: any source (for 'is this port covered at all')."""
    ports = rule.get("ports") or []
    if ports and not any(port_admits(p, target, port, protocol) for p in ports):
        return False
    peers = rule.get("from") or []
    if not peers or source is None:
        return True
    return any(peer_admits(peer, policy_ns, source) for peer in peers)


def egress_rule_admits(
    rule: dict[str, Any], policy_ns: str, target: Endpoint, port: int, protocol: str
) -> bool:
    ports = rule.get("ports") or []
    if ports and not any(port_admits(p, target, port, protocol) for p in ports):
        return False
    peers = rule.get("to") or []
    return not peers or any(peer_admits(peer, policy_ns, target) for peer in peers)


def governing(all_policies: list[dict[str, Any]], target: Endpoint) -> list[dict[str, Any]]:
    return [
        p
        for p in all_policies
        if _policy_ns(p) == target.namespace
        and isolates_ingress(p)
        and selects(p["spec"].get("podSelector"), target.labels)
    ]


def egress_admitted(
    all_policies: list[dict[str, Any]],
    source: Endpoint,
    target: Endpoint,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """Whether the egress policies over `source` let it open `port` on `target`."""
    ruling = [
        p
        for p in all_policies
        if _policy_ns(p) == source.namespace
        and isolates_egress(p)
        and selects(p["spec"].get("podSelector"), source.labels)
    ]
    if not ruling:
        return True
    return any(
        egress_rule_admits(rule, _policy_ns(p), target, port, protocol)
        for p in ruling
        for rule in p["spec"].get("egress") or []
    )


def admitted(
    all_policies: list[dict[str, Any]],
    target: Endpoint,
    port: int,
    source: Endpoint,
    protocol: str = "TCP",
) -> bool:
    """Whether Kubernetes lets `source` open `port` on `target`: the source's egress policies
    and the target's ingress policies must both allow it."""
    if not egress_admitted(all_policies, source, target, port, protocol):
        return False
    ruling = governing(all_policies, target)
    if not ruling:
        return True
    return any(
        rule_admits(rule, _policy_ns(p), target, port, source, protocol)
        for p in ruling
        for rule in p["spec"].get("ingress") or []
    )


# --- who talks to whom ------------------------------------------------------------------------

HEAD = "RayCluster/rcp head"
GPU = "RayCluster/rcp worker gpu-cluster"
EXT = "RayCluster/rcp worker gpu-external-rent-a"
PROM = "Deployment/prometheus"
GRAFANA = "Deployment/grafana"
REDIS = "Deployment/rcp-redis"
EDGE = "Deployment/rcp-edge"

# Sources from outside the install's pods.
OUTSIDERS = {
    "ingress controller": Endpoint(
        "ingress controller", {"app.kubernetes.io/name": "ingress-nginx"}, INGRESS_NAMESPACE
    ),
    "api-client namespace": Endpoint(
        "api-client pod", {"app": "notebook"}, "team-a", {"rcp.dev/api-client": "true"}
    ),
    "serve-client namespace": Endpoint(
        "serve-client pod", {"app": "batch"}, "team-b", {"rcp.dev/serve-client": "true"}
    ),
    "kube-prometheus": Endpoint(
        "kube-prometheus", {"app.kubernetes.io/name": "prometheus"}, MONITORING_NAMESPACE
    ),
    "monitoring other pod": Endpoint(
        "alertmanager", {"app.kubernetes.io/name": "alertmanager"}, MONITORING_NAMESPACE
    ),
    "prometheus elsewhere": Endpoint(
        "rogue prometheus", {"app.kubernetes.io/name": "prometheus"}, "default"
    ),
    "other namespace": Endpoint("any pod", {"app": "web"}, "default"),
    # The cluster's DNS (CoreDNS or kube-dns: both label their pods k8s-app=kube-dns).
    "cluster DNS": Endpoint("cluster DNS", {"k8s-app": "kube-dns"}, DNS_NAMESPACE),
    "other kube-system pod": Endpoint(
        "metrics-server", {"k8s-app": "metrics-server"}, DNS_NAMESPACE
    ),
    "stranger in rcp": Endpoint("debug pod", {"app": "debug-shell"}),
    "other RayCluster in rcp": Endpoint(
        "other cluster worker", kuberay_labels("other", "worker", "cpu")
    ),
}

# Who each Service port is for: the sources that must reach every pod behind it. A Service
# port missing here is a port nobody decided about, and fails.
SERVICE_SOURCES: dict[tuple[str, str], tuple[str, ...]] = {
    # Model traffic enters at the edge, which reaches every proxy (found through the
    # headless rcp-serve-proxies); rcp-serve stays open to the direct path's sources.
    # Prometheus scrapes the edge's admin port, which no Service exposes (FLOWS).
    ("rcp-edge", "http"): ("ingress controller", "serve-client namespace"),
    ("rcp-serve-proxies", "serve"): (EDGE,),
    ("rcp-serve", "serve"): (EDGE, "ingress controller", "serve-client namespace"),
    ("rcp-api", "rcp-api"): ("ingress controller", "api-client namespace"),
    ("prometheus", "web"): (GRAFANA, HEAD),
    ("grafana", "http"): ("ingress controller", HEAD),
    ("rcp-head-svc (KubeRay)", "gcs-server"): (GPU, EXT),
    ("rcp-head-svc (KubeRay)", "dashboard"): (GPU, EXT),
    ("rcp-head-svc (KubeRay)", "client"): (GPU, EXT),
    ("rcp-head-svc (KubeRay)", "metrics"): (PROM, "kube-prometheus"),
    # The controller on the head calls the Kubernetes actuator service; no one else may
    # (networkpolicy-kube-actuator.yaml; test_k8s_security.py checks the refusals).
    ("rcp-kube-actuator", "http"): (HEAD,),
    # The head's GCS keeps its tables in Redis (GCS fault tolerance); no one else may connect.
    ("rcp-redis", "redis"): (HEAD,),
}


def endpoint(source_id: str, pods: list[Endpoint]) -> Endpoint:
    return next((p for p in pods if p.id == source_id), None) or OUTSIDERS[source_id]


def service_source_problems(
    all_policies: list[dict[str, Any]],
    pods: list[Endpoint],
    svcs: list[tuple[str, dict[str, str], list[dict[str, Any]]]],
) -> list[str]:
    """Every Service port is admitted, on every pod behind it, from the sources it is for."""
    problems = []
    for svc_name, selector, ports in svcs:
        behind = [p for p in pods if selects({"matchLabels": selector}, p.labels)]
        for svc_port in ports:
            key = (svc_name, str(svc_port.get("name", svc_port["port"])))
            if key not in SERVICE_SOURCES:
                problems.append(
                    f"Service/{key[0]} port {key[1]}: no source decided (SERVICE_SOURCES)"
                )
                continue
            target = svc_port.get("targetPort", svc_port["port"])
            for pod in behind:
                number = pod.ports.get(target) if isinstance(target, str) else int(target)
                for source_id in SERVICE_SOURCES[key]:
                    source = endpoint(source_id, pods)
                    if number is None or not admitted(all_policies, pod, number, source):
                        problems.append(
                            f"Service/{key[0]} port {key[1]} -> {pod.id}: refused from {source_id}"
                        )
    return problems


# --- problems: each names the policy, pod or port ------------------------------------------


def _name(policy: dict[str, Any]) -> str:
    return f"NetworkPolicy/{(policy.get('metadata') or {}).get('name', '<no name>')}"


def coverage_problems(all_policies: list[dict[str, Any]], pods: list[Endpoint]) -> list[str]:
    """Every pod, and a pod nobody planned for, is selected by a deny-all-ingress policy."""
    stranger = Endpoint("a pod with labels no policy expects", {"app": "debug-shell"})
    problems = []
    for pod in [*pods, stranger]:
        deny = [p for p in governing(all_policies, pod) if not p["spec"].get("ingress")]
        if not deny:
            problems.append(f"{pod.id}: no default-deny ingress policy selects it")
    return problems


def _named(peer: dict[str, Any]) -> bool:
    """A peer that names its source: a non-empty pod or namespace selector, no ipBlock."""
    if "ipBlock" in peer:
        return False
    return any(
        (peer.get(key) or {}).get("matchLabels") or (peer.get(key) or {}).get("matchExpressions")
        for key in ("podSelector", "namespaceSelector")
    )


def open_rule_problems(all_policies: list[dict[str, Any]]) -> list[str]:
    """A rule with no `from` admits every source in and out of the cluster; a peer with only
    empty selectors admits a whole namespace or every namespace."""
    problems = []
    for policy in all_policies:
        for i, rule in enumerate(policy["spec"].get("ingress") or []):
            peers = rule.get("from") or []
            if not peers:
                problems.append(f"{_name(policy)} ingress[{i}]: no `from`: open to everyone")
            for j, peer in enumerate(peers):
                if not _named(peer):
                    problems.append(f"{_name(policy)} ingress[{i}].from[{j}]: names no source")
        for i, rule in enumerate(policy["spec"].get("egress") or []):
            peers = rule.get("to") or []
            if not peers:
                problems.append(f"{_name(policy)} egress[{i}]: no `to`: open to everywhere")
            for j, peer in enumerate(peers):
                if not _named(peer):
                    problems.append(f"{_name(policy)} egress[{i}].to[{j}]: names no target")
    return problems


def service_port_problems(
    all_policies: list[dict[str, Any]],
    pods: list[Endpoint],
    svcs: list[tuple[str, dict[str, str], list[dict[str, Any]]]],
) -> list[str]:
    """Every Service port reaches each pod behind it through a rule with a named source."""
    problems = []
    for svc_name, selector, ports in svcs:
        behind = [p for p in pods if selects({"matchLabels": selector}, p.labels)]
        if not behind:
            problems.append(f"Service/{svc_name}: selects no pod of the install")
        for svc_port in ports:
            target = svc_port.get("targetPort", svc_port["port"])
            for pod in behind:
                number = pod.ports.get(target) if isinstance(target, str) else int(target)
                at = f"Service/{svc_name} port {svc_port.get('name', svc_port['port'])} -> {pod.id}"
                if number is None:
                    problems.append(f"{at}: the pod has no port {target!r}")
                    continue
                named = [
                    rule
                    for p in governing(all_policies, pod)
                    for rule in p["spec"].get("ingress") or []
                    if rule.get("from")
                    and all(_named(peer) for peer in rule["from"])
                    and rule_admits(rule, _policy_ns(p), pod, number, None)
                ]
                if not named:
                    problems.append(f"{at} ({number}): no rule admits it from a named source")
    return problems


def selector_problems(all_policies: list[dict[str, Any]], pods: list[Endpoint]) -> list[str]:
    """Selectors on this namespace's pods match some pod the install creates (a label KubeRay
    does not set, or a misspelled cluster name, matches nothing and silently drops the flow);
    namespace selectors use only the promised namespace labels."""
    problems = []
    for policy in all_policies:
        spec = policy["spec"]
        if spec.get("podSelector") and not any(
            selects(spec["podSelector"], p.labels) for p in pods
        ):
            problems.append(f"{_name(policy)}: podSelector {spec['podSelector']} selects no pod")
        peers = [
            (f"ingress[{i}].from[{j}]", peer)
            for i, rule in enumerate(spec.get("ingress") or [])
            for j, peer in enumerate(rule.get("from") or [])
        ] + [
            (f"egress[{i}].to[{j}]", peer)
            for i, rule in enumerate(spec.get("egress") or [])
            for j, peer in enumerate(rule.get("to") or [])
        ]
        for where, peer in peers:
            at = f"{_name(policy)} {where}"
            ns_sel = peer.get("namespaceSelector")
            pod_sel = peer.get("podSelector")
            if ns_sel is None and pod_sel and not any(selects(pod_sel, p.labels) for p in pods):
                problems.append(f"{at}: podSelector {peer['podSelector']} selects no pod")
            if ns_sel is not None:
                keys = set(ns_sel.get("matchLabels") or {})
                keys |= {e["key"] for e in ns_sel.get("matchExpressions") or []}
                unknown = keys - NAMESPACE_LABEL_KEYS
                if unknown:
                    problems.append(f"{at}: namespace label(s) {sorted(unknown)} nobody sets")
                if (ns_sel.get("matchLabels") or {}).get(
                    "kubernetes.io/metadata.name"
                ) == NAMESPACE:
                    problems.append(f"{at}: selects its own namespace by name; use a podSelector")
    return problems


def port_problems(all_policies: list[dict[str, Any]], pods: list[Endpoint]) -> list[str]:
    """Every port an ingress rule names is a port of some pod the policy selects, and every
    port an egress rule names toward the install's pods is one of theirs: a typo (6380) would
    admit nothing and leave the real port closed."""
    problems = []
    for policy in all_policies:
        targets = [p for p in pods if selects(policy["spec"].get("podSelector"), p.labels)]
        for i, rule in enumerate(policy["spec"].get("ingress") or []):
            for rule_port in rule.get("ports") or []:
                value = rule_port.get("port")
                if value is None:
                    continue
                real = (
                    {n for t in targets for n in t.ports.values()}
                    if isinstance(value, int)
                    else {n for t in targets for n in t.ports}
                )
                if value not in real:
                    problems.append(
                        f"{_name(policy)} ingress[{i}]: port {value} is no port of the pods it selects"
                    )
        for i, rule in enumerate(policy["spec"].get("egress") or []):
            # Only toward the install's own pods: a peer in another namespace is not modelled.
            peers = [peer for peer in rule.get("to") or [] if "namespaceSelector" not in peer]
            targets = [
                p for p in pods for peer in peers if selects(peer.get("podSelector"), p.labels)
            ]
            for rule_port in rule.get("ports") or [] if peers else []:
                value = rule_port.get("port")
                real = (
                    {n for t in targets for n in t.ports.values()}
                    if isinstance(value, int)
                    else {n for t in targets for n in t.ports}
                )
                if value is not None and value not in real:
                    problems.append(
                        f"{_name(policy)} egress[{i}]: port {value} is no port of the pods it names"
                    )
    return problems


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return rcp_config(tmp_path_factory.mktemp("rcp"))


def _install(docs: list[Doc] | None, cfg: Any) -> tuple[list[dict[str, Any]], list[Endpoint]]:
    docs = installed_docs() if docs is None else docs
    return policies(docs), installed_endpoints(docs, cfg.ray.metrics_export_port)


def all_problems(docs: list[Doc], cfg: Any) -> list[str]:
    pols, pods = _install(docs, cfg)
    return (
        coverage_problems(pols, pods)
        + open_rule_problems(pols)
        + service_port_problems(pols, pods, services(docs, cfg))
        + service_source_problems(pols, pods, services(docs, cfg))
        + selector_problems(pols, pods)
        + port_problems(pols, pods)
    )


# --- tests: the shipped policies ------------------------------------------------------------


def test_policies_are_applied_in_the_namespace() -> None:
    k8s_dir = Path(applied()[0].path).parent
    assert POLICY_FILE in kustomization(k8s_dir)["resources"]
    pols = [d for d in applied() if d.kind == "NetworkPolicy"]
    assert pols, f"infra/k8s applies no NetworkPolicy ({POLICY_FILE})"
    assert kustomization(k8s_dir)["namespace"] == NAMESPACE
    for doc in pols:
        assert _policy_ns(doc.body) == NAMESPACE, doc.where


# The pods by id (the metrics port does not change which pods there are).
POD_IDS = [p.id for p in installed_endpoints(installed_docs(), metrics_port=0)]


@pytest.mark.parametrize("pod_id", POD_IDS)
def test_every_pod_is_under_default_deny_ingress(pod_id: str, cfg: Any) -> None:
    pols, pods = _install(None, cfg)
    problems = coverage_problems(pols, [p for p in pods if p.id == pod_id])
    assert not problems, "\n".join(problems)


def test_no_rule_is_open_to_everyone(cfg: Any) -> None:
    problems = open_rule_problems(_install(None, cfg)[0])
    assert not problems, "\n".join(problems)


def test_every_service_port_has_a_named_source(cfg: Any) -> None:
    docs = installed_docs()
    pols, pods = _install(docs, cfg)
    names = {name for name, _, _ in services(docs, cfg)}
    assert {"rcp-serve", "rcp-api", "prometheus", "grafana", "rcp-head-svc (KubeRay)"} <= names
    svcs = services(docs, cfg)
    problems = service_port_problems(pols, pods, svcs) + service_source_problems(pols, pods, svcs)
    assert not problems, "\n".join(problems)


def test_selectors_use_labels_the_pods_carry(cfg: Any) -> None:
    pols, pods = _install(None, cfg)
    problems = selector_problems(pols, pods)
    assert not problems, "\n".join(problems)


def test_policy_ports_are_real_ports(cfg: Any) -> None:
    pols, pods = _install(None, cfg)
    problems = port_problems(pols, pods)
    assert not problems, "\n".join(problems)


# --- tests: flows, source -> target:port ----------------------------------------------------

# Port numbers by the config key that sets them; an int is a Ray port chosen at run time.
PORTS: dict[str, Callable[[Any], int]] = {
    "gcs": lambda c: c.ray.gcs_port,
    "dashboard": lambda c: c.ray.dashboard_port,
    "client": lambda c: c.ray.client_port,
    "metrics": lambda c: c.ray.metrics_export_port,
    "telemetry": lambda c: c.telemetry.exporter_port,
    "serve": lambda c: c.serve.http_port,
    "edge-admin": lambda c: c.serve.edge_admin_port,
    "dns": lambda c: 53,
    "https": lambda c: 443,
    "api": lambda c: c.api.port,
    "prometheus": lambda c: 9090,
    "grafana": lambda c: 3000,
    "nccl": lambda c: 29500,
    "object-manager": lambda c: 43125,
    "worker-process": lambda c: 10123,
    "redis": lambda c: 6379,
}

FLOWS = [
    # (source, target, port, admitted)
    # Ray inside the cluster: everything, both ways.
    (GPU, HEAD, "gcs", True),
    (EXT, HEAD, "gcs", True),
    (GPU, HEAD, "dashboard", True),
    (GPU, HEAD, "client", True),
    (HEAD, HEAD, "gcs", True),
    (HEAD, GPU, "object-manager", True),
    (GPU, GPU, "nccl", True),
    (GPU, EXT, "nccl", True),
    (EXT, GPU, "worker-process", True),
    (GPU, HEAD, "object-manager", True),
    # Monitoring.
    (PROM, HEAD, "metrics", True),
    (PROM, GPU, "metrics", True),
    (PROM, EXT, "telemetry", True),
    (PROM, HEAD, "telemetry", True),
    ("kube-prometheus", GPU, "telemetry", True),
    (GRAFANA, PROM, "prometheus", True),
    (HEAD, PROM, "prometheus", True),
    (HEAD, GRAFANA, "grafana", True),
    ("ingress controller", GRAFANA, "grafana", True),
    # Users.
    ("ingress controller", HEAD, "serve", True),
    ("ingress controller", HEAD, "api", True),
    ("api-client namespace", HEAD, "api", True),
    ("serve-client namespace", HEAD, "serve", True),
    # Serve's proxies on the workers take traffic too (the head may be down).
    ("ingress controller", GPU, "serve", True),
    ("ingress controller", EXT, "serve", True),
    ("serve-client namespace", GPU, "serve", True),
    ("other namespace", GPU, "serve", False),
    ("api-client namespace", EXT, "serve", False),
    # The edge: clients in on the serve port, Prometheus on the admin port; out to every
    # proxy, nothing else of the cluster.
    ("ingress controller", EDGE, "serve", True),
    ("serve-client namespace", EDGE, "serve", True),
    ("other namespace", EDGE, "serve", False),
    ("api-client namespace", EDGE, "serve", False),
    ("stranger in rcp", EDGE, "serve", False),
    (GPU, EDGE, "serve", False),  # user code on a worker does not get in
    (PROM, EDGE, "edge-admin", True),  # the scrape of /metrics and /rcp/metrics
    ("kube-prometheus", EDGE, "edge-admin", True),
    (PROM, EDGE, "serve", False),  # metrics are on the admin port only
    ("monitoring other pod", EDGE, "edge-admin", False),
    ("prometheus elsewhere", EDGE, "edge-admin", False),
    ("ingress controller", EDGE, "edge-admin", False),
    ("serve-client namespace", EDGE, "edge-admin", False),
    ("stranger in rcp", EDGE, "edge-admin", False),
    (GPU, EDGE, "edge-admin", False),
    (EDGE, HEAD, "serve", True),
    (EDGE, GPU, "serve", True),
    (EDGE, EXT, "serve", True),
    (EDGE, HEAD, "gcs", False),
    (EDGE, HEAD, "api", False),
    (EDGE, GPU, "nccl", False),
    (EDGE, REDIS, "redis", False),
    # Its egress is restricted: a target that admits anyone is still out of its reach.
    (EDGE, "other namespace", "https", False),
    (EDGE, "other namespace", "serve", False),
    (EDGE, "cluster DNS", "dns", True),  # TCP; UDP below
    (EDGE, "other kube-system pod", "dns", False),
    (EDGE, "cluster DNS", "https", False),
    # The GCS store: the head only.
    (HEAD, REDIS, "redis", True),
    (GPU, REDIS, "redis", False),
    (EXT, REDIS, "redis", False),
    ("stranger in rcp", REDIS, "redis", False),
    ("other RayCluster in rcp", REDIS, "redis", False),
    ("ingress controller", REDIS, "redis", False),
    # The head's Ray ports: only the cluster's own pods.
    ("other namespace", HEAD, "gcs", False),
    ("stranger in rcp", HEAD, "gcs", False),
    ("other RayCluster in rcp", HEAD, "gcs", False),
    ("ingress controller", HEAD, "gcs", False),
    ("ingress controller", HEAD, "dashboard", False),
    ("ingress controller", HEAD, "client", False),
    ("api-client namespace", HEAD, "gcs", False),
    ("api-client namespace", HEAD, "dashboard", False),
    (PROM, HEAD, "gcs", False),
    (GRAFANA, HEAD, "gcs", False),
    (GRAFANA, HEAD, "dashboard", False),
    ("kube-prometheus", HEAD, "gcs", False),
    # Workers: no way in from outside the cluster but the scrape.
    ("other namespace", GPU, "nccl", False),
    ("stranger in rcp", GPU, "object-manager", False),
    ("other RayCluster in rcp", EXT, "nccl", False),
    (GRAFANA, GPU, "metrics", False),
    ("monitoring other pod", GPU, "metrics", False),
    ("prometheus elsewhere", GPU, "metrics", False),
    # Users' ports: only from their sources.
    ("other namespace", HEAD, "api", False),
    ("other namespace", HEAD, "serve", False),
    ("stranger in rcp", HEAD, "api", False),
    ("api-client namespace", HEAD, "serve", False),
    ("serve-client namespace", HEAD, "api", False),
    ("other namespace", PROM, "prometheus", False),
    ("ingress controller", PROM, "prometheus", False),
    (GPU, PROM, "prometheus", False),
    ("other namespace", GRAFANA, "grafana", False),
    (GPU, GRAFANA, "grafana", False),
]


# (source, target, port, protocol, admitted): flows not over TCP.
UDP_FLOWS = [
    (EDGE, "cluster DNS", "dns", True),
    (EDGE, "other kube-system pod", "dns", False),
    (EDGE, "other namespace", "dns", False),
]


def _flow_id(flow: tuple[str, str, str, bool]) -> str:
    source, target, port, ok = flow
    return f"{source} -> {target}:{port} {'admitted' if ok else 'refused'}"


@pytest.mark.parametrize("flow", FLOWS, ids=_flow_id)
def test_flow(flow: tuple[str, str, str, bool], cfg: Any) -> None:
    source_id, target_id, port_key, expected = flow
    pols, pods = _install(None, cfg)
    source, target = endpoint(source_id, pods), endpoint(target_id, pods)
    port = PORTS[port_key](cfg)
    assert admitted(pols, target, port, source) is expected, (
        f"{_flow_id(flow)}: port {port}; got the opposite"
    )


@pytest.mark.parametrize("flow", UDP_FLOWS, ids=lambda f: _flow_id(f) + " (UDP)")
def test_udp_flow(flow: tuple[str, str, str, bool], cfg: Any) -> None:
    source_id, target_id, port_key, expected = flow
    pols, pods = _install(None, cfg)
    source, target = endpoint(source_id, pods), endpoint(target_id, pods)
    assert admitted(pols, target, PORTS[port_key](cfg), source, "UDP") is expected


def test_the_edge_policy_admits_the_ports_its_config_listens_on(cfg: Any) -> None:
    """The listeners of the checked-in haproxy.cfg (edge-config.yaml), the public one from
    clients and the admin one from Prometheus; the proxies it sends to, by the port in its
    server-template line."""
    pols, pods = _install(None, cfg)
    edge = endpoint(EDGE, pods)
    config_map = next(d for d in installed_docs() if d.name == "rcp-edge-config").body
    haproxy_cfg = config_map["data"]["haproxy.cfg"]
    public, _, rest = haproxy_cfg.partition("frontend admin")
    public_port = int(public.split("frontend public")[1].split("bind 0.0.0.0:")[1].split()[0])
    admin_port = int(rest.split("bind 0.0.0.0:")[1].split()[0])
    proxy_port = int(haproxy_cfg.split("server-template ")[1].split()[2].rpartition(":")[2])
    assert (public_port, admin_port) == (cfg.serve.http_port, cfg.serve.edge_admin_port)
    assert admitted(pols, edge, public_port, OUTSIDERS["ingress controller"])
    assert admitted(pols, edge, admin_port, OUTSIDERS["kube-prometheus"])
    assert not admitted(pols, edge, admin_port, OUTSIDERS["ingress controller"])
    for worker in (GPU, EXT):
        assert admitted(pols, endpoint(worker, pods), proxy_port, edge)


# --- tests: the checks catch what they are for ----------------------------------------------


def _mutated(mutate: Callable[[list[Doc]], None]) -> list[Doc]:
    docs = [Doc(d.path, d.index, copy.deepcopy(d.body)) for d in installed_docs()]
    mutate(docs)
    return docs


def _edit(name: str, fn: Callable[[dict[str, Any]], None]) -> Callable[[list[Doc]], None]:
    def mutate(docs: list[Doc]) -> None:
        fn(next(d.body for d in docs if d.kind == "NetworkPolicy" and d.name == name))

    return mutate


def _drop(name: str) -> Callable[[list[Doc]], None]:
    def mutate(docs: list[Doc]) -> None:
        docs[:] = [d for d in docs if not (d.kind == "NetworkPolicy" and d.name == name)]

    return mutate


def _drop_all(docs: list[Doc]) -> None:
    docs[:] = [d for d in docs if d.kind != "NetworkPolicy"]


def _set(path: list[Any], value: Any) -> Callable[[dict[str, Any]], None]:
    def fn(body: dict[str, Any]) -> None:
        node: Any = body
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return fn


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        pytest.param(
            _drop_all, "no default-deny ingress policy selects it", id="no-policies-at-all"
        ),
        pytest.param(
            _drop("rcp-default-deny-ingress"),
            "a pod with labels no policy expects: no default-deny",
            id="no-default-deny",
        ),
        pytest.param(
            _edit("rcp-ray-intra-cluster", _set(["spec", "ingress", 0, "from"], [])),
            "no `from`: open to everyone",
            id="intra-cluster-from-emptied",
        ),
        pytest.param(
            _edit(
                "rcp-ray-intra-cluster",
                _set(["spec", "ingress", 0, "from"], [{"namespaceSelector": {}}]),
            ),
            "names no source",
            id="intra-cluster-from-every-namespace",
        ),
        pytest.param(
            _edit(
                "rcp-ray-intra-cluster",
                _set(["spec", "podSelector", "matchLabels", "ray.io/cluster"], "rcp-cluster"),
            ),
            "selects no pod",
            id="misspelled-cluster-name",
        ),
        pytest.param(
            _edit(
                "rcp-prometheus",
                _set(
                    ["spec", "ingress", 0, "from", 0, "podSelector"],
                    {"matchLabels": {"app": "grafana"}},
                ),
            ),
            "selects no pod",
            id="label-grafana-does-not-carry",
        ),
        pytest.param(
            _edit("rcp-head-api", _set(["spec", "ingress", 0, "ports", 0, "port"], 8089)),
            "port 8089 is no port",
            id="api-port-typo",
        ),
        pytest.param(
            _drop("rcp-serve"),
            "Service/rcp-serve port serve -> RayCluster/rcp head: refused from ingress controller",
            id="serve-port-unadmitted",
        ),
        pytest.param(
            _drop("rcp-ray-intra-cluster"),
            "Service/rcp-head-svc (KubeRay) port gcs-server",
            id="gcs-unadmitted",
        ),
        pytest.param(
            _drop("rcp-edge"),
            "Service/rcp-edge port http -> Deployment/rcp-edge: refused from ingress controller",
            id="edge-unadmitted",
        ),
        pytest.param(
            _edit("rcp-serve", lambda b: b["spec"]["ingress"][0]["from"].pop(0)),
            "Service/rcp-serve-proxies port serve -> RayCluster/rcp worker gpu-cluster: "
            "refused from Deployment/rcp-edge",
            id="edge-cannot-reach-the-proxies",
        ),
        pytest.param(
            _edit(
                "rcp-head-api",
                _set(
                    ["spec", "ingress", 0, "from", 1],
                    {"namespaceSelector": {"matchLabels": {"team": "x"}}},
                ),
            ),
            "['team'] nobody sets",
            id="unpromised-namespace-label",
        ),
        pytest.param(
            _edit("rcp-edge", lambda b: b["spec"]["egress"].pop(0)),
            "Service/rcp-serve-proxies port serve -> RayCluster/rcp worker gpu-cluster: "
            "refused from Deployment/rcp-edge",
            id="edge-egress-to-the-proxies-dropped",
        ),
        pytest.param(
            _edit("rcp-edge", _set(["spec", "egress", 0, "ports", 0, "port"], 8001)),
            "NetworkPolicy/rcp-edge egress[0]: port 8001 is no port",
            id="edge-egress-port-typo",
        ),
        pytest.param(
            _edit("rcp-edge", _set(["spec", "egress", 0, "to"], [])),
            "NetworkPolicy/rcp-edge egress[0]: no `to`: open to everywhere",
            id="edge-egress-to-emptied",
        ),
    ],
)
def test_checks_name_the_problem(
    mutate: Callable[[list[Doc]], None], needle: str, cfg: Any
) -> None:
    problems = all_problems(_mutated(mutate), cfg)
    assert any(needle in p for p in problems), "\n".join(problems) or "no problem found"


def test_shipped_install_has_no_problem(cfg: Any) -> None:
    problems = all_problems(installed_docs(), cfg)
    assert not problems, "\n".join(problems)


def test_without_policies_the_gcs_is_open(cfg: Any) -> None:
    """The evaluator itself: with no policy, Kubernetes admits everything."""
    docs = _mutated(_drop_all)
    pols, pods = _install(docs, cfg)
    head = next(p for p in pods if p.id == HEAD)
    assert admitted(pols, head, cfg.ray.gcs_port, OUTSIDERS["other namespace"])
