"""Shrinking an external provider's worker group only by the nodes it emptied.

The policy (`policies.external_shrink`) is tested as a pure table. The whole path, policy ->
`ExternalGroup` -> `KubernetesActuator.scale_external`, runs through the real `kubernetes`
client against the loopback fake API server (tests/unit/kubeapi.py) with its model of the
KubeRay operator's worker-group reconcile switched on: no Kubernetes API server or KubeRay
operator runs here, so the fake is the protocol boundary, and what the operator deletes on a
shrink (the named pods first, then the first pods of its list) is the fake's model of
KubeRay's ``reconcilePods``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import pytest
from kubernetes import client as k8s

from controlplane.kube import KubernetesActuator
from controlplane.loop.act.serving import ExternalGroup
from policies import external_shrink
from policies.external_shrink import ExternalGroupSize, nodes_wanted, recheck
from policies.providers import Provider
from policies.snapshot import ClusterSnapshot, NodeView, Pool, RunningGang, ServeReplica
from tests.unit.kube.test_kube_actuator import CLUSTER, NS, RC_PATH, group, kube_config
from tests.unit.kubeapi import FakeKubeApi, running

PROVIDERS = (Provider("rent-a", 8, 2.0), Provider("rent-b", 8, 3.0))
GPUS_PER_NODE = {"rent-a": 2, "rent-b": 2}


# --- builders -----------------------------------------------------------------------------------


def ext(node_id: str, provider: str = "rent-a", *, free: int = 2, healthy: bool = True) -> NodeView:
    return NodeView(node_id, Pool.EXTERNAL, 2, free, healthy, {"provider": provider})


def replica(node_id: str, model: str = "llm") -> ServeReplica:
    return ServeReplica(f"{model}-on-{node_id}", model, Pool.EXTERNAL, node_id, 2)


def gang(node_id: str) -> RunningGang:
    return RunningGang("job-1", "team", "low", 1, 2, {node_id: 2}, started_s=0.0)


def snap(
    nodes: Sequence[NodeView],
    replicas: Sequence[ServeReplica] = (),
    gangs: Sequence[RunningGang] = (),
) -> ClusterSnapshot:
    return ClusterSnapshot(
        now_s=100.0, nodes=tuple(nodes), serve_replicas=tuple(replicas), running=tuple(gangs)
    )


def decide(
    snapshot: ClusterSnapshot, asked: Mapping[str, int], reserved: Collection[str] = ()
) -> tuple[ExternalGroupSize, ...]:
    return external_shrink.decide(snapshot, asked, GPUS_PER_NODE, PROVIDERS, reserved)


# --- the policy, pure ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("snapshot", "asked", "reserved", "expected"),
    [
        pytest.param(
            snap([ext("n1", free=0), ext("n2"), ext("n3")], [replica("n1")]),
            {"rent-a": 2},
            (),
            {"rent-a": (1, ("n2", "n3")), "rent-b": (0, ())},
            id="return-empties-two-of-three",
        ),
        pytest.param(
            snap([ext("n1", free=0), ext("n2"), ext("n3")], [replica("n1")]),
            {"rent-a": 0},
            (),
            {"rent-a": (0, ("n2", "n3")), "rent-b": (0, ())},
            id="never-the-serving-node-even-at-zero",
        ),
        pytest.param(
            snap([ext("n1"), ext("n2"), ext("n3")]),
            {"rent-a": 4},
            (),
            {"rent-a": (2, ("n1",)), "rent-b": (0, ())},
            id="only-the-surplus",
        ),
        pytest.param(
            snap([ext("n1"), ext("n2")]),
            {"rent-a": 6},
            (),
            {"rent-a": (3, ()), "rent-b": (0, ())},
            id="growth-names-nothing",
        ),
        pytest.param(
            snap([ext("n1"), ext("n2", free=0), ext("n3", free=1)], [], [gang("n2")]),
            {},
            (),
            {"rent-a": (0, ("n1",)), "rent-b": (0, ())},
            id="gang-and-gpus-held-stay",
        ),
        pytest.param(
            snap([ext("n1"), ext("n2"), ext("n3", healthy=False)]),
            {"rent-a": 2},
            ("n1",),
            {"rent-a": (1, ("n3", "n2")), "rent-b": (0, ())},
            id="reserved-stays-unhealthy-first",
        ),
        pytest.param(
            snap([ext("a1"), ext("a2", free=0), ext("b1", "rent-b"), ext("b2", "rent-b")]),
            {"rent-a": 2, "rent-b": 2},
            (),
            {"rent-a": (1, ("a1",)), "rent-b": (1, ("b1",))},
            id="each-provider-its-own-nodes",
        ),
        pytest.param(
            snap([ext("n1", free=0), ext("n2")], [replica("n1")]),
            {"rent-a": 4},
            (),
            {"rent-a": (2, ()), "rent-b": (0, ())},
            id="no-surplus",
        ),
    ],
)
def test_a_shrink_names_only_emptied_nodes(
    snapshot: ClusterSnapshot,
    asked: dict[str, int],
    reserved: tuple[str, ...],
    expected: dict[str, tuple[int, tuple[str, ...]]],
) -> None:
    sizes = decide(snapshot, asked, reserved)
    assert {s.provider: (s.num_nodes, s.remove_node_ids) for s in sizes} == expected


def test_the_reason_says_what_stays() -> None:
    (a, _b) = decide(snap([ext("n1", free=0), ext("n2")], [replica("n1")]), {})
    assert a.reason == "rent-a: 0 node(s) wanted of 2; take emptied n2; 1 more stay(s) until " + (
        "emptied (they hold work)"
    )


def test_recheck_drops_a_node_that_gained_work() -> None:
    size = ExternalGroupSize("rent-a", 1, ("n2", "n3"), "r")
    again = recheck(size, {"n3", "n9"})
    assert again.remove_node_ids == ("n2",)
    assert "not n3: gained work since the decision" in again.reason
    assert recheck(size, ()) is size


@pytest.mark.parametrize(
    ("gpus", "per_node", "nodes"), [(0, 2, 0), (1, 2, 1), (4, 2, 2), (5, 2, 3), (3, 8, 1)]
)
def test_nodes_wanted(gpus: int, per_node: int, nodes: int) -> None:
    assert nodes_wanted(gpus, per_node) == nodes


@pytest.mark.parametrize(
    ("gpus", "per_node", "match"),
    [(-1, 2, "requested_gpus must be >= 0"), (2, 0, "gpus_per_node must be >= 1")],
)
def test_bad_sizes_are_named(gpus: int, per_node: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        nodes_wanted(gpus, per_node)


def test_a_request_for_an_unknown_provider_is_named() -> None:
    with pytest.raises(ValueError, match=r"without a node shape: \['rent-z'\]"):
        decide(snap([]), {"rent-z": 2})


# --- the whole path against the fake API server and its KubeRay operator ------------------------


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    with running() as server:
        yield server


def operated_cluster(api: FakeKubeApi, **replicas: int) -> dict[str, list[str]]:
    """A RayCluster with one worker group per provider at `replicas`, the operator running:
    the pods it created, by provider, in the order it lists them."""
    groups = [group(f"gpu-external-{p}", n, 0, 8) for p, n in replicas.items()]
    api.add_raycluster(
        CLUSTER,
        namespace=NS,
        spec={"headGroupSpec": {"rayStartParams": {}}, "workerGroupSpecs": groups},
    )
    api.operate(CLUSTER, namespace=NS)
    return {p: [n for n in api.operator_created if f"-gpu-external-{p}-" in n] for p in replicas}


def pods_of(api: FakeKubeApi, provider: str) -> list[str]:
    prefix = f"/api/v1/namespaces/{NS}/pods/{CLUSTER}-gpu-external-{provider}-"
    return sorted(p.rsplit("/", 1)[1] for p in api.objects if p.startswith(prefix))


def group_spec(api: FakeKubeApi, provider: str) -> dict[str, Any]:
    rc = api.get(RC_PATH)
    assert rc is not None
    name = f"gpu-external-{provider}"
    return next(g for g in rc["spec"]["workerGroupSpecs"] if g["groupName"] == name)


def actuator(api: FakeKubeApi) -> KubernetesActuator:
    conf = k8s.Configuration()
    conf.host = api.url
    return KubernetesActuator(kube_config(), k8s.ApiClient(conf), sleep=lambda _s: None)


def external_group(
    act: KubernetesActuator,
    hostnames: Mapping[str, str],
    busy_now: Callable[[Sequence[str]], Collection[str]] | None = None,
) -> tuple[ExternalGroup, list[str]]:
    events: list[str] = []
    ext_group = ExternalGroup(
        GPUS_PER_NODE,
        lambda: act.scale_external,
        lambda _kind, message: events.append(message),
        hostname=hostnames.get,
        busy_now=busy_now or (lambda _ids: ()),
    )
    return ext_group, events


def test_a_return_deletes_only_the_emptied_pods_and_never_the_serving_one(
    api: FakeKubeApi,
) -> None:
    """Three external nodes of rent-a, two emptied by a return to the cluster pool, one still
    serving (the first pod in the operator's list: the one a bare ``replicas`` cut deletes)."""
    pods = operated_cluster(api, **{"rent-a": 3, "rent-b": 0})["rent-a"]
    assert len(pods) == 3 and pods == pods_of(api, "rent-a")
    hostnames = dict(zip(("n1", "n2", "n3"), pods, strict=True))
    snapshot = snap([ext("n1", free=0), ext("n2"), ext("n3")], [replica("n1")])
    api.operator_created.clear()
    with actuator(api) as act:
        ext_group, events = external_group(act, hostnames)
        ext_group.apply(decide(snapshot, {"rent-a": 2}))

    assert pods_of(api, "rent-a") == [hostnames["n1"]]  # the serving pod stays
    assert api.operator_deleted == [hostnames["n2"], hostnames["n3"]]  # nothing else
    assert api.operator_created == []
    spec = group_spec(api, "rent-a")
    assert spec["replicas"] == 1
    assert spec["scaleStrategy"]["workersToDelete"] == [hostnames["n2"], hostnames["n3"]]
    assert any("deleting" in e and hostnames["n2"] in e for e in events)


def test_the_group_is_never_cut_below_its_serving_nodes(api: FakeKubeApi) -> None:
    """Placement asks nothing more of rent-a, yet n1 still serves: the group goes to 1, not 0,
    and stays there until n1 is emptied too."""
    pods = operated_cluster(api, **{"rent-a": 3})["rent-a"]
    hostnames = dict(zip(("n1", "n2", "n3"), pods, strict=True))
    snapshot = snap([ext("n1", free=0), ext("n2"), ext("n3")], [replica("n1")])
    with actuator(api) as act:
        ext_group, _ = external_group(act, hostnames)
        ext_group.apply(
            external_shrink.decide(snapshot, {"rent-a": 0}, {"rent-a": 2}, PROVIDERS[:1])
        )
        assert pods_of(api, "rent-a") == [hostnames["n1"]]
        assert group_spec(api, "rent-a")["replicas"] == 1

        # Next tick: Ray still lists n2 and n3 while their pods go; naming them again must
        # not cut the group further (they are already in workersToDelete).
        ext_group.apply(
            external_shrink.decide(snapshot, {"rent-a": 0}, {"rent-a": 2}, PROVIDERS[:1])
        )
        assert pods_of(api, "rent-a") == [hostnames["n1"]]
        spec = group_spec(api, "rent-a")
        assert spec["replicas"] == 1
        assert spec["scaleStrategy"]["workersToDelete"] == []  # cleared: those pods are gone


def test_a_node_that_gained_a_replica_after_the_decision_is_not_named(api: FakeKubeApi) -> None:
    """n3 was empty at the decision; a fresh read just before the write shows a replica
    there (Serve placed one in between): only n2 is named and the group goes to 2."""
    pods = operated_cluster(api, **{"rent-a": 3})["rent-a"]
    hostnames = dict(zip(("n1", "n2", "n3"), pods, strict=True))
    snapshot = snap([ext("n1", free=0), ext("n2"), ext("n3")], [replica("n1")])
    sizes = external_shrink.decide(snapshot, {"rent-a": 2}, {"rent-a": 2}, PROVIDERS[:1])
    assert sizes[0].remove_node_ids == ("n2", "n3")
    read: list[list[str]] = []

    def busy_now(node_ids: Sequence[str]) -> set[str]:
        read.append(list(node_ids))
        return {"n3"}  # the fresh Serve view: a replica of llm started on n3

    with actuator(api) as act:
        ext_group, events = external_group(act, hostnames, busy_now)
        ext_group.apply(sizes)

    assert read == [["n2", "n3"]]
    assert api.operator_deleted == [hostnames["n2"]]
    assert pods_of(api, "rent-a") == [hostnames["n1"], hostnames["n3"]]
    spec = group_spec(api, "rent-a")
    assert (spec["replicas"], spec["scaleStrategy"]["workersToDelete"]) == (2, [hostnames["n2"]])
    assert any("not n3: gained work since the decision" in e for e in events)


def test_each_provider_loses_only_its_own_emptied_pods(api: FakeKubeApi) -> None:
    created = operated_cluster(api, **{"rent-a": 2, "rent-b": 2})
    a, b = created["rent-a"], created["rent-b"]
    hostnames = {"a1": a[0], "a2": a[1], "b1": b[0], "b2": b[1]}
    snapshot = snap(
        [ext("a1", free=0), ext("a2"), ext("b1", "rent-b"), ext("b2", "rent-b", free=0)],
        [replica("a1"), replica("b2", "embed")],
    )
    with actuator(api) as act:
        ext_group, _ = external_group(act, hostnames)
        ext_group.apply(decide(snapshot, {"rent-a": 2, "rent-b": 2}))
    assert (pods_of(api, "rent-a"), pods_of(api, "rent-b")) == ([a[0]], [b[1]])
    assert sorted(api.operator_deleted) == sorted([a[1], b[0]])
    assert group_spec(api, "rent-a")["scaleStrategy"]["workersToDelete"] == [a[1]]
    assert group_spec(api, "rent-b")["scaleStrategy"]["workersToDelete"] == [b[0]]


def test_a_node_without_a_pod_name_is_not_named_and_the_group_holds(api: FakeKubeApi) -> None:
    pods = operated_cluster(api, **{"rent-a": 2})["rent-a"]
    snapshot = snap([ext("n1"), ext("n2")])
    with actuator(api) as act:
        ext_group, _ = external_group(act, {"n1": pods[0]})  # Ray knows no hostname of n2
        ext_group.apply(
            external_shrink.decide(snapshot, {"rent-a": 0}, {"rent-a": 2}, PROVIDERS[:1])
        )
    assert api.operator_deleted == [pods[0]]
    assert group_spec(api, "rent-a")["replicas"] == 1


def test_growth_writes_replicas_alone(api: FakeKubeApi) -> None:
    operated_cluster(api, **{"rent-a": 1, "rent-b": 0})
    with actuator(api) as act:
        ext_group, _ = external_group(act, {})
        ext_group.apply(decide(snap([ext("n1", free=0)], [replica("n1")]), {"rent-a": 6}))
    spec = group_spec(api, "rent-a")
    assert spec["replicas"] == 3 and "scaleStrategy" not in spec
    assert len(pods_of(api, "rent-a")) == 3 and api.operator_deleted == []


# --- the fake's operator keeps to KubeRay's reconcile -------------------------------------------


def test_fake_operator_deletes_the_front_of_its_list_on_a_bare_cut(api: FakeKubeApi) -> None:
    """What today's ``replicas``-only write leads to: the first pods of the list go, whichever
    they are."""
    pods = operated_cluster(api, **{"rent-a": 3})["rent-a"]
    conf = k8s.Configuration()
    conf.host = api.url
    k8s.CustomObjectsApi(k8s.ApiClient(conf)).patch_namespaced_custom_object(
        "ray.io",
        "v1",
        NS,
        "rayclusters",
        CLUSTER,
        [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 1}],
        _content_type="application/json-patch+json",
    )
    assert api.operator_deleted == pods[:2]
    assert pods_of(api, "rent-a") == pods[2:]


