"""The Kubernetes actuator, through the real `kubernetes` client, against a loopback fake API
server (tests/unit/kubeapi.py) that checks paths, verbs, patch types and resourceVersions.

Also pins the fake itself to the API's rules (415, 409, 404 bodies, RFC 7386 / 6902 patch
semantics, atomic taint lists under strategic merge), so it cannot silently accept a wrong call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from controlplane.config import Config, ConfigError, KubernetesConfig, load_config
from controlplane.kube import (
    KubeConflictError,
    KubeNotFoundError,
    KubeRefusedError,
    KubernetesActuator,
    KubernetesActuatorError,
    from_config,
    reason_slug,
)
from tests.unit.kubeapi import (
    JSON_PATCH,
    STRATEGIC,
    FakeKubeApi,
    PatchError,
    json_patch,
    merge_patch,
    running,
    write_kubeconfig,
)

NS = "ml"
CLUSTER = "rcp"
NODE = "gpu-node-1"
POD = "rcp-gpu-cluster-worker-abcde"
NODE_PATH = f"/api/v1/nodes/{NODE}"
POD_PATH = f"/api/v1/namespaces/{NS}/pods/{POD}"
RC_PATH = f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/{CLUSTER}"
KEY = "rcp.dev/unhealthy"
FOREIGN = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NOW_S = 1_800_000_000.0  # 2027-01-15T08:00:00Z


# --- builders -----------------------------------------------------------------------------------


def kube_config(**overrides: Any) -> KubernetesConfig:
    values: dict[str, Any] = {
        "enabled": True,
        "namespace": NS,
        "raycluster": CLUSTER,
        "autoscaler_owns_external": False,
        "conflict_retries": 3,
    }
    values.update(overrides)
    return KubernetesConfig(**values)


def worker_labels(cluster: str = CLUSTER, node_type: str = "worker") -> dict[str, str]:
    return {"ray.io/cluster": cluster, "ray.io/node-type": node_type, "ray.io/group": "gpu-cluster"}


def group(name: str, replicas: int | None, lo: int = 0, hi: int | None = 8) -> dict[str, Any]:
    g: dict[str, Any] = {"groupName": name, "minReplicas": lo, "rayStartParams": {}}
    if replicas is not None:
        g["replicas"] = replicas
    if hi is not None:
        g["maxReplicas"] = hi
    return g


def add_cluster(api: FakeKubeApi, *groups: dict[str, Any], autoscaling: bool = False) -> None:
    spec: dict[str, Any] = {
        "rayVersion": "2.60.0",
        "headGroupSpec": {"rayStartParams": {}},
        "workerGroupSpecs": list(groups)
        or [group("gpu-cluster", 2, 2, 2), group("gpu-external", 0, 0, 4)],
    }
    if autoscaling:
        spec["enableInTreeAutoscaling"] = True
    api.add_raycluster(CLUSTER, namespace=NS, spec=spec)


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    with running() as server:
        yield server


def actuator_for(
    api: FakeKubeApi, *, sleeps: list[float] | None = None, **overrides: Any
) -> KubernetesActuator:
    conf = k8s.Configuration()
    conf.host = api.url
    pauses = sleeps if sleeps is not None else []
    return KubernetesActuator(
        kube_config(**overrides), k8s.ApiClient(conf), clock=lambda: NOW_S, sleep=pauses.append
    )


@pytest.fixture
def act(api: FakeKubeApi) -> Iterator[KubernetesActuator]:
    actuator = actuator_for(api)
    yield actuator
    actuator.close()


def node(api: FakeKubeApi) -> dict[str, Any]:
    obj = api.get(NODE_PATH)
    assert obj is not None
    return obj


def ours(value: str) -> dict[str, Any]:
    return {"key": KEY, "value": value, "effect": "NoSchedule"}


def calls(api: FakeKubeApi) -> list[tuple[str, str, str | None, int]]:
    return [(r.method, r.path, r.content_type, r.status) for r in api.writes()]


# --- remove_node --------------------------------------------------------------------------------


def test_remove_node_cordons_taints_annotates_then_deletes_the_pod(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    api.add_node(NODE, taints=[FOREIGN])
    pod = api.add_pod(POD, namespace=NS, node_name=NODE, labels=worker_labels())

    result = act.remove_node(POD, "GPU overheated (81 C)")

    n = node(api)
    assert n["spec"]["unschedulable"] is True
    assert n["spec"]["taints"] == [FOREIGN, ours("gpu-overheated-81-c")]
    assert n["metadata"]["annotations"] == {
        f"{KEY}-reason": "GPU overheated (81 C)",
        f"{KEY}-since": "2027-01-15T08:00:00Z",
    }
    assert api.get(POD_PATH) is None
    assert calls(api) == [
        ("PATCH", NODE_PATH, STRATEGIC, 200),
        ("DELETE", POD_PATH, "application/json", 200),
    ]
    patch = api.writes()[0].body
    assert patch["metadata"]["resourceVersion"]  # an optimistic lock, not a blind write
    delete = api.writes()[1].body
    assert delete["preconditions"] == {"uid": pod["metadata"]["uid"]}
    assert "gracePeriodSeconds" not in delete  # the pod's own grace period
    assert result.node_name == NODE
    assert result.pod_deleted
    assert result.cordon is not None and result.cordon.changed
    assert result.cordon.taint == f"{KEY}=gpu-overheated-81-c:NoSchedule"
    assert "deleted" in result.detail


def test_grace_period_from_config_is_sent(api: FakeKubeApi) -> None:
    api.add_node(NODE)
    api.add_pod(POD, namespace=NS, node_name=NODE, labels=worker_labels())
    with actuator_for(api, pod_grace_period_s=5) as act:
        act.remove_node(POD, "xid_fatal")
    assert api.writes()[-1].body["gracePeriodSeconds"] == 5


def test_cordon_twice_writes_once(api: FakeKubeApi, act: KubernetesActuator) -> None:
    api.add_node(NODE, taints=[FOREIGN])
    first = act.cordon(NODE, "xid_fatal")
    before = node(api)
    second = act.cordon(NODE, "xid_fatal")

    assert (first.changed, second.changed) == (True, False)
    assert node(api) == before  # same resourceVersion, same annotation time
    assert [r.method for r in api.writes()] == ["PATCH"]


def test_remove_node_on_an_already_cordoned_node_only_deletes_the_pod(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    api.add_node(NODE)
    act.cordon(NODE, "xid_fatal")  # the earlier CordonNode action
    api.add_pod(POD, namespace=NS, node_name=NODE, labels=worker_labels())
    api.requests.clear()

    result = act.remove_node(POD, "xid_fatal")

    assert [r.method for r in api.writes()] == ["DELETE"]
    assert result.cordon is not None and not result.cordon.changed
    assert result.pod_deleted


def test_a_new_reason_replaces_our_taint_and_keeps_the_others(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    other_effect = {"key": KEY, "value": "x", "effect": "PreferNoSchedule"}
    api.add_node(NODE, taints=[FOREIGN, other_effect])
    act.cordon(NODE, "gpu_overheated")
    act.cordon(NODE, "ib_link_down")
    assert node(api)["spec"]["taints"] == [FOREIGN, other_effect, ours("ib_link_down")]
    assert node(api)["metadata"]["annotations"][f"{KEY}-reason"] == "ib_link_down"


def test_pod_already_gone_is_success_and_writes_nothing(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    api.add_node(NODE)
    result = act.remove_node(POD, "xid_fatal")
    assert (result.pod_deleted, result.node_name, result.cordon) == (False, None, None)
    assert "already gone" in result.detail
    assert api.writes() == []


def test_pod_gone_between_read_and_delete_is_success(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    api.add_node(NODE)
    api.add_pod(POD, namespace=NS, node_name=NODE, labels=worker_labels())
    api.before("DELETE", POD_PATH, lambda a: a.objects.pop(POD_PATH))

    result = act.remove_node(POD, "xid_fatal")

    assert not result.pod_deleted
    assert calls(api)[-1] == ("DELETE", POD_PATH, "application/json", 404)
    assert node(api)["spec"]["unschedulable"] is True


def test_a_same_named_replacement_pod_is_left_alone(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    api.add_node(NODE)
    api.add_pod(POD, namespace=NS, node_name=NODE, labels=worker_labels())

    def replace_pod(a: FakeKubeApi) -> None:
        a.add_pod(POD, namespace=NS, node_name="gpu-node-2", labels=worker_labels())

    api.before("DELETE", POD_PATH, replace_pod)
    result = act.remove_node(POD, "xid_fatal")

    assert not result.pod_deleted
    replacement = api.get(POD_PATH)
    assert replacement is not None and replacement["spec"]["nodeName"] == "gpu-node-2"
    assert calls(api)[-1][3] == 409


def test_missing_node_is_a_clear_error_and_the_pod_stays(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    api.add_pod(POD, namespace=NS, node_name=NODE, labels=worker_labels())
    with pytest.raises(KubeNotFoundError, match=f"Kubernetes node '{NODE}' not found"):
        act.remove_node(POD, "xid_fatal")
    assert api.get(POD_PATH) is not None
    assert api.writes() == []


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        pytest.param(worker_labels(cluster="other"), "not a Ray pod of RayCluster", id="other"),
        pytest.param({}, "not a Ray pod of RayCluster", id="unlabelled"),
        pytest.param(worker_labels(node_type="head"), "is the Ray head", id="head"),
    ],
)
def test_pods_that_are_not_our_workers_are_refused(
    api: FakeKubeApi, act: KubernetesActuator, labels: dict[str, str], match: str
) -> None:
    api.add_node(NODE)
    api.add_pod(POD, namespace=NS, node_name=NODE, labels=labels)
    with pytest.raises(KubernetesActuatorError, match=match):
        act.remove_node(POD, "xid_fatal")
    assert api.writes() == []


def test_an_unscheduled_pod_is_deleted_without_a_cordon(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    api.add_pod(POD, namespace=NS, node_name=None, labels=worker_labels())
    result = act.remove_node(POD, "xid_fatal")
    assert (result.node_name, result.cordon, result.pod_deleted) == (None, None, True)
    assert [r.method for r in api.writes()] == ["DELETE"]


def test_remove_worker_acts_on_its_read_not_on_a_later_binding(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    """The service counts the actions one read shows; a pod bound to a node after that read
    must not get the node cordoned (issue 26, finding 4)."""
    api.add_node(NODE)
    api.add_pod(POD, namespace=NS, node_name=None, labels=worker_labels())
    worker = act.read_worker(POD)
    assert worker is not None and worker.node_name is None
    api.objects[POD_PATH]["spec"]["nodeName"] = NODE  # the scheduler binds it now
    result = act.remove_worker(POD, worker, "xid_fatal")
    assert (result.node_name, result.cordon, result.pod_deleted) == (None, None, True)
    assert [r.method for r in api.writes()] == ["DELETE"]
    assert not node(api)["spec"].get("unschedulable")


def test_a_concurrent_taint_writer_is_not_overwritten(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    api.add_node(NODE, taints=[FOREIGN])
    unreachable = {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}
    added = iter([unreachable, {"key": "example.com/maint", "effect": "NoSchedule"}])

    def node_controller(obj: dict[str, Any]) -> None:
        obj["spec"].setdefault("taints", []).append(next(added))

    api.interfere("PATCH", NODE_PATH, node_controller, times=2)
    result = act.cordon(NODE, "xid_fatal")

    assert result.attempts == 3
    assert [r.status for r in api.writes()] == [409, 409, 200]
    assert node(api)["spec"]["taints"] == [
        FOREIGN,
        unreachable,
        {"key": "example.com/maint", "effect": "NoSchedule"},
        ours("xid_fatal"),
    ]


def test_conflict_retries_pause_a_little_longer_each_time(api: FakeKubeApi) -> None:
    api.add_node(NODE)
    api.interfere("PATCH", NODE_PATH, lambda o: None, times=2)
    sleeps: list[float] = []
    with actuator_for(api, sleeps=sleeps) as act:
        act.cordon(NODE, "xid_fatal")
    assert sleeps == pytest.approx([0.01, 0.02])


def test_recordon_after_a_manual_uncordon_keeps_the_first_time(api: FakeKubeApi) -> None:
    api.add_node(NODE)
    conf = k8s.Configuration()
    conf.host = api.url
    early = KubernetesActuator(kube_config(), k8s.ApiClient(conf), clock=lambda: NOW_S - 3600)
    early.cordon(NODE, "xid_fatal")
    early.close()
    api.interfere("GET", NODE_PATH, lambda o: o["spec"].update(unschedulable=False))  # kubectl

    with actuator_for(api) as act:
        assert act.cordon(NODE, "xid_fatal").changed
    n = node(api)
    assert n["spec"]["unschedulable"] is True
    assert n["metadata"]["annotations"][f"{KEY}-since"] == "2027-01-15T07:00:00Z"


def test_a_forbidden_patch_names_the_node_and_keeps_the_pod(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    api.add_node(NODE)
    api.add_pod(POD, namespace=NS, node_name=NODE, labels=worker_labels())
    api.fail(
        "PATCH",
        NODE_PATH,
        403,
        f'nodes "{NODE}" is forbidden: User "system:serviceaccount:ml:rcp" cannot patch '
        'resource "nodes"',
    )
    with pytest.raises(KubernetesActuatorError, match=f"node '{NODE}' failed: .*cannot patch"):
        act.remove_node(POD, "xid_fatal")
    assert api.get(POD_PATH) is not None


def test_an_unreachable_api_server_is_named(api: FakeKubeApi) -> None:
    act = actuator_for(api, request_timeout_s=1.0)
    url = api.url
    api.stop()
    with pytest.raises(KubernetesActuatorError, match=f"cannot reach the Kubernetes API at {url}"):
        act.uncordon(NODE)
    act.close()


def test_persistent_node_conflicts_give_up_with_a_clear_error(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    api.add_node(NODE)
    api.interfere("PATCH", NODE_PATH, lambda o: None, times=100)
    with pytest.raises(KubeConflictError, match="after 4 tries"):
        act.cordon(NODE, "xid_fatal")
    assert [r.status for r in api.writes()] == [409] * 4
    assert "unschedulable" not in node(api)["spec"]


def test_pod_for_ip_lists_only_our_cluster(api: FakeKubeApi, act: KubernetesActuator) -> None:
    api.add_pod("other-worker", namespace=NS, node_name=NODE, pod_ip="10.0.0.7", labels={})
    api.add_pod(POD, namespace=NS, node_name=NODE, labels=worker_labels(), pod_ip="10.0.0.7")
    assert act.pod_for_ip("10.0.0.7") == POD
    assert act.pod_for_ip("10.0.0.8") is None
    listing = api.requests[-1]
    assert listing.query["labelSelector"] == [f"ray.io/cluster={CLUSTER}"]


# --- uncordon -----------------------------------------------------------------------------------


def test_uncordon_removes_only_our_taint_and_annotations(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    api.add_node(NODE, taints=[FOREIGN])
    act.cordon(NODE, "xid_fatal")
    api.interfere(  # someone else's annotation and taint, added while cordoned
        "GET",
        NODE_PATH,
        lambda o: (
            o["metadata"]["annotations"].update({"team": "infra"}),
            o["spec"]["taints"].append({"key": "example.com/maint", "effect": "NoExecute"}),
        ),
    )

    result = act.uncordon(NODE)

    n = node(api)
    assert n["spec"]["unschedulable"] is False
    assert n["spec"]["taints"] == [FOREIGN, {"key": "example.com/maint", "effect": "NoExecute"}]
    assert n["metadata"]["annotations"] == {"team": "infra"}
    assert result.changed
    assert result.removed_taints == (f"{KEY}=xid_fatal:NoSchedule",)
    assert calls(api)[-1] == ("PATCH", NODE_PATH, STRATEGIC, 200)


def test_uncordon_of_a_node_with_only_our_taint_leaves_no_taints(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    api.add_node(NODE)
    act.cordon(NODE, "xid_fatal")
    act.uncordon(NODE)
    assert "taints" not in node(api)["spec"]
    second = act.uncordon(NODE)
    assert not second.changed
    assert [r.method for r in api.writes()] == ["PATCH", "PATCH"]


def test_uncordon_of_a_missing_node_names_it(api: FakeKubeApi, act: KubernetesActuator) -> None:
    with pytest.raises(KubeNotFoundError, match="node 'gpu-node-9' not found: cannot uncordon"):
        act.uncordon("gpu-node-9")


# --- scale_external -----------------------------------------------------------------------------


def replicas_of(api: FakeKubeApi, name: str = "gpu-external") -> Any:
    rc = api.get(RC_PATH)
    assert rc is not None
    return next(g.get("replicas") for g in rc["spec"]["workerGroupSpecs"] if g["groupName"] == name)


def test_scale_external_patches_only_that_group(api: FakeKubeApi, act: KubernetesActuator) -> None:
    add_cluster(api)
    result = act.scale_external(3)
    assert (replicas_of(api), replicas_of(api, "gpu-cluster")) == (3, 2)
    assert (result.changed, result.previous, result.replicas, result.clamped) == (True, 0, 3, False)
    assert calls(api) == [("PATCH", RC_PATH, JSON_PATCH, 200)]


def test_scale_external_retries_on_conflict(api: FakeKubeApi, act: KubernetesActuator) -> None:
    add_cluster(api)

    def operator_edit(obj: dict[str, Any]) -> None:
        obj["metadata"].setdefault("labels", {})["edited"] = "yes"

    api.interfere("PATCH", RC_PATH, operator_edit, times=2)
    result = act.scale_external(3)

    assert result.attempts == 3
    assert [(r.content_type, r.status) for r in api.writes()] == [(JSON_PATCH, 409)] * 2 + [
        (JSON_PATCH, 200)
    ]
    assert replicas_of(api) == 3
    rc = api.get(RC_PATH)
    assert rc is not None and rc["metadata"]["labels"] == {"edited": "yes"}


def test_scale_external_follows_its_group_when_groups_move(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    add_cluster(api)

    def insert_group(obj: dict[str, Any]) -> None:
        obj["spec"]["workerGroupSpecs"].insert(0, group("cpu", 1))

    api.interfere("PATCH", RC_PATH, insert_group)
    act.scale_external(3)
    assert (replicas_of(api), replicas_of(api, "cpu"), replicas_of(api, "gpu-cluster")) == (3, 1, 2)


def test_persistent_conflict_gives_up_with_a_clear_error(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    add_cluster(api)
    api.interfere("PATCH", RC_PATH, lambda o: None, times=100)
    with pytest.raises(KubeConflictError, match=r"gave up scaling worker group 'gpu-external'.*4"):
        act.scale_external(3)
    assert [r.status for r in api.writes()] == [409] * 4
    assert replicas_of(api) == 0


@pytest.mark.parametrize(
    ("lo", "hi", "asked", "expected", "clamped"),
    [
        pytest.param(0, 4, 3, 3, False, id="within"),
        pytest.param(0, 4, 9, 4, True, id="above-max"),
        pytest.param(1, 4, 0, 1, True, id="below-min"),
        pytest.param(0, None, 50, 50, False, id="no-max"),
    ],
)
def test_scale_external_clamps_to_the_group_bounds(
    api: FakeKubeApi,
    act: KubernetesActuator,
    lo: int,
    hi: int | None,
    asked: int,
    expected: int,
    clamped: bool,
) -> None:
    add_cluster(api, group("gpu-external", None, lo, hi))
    result = act.scale_external(asked)
    assert (result.replicas, result.clamped, replicas_of(api)) == (expected, clamped, expected)


def test_scale_external_to_the_current_size_writes_nothing(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    add_cluster(api)
    result = act.scale_external(0)
    assert not result.changed
    assert api.writes() == []


def test_scale_external_is_refused_when_the_autoscaler_owns_the_group(api: FakeKubeApi) -> None:
    add_cluster(api)
    with actuator_for(api, autoscaler_owns_external=True) as act:
        result = act.scale_external(3)
    assert result.refused and "autoscaler_owns_external" in result.refused
    assert not result.changed
    assert api.requests == []


def test_scale_external_is_refused_with_in_tree_autoscaling(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    add_cluster(api, autoscaling=True)
    result = act.scale_external(3)
    assert result.refused and "enableInTreeAutoscaling" in result.refused
    assert api.writes() == []
    assert replicas_of(api) == 0


def test_missing_group_is_a_clear_error(api: FakeKubeApi, act: KubernetesActuator) -> None:
    add_cluster(api, group("gpu-cluster", 2), group("rented", 0))
    with pytest.raises(
        KubeNotFoundError,
        match=r"no worker group named 'gpu-external' \(kubernetes.external_group\); "
        r"its worker groups: 'gpu-cluster', 'rented'",
    ):
        act.scale_external(1)


def test_missing_raycluster_is_a_clear_error(act: KubernetesActuator) -> None:
    with pytest.raises(KubeNotFoundError, match=f"RayCluster {NS}/{CLUSTER} not found"):
        act.scale_external(1)


def test_negative_replicas_are_rejected(act: KubernetesActuator) -> None:
    with pytest.raises(ValueError, match="must be >= 0, got -1"):
        act.scale_external(-1)


# --- from_config and config ---------------------------------------------------------------------


def test_from_config_is_none_when_disabled() -> None:
    assert from_config(Config()) is None


def test_from_config_reads_a_kubeconfig(api: FakeKubeApi, tmp_path: Path) -> None:
    api.add_node(NODE)
    kubeconfig = write_kubeconfig(api, tmp_path / "kubeconfig")
    cfg = load_config(
        None,
        [
            "kubernetes.enabled=true",
            "kubernetes.in_cluster=false",
            f"kubernetes.kubeconfig={kubeconfig}",
        ],
    )
    act = from_config(cfg)
    assert act is not None
    with act:
        assert act.cordon(NODE, "xid_fatal").changed


def test_from_config_outside_a_pod_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cfg = load_config(None, ["kubernetes.enabled=true"])
    with pytest.raises(KubernetesActuatorError, match="service account.*in_cluster"):
        from_config(cfg)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        pytest.param("kubernetes.namespace=ML_Prod", "kubernetes.namespace", id="namespace"),
        pytest.param("kubernetes.raycluster=-rcp", "kubernetes.raycluster", id="raycluster"),
        pytest.param("kubernetes.taint_key=rcp.dev/", "kubernetes.taint_key", id="taint-name"),
        pytest.param("kubernetes.taint_key=/x", "kubernetes.taint_key", id="taint-prefix"),
        pytest.param("kubernetes.external_group=''", "kubernetes.external_group", id="group"),
        pytest.param("kubernetes.conflict_retries=-1", "kubernetes.conflict_retries", id="retry"),
        pytest.param(
            "kubernetes.pod_grace_period_s=-5", "kubernetes.pod_grace_period_s", id="grace"
        ),
    ],
)
def test_bad_kubernetes_config_names_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"{key}: must"):
        load_config(None, [override])


@pytest.mark.parametrize(
    ("reason", "slug"),
    [
        pytest.param("xid_fatal", "xid_fatal", id="plain"),
        pytest.param("GPU overheated (81 C)", "gpu-overheated-81-c", id="spaces"),
        pytest.param("--!!--", "unspecified", id="nothing-left"),
        pytest.param("a" * 70 + "-b", "a" * 63, id="too-long"),
        pytest.param("node x: ib_link_down, xid_fatal", "node-x-ib_link_down-xid_fatal", id="list"),
    ],
)
def test_reason_slug_is_a_label_value(reason: str, slug: str) -> None:
    assert reason_slug(reason) == slug


# --- the fake API server keeps to the API's rules -----------------------------------------------


def raw_client(api: FakeKubeApi) -> k8s.CoreV1Api:
    conf = k8s.Configuration()
    conf.host = api.url
    return k8s.CoreV1Api(k8s.ApiClient(conf))


@pytest.mark.parametrize(
    ("path_kind", "content_type"),
    [
        pytest.param("node", "application/json", id="node-plain-json"),
        pytest.param("node", "application/apply-patch+yaml", id="node-apply-not-modelled"),
        pytest.param("raycluster", STRATEGIC, id="custom-resource-strategic"),
    ],
)
def test_fake_rejects_unsupported_patch_types_with_415(
    api: FakeKubeApi, path_kind: str, content_type: str
) -> None:
    api.add_node(NODE)
    add_cluster(api)
    conf = k8s.Configuration()
    conf.host = api.url
    client = k8s.ApiClient(conf)
    body = {"metadata": {"labels": {"a": "b"}}}
    with pytest.raises(ApiException) as err:
        if path_kind == "node":
            k8s.CoreV1Api(client).patch_node(NODE, body, _content_type=content_type)
        else:
            k8s.CustomObjectsApi(client).patch_namespaced_custom_object(
                "ray.io", "v1", NS, "rayclusters", CLUSTER, body, _content_type=content_type
            )
    assert err.value.status == 415
    status = json.loads(err.value.body)
    assert (status["kind"], status["reason"], status["code"]) == (
        "Status",
        "UnsupportedMediaType",
        415,
    )


def test_fake_answers_stale_writes_with_a_409_status(api: FakeKubeApi) -> None:
    api.add_node(NODE)
    with pytest.raises(ApiException) as err:
        raw_client(api).patch_node(
            NODE, {"metadata": {"resourceVersion": "1"}}, _content_type=STRATEGIC
        )
    status = json.loads(err.value.body)
    assert err.value.status == 409
    assert status["reason"] == "Conflict"
    assert status["details"] == {"name": NODE, "kind": "nodes"}
    assert "the object has been modified" in status["message"]


def test_fake_answers_missing_objects_with_a_404_status(api: FakeKubeApi) -> None:
    with pytest.raises(ApiException) as err:
        raw_client(api).read_node("nope")
    status = json.loads(err.value.body)
    assert (err.value.status, status["reason"], status["message"]) == (
        404,
        "NotFound",
        'nodes "nope" not found',
    )


def test_fake_strategic_merge_replaces_the_whole_taint_list(api: FakeKubeApi) -> None:
    """Node.spec.taints has no patchMergeKey in Kubernetes: a patch sends the whole list."""
    api.add_node(NODE, taints=[FOREIGN])
    raw_client(api).patch_node(NODE, {"spec": {"taints": [ours("x")]}}, _content_type=STRATEGIC)
    assert node(api)["spec"]["taints"] == [ours("x")]


def test_fake_strategic_merge_merges_lists_that_have_a_merge_key(api: FakeKubeApi) -> None:
    api.add_node(NODE)
    client = raw_client(api)
    ready = {"type": "Ready", "status": "True"}
    disk = {"type": "DiskPressure", "status": "False"}
    client.patch_node(NODE, {"status": {"conditions": [ready]}}, _content_type=STRATEGIC)
    client.patch_node(NODE, {"status": {"conditions": [disk]}}, _content_type=STRATEGIC)
    assert node(api)["status"]["conditions"] == [ready, disk]


def test_fake_rejects_directives_it_does_not_model(api: FakeKubeApi) -> None:
    api.add_node(NODE)
    with pytest.raises(ApiException) as err:
        raw_client(api).patch_node(
            NODE, {"spec": {"$retainKeys": ["taints"]}}, _content_type=STRATEGIC
        )
    assert err.value.status == 400


def test_fake_put_needs_a_resource_version(api: FakeKubeApi) -> None:
    add_cluster(api)
    conf = k8s.Configuration()
    conf.host = api.url
    custom = k8s.CustomObjectsApi(k8s.ApiClient(conf))
    rc = custom.get_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", CLUSTER)
    del rc["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as err:
        custom.replace_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", CLUSTER, rc)
    assert err.value.status == 422


# RFC 7386 appendix A examples (a selection).
@pytest.mark.parametrize(
    ("target", "patch", "result"),
    [
        pytest.param({"a": "b"}, {"a": "c"}, {"a": "c"}, id="replace"),
        pytest.param({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}, id="add"),
        pytest.param({"a": "b"}, {"a": None}, {}, id="null-deletes"),
        pytest.param({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}, id="lists-replace"),
        pytest.param({"e": None}, {"a": 1}, {"e": None, "a": 1}, id="existing-null-kept"),
        pytest.param({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}, id="nested-null"),
    ],
)
def test_merge_patch_follows_rfc_7386(target: Any, patch: Any, result: Any) -> None:
    assert merge_patch(target, patch) == result


# RFC 6902 appendix A examples (a selection).
@pytest.mark.parametrize(
    ("doc", "ops", "result"),
    [
        pytest.param(
            {"foo": ["bar", "baz"]},
            [{"op": "add", "path": "/foo/1", "value": "qux"}],
            {"foo": ["bar", "qux", "baz"]},
            id="add-into-array",
        ),
        pytest.param(
            {"foo": [1]},
            [{"op": "add", "path": "/foo/-", "value": 2}],
            {"foo": [1, 2]},
            id="append",
        ),
        pytest.param(
            {"baz": "qux", "foo": "bar"},
            [{"op": "remove", "path": "/baz"}],
            {"foo": "bar"},
            id="remove",
        ),
        pytest.param(
            {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
            [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
            {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}},
            id="move",
        ),
        pytest.param(
            {"/": 9, "~1": 10},
            [{"op": "replace", "path": "/~01", "value": 11}],
            {"/": 9, "~1": 11},
            id="pointer-escapes",
        ),
    ],
)
def test_json_patch_follows_rfc_6902(doc: Any, ops: Any, result: Any) -> None:
    assert json_patch(doc, ops) == result


@pytest.mark.parametrize(
    ("doc", "ops"),
    [
        pytest.param({"baz": "qux"}, [{"op": "test", "path": "/baz", "value": "bar"}], id="test"),
        pytest.param(
            {"foo": "bar"}, [{"op": "add", "path": "/baz/bat", "value": 1}], id="no-parent"
        ),
        pytest.param({"a": 1}, [{"op": "replace", "path": "/b", "value": 2}], id="replace-absent"),
        pytest.param({"a": [1]}, [{"op": "add", "path": "/a/01", "value": 2}], id="leading-zero"),
        pytest.param({"a": True}, [{"op": "test", "path": "/a", "value": 1}], id="bool-is-not-1"),
    ],
)
def test_failed_json_patch_ops_are_422_and_apply_nothing(doc: Any, ops: Any) -> None:
    before = json.dumps(doc)
    with pytest.raises(PatchError) as err:
        json_patch(doc, [{"op": "add", "path": "/added", "value": 1}, *ops])
    assert err.value.code == 422
    assert json.dumps(doc) == before


# --- scale_external: a shrink names its pods (scaleStrategy.workersToDelete) --------------------


def external_worker(api: FakeKubeApi, name: str, grp: str = "gpu-external", **kw: Any) -> None:
    labels = {**worker_labels(**kw), "ray.io/group": grp}
    api.add_pod(name, namespace=NS, node_name=None, labels=labels)


def strategy_of(api: FakeKubeApi, name: str = "gpu-external") -> Any:
    rc = api.get(RC_PATH)
    assert rc is not None
    g = next(g for g in rc["spec"]["workerGroupSpecs"] if g["groupName"] == name)
    return g.get("scaleStrategy")


def test_a_shrink_writes_replicas_and_the_names_in_one_guarded_patch(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    add_cluster(api, group("gpu-cluster", 2, 2, 2), group("gpu-external", 3, 0, 4))
    for name in ("w-1", "w-2", "w-3"):
        external_worker(api, name)
    result = act.scale_external(1, workers_to_delete=["w-2", "w-3"])

    assert (replicas_of(api), strategy_of(api)) == (1, {"workersToDelete": ["w-2", "w-3"]})
    assert (result.changed, result.named, result.previous, result.replicas) == (
        True,
        ("w-2", "w-3"),
        3,
        1,
    )
    (patch,) = api.writes()
    assert patch.content_type == JSON_PATCH
    ops = {op["path"]: op for op in patch.body}
    assert ops["/spec/workerGroupSpecs/1/groupName"]["op"] == "test"
    assert ops["/metadata/resourceVersion"]["op"] == "replace"
    assert ops["/spec/workerGroupSpecs/1/scaleStrategy"]["value"] == {
        "workersToDelete": ["w-2", "w-3"]
    }
    assert "deleting w-2, w-3" in result.detail


@pytest.mark.parametrize(
    ("asked", "names", "replicas", "named"),
    [
        pytest.param(0, [], 3, (), id="no-names-no-cut"),
        pytest.param(0, ["w-2"], 2, ("w-2",), id="one-name-one-node"),
        pytest.param(2, ["w-1", "w-2", "w-3"], 2, ("w-1",), id="no-more-than-asked"),
        pytest.param(1, ["gone", "w-3"], 2, ("w-3",), id="a-gone-name-is-skipped"),
        pytest.param(4, ["w-1"], 4, (), id="growth-names-nothing"),
    ],
)
def test_replicas_never_drop_by_more_than_the_pods_named(
    api: FakeKubeApi,
    act: KubernetesActuator,
    asked: int,
    names: list[str],
    replicas: int,
    named: tuple[str, ...],
) -> None:
    add_cluster(api, group("gpu-external", 3, 0, 4))
    for name in ("w-1", "w-2", "w-3"):
        external_worker(api, name)
    result = act.scale_external(asked, workers_to_delete=names)
    assert (replicas_of(api), result.named) == (replicas, named)
    assert ((strategy_of(api) or {}).get("workersToDelete") or []) == list(named)


def test_names_already_pending_do_not_cut_again_and_gone_ones_are_cleared(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    add_cluster(api, group("gpu-external", 3, 0, 4))
    for name in ("w-1", "w-2", "w-3"):
        external_worker(api, name)
    act.scale_external(2, workers_to_delete=["w-3"])
    again = act.scale_external(0, workers_to_delete=["w-3"])  # w-3 not gone yet
    assert (replicas_of(api), again.changed) == (2, False)

    del api.objects[f"/api/v1/namespaces/{NS}/pods/w-3"]  # the operator deleted it
    cleared = act.scale_external(2)
    assert (cleared.changed, cleared.cleared, replicas_of(api)) == (True, ("w-3",), 2)
    assert strategy_of(api) == {"workersToDelete": []}
    assert "cleared gone w-3" in cleared.detail


def test_a_conflict_rereads_and_renames(api: FakeKubeApi, act: KubernetesActuator) -> None:
    add_cluster(api, group("gpu-external", 2, 0, 4))
    external_worker(api, "w-1")
    external_worker(api, "w-2")

    def someone_scales_up(rc: dict[str, Any]) -> None:
        rc["spec"]["workerGroupSpecs"][0]["replicas"] = 3

    api.interfere("PATCH", RC_PATH, someone_scales_up)
    result = act.scale_external(1, workers_to_delete=["w-2"])
    assert [r.status for r in api.writes()] == [409, 200]
    assert (result.previous, replicas_of(api), result.named) == (3, 2, ("w-2",))


@pytest.mark.parametrize(
    ("pod", "labels", "match"),
    [
        pytest.param("rcp-head", worker_labels(node_type="head"), "is the Ray head", id="head"),
        pytest.param(
            "other-rc", worker_labels(cluster="other"), "not a Ray pod of RayCluster", id="other-rc"
        ),
        pytest.param(
            "cluster-w",
            {**worker_labels(), "ray.io/group": "gpu-cluster"},
            "is a worker of group 'gpu-cluster', not of 'gpu-external'",
            id="other-group",
        ),
        pytest.param("bare", {}, "not a Ray pod of RayCluster", id="unlabelled"),
    ],
)
def test_a_name_that_is_not_a_worker_of_the_group_refuses_the_shrink(
    api: FakeKubeApi, act: KubernetesActuator, pod: str, labels: dict[str, str], match: str
) -> None:
    add_cluster(api, group("gpu-cluster", 2, 2, 2), group("gpu-external", 2, 0, 4))
    external_worker(api, "w-1")
    api.add_pod(pod, namespace=NS, node_name=None, labels=labels)
    with pytest.raises(KubeRefusedError, match=match):
        act.scale_external(0, workers_to_delete=["w-1", pod])
    assert api.writes() == []


def test_repeated_names_are_rejected(act: KubernetesActuator) -> None:
    with pytest.raises(ValueError, match=r"names pods twice: \['w-1'\]"):
        act.scale_external(0, workers_to_delete=["w-1", "w-2", "w-1"])


def test_names_are_refused_with_in_tree_autoscaling_too(
    api: FakeKubeApi, act: KubernetesActuator
) -> None:
    add_cluster(api, group("gpu-external", 2, 0, 4), autoscaling=True)
    external_worker(api, "w-1")
    result = act.scale_external(1, workers_to_delete=["w-1"])
    assert result.refused and "enableInTreeAutoscaling" in result.refused
    assert api.writes() == [] and replicas_of(api) == 2
