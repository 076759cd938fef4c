"""Security of the Kubernetes install (issue 12, "Separation"): where user code runs, with which
credentials, and what the control plane's ServiceAccount may do.

Owns the checks that:

* every pod that ``kubectl apply -k`` installs from infra/k8s, infra/prometheus and
  infra/grafana (including the RayCluster's autoscaler sidecar, built from
  ``autoscalerOptions``) runs with a restricted securityContext, and that the namespace
  enforces Pod Security ``restricted``;
* no container where Ray runs code (``ray-head``, ``ray-worker``) mounts a credential of the
  control plane (the job store and API token, a Secret, the config); the head pod's
  ``rcp-controller`` container, which runs the controller as a Ray driver, holds them, shares
  only Ray's session dir with ``ray-head``, and no pod shares its process namespace;
* Ray Job drivers (the ``rcp_job_driver`` resource every entrypoint asks for) can run only on
  worker groups that hold no control-plane credential, never on the head, and that the head
  offers Ray no CPUs and shares no volume or S3 key with user code;
* the RBAC granted to the control plane is exactly what the calls in
  KubernetesActuator (controlplane/kube/) need (the allow-list is derived from its source),
  with no RayCluster grant in the default install, and is bound only to the ServiceAccount of
  the ``rcp-kube-actuator`` Deployment, never to a Ray pod's;
* no Ray pod mounts a ServiceAccount token, except KubeRay's autoscaler sidecar (its own
  projected token, in that container alone); the actuator's bearer-token Secret reaches only
  the head's rcp-controller container and the actuator; the actuator pod is restricted, single and
  reachable only from the Ray head (its NetworkPolicy), and the config points at it.

Must not: talk to a Kubernetes API server or start Ray. Admission itself (Pod Security, KubeRay's
mutating of pods) is not exercised here; docs/operations.md says what was and was not checked.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controlplane.pools import JOB_DRIVER_RESOURCE
from tests.unit.kube.test_k8s_manifests import (
    CONTROLLER_CONTAINER,
    K8S_DIR,
    ROOT,
    Doc,
    applied,
    head_container,
    kustomization,
    load_docs,
    rcp_config,
)

INSTALL_DIRS = (K8S_DIR, ROOT / "infra" / "prometheus", ROOT / "infra" / "grafana")
# KubernetesActuator (actuator.py) and the classes it is made of, one module per part.
ACTUATOR_PARTS = tuple(
    ROOT / "controlplane" / "kube" / f"{part}.py"
    for part in ("client", "pods", "nodes", "raycluster", "actuator")
)
OPTIONAL_SCALE_RBAC = K8S_DIR / "optional" / "rbac-scale-external.yaml"
CONTROL_PLANE_SA = "rcp-kube-actuator"
"""The one ServiceAccount our RBAC is bound to: the actuator service's (kube-actuator.yaml)."""
HEAD_SA = "rcp-head"
ACTUATOR_POD = "Deployment/rcp-kube-actuator"
ACTUATOR_SECRET = "rcp-kube-actuator"
SA_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
# Ray containers that may mount a ServiceAccount token, and why (docs/operations.md, residual).
TOKEN_MOUNTS = {
    ("RayCluster/rcp head autoscaler", "autoscaler"): "KubeRay's autoscaler scales worker groups",
}
S3_SECRET = "rcp-s3"

# The pods the install creates, by the ids below. A new pod must be added here on purpose.
EXPECTED_PODS = {
    "RayCluster/rcp head",
    "RayCluster/rcp head autoscaler",
    "RayCluster/rcp worker gpu-cluster",
    "RayCluster/rcp worker gpu-external-rent-a",
    "RayCluster/rcp worker gpu-external-rent-b",
    "Deployment/prometheus",
    "Deployment/grafana",
    "Deployment/rcp-redis",
    ACTUATOR_POD,
    "Deployment/rcp-edge",
}
# Containers whose root filesystem may stay writable, and why (docs/operations.md).
WRITABLE_ROOT = {
    ("RayCluster/rcp worker gpu-cluster", "ray-worker"): "user code writes caches under $HOME",
    (
        "RayCluster/rcp worker gpu-external-rent-a",
        "ray-worker",
    ): "user code writes caches under $HOME",
    (
        "RayCluster/rcp worker gpu-external-rent-b",
        "ray-worker",
    ): "user code writes caches under $HOME",
}
# Pod Security `restricted` lets a container add only this capability.
ALLOWED_ADDED_CAPABILITIES = {"NET_BIND_SERVICE"}
PSA_MODES = ("enforce", "audit", "warn")


# --- pods -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    """One pod template of the install, as Kubernetes will see it."""

    id: str
    """Readable: ``RayCluster/rcp worker gpu-cluster``, ``Deployment/grafana``."""
    spec: dict[str, Any]
    is_ray_worker: bool = False