def test_fake_operator_deletes_named_pods_even_at_the_same_replicas(api: FakeKubeApi) -> None:
    pods = operated_cluster(api, **{"rent-a": 2})["rent-a"]
    rc = api.objects[RC_PATH]
    rc["spec"]["workerGroupSpecs"][0]["scaleStrategy"] = {"workersToDelete": [pods[1]]}
    api.reconcile()
    assert api.operator_deleted == [pods[1]]
    assert len(pods_of(api, "rent-a")) == 2  # a replacement was created
    assert api.operator_created[-1] not in pods
    api.reconcile()  # KubeRay leaves the name in the object: it would delete it again if seen
    assert api.operator_deleted == [pods[1]]


def test_fake_operator_with_in_tree_autoscaling_deletes_nothing_unnamed(api: FakeKubeApi) -> None:
    pods = operated_cluster(api, **{"rent-a": 3})["rent-a"]
    rc = api.objects[RC_PATH]
    rc["spec"]["enableInTreeAutoscaling"] = True
    rc["spec"]["workerGroupSpecs"][0]["replicas"] = 1
    api.reconcile()
    assert api.operator_deleted == [] and pods_of(api, "rent-a") == pods
    rc["spec"]["workerGroupSpecs"][0]["scaleStrategy"] = {"workersToDelete": [pods[0]]}
    api.reconcile()
    assert api.operator_deleted == [pods[0]]
    assert pods_of(api, "rent-a") == pods[1:]
