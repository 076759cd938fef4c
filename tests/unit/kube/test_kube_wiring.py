"""The control plane's two Kubernetes paths, through the real `kubernetes` client against the
loopback fake API server: health's node removal (Remediator -> `remove_node`) and the external
worker group sized by the serving loop when the in-tree autoscaler is off."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from controlplane.config import load_config
from controlplane.kube import KubernetesActuator
from controlplane.loop.act.nodes import Remediator
from controlplane.store import Store
from policies import external_shrink
from policies.external_shrink import ExternalGroupSize
from policies.providers import Provider
from policies.snapshot import ClusterSnapshot, Pool
from tests.unit.kube.test_kube_actuator import (
    CLUSTER,
    NODE,
    NODE_PATH,
    NS,
    POD,
    POD_PATH,
    add_cluster,
    group,
    kube_config,
    replicas_of,
    worker_labels,
)
from tests.unit.kubeapi import FakeKubeApi, running, write_kubeconfig
from tests.unit.loop.test_health_actuation import FakeNodes


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    with running() as server:
        yield server


def actuator(api: FakeKubeApi, **overrides: Any) -> KubernetesActuator:
    conf = k8s.Configuration()
    conf.host = api.url
    return KubernetesActuator(kube_config(**overrides), k8s.ApiClient(conf), sleep=lambda _s: None)


def test_an_empty_unhealthy_node_is_cordoned_tainted_and_its_pod_deleted(api: FakeKubeApi) -> None:
    api.add_node(NODE)
    api.add_pod(POD, namespace=NS, node_name=NODE, labels=worker_labels())
    events: list[tuple[str, str]] = []
    with actuator(api) as act:
        r = Remediator(
            FakeNodes(hostnames={"ray-node-a": POD}),
            drain_deadline_s=600,
            replace_drained=True,
            record=lambda k, m: events.append((k, m)),
            kube_remove=act.remove_node,
        )
        long_reason = "node ray-node-a unhealthy: gpu_overheated (gpu 0 at 91.5 C > 78 C)"
        r.cordon("ray-node-a", long_reason, now_s=0.5)
        assert r.replace("ray-node-a", long_reason, now_s=1.0, cause="gpu_overheated")
    node = api.get(NODE_PATH)
    assert node is not None and node["spec"]["unschedulable"] is True
    taints = node["spec"]["taints"]
    assert [(t["key"], t["value"], t["effect"]) for t in taints] == [
        ("rcp.dev/unhealthy", "gpu_overheated", "NoSchedule")
    ]
    assert api.get(POD_PATH) is None  # KubeRay creates a new pod on another node
    assert POD in dict(events)["health.drain"]


def sizes(
    gpus: Mapping[str, int], gpus_per_node: Mapping[str, int]
) -> tuple[ExternalGroupSize, ...]:
    """The external-group policy's sizes for a cluster with no external node yet."""
    names = [Provider(name, 8, 1.0) for name in gpus_per_node]
    return external_shrink.decide(ClusterSnapshot(now_s=0.0), gpus, gpus_per_node, names)


PROVIDER_GROUPS = (
    group("gpu-cluster", 2, 2, 2),
    group("gpu-external-rent-a", 0, 0, 2),
    group("gpu-external-rent-b", 0, 0, 2),
)


@pytest.mark.parametrize(
    ("owns", "gpus", "replicas"),
    [  # 2 GPUs per node of each default provider
        (False, {"rent-a": 4, "rent-b": 1}, (2, 1)),
        (False, {"rent-a": 3}, (2, 0)),
        (True, {"rent-a": 4, "rent-b": 4}, (0, 0)),
    ],
)
def test_the_loop_sizes_each_providers_group_only_when_it_owns_them(
    api: FakeKubeApi, tmp_path: Path, owns: bool, gpus: dict[str, int], replicas: tuple[int, int]
) -> None:
    from controlplane.loop import Adapters, Loop
    from controlplane.loop.decide import policies_of
    from tests.unit.loop_fakes import FakeCluster, FakeMetrics, FakeTelemetry

    add_cluster(api, *PROVIDER_GROUPS)
    cfg = load_config(
        None,
        [
            f"state_dir={tmp_path}",
            "kubernetes.enabled=true",
            f"kubernetes.namespace={NS}",
            f"kubernetes.raycluster={CLUSTER}",
            f"kubernetes.autoscaler_owns_external={str(owns).lower()}",
        ],
    )
    store = Store(cfg.jobs_db_path)
    cluster = FakeCluster()
    act = actuator(api, autoscaler_owns_external=owns)
    adapters = Adapters(
        jobs=None,  # type: ignore[arg-type]
        nodes=cluster,
        node_actions=cluster,
        telemetry=FakeTelemetry(cluster),
        metrics=FakeMetrics(),
        kube_scale_external=lambda: act.scale_external,
    )
    loop = Loop(cfg, store, adapters, policies_of(cfg))
    if loop.external_group is not None:
        loop.external_group.apply(sizes(gpus, loop.external_group.gpus_per_node))
    got = (replicas_of(api, "gpu-external-rent-a"), replicas_of(api, "gpu-external-rent-b"))
    assert got == replicas