def _templates(doc: Doc) -> Iterator[Pod]:
    body, where = doc.body, f"{doc.kind}/{doc.name}"
    if doc.kind == "RayCluster":
        spec = body["spec"]
        head = spec["headGroupSpec"]["template"]["spec"]
        yield Pod(f"{where} head", head)
        if spec.get("enableInTreeAutoscaling"):
            # KubeRay adds the autoscaler as a sidecar of the head pod, with these options.
            options = spec.get("autoscalerOptions") or {}
            sidecar = {"name": "autoscaler", "securityContext": options.get("securityContext")}
            sidecar["volumeMounts"] = options.get("volumeMounts") or []
            pod = {**copy.deepcopy(head), "containers": [sidecar], "initContainers": []}
            yield Pod(f"{where} head autoscaler", pod)
        for group in spec.get("workerGroupSpecs") or []:
            # KubeRay's injected init container copies the Ray container's securityContext.
            yield Pod(f"{where} worker {group['groupName']}", group["template"]["spec"], True)
    elif doc.kind == "Pod":
        yield Pod(where, body["spec"])
    elif doc.kind == "CronJob":
        yield Pod(where, body["spec"]["jobTemplate"]["spec"]["template"]["spec"])
    elif isinstance((body.get("spec") or {}).get("template"), dict):
        yield Pod(where, body["spec"]["template"]["spec"])


def _count_pod_specs(node: Any) -> int:
    """Every mapping with ``containers`` anywhere in a document: a pod spec."""
    if isinstance(node, dict):
        here = 1 if isinstance(node.get("containers"), list) else 0
        return here + sum(_count_pod_specs(v) for v in node.values())
    if isinstance(node, list):
        return sum(_count_pod_specs(v) for v in node)
    return 0


def installed_docs() -> list[Doc]:
    return [d for directory in INSTALL_DIRS for d in applied(directory)]


def installed_pods(docs: list[Doc] | None = None) -> list[Pod]:
    return [p for d in (installed_docs() if docs is None else docs) for p in _templates(d)]


def _containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        yield from spec.get(field) or []


def pod_problems(pod: Pod) -> list[str]:
    """How `pod` falls short of a restricted securityContext; one line each, naming the pod
    and container. Container fields override the pod's, as in Kubernetes."""
    spec, problems = pod.spec, []
    pod_sc = spec.get("securityContext") or {}
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(host):
            problems.append(f"{pod.id}: {host}: true")
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            problems.append(f"{pod.id}: volume {volume['name']}: hostPath")
    names = {v["name"] for v in spec.get("volumes") or []}
    if pod.is_ray_worker and spec.get("automountServiceAccountToken") is not False:
        problems.append(f"{pod.id}: automountServiceAccountToken must be false (user code)")
    for c in _containers(spec):
        at = f"{pod.id}: container {c['name']}"
        sc = c.get("securityContext") or {}

        def get(key: str, sc: dict[str, Any] = sc) -> Any:
            return sc[key] if key in sc else pod_sc.get(key)

        if get("runAsNonRoot") is not True:
            problems.append(f"{at}: runAsNonRoot must be true")
        if get("runAsUser") == 0:
            problems.append(f"{at}: runAsUser 0 (root)")
        if sc.get("privileged"):
            problems.append(f"{at}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{at}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            problems.append(f"{at}: capabilities.drop must include ALL")
        added = set(caps.get("add") or []) - ALLOWED_ADDED_CAPABILITIES
        if added:
            problems.append(f"{at}: capabilities.add {sorted(added)}")
        seccomp = (get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{at}: seccompProfile.type must be RuntimeDefault, got {seccomp}")
        writable_ok = (pod.id, c["name"]) in WRITABLE_ROOT
        if sc.get("readOnlyRootFilesystem") is not True and not writable_ok:
            problems.append(f"{at}: readOnlyRootFilesystem must be true")
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{at}: hostPort {port['hostPort']}")
        for mount in c.get("volumeMounts") or []:
            if mount["name"] not in names:
                problems.append(f"{at}: mounts volume {mount['name']!r} the pod does not have")
    return problems


# --- tests: every pod -------------------------------------------------------------------------


def test_every_pod_spec_is_found() -> None:
    """A pod spec the extraction misses would escape every check below."""
    docs = installed_docs()
    for doc in docs:
        found = [p for p in installed_pods([doc]) if not p.id.endswith(" autoscaler")]
        assert len(found) == _count_pod_specs(doc.body), f"{doc.where}: pod specs missed"
    assert {p.id for p in installed_pods(docs)} == EXPECTED_PODS


@pytest.mark.parametrize("pod", installed_pods(), ids=lambda p: p.id)
def test_pod_is_restricted(pod: Pod) -> None:
    problems = pod_problems(pod)
    assert not problems, "\n".join(problems)


def _raycluster() -> Doc:
    return next(d for d in applied() if d.kind == "RayCluster")


def _strip_security(node: Any) -> Any:
    """The manifests as they were before issue 12: no securityContext, tokens mounted."""
    if isinstance(node, dict):
        drop = {"securityContext", "automountServiceAccountToken"}
        return {k: _strip_security(v) for k, v in node.items() if k not in drop}
    if isinstance(node, list):
        return [_strip_security(v) for v in node]
    return node


def _mutated_pods(mutate: Callable[[dict[str, Any]], None]) -> list[Pod]:
    doc = _raycluster()
    body = copy.deepcopy(doc.body)
    mutate(body)
    return installed_pods([Doc(doc.path, doc.index, body)])


def _head(b: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = b["spec"]["headGroupSpec"]["template"]["spec"]
    return spec


def _worker(b: dict[str, Any], i: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = b["spec"]["workerGroupSpecs"][i]["template"]["spec"]
    return spec


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        pytest.param(
            lambda b: b.update(_strip_security(b)),
            "RayCluster/rcp head: container ray-head: runAsNonRoot must be true",
            id="no-securityContext-at-all",
        ),
        pytest.param(
            lambda b: _head(b)["securityContext"].pop("seccompProfile"),
            "head: container ray-head: seccompProfile.type must be RuntimeDefault, got None",
            id="no-seccomp",
        ),
        pytest.param(
            lambda b: _head(b)["securityContext"].update(runAsUser=0),
            "head: container ray-head: runAsUser 0",
            id="root-user",
        ),
        pytest.param(
            lambda b: _worker(b)["containers"][0]["securityContext"].update(
                allowPrivilegeEscalation=True
            ),
            "worker gpu-cluster: container ray-worker: allowPrivilegeEscalation must be false",
            id="privilege-escalation",
        ),
        pytest.param(
            lambda b: _worker(b, 1)["containers"][0]["securityContext"].update(
                capabilities={"add": ["SYS_ADMIN"]}
            ),
            "worker gpu-external-rent-a: container ray-worker: capabilities.drop must include ALL",
            id="capabilities-not-dropped",
        ),
        pytest.param(
            lambda b: _worker(b)["containers"][0]["securityContext"]["capabilities"].update(
                add=["IPC_LOCK"]
            ),
            "container ray-worker: capabilities.add ['IPC_LOCK']",
            id="capability-added",
        ),
        pytest.param(
            lambda b: _head(b)["containers"][0]["securityContext"].update(
                readOnlyRootFilesystem=False
            ),
            "head: container ray-head: readOnlyRootFilesystem must be true",
            id="head-root-writable",
        ),
        pytest.param(
            lambda b: _worker(b).update(automountServiceAccountToken=True),
            "worker gpu-cluster: automountServiceAccountToken must be false",
            id="worker-mounts-token",
        ),
        pytest.param(
            lambda b: _worker(b)["volumes"].append({"name": "sys", "hostPath": {"path": "/sys"}}),
            "worker gpu-cluster: volume sys: hostPath",
            id="host-path",
        ),
        pytest.param(
            lambda b: b["spec"]["autoscalerOptions"].pop("securityContext"),
            "head autoscaler: container autoscaler: allowPrivilegeEscalation must be false",
            id="autoscaler-sidecar",
        ),
        pytest.param(
            lambda b: _head(b)["volumes"].remove(
                next(v for v in _head(b)["volumes"] if v["name"] == "autoscaler-tmp")
            ),
            "head autoscaler: container autoscaler: mounts volume 'autoscaler-tmp'",
            id="sidecar-volume-missing",
        ),
    ],
)
def test_pod_check_names_the_problem(mutate: Callable[[dict[str, Any]], None], needle: str) -> None:
    problems = [p for pod in _mutated_pods(mutate) for p in pod_problems(pod)]
    assert any(needle in p for p in problems), problems


def test_namespace_enforces_restricted_pod_security() -> None:
    namespaces = [d for d in applied() if d.kind == "Namespace"]
    assert len(namespaces) == 1
    labels = namespaces[0].body["metadata"].get("labels") or {}
    for mode in PSA_MODES:
        assert labels.get(f"pod-security.kubernetes.io/{mode}") == "restricted", mode
    # Every kustomization installs into that namespace, so PSA covers all the pods above.
    for directory in INSTALL_DIRS:
        assert kustomization(directory)["namespace"] == namespaces[0].name, directory.name


# --- tests: where job drivers run --------------------------------------------------------------


def _quantity(value: Any) -> float:
    return float(str(value))


def _claims(spec: dict[str, Any]) -> set[str]:
    return {
        v["persistentVolumeClaim"]["claimName"]
        for v in spec.get("volumes") or []
        if "persistentVolumeClaim" in v
    }


def _secret_refs(spec: dict[str, Any]) -> set[str]:
    refs = set()
    for c in _containers(spec):
        for e in c.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                refs.add(ref["name"])
        for source in c.get("envFrom") or []:
            if source.get("secretRef"):
                refs.add(source["secretRef"]["name"])
    for v in spec.get("volumes") or []:
        if "secret" in v:
            refs.add(v["secret"]["secretName"])
    return refs


def test_head_offers_no_job_driver_slot_and_no_cpus() -> None:
    head = _raycluster().body["spec"]["headGroupSpec"]
    resources = head.get("resources") or {}
    assert JOB_DRIVER_RESOURCE not in resources, "job drivers would run beside the credentials"
    assert JOB_DRIVER_RESOURCE not in str(head.get("rayStartParams") or {})
    # Tasks and actors with default resources (1 CPU) must not be placed on the head either.
    assert _quantity(resources.get("CPU", -1)) == 0, "the head must offer Ray CPU: 0"


def test_job_drivers_run_only_where_no_credential_is(tmp_path: Path) -> None:
    rc = _raycluster().body["spec"]
    head = rc["headGroupSpec"]["template"]["spec"]
    state_dir = rcp_config(tmp_path).state_dir
    controller = head_container(_raycluster().body, CONTROLLER_CONTAINER)
    head_mounts = {m["mountPath"]: m["name"] for m in controller["volumeMounts"]}
    state_volume = next(v for v in head["volumes"] if v["name"] == head_mounts[state_dir])
    state_claim = state_volume["persistentVolumeClaim"]["claimName"]
    drivers = [
        g for g in rc["workerGroupSpecs"] if _quantity(g["resources"].get(JOB_DRIVER_RESOURCE, 0))
    ]
    assert drivers, f"no worker group offers {JOB_DRIVER_RESOURCE}: every job would stay pending"
    for group in drivers:
        spec, name = group["template"]["spec"], group["groupName"]
        assert spec.get("automountServiceAccountToken") is False, name
        assert spec.get("serviceAccountName") in (None, "default"), name
        assert state_claim not in _claims(spec), f"{name} mounts the job store and API token"
        assert JOB_DRIVER_RESOURCE not in str(group.get("rayStartParams") or {}), name


def _credential_volumes(spec: dict[str, Any], state_claim: str) -> dict[str, str]:
    """Volume name -> what it holds, for each volume of `spec` that carries a credential of
    the control plane: the job store and API token (PVC `state_claim`), any Secret (the
    actuator's bearer token, ...), a projected ServiceAccount token, the config."""
    found = {}
    for v in spec.get("volumes") or []:
        if (v.get("persistentVolumeClaim") or {}).get("claimName") == state_claim:
            found[v["name"]] = f"PVC {state_claim} (job store, API token)"
        elif "secret" in v:
            found[v["name"]] = f"Secret {v['secret']['secretName']}"
        elif any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources", [])):
            found[v["name"]] = "a ServiceAccount token"
        elif (v.get("configMap") or {}).get("name") == "rcp-config":
            found[v["name"]] = "the control plane's config"
    return found


def test_no_credential_reaches_a_container_where_ray_runs_code(tmp_path: Path) -> None:
    """Every Ray worker process (Serve's, the telemetry agent's, a job's that asks for the
    head) runs in ray-head or a ray-worker container: none of them may mount a credential
    of the control plane, nor get a Secret in its env other than the Ray token (KubeRay's):
    no S3 key either (jobs fetch credentials scoped to their prefix from the signals actor).
    rcp-controller, where Ray starts no worker, has them all, and the head pod shares no
    process namespace."""
    rc = _raycluster().body
    state_claim = "rcp-state"
    assert rcp_config(tmp_path).state_dir == "/var/lib/rcp"
    templates = [("head", rc["spec"]["headGroupSpec"]["template"]["spec"])] + [
        (g["groupName"], g["template"]["spec"]) for g in rc["spec"]["workerGroupSpecs"]
    ]
    for group, spec in templates:
        assert "shareProcessNamespace" not in spec, f"{group}: containers must not see each other"
        credentials = _credential_volumes(spec, state_claim)
        ray = spec["containers"][0]
        assert ray["name"] in ("ray-head", "ray-worker"), group
        for init in spec.get("initContainers") or []:
            assert not init.get("volumeMounts"), f"{group}: init container {init['name']}"
        for m in ray.get("volumeMounts") or []:
            assert m["name"] not in credentials, (
                f"{group}/{ray['name']} mounts {credentials[m['name']]}: any code Ray runs "
                "there could read it"
            )
        assert _secret_refs({"containers": [ray]}) == set(), f"{group}/{ray['name']}"
    head = rc["spec"]["headGroupSpec"]["template"]["spec"]
    controller = head_container(rc, CONTROLLER_CONTAINER)
    held = {
        _credential_volumes(head, state_claim)[m["name"]]
        for m in controller["volumeMounts"]
        if m["name"] in _credential_volumes(head, state_claim)
    }
    assert held == {
        f"PVC {state_claim} (job store, API token)",
        f"Secret {ACTUATOR_SECRET}",
        "Secret rcp-api-admin",
        "the control plane's config",
    }
    # What ray-head and rcp-controller share is Ray's session dir alone (an emptyDir).
    ray_mounts = {m["name"]: m["mountPath"] for m in head["containers"][0]["volumeMounts"]}
    shared = {
        m["name"]: m["mountPath"] for m in controller["volumeMounts"] if m["name"] in ray_mounts
    }
    assert shared == {"ray-logs": "/tmp/ray"}, shared
    assert ray_mounts["ray-logs"] == "/tmp/ray"
    assert "emptyDir" in next(v for v in head["volumes"] if v["name"] == "ray-logs")
    # The controller's Secrets in env: the Ray token, as ray-head gets it from KubeRay, and
    # its own object-storage key (it mints jobs' scoped credentials).
    assert _secret_refs({"containers": [controller]}) == {rc["metadata"]["name"], S3_SECRET}
    assert _env_names(controller) >= {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RCP_NODE_IP"}


def _env_names(container: dict[str, Any]) -> set[str]:
    return {e["name"] for e in container.get("env") or []}


def test_head_shares_no_volume_or_s3_key_with_user_code() -> None:
    rc = _raycluster().body["spec"]
    head = rc["headGroupSpec"]["template"]["spec"]
    for group in rc["workerGroupSpecs"]:
        shared = _claims(head) & _claims(group["template"]["spec"])
        assert not shared, f"head and {group['groupName']} both mount {sorted(shared)}"
    workers = [c for g in rc["workerGroupSpecs"] for c in g["template"]["spec"]["containers"]]
    holders = [
        c["name"]
        for c in head["containers"] + workers
        if S3_SECRET in _secret_refs({"containers": [c]})
    ]
    assert holders == [CONTROLLER_CONTAINER], "only the controller holds the S3 key"


# --- RBAC: derived from the actuator's calls ----------------------------------------------------


@dataclass(frozen=True, order=True)
class Grant:
    scope: str
    """``ClusterRole`` for cluster-scoped resources, ``Role`` for namespaced ones."""
    api_group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        return f"{self.scope} {self.api_group or 'core'}/{self.resource} {self.verb}"


# Each Kubernetes client method -> the one grant it needs. The actuator may call only these.
API_GRANTS = {
    "read_node": Grant("ClusterRole", "", "nodes", "get"),
    "patch_node": Grant("ClusterRole", "", "nodes", "patch"),
    "list_namespaced_pod": Grant("Role", "", "pods", "list"),
    "read_namespaced_pod": Grant("Role", "", "pods", "get"),
    "delete_namespaced_pod": Grant("Role", "", "pods", "delete"),
    "get_namespaced_custom_object": Grant("Role", "ray.io", "rayclusters", "get"),
    "patch_namespaced_custom_object": Grant("Role", "ray.io", "rayclusters", "patch"),
}
# The public method that writes the RayCluster; it calls nothing while the autoscaler owns the
# external group (kubernetes.autoscaler_owns_external, test_kube_actuator.py).
SCALE_METHOD = "scale_external"


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def actuator_calls() -> dict[str, set[str]]:
    """Public method of KubernetesActuator -> the client methods it can reach (through its own
    helpers), read from the source of the class and its parts: ``self.core.<m>`` /
    ``self.custom.<m>``."""
    classes = [
        n
        for path in ACTUATOR_PARTS
        for n in ast.parse(path.read_text()).body
        if isinstance(n, ast.ClassDef)
    ]
    assert "KubernetesActuator" in {c.name for c in classes}
    direct: dict[str, set[str]] = {}
    helpers: dict[str, set[str]] = {}
    for fn in (f for cls in classes for f in cls.body):
        if not isinstance(fn, ast.FunctionDef):
            continue
        direct[fn.name], helpers[fn.name] = set(), set()
        for node in ast.walk(fn):
            if not isinstance(node, ast.Attribute):
                continue
            if _is_self(node.value):  # self.<helper>
                helpers[fn.name].add(node.attr)
            elif (  # self.core.<client method> / self.custom.<client method>
                isinstance(node.value, ast.Attribute)
                and _is_self(node.value.value)
                and node.value.attr in ("core", "custom")
            ):
                direct[fn.name].add(node.attr)

    def reach(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        calls = set(direct.get(name, set()))
        for h in helpers.get(name, set()) - seen - {name}:
            if h in direct:
                calls |= reach(h, seen | {name})
        return calls

    return {n: reach(n) for n in direct if not n.startswith("_")}


def needed_grants(autoscaler_owns_external: bool) -> set[Grant]:
    calls = actuator_calls()
    used = set().union(
        *(c for m, c in calls.items() if not (autoscaler_owns_external and m == SCALE_METHOD))
    )
    return {API_GRANTS[c] for c in used}


def granted(docs: list[Doc], subject: str = CONTROL_PLANE_SA) -> tuple[set[Grant], list[str]]:
    """What the Roles/ClusterRoles bound to ServiceAccount `subject` in `docs` grant, and every
    rule that RBAC cannot narrow (wildcards, aggregation, non-resource URLs)."""
    bound = {
        (b.body["roleRef"]["kind"], b.body["roleRef"]["name"])
        for b in docs
        if b.kind in ("RoleBinding", "ClusterRoleBinding")
        and any(
            s.get("kind") == "ServiceAccount" and s.get("name") == subject
            for s in b.body.get("subjects") or []
        )
    }
    grants: set[Grant] = set()
    problems: list[str] = []
    for d in docs:
        if d.kind not in ("Role", "ClusterRole") or (d.kind, d.name) not in bound:
            continue
        if d.body.get("aggregationRule"):
            problems.append(f"{d.where}: aggregationRule grants whatever it matches")
        for i, rule in enumerate(d.body.get("rules") or []):
            if rule.get("nonResourceURLs"):
                problems.append(f"{d.where}: rules[{i}]: nonResourceURLs")
            values = [*rule.get("apiGroups", []), *rule.get("resources", []), *rule["verbs"]]
            if "*" in values:
                problems.append(f"{d.where}: rules[{i}]: wildcard '*'")
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    grants |= {Grant(d.kind, group, resource, v) for v in rule["verbs"]}
    return grants, problems


def rbac_problems(docs: list[Doc], autoscaler_owns_external: bool) -> list[str]:
    """How the grants in `docs` differ from what the actuator needs in that mode."""
    grants, problems = granted(docs)
    allowed = set(API_GRANTS.values())
    need = needed_grants(autoscaler_owns_external)
    problems += [f"not a grant any actuator call needs: {g}" for g in sorted(grants - allowed)]
    problems += [f"not needed in this mode: {g}" for g in sorted((grants & allowed) - need)]
    problems += [f"missing, the actuator calls it: {g}" for g in sorted(need - grants)]
    return problems


# --- tests: RBAC -------------------------------------------------------------------------------


def test_every_actuator_call_has_a_known_grant() -> None:
    """A new Kubernetes call in the actuator fails here until its grant is decided on."""
    calls = set().union(*actuator_calls().values())
    assert calls == set(API_GRANTS), (
        f"calls without a grant: {sorted(calls - set(API_GRANTS))}; "
        f"grants for calls no longer made: {sorted(set(API_GRANTS) - calls)}"
    )


def test_only_scaling_touches_the_raycluster() -> None:
    calls = actuator_calls()
    raycluster = {m for m, g in API_GRANTS.items() if g.resource == "rayclusters"}
    users = {m for m, c in calls.items() if c & raycluster}
    assert users == {SCALE_METHOD}, users


def test_shipped_config_leaves_the_external_group_to_the_autoscaler(tmp_path: Path) -> None:
    assert rcp_config(tmp_path).kubernetes.autoscaler_owns_external is True


def test_default_rbac_is_exactly_what_the_actuator_needs() -> None:
    docs = applied()
    problems = rbac_problems(docs, autoscaler_owns_external=True)
    assert not problems, "\n".join(problems)
    grants, _ = granted(docs)
    assert not [g for g in grants if g.resource == "rayclusters"], "no RayCluster grant by default"


def test_optional_rbac_adds_only_the_raycluster_scaling() -> None:
    optional = load_docs(OPTIONAL_SCALE_RBAC.parent)
    assert {d.path for d in optional} == {OPTIONAL_SCALE_RBAC}
    assert not {d.path for d in applied()} & {OPTIONAL_SCALE_RBAC}, "must stay opt-in"
    problems = rbac_problems(applied() + optional, autoscaler_owns_external=False)
    assert not problems, "\n".join(problems)
    grants, _ = granted(optional)
    assert {str(g) for g in grants} == {
        "Role ray.io/rayclusters get",
        "Role ray.io/rayclusters patch",
    }
    rules = [r for d in optional if d.kind == "Role" for r in d.body["rules"]]
    assert all(r.get("resourceNames") == [_raycluster().name] for r in rules)


def _with_role(mutate: Callable[[dict[str, Any]], None], kind: str = "Role") -> list[Doc]:
    docs = []
    for d in applied():
        if d.kind == kind:
            body = copy.deepcopy(d.body)
            mutate(body)
            d = Doc(d.path, d.index, body)
        docs.append(d)
    return docs


@pytest.mark.parametrize(
    ("mutate", "kind", "needle"),
    [
        pytest.param(
            lambda r: r["rules"].append(
                {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "patch"]}
            ),
            "Role",
            "not needed in this mode: Role ray.io/rayclusters patch",
            id="raycluster-patch-while-autoscaler-owns",
        ),
        pytest.param(
            lambda r: r["rules"][0]["verbs"].append("watch"),
            "Role",
            "not a grant any actuator call needs: Role core/pods watch",
            id="unused-verb",
        ),
        pytest.param(
            lambda r: r["rules"][0]["verbs"].append("*"),
            "ClusterRole",
            "wildcard '*'",
            id="wildcard",
        ),
        pytest.param(
            lambda r: r["rules"].append(
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
            ),
            "Role",
            "not a grant any actuator call needs: Role core/secrets get",
            id="extra-resource",
        ),
        pytest.param(
            lambda r: r["rules"][0]["verbs"].remove("delete"),
            "Role",
            "missing, the actuator calls it: Role core/pods delete",
            id="missing-verb",
        ),
        pytest.param(
            lambda r: r["rules"][0]["verbs"].append("list"),
            "ClusterRole",
            "not a grant any actuator call needs: ClusterRole core/nodes list",
            id="node-list",
        ),
    ],
)
def test_rbac_check_catches_widening(
    mutate: Callable[[dict[str, Any]], None], kind: str, needle: str
) -> None:
    problems = rbac_problems(_with_role(mutate, kind), autoscaler_owns_external=True)
    assert any(needle in p for p in problems), problems


# --- tests: no Kubernetes credential in a Ray pod; the actuator service ----------------------


def _token_volumes(spec: dict[str, Any]) -> set[str]:
    """Volumes of `spec` that carry a ServiceAccount token (projected serviceAccountToken)."""
    return {
        v["name"]
        for v in spec.get("volumes") or []
        if any(
            "serviceAccountToken" in src for src in (v.get("projected") or {}).get("sources", [])
        )
    }


def token_problems(pods: list[Pod]) -> list[str]:
    """Ray pods (head, its autoscaler sidecar, workers) that hold a ServiceAccount token other
    than as `TOKEN_MOUNTS` allows."""
    problems = []
    for pod in pods:
        if not pod.id.startswith("RayCluster/"):
            continue
        if pod.spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{pod.id}: automountServiceAccountToken must be false")
        tokens = _token_volumes(pod.spec)
        for c in _containers(pod.spec):
            for m in c.get("volumeMounts") or []:
                is_token = m["name"] in tokens or m["mountPath"].startswith(SA_TOKEN_PATH)
                if is_token and (pod.id, c["name"]) not in TOKEN_MOUNTS:
                    problems.append(f"{pod.id}: container {c['name']} mounts a token ({m['name']})")
    return problems


def test_no_ray_pod_mounts_a_service_account_token_but_the_autoscaler() -> None:
    pods = installed_pods()
    assert not token_problems(pods), "\n".join(token_problems(pods))
    sidecar = next(p for p in pods if p.id == "RayCluster/rcp head autoscaler")
    mounts = {m["mountPath"]: m["name"] for m in sidecar.spec["containers"][0]["volumeMounts"]}
    assert mounts[SA_TOKEN_PATH] in _token_volumes(sidecar.spec), "the autoscaler needs its token"


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        pytest.param(
            lambda b: _head(b).pop("automountServiceAccountToken"),
            "RayCluster/rcp head: automountServiceAccountToken must be false",
            id="head-automount",
        ),
        pytest.param(
            lambda b: _head(b)["containers"][0]["volumeMounts"].append(
                {"name": "autoscaler-token", "mountPath": "/var/run/secrets/x"}
            ),
            "head: container ray-head mounts a token (autoscaler-token)",
            id="head-container-mounts-the-projected-token",
        ),
        pytest.param(
            lambda b: (
                _worker(b)["containers"][0]
                .setdefault("volumeMounts", [])
                .append({"name": "t", "mountPath": SA_TOKEN_PATH})
            ),
            "worker gpu-cluster: container ray-worker mounts a token (t)",
            id="worker-mounts-the-token-path",
        ),
    ],
)
def test_token_check_names_the_problem(
    mutate: Callable[[dict[str, Any]], None], needle: str
) -> None:
    problems = token_problems(_mutated_pods(mutate))
    assert any(needle in p for p in problems), problems


def _bindings_to(docs: list[Doc], subject: str) -> list[str]:
    return [
        d.where
        for d in docs
        if d.kind in ("RoleBinding", "ClusterRoleBinding")
        and any(s.get("name") == subject for s in d.body.get("subjects") or [])
    ]


def test_rbac_is_bound_only_to_the_actuator_services_account() -> None:
    docs = applied()
    optional = load_docs(OPTIONAL_SCALE_RBAC.parent)
    for d in docs + optional:
        if d.kind in ("RoleBinding", "ClusterRoleBinding"):
            subjects = d.body.get("subjects") or []
            assert [(s["kind"], s["name"]) for s in subjects] == [
                ("ServiceAccount", CONTROL_PLANE_SA)
            ], d.where
    assert not _bindings_to(docs + optional, HEAD_SA)
    head = _raycluster().body["spec"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == HEAD_SA != CONTROL_PLANE_SA
    users = [p.id for p in installed_pods() if p.spec.get("serviceAccountName") == CONTROL_PLANE_SA]
    assert users == [ACTUATOR_POD], "only the actuator service runs as the account with our RBAC"


def _actuator_spec() -> dict[str, Any]:
    return next(p for p in installed_pods() if p.id == ACTUATOR_POD).spec


def test_the_actuator_deployment_is_restricted_and_alone() -> None:
    dep = next(d for d in applied() if d.kind == "Deployment" and d.name == "rcp-kube-actuator")
    assert dep.body["spec"]["replicas"] == 1, "the rate cap is one process's memory"
    assert dep.body["spec"]["strategy"]["type"] == "Recreate"
    spec = _actuator_spec()
    assert not pod_problems(Pod(ACTUATOR_POD, spec))  # restricted, read-only root, no host access
    (container,) = spec["containers"]
    assert container["command"] == ["python", "-m", "controlplane.kube.service"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    labels = dep.body["spec"]["template"]["metadata"]["labels"]
    assert not any(k.startswith("ray.io/") for k in labels), "not a Ray pod"
    assert JOB_DRIVER_RESOURCE not in str(dep.body)
    assert not _claims(spec), "no job store, no train storage"
    assert S3_SECRET not in _secret_refs(spec)


def test_the_actuator_token_secret_reaches_only_the_controller_container_and_the_actuator() -> None:
    assert _secret_holders(ACTUATOR_SECRET) == [
        (ACTUATOR_POD, "kube-actuator"),
        ("RayCluster/rcp head", CONTROLLER_CONTAINER),
    ]


def _secret_holders(secret: str) -> list[tuple[str, str]]:
    """(pod, container) of every container that mounts `secret`."""
    holders = []
    for pod in installed_pods():
        volumes = {
            v["name"]
            for v in pod.spec.get("volumes") or []
            if (v.get("secret") or {}).get("secretName") == secret
        }
        for c in _containers(pod.spec):
            if any(m["name"] in volumes for m in c.get("volumeMounts") or []):
                holders.append((pod.id, c["name"]))
        assert secret not in str([c.get("env") for c in _containers(pod.spec)]), (
            f"{pod.id}: the token as an env var would show in the Ray dashboard"
        )
    return sorted(holders)


def test_the_admin_api_token_is_a_secret_only_the_controller_container_mounts(
    tmp_path: Path,
) -> None:
    """Issue 15: the first admin's token comes from Secret rcp-api-admin, which no container
    that runs users' code can read; the config points the controller at its mount."""
    assert _secret_holders("rcp-api-admin") == [("RayCluster/rcp head", CONTROLLER_CONTAINER)]
    token_file = rcp_config(tmp_path).api.admin_token_file
    head = _raycluster().body["spec"]["headGroupSpec"]["template"]["spec"]
    controller = next(c for c in head["containers"] if c["name"] == CONTROLLER_CONTAINER)
    volumes = {v["name"]: v for v in head["volumes"]}
    mount = next(
        m for m in controller["volumeMounts"] if m["mountPath"] == str(Path(token_file).parent)
    )
    assert volumes[mount["name"]]["secret"]["secretName"] == "rcp-api-admin"
    (example,) = [d for d in load_docs() if d.path.name == "secret-api-admin.example.yaml"]
    assert example.body["metadata"]["name"] == "rcp-api-admin"
    assert Path(token_file).name in example.body["stringData"]


def test_the_config_points_the_controller_at_the_actuator_service(tmp_path: Path) -> None:
    kc = rcp_config(tmp_path).kubernetes
    svc = next(d for d in applied() if d.kind == "Service" and d.name == "rcp-kube-actuator")
    (port,) = svc.body["spec"]["ports"]
    assert kc.actuator_url == f"http://{svc.name}.{svc.body['metadata']['namespace']}.svc:" + str(
        port["port"]
    )
    spec = _actuator_spec()
    (container,) = spec["containers"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]}[port["targetPort"]] == (
        kc.service.port
    )
    head = _raycluster().body["spec"]["headGroupSpec"]["template"]["spec"]
    token_dir = str(Path(kc.actuator_token_file).parent)
    controller = next(c for c in head["containers"] if c["name"] == CONTROLLER_CONTAINER)
    for where, c in ((CONTROLLER_CONTAINER, controller), ("actuator", container)):
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert token_dir in mounts, f"{where} does not mount the token at {token_dir}"
    assert kc.service.max_node_actions >= rcp_config(tmp_path).health.breaker.max_nodes


def _peer_admits(peer: dict[str, Any], labels: dict[str, str], same_namespace: bool) -> bool:
    """NetworkPolicy peer semantics for pod sources (no ipBlock in the install)."""
    if "ipBlock" in peer:
        return True  # an address range could be anything: treat as open
    if "namespaceSelector" not in peer and not same_namespace:
        return False
    if "namespaceSelector" in peer and peer["namespaceSelector"] != {}:
        return True  # some other namespace: not the head, so refused below
    wanted = (peer.get("podSelector") or {}).get("matchLabels") or {}
    return all(labels.get(k) == v for k, v in wanted.items()) and not (
        peer.get("podSelector") or {}
    ).get("matchExpressions")


HEAD_LABELS = {"ray.io/cluster": "rcp", "ray.io/node-type": "head"}


@pytest.mark.parametrize(
    ("labels", "same_namespace", "allowed"),
    [
        pytest.param(HEAD_LABELS, True, True, id="ray-head"),
        pytest.param(
            {"ray.io/cluster": "rcp", "ray.io/node-type": "worker"}, True, False, id="ray-worker"
        ),
        pytest.param(
            {"ray.io/cluster": "other", "ray.io/node-type": "head"},
            True,
            False,
            id="other-raycluster-head",
        ),
        pytest.param({"app.kubernetes.io/name": "prometheus"}, True, False, id="prometheus"),
        pytest.param(HEAD_LABELS, False, False, id="head-labels-in-another-namespace"),
    ],
)
def test_only_the_ray_head_reaches_the_actuator(
    labels: dict[str, str], same_namespace: bool, allowed: bool
) -> None:
    target = next(
        d for d in applied() if d.kind == "Deployment" and d.name == "rcp-kube-actuator"
    ).body["spec"]["template"]["metadata"]["labels"]
    ruling = [
        d.body
        for d in applied()
        if d.kind == "NetworkPolicy"
        and all(
            target.get(k) == v
            for k, v in (d.body["spec"]["podSelector"].get("matchLabels") or {}).items()
        )
        and not d.body["spec"]["podSelector"].get("matchExpressions")
    ]
    assert any(p["spec"]["podSelector"] == {} for p in ruling), "no default-deny over it"
    port = rcp_config_port()
    admitted = False
    for policy in ruling:
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports") or [{}]
            if not any(p.get("port") in (None, port, "http") for p in ports):
                continue
            peers = rule.get("from")
            if not peers:
                admitted = True  # a rule without `from` admits everyone
            admitted |= any(_peer_admits(peer, labels, same_namespace) for peer in peers or [])
    assert admitted is allowed


def rcp_config_port() -> int:
    doc = next(d for d in applied() if d.kind == "Service" and d.name == "rcp-kube-actuator")
    return int(doc.body["spec"]["ports"][0]["port"])