def test_the_controllers_removal_treats_a_vanished_kubernetes_node_as_done(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    from controlplane.controller.actor import _kube_remove

    api.add_pod(POD, namespace=NS, node_name="node-that-is-gone", labels=worker_labels())
    cfg = load_config(
        None,
        [
            "kubernetes.enabled=true",
            "kubernetes.in_cluster=false",
            f"kubernetes.namespace={NS}",
            f"kubernetes.raycluster={CLUSTER}",
            f"kubernetes.kubeconfig={write_kubeconfig(api, tmp_path / 'kubeconfig')}",
        ],
    )
    remove = _kube_remove(cfg)
    assert remove is not None
    assert remove(POD, "gpu_overheated") is None  # no error: retried forever otherwise
    r = Remediator(
        FakeNodes(hostnames={"a": POD}),
        drain_deadline_s=600,
        replace_drained=True,
        record=lambda _k, _m: None,
        kube_remove=remove,
    )
    r.cordon("a", "x", now_s=1.0)
    assert r.replace("a", "x", now_s=2.0) and "a" in r.replaced
    assert _kube_remove(load_config(None, [])) is None  # local mode: no actuator


def test_rcp_uncordon_lets_the_host_take_pods_again(api: FakeKubeApi, tmp_path: Path) -> None:

    from click.testing import CliRunner

    from controlplane.cli import cli

    foreign = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    api.add_node(NODE, taints=[foreign])
    with actuator(api) as act:
        act.cordon(NODE, "gpu_overheated")
    kubeconfig = write_kubeconfig(api, tmp_path / "kubeconfig")
    args = [
        "kubernetes.enabled=true",
        "kubernetes.in_cluster=false",
        f"kubernetes.kubeconfig={kubeconfig}",
    ]
    result = CliRunner().invoke(cli, ["uncordon", NODE, "--kube", *args])
    assert result.exit_code == 0, result.output
    node = api.get(NODE_PATH)
    assert node is not None and not node["spec"].get("unschedulable")
    assert node["spec"]["taints"] == [foreign]  # only our taint went

    missing = CliRunner().invoke(cli, ["uncordon", "no-such-node", "--kube", *args])
    assert missing.exit_code == 1 and "no-such-node" in missing.output


def test_rcp_uncordon_in_local_mode_says_there_is_nothing_to_uncordon() -> None:
    from click.testing import CliRunner

    from controlplane.cli import cli

    result = CliRunner().invoke(cli, ["uncordon", "some-node", "--kube"])
    assert result.exit_code == 2
    assert "kubernetes.enabled is false" in result.output


def test_the_external_group_is_set_again_when_someone_changed_it(
    api: FakeKubeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Level-triggered: a scale lost to an operator's edit (or a failed call) is repaired."""
    from controlplane.loop.act import serving as act_serving

    add_cluster(api, *PROVIDER_GROUPS)
    act = actuator(api)
    ext = act_serving.ExternalGroup({"rent-a": 2}, lambda: act.scale_external, lambda _k, _m: None)
    ext.apply(sizes({"rent-a": 4}, ext.gpus_per_node))
    assert replicas_of(api, "gpu-external-rent-a") == 2
    with api._lock:  # someone scales it down behind our back
        api.objects[f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/{CLUSTER}"]["spec"][
            "workerGroupSpecs"
        ][1]["replicas"] = 0
    ext.apply(sizes({"rent-a": 4}, ext.gpus_per_node))
    assert replicas_of(api, "gpu-external-rent-a") == 0  # not yet: within the recheck interval
    monkeypatch.setattr(act_serving, "EXTERNAL_GROUP_RECHECK_S", 0.0)
    ext.recheck_at = 0.0
    ext.apply(sizes({"rent-a": 4}, ext.gpus_per_node))
    assert replicas_of(api, "gpu-external-rent-a") == 2


def test_a_tick_shrinks_the_external_group_by_its_emptied_nodes_only(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    """The loop end to end on its fakes, the RayCluster on the fake API server with its
    KubeRay operator: three rent-a nodes (a Ray node's hostname is its pod name), one holding
    GPUs, placement asking nothing of rent-a. The tick's decide names the two empty nodes,
    the act writes them, and the operator deletes those two and nothing else."""
    from tests.unit.loop_fakes import build_loop, make_world

    api.add_raycluster(
        CLUSTER,
        namespace=NS,
        spec={"headGroupSpec": {}, "workerGroupSpecs": list(PROVIDER_GROUPS)},
    )
    with api._lock:
        api.objects[f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/{CLUSTER}"]["spec"][
            "workerGroupSpecs"
        ][1]["replicas"] = 3
    api.operate(CLUSTER, namespace=NS)
    pods = [p for p in api.operator_created if "-gpu-external-rent-a-" in p]
    assert len(pods) == 3
    world = make_world(
        tmp_path,
        "kubernetes.enabled=true",
        f"kubernetes.namespace={NS}",
        f"kubernetes.raycluster={CLUSTER}",
        "kubernetes.autoscaler_owns_external=false",
    )
    for pod in pods:
        world.cluster.add(pod, Pool.EXTERNAL, gpus=2, provider="rent-a")
    world.cluster.gangs["busy"] = {pods[0]: 2}  # the first pod: what a bare cut would take
    act = actuator(api)
    w = world
    loop = build_loop(
        w.cfg, w.store, w.clock, w.cluster, w.serve, w.jobs, w.telemetry, w.metrics,
        kube_scale_external=lambda: act.scale_external,
    )  # fmt: skip
    loop.tick()
    assert loop.stats.failures == {}
    assert sorted(api.operator_deleted) == sorted(pods[1:])
    assert replicas_of(api, "gpu-external-rent-a") == 1
    assert api.get(f"/api/v1/namespaces/{NS}/pods/{pods[0]}") is not None
