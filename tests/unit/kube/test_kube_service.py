"""The ``rcp-kube-actuator`` service (controlplane/kube/service.py, its checks in
controlplane/kube/gate.py) and the controller's HTTP client of it (controlplane/kube/remote.py),
over real HTTP on 127.0.0.1, backed by the fake Kubernetes API server (tests/unit/kubeapi.py)
through the real `kubernetes` client.

The caller is treated as hostile: every refusal below is checked to write nothing to
Kubernetes. No Kubernetes API server runs here, so this fake is the protocol boundary.
"""

from __future__ import annotations

import http.client
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from kubernetes import client as k8s

from controlplane.config import ConfigError, KubeActuatorServiceConfig, load_config
from controlplane.kube import (
    KubeNotFoundError,
    KubeRateLimitedError,
    KubeRefusedError,
    KubernetesActuator,
    KubernetesActuatorError,
    RemoteKubernetesActuator,
    from_config,
)
from controlplane.kube.gate import MAX_REASON_CHARS, ActuatorService, NodeActionCap
from controlplane.kube.service import ActuatorServer, loggable, main
from controlplane.loop.act.nodes import Remediator
from tests.unit.kube.test_kube_actuator import (
    CLUSTER,
    KEY,
    NODE,
    NODE_PATH,
    NS,
    POD,
    POD_PATH,
    RC_PATH,
    add_cluster,
    group,
    kube_config,
    replicas_of,
    worker_labels,
)
from tests.unit.kubeapi import FakeKubeApi, running, write_kubeconfig
from tests.unit.loop.test_health_actuation import FakeNodes

TOKEN = "s3cret-" + "x" * 40
OTHER_NODE = "gpu-node-2"


# --- builders ---------------------------------------------------------------------------------


@dataclass
class Rig:
    api: FakeKubeApi
    server: ActuatorServer
    service: ActuatorService
    client: RemoteKubernetesActuator
    clock: list[float]
    token_file: Path

    def post(
        self,
        route: str,
        body: Any,
        *,
        token: str | None = TOKEN,
        content_type: str = "application/json",
        raw: bytes | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """A raw request, as hostile code would send it."""
        headers = {"Content-Type": content_type}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = raw if raw is not None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.server.url + route, data=data, headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


def make_rig(api: FakeKubeApi, tmp_path: Path, **overrides: Any) -> Iterator[Rig]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    service_cfg = KubeActuatorServiceConfig(
        **{"max_node_actions": 2, "window_s": 600.0, **overrides.pop("service", {})}
    )
    kc = kube_config(actuator_token_file=str(token_file), service=service_cfg, **overrides)
    conf = k8s.Configuration()
    conf.host = api.url
    actuator = KubernetesActuator(kc, k8s.ApiClient(conf), sleep=lambda _s: None)
    clock = [1000.0]
    service = ActuatorService(actuator, kc, providers=("rent-a", "rent-b"), clock=lambda: clock[0])
    server = ActuatorServer(service).start()
    kc_client = kube_config(actuator_url=server.url, actuator_token_file=str(token_file))
    try:
        yield Rig(api, server, service, RemoteKubernetesActuator(kc_client), clock, token_file)
    finally:
        server.stop()
        actuator.close()


@pytest.fixture
def api() -> Iterator[FakeKubeApi]:
    with running() as server:
        yield server


@pytest.fixture
def rig(api: FakeKubeApi, tmp_path: Path) -> Iterator[Rig]:
    yield from make_rig(api, tmp_path)


def add_worker(api: FakeKubeApi, name: str = POD, node: str | None = NODE, **kw: Any) -> None:
    api.add_pod(
        name,
        namespace=kw.pop("namespace", NS),
        node_name=node,
        labels=kw.pop("labels", worker_labels()),
        **kw,
    )


# --- the legitimate calls, end to end -----------------------------------------------------------


def test_remove_node_through_the_service_cordons_taints_and_deletes(rig: Rig) -> None:
    rig.api.add_node(NODE)
    add_worker(rig.api)
    result = rig.client.remove_node(POD, "gpu_overheated")
    assert (result.pod_name, result.node_name, result.pod_deleted) == (POD, NODE, True)
    assert result.cordon is not None and result.cordon.changed
    assert result.cordon.taint == f"{KEY}=gpu_overheated:NoSchedule"
    node = rig.api.get(NODE_PATH)
    assert node is not None and node["spec"]["unschedulable"] is True
    assert rig.api.get(POD_PATH) is None
    again = rig.client.remove_node(POD, "gpu_overheated")  # idempotent: the pod is gone
    assert (again.node_name, again.pod_deleted) == (None, False)


def test_cordon_through_the_service(rig: Rig) -> None:
    rig.api.add_node(NODE)
    add_worker(rig.api)
    result = rig.client.cordon(NODE, "xid_fatal")
    assert result.changed and result.node_name == NODE
    assert not rig.client.cordon(NODE, "xid_fatal").changed


def test_pod_for_ip_through_the_service(rig: Rig) -> None:
    add_worker(rig.api, pod_ip="10.0.0.7")
    assert rig.client.pod_for_ip("10.0.0.7") == POD
    assert rig.client.pod_for_ip("10.0.0.8") is None


def test_the_remediator_removes_a_node_through_the_service(rig: Rig) -> None:
    rig.api.add_node(NODE)
    add_worker(rig.api)
    events: list[tuple[str, str]] = []
    r = Remediator(
        FakeNodes(hostnames={"ray-node-a": POD}),
        drain_deadline_s=600,
        replace_drained=True,
        record=lambda k, m: events.append((k, m)),
        kube_remove=rig.client.remove_node,
    )
    r.cordon("ray-node-a", "unhealthy", now_s=0.5)
    assert r.replace("ray-node-a", "unhealthy", now_s=1.0, cause="gpu_overheated")
    assert rig.api.get(POD_PATH) is None
    assert POD in dict(events)["health.drain"]


def test_the_controllers_removal_treats_a_vanished_node_as_done(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    """404 from the service is KubeNotFoundError in the controller, as in-process."""
    from controlplane.controller.actor import _kube_remove

    for rig in make_rig(api, tmp_path):
        add_worker(api, node="node-that-is-gone")
        with pytest.raises(KubeNotFoundError, match="node-that-is-gone"):
            rig.client.remove_node(POD, "gpu_overheated")
        cfg = load_config(
            None,
            [
                "kubernetes.enabled=true",
                f"kubernetes.namespace={NS}",
                f"kubernetes.actuator_url={rig.server.url}",
                f"kubernetes.actuator_token_file={rig.token_file}",
            ],
        )
        remove = _kube_remove(cfg)
        assert remove is not None and remove(POD, "gpu_overheated") is None


@pytest.mark.parametrize(("owns", "expect"), [(True, 0), (False, 3)], ids=["autoscaler", "ours"])
def test_scale_external_follows_the_services_own_config(
    api: FakeKubeApi, tmp_path: Path, owns: bool, expect: int
) -> None:
    add_cluster(api)
    for rig in make_rig(api, tmp_path, autoscaler_owns_external=owns):
        result = rig.client.scale_external(3)
        assert replicas_of(api) == expect
        assert (result.refused is not None) == owns
        if owns:  # refused before reading anything
            assert not [r for r in api.requests if "rayclusters" in r.path]


def test_scale_external_sizes_the_named_providers_group(api: FakeKubeApi, tmp_path: Path) -> None:
    add_cluster(
        api,
        group("gpu-cluster", 2, 2, 2),
        group("gpu-external-rent-a", 0, 0, 4),
        group("gpu-external-rent-b", 0, 0, 4),
    )
    for rig in make_rig(api, tmp_path, autoscaler_owns_external=False):
        result = rig.client.scale_external(3, "rent-b")
        assert result.changed
        assert replicas_of(api, "gpu-external-rent-b") == 3
        assert replicas_of(api, "gpu-external-rent-a") == 0


# --- refusals: each writes nothing --------------------------------------------------------------


def _setup_refusals(api: FakeKubeApi) -> None:
    api.add_node(NODE)
    api.add_node(OTHER_NODE)
    api.add_node("head-node")
    api.add_node("foreign-node")
    api.add_node("done-node")
    add_worker(api, "rcp-head-xyz", "head-node", labels=worker_labels(node_type="head"))
    add_worker(api, "other-worker", "foreign-node", labels=worker_labels(cluster="other"))
    add_worker(api, POD, NODE, namespace="elsewhere")  # same name, another namespace
    add_worker(api, "finished", "done-node")
    api.objects[f"/api/v1/namespaces/{NS}/pods/finished"]["status"]["phase"] = "Succeeded"


LONG = "a" * 254


@pytest.mark.parametrize(
    ("route", "body", "status", "needle"),
    [
        pytest.param(
            "/v1/cordon",
            {"node_name": OTHER_NODE, "reason": "x"},
            403,
            "hosts no running worker pod",
            id="node-without-our-pod",
        ),
        pytest.param(
            "/v1/cordon",
            {"node_name": "head-node", "reason": "x"},
            403,
            "hosts no running worker pod",
            id="node-with-only-the-head",
        ),
        pytest.param(
            "/v1/cordon",
            {"node_name": "foreign-node", "reason": "x"},
            403,
            "hosts no running worker pod",
            id="node-of-another-raycluster",
        ),
        pytest.param(
            "/v1/cordon",
            {"node_name": "done-node", "reason": "x"},
            403,
            "hosts no running worker pod",
            id="node-with-a-finished-pod",
        ),
        pytest.param(
            "/v1/remove-node",
            {"pod_name": "rcp-head-xyz", "reason": "x"},
            403,
            "is the Ray head",
            id="head-pod",
        ),
        pytest.param(
            "/v1/remove-node",
            {"pod_name": "other-worker", "reason": "x"},
            403,
            "not a Ray pod of RayCluster",
            id="pod-of-another-raycluster",
        ),
        pytest.param(
            "/v1/remove-node",
            {"pod_name": POD, "reason": "x", "namespace": "elsewhere"},
            400,
            "unknown ['namespace']",
            id="caller-names-a-namespace",
        ),
        pytest.param(
            "/v1/remove-node",
            {"pod_name": f"elsewhere/{POD}", "reason": "x"},
            400,
            "DNS-1123",
            id="namespace-in-the-name",
        ),
        pytest.param(
            "/v1/cordon", {"node_name": "Node_1", "reason": "x"}, 400, "DNS-1123", id="name-not-dns"
        ),
        pytest.param(
            "/v1/cordon", {"node_name": LONG, "reason": "x"}, 400, "DNS-1123", id="name-too-long"
        ),
        pytest.param(
            "/v1/cordon", {"node_name": 7, "reason": "x"}, 400, "DNS-1123", id="name-not-a-string"
        ),
        pytest.param(
            "/v1/cordon",
            {"node_name": NODE, "reason": "a\nb"},
            400,
            "control",
            id="reason-control-chars",
        ),
        pytest.param(
            "/v1/cordon",
            {"node_name": NODE, "reason": "r" * (MAX_REASON_CHARS + 1)},
            400,
            "printable text",
            id="reason-too-long",
        ),
        pytest.param(
            "/v1/cordon", {"node_name": NODE}, 400, "missing ['reason']", id="missing-key"
        ),
        pytest.param("/v1/cordon", [NODE, "x"], 400, "JSON object", id="not-an-object"),
        pytest.param("/v1/scale-external", {"replicas": True}, 400, "integer", id="bool"),
        pytest.param("/v1/scale-external", {"replicas": -1}, 400, "0..", id="negative"),
        pytest.param("/v1/scale-external", {"replicas": 10**6}, 400, "0..", id="huge"),
        pytest.param(
            "/v1/scale-external",
            {"replicas": 1, "provider": "elsewhere"},
            400,
            "provider must be one of ['rent-a', 'rent-b']",
            id="unknown-provider",
        ),
        pytest.param(
            "/v1/scale-external",
            {"replicas": 1, "provider": "rent-a", "group": "gpu-cluster"},
            400,
            "unknown ['group']",
            id="extra-key",
        ),
        pytest.param("/v1/pod-for-ip", {"pod_ip": "10.0.0.1; rm"}, 400, "IPv4", id="bad-ip"),
        pytest.param("/v1/uncordon", {"node_name": NODE}, 404, "no such route", id="uncordon"),
        pytest.param("/v1/delete-pod", {"pod_name": POD}, 404, "no such route", id="other-route"),
    ],
)
def test_refused_requests_write_nothing(
    rig: Rig, route: str, body: Any, status: int, needle: str
) -> None:
    _setup_refusals(rig.api)
    add_worker(rig.api)  # a legitimate worker exists too: refusals are not "nothing there"
    got, answer = rig.post(route, body)
    assert got == status, answer
    assert needle in answer["error"], answer
    assert answer["request_id"]
    assert rig.api.writes() == []


def test_another_namespaces_pod_is_never_touched(rig: Rig) -> None:
    """The service reads only its own namespace: a same-named pod elsewhere is not found."""
    _setup_refusals(rig.api)
    result = rig.client.remove_node(POD, "x")
    assert (result.node_name, result.pod_deleted) == (None, False)
    assert rig.api.get(f"/api/v1/namespaces/elsewhere/pods/{POD}") is not None
    assert rig.api.writes() == []
    assert all(f"/namespaces/{NS}/" in r.path for r in rig.api.requests if "/pods" in r.path)


@pytest.mark.parametrize(
    ("token", "status"),
    [
        pytest.param(None, 401, id="no-token"),
        pytest.param("", 401, id="empty"),
        pytest.param(TOKEN[:-1], 401, id="prefix"),
        pytest.param(TOKEN + "x", 401, id="longer"),
        pytest.param("x" * len(TOKEN), 401, id="same-length"),
        pytest.param("\xe9" * len(TOKEN), 401, id="not-utf8"),  # urllib sends latin-1 bytes
        pytest.param(TOKEN[:-1] + "\xff", 401, id="last-byte-not-utf8"),
    ],
)
def test_a_bad_token_is_refused_before_anything_is_read(
    rig: Rig, token: str | None, status: int
) -> None:
    add_worker(rig.api)
    got, answer = rig.post("/v1/remove-node", {"pod_name": POD, "reason": "x"}, token=token)
    assert got == status and "token" in answer["error"] and answer["request_id"]
    assert rig.api.requests == []


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param("authorized", id="in-the-auth-check"),
        pytest.param("cordon", id="in-the-action"),
    ],
)
def test_an_unexpected_exception_is_a_json_500_with_the_request_id(
    rig: Rig, broken: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def boom(*_args: Any) -> Any:
        raise LookupError("a bug")

    monkeypatch.setattr(rig.service, broken, boom)
    with caplog.at_level(logging.ERROR, logger="controlplane.kube.service"):
        got, answer = rig.post("/v1/cordon", {"node_name": NODE, "reason": "x"})
    assert got == 500 and answer["request_id"]
    assert "a bug" not in answer["error"] and "see the service's log" in answer["error"]
    assert any(answer["request_id"] in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_missing_or_short_token_file_refuses_every_call(rig: Rig) -> None:
    rig.token_file.write_text("short")
    got, answer = rig.post("/v1/cordon", {"node_name": NODE, "reason": "x"}, token="short")
    assert got == 503
    rig.token_file.unlink()
    got, _ = rig.post("/v1/cordon", {"node_name": NODE, "reason": "x"})
    assert got == 503
    assert rig.api.requests == []


def test_a_rotated_token_takes_effect_without_a_restart(rig: Rig) -> None:
    rig.api.add_node(NODE)
    add_worker(rig.api)
    rotated = "rotated-" + "y" * 40
    rig.token_file.write_text(rotated)
    assert rig.post("/v1/cordon", {"node_name": NODE, "reason": "x"})[0] == 401
    assert rig.post("/v1/cordon", {"node_name": NODE, "reason": "x"}, token=rotated)[0] == 200
    assert rig.client.cordon(NODE, "x").node_name == NODE  # the client re-reads its file too


def test_an_oversize_body_is_413(rig: Rig) -> None:
    body = {"node_name": NODE, "reason": "r" * 5000}
    got, answer = rig.post("/v1/cordon", body)
    assert got == 413 and "4096 bytes" in answer["error"]
    assert rig.api.requests == []


@pytest.mark.parametrize(
    ("raw", "content_type", "status"),
    [
        pytest.param(b'{"node_name": "a", "reason": NaN}', "application/json", 400, id="nan"),
        pytest.param(b"[" * 100 + b"]" * 100, "application/json", 400, id="deep"),
        pytest.param(b"\xff\xfe", "application/json", 400, id="not-utf8"),
        pytest.param(b'{"node_name": "a"}', "text/plain", 415, id="not-json"),
    ],
)
def test_malformed_bodies_are_4xx(rig: Rig, raw: bytes, content_type: str, status: int) -> None:
    got, _ = rig.post("/v1/cordon", None, raw=raw, content_type=content_type)
    assert got == status
    assert rig.api.requests == []


# --- the rate cap -----------------------------------------------------------------------------


def test_past_the_rate_cap_node_actions_are_429_until_the_window_moves(rig: Rig) -> None:
    for i in range(4):
        rig.api.add_node(f"n{i}")
        add_worker(rig.api, f"w{i}", f"n{i}")
    assert rig.client.cordon("n0", "x").changed
    assert rig.client.remove_node("w1", "x").pod_deleted
    with pytest.raises(KubeRateLimitedError, match="max_node_actions"):
        rig.client.cordon("n2", "x")
    with pytest.raises(KubeRateLimitedError):
        rig.client.remove_node("w3", "x")
    with pytest.raises(KubeRateLimitedError):  # n0 is counted, deleting w0 is a new action
        rig.client.remove_node("w0", "x")
    assert rig.api.get(f"/api/v1/namespaces/{NS}/pods/w3") is not None
    assert rig.api.get(f"/api/v1/namespaces/{NS}/pods/w0") is not None
    n2 = rig.api.get("/api/v1/nodes/n2")
    assert n2 is not None and not n2["spec"].get("unschedulable")
    assert not rig.client.cordon("n0", "x").changed  # a repeat: free
    rig.clock[0] += 600
    assert rig.client.cordon("n2", "x").changed


def test_unscheduled_worker_pods_count_against_the_cap(rig: Rig) -> None:
    """Finding 4 of issue 26: with the cap full, 10 unscheduled worker pods were deleted."""
    for node in ("n0", "n1"):
        rig.api.add_node(node)
        add_worker(rig.api, f"w-{node}", node)
        rig.client.cordon(node, "x")
    pods = [f"pending-{i}" for i in range(10)]
    for pod in pods:
        add_worker(rig.api, pod, None)
    for pod in pods:
        with pytest.raises(KubeRateLimitedError):
            rig.client.remove_node(pod, "x")
    assert [p for p in pods if rig.api.get(f"/api/v1/namespaces/{NS}/pods/{p}") is None] == []
    assert [r.path for r in rig.api.writes() if r.method == "DELETE"] == []


def _bind_on_second_read(node: str) -> Any:
    """A scheduler that binds the pod to `node` after the first read of it."""
    reads = [0]

    def bind(pod: dict[str, Any]) -> None:
        reads[0] += 1
        if reads[0] == 2:
            pod["spec"]["nodeName"] = node

    return bind


@pytest.mark.parametrize(
    ("filled", "outcomes"),
    [
        pytest.param(2, ["429", "429", "429"], id="cap-full"),
        pytest.param(0, ["deleted", "deleted", "429"], id="cap-free"),
    ],
)
def test_a_pod_bound_after_the_check_gets_no_node_cordoned_outside_the_cap(
    rig: Rig, filled: int, outcomes: list[str]
) -> None:
    """Finding 4 of issue 26: a pod bound between the service's check and the actuator's
    re-read let three more nodes be cordoned outside the cap. One read now serves the check,
    the count and the action, so the node it was bound to later is never cordoned."""
    for i in range(filled):
        rig.api.add_node(f"full-{i}")
        add_worker(rig.api, f"w-full-{i}", f"full-{i}")
        rig.client.cordon(f"full-{i}", "x")
    for i in range(3):
        rig.api.add_node(f"x{i}")
        add_worker(rig.api, f"p{i}", None)
        path = f"/api/v1/namespaces/{NS}/pods/p{i}"
        rig.api.interfere("GET", path, _bind_on_second_read(f"x{i}"), times=2)
    got = []
    for i in range(3):
        try:
            got.append("deleted" if rig.client.remove_node(f"p{i}", "x").pod_deleted else "no")
        except KubeRateLimitedError:
            got.append("429")
    assert got == outcomes
    node_patches = [r.path for r in rig.api.writes() if r.path.startswith("/api/v1/nodes/x")]
    assert node_patches == []


@pytest.mark.parametrize(
    ("actions", "admitted"),
    [
        pytest.param(
            [({"node a"}, 0), ({"node b"}, 10), ({"node c"}, 20)],
            [True, True, False],
            id="third-refused",
        ),
        pytest.param(
            [({"node a"}, 0), ({"node a"}, 5), ({"node b"}, 10)],
            [True, True, True],
            id="repeat-is-free",
        ),
        pytest.param(
            [({"node a"}, 0), ({"node b"}, 10), ({"node c"}, 601)],
            [True, True, True],
            id="window-moves",
        ),
        pytest.param(
            [({"pod 1", "node a"}, 0), ({"node a"}, 5), ({"pod 1", "node a"}, 6)],
            [True, True, True],
            id="cordon-of-a-removed-pods-node-is-free",
        ),
        pytest.param(
            [({"node a"}, 0), ({"pod 1", "node a"}, 5), ({"pod 2"}, 6)],
            [True, True, False],
            id="a-new-pod-on-a-counted-node-takes-a-slot",
        ),
        pytest.param(
            [({"pod 1"}, 0), ({"pod 2"}, 1), ({"pod 3"}, 2)],
            [True, True, False],
            id="unscheduled-pods-count",
        ),
    ],
)
def test_node_action_cap(actions: list[tuple[set[str], float]], admitted: list[bool]) -> None:
    cap = NodeActionCap(max_actions=2, window_s=600)
    assert [cap.admit(frozenset(o), t) for o, t in actions] == admitted


def test_a_zero_cap_refuses_every_node_action(api: FakeKubeApi, tmp_path: Path) -> None:
    api.add_node(NODE)
    add_worker(api)
    for rig in make_rig(api, tmp_path, service={"max_node_actions": 0}):
        with pytest.raises(KubeRateLimitedError):
            rig.client.remove_node(POD, "x")
    assert api.writes() == []


# --- client errors, logging, wiring -------------------------------------------------------------


def test_refusals_reach_the_controller_as_refused_errors(rig: Rig) -> None:
    _setup_refusals(rig.api)
    with pytest.raises(KubeRefusedError, match="Ray head"):
        rig.client.remove_node("rcp-head-xyz", "x")


def test_an_unreachable_service_names_its_url(tmp_path: Path) -> None:
    token = tmp_path / "t"
    token.write_text(TOKEN)
    client = RemoteKubernetesActuator(
        kube_config(actuator_url="http://127.0.0.1:9", actuator_token_file=str(token))
    )
    with pytest.raises(KubernetesActuatorError, match=r"127\.0\.0\.1:9.*actuator_url"):
        client.cordon(NODE, "x")


def test_uncordon_is_not_offered_to_the_head(rig: Rig) -> None:
    with pytest.raises(KubernetesActuatorError, match="kubectl uncordon"):
        rig.client.uncordon(NODE)


def test_every_request_is_logged(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    rig.api.add_node(NODE)
    add_worker(rig.api)
    with caplog.at_level(logging.INFO, logger="controlplane.kube.service"):
        rig.client.cordon(NODE, "xid_fatal")
        rig.post("/v1/cordon", {"node_name": OTHER_NODE, "reason": "x"}, token="nope")
    text = caplog.text
    assert "POST /v1/cordon -> 200" in text and '"changed": true' in text
    assert "POST /v1/cordon -> 401" in text


FORGED = "request abc from 10.0.0.1: POST /v1/remove-node -> 200"


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/v1/cordon%0A" + quote(FORGED), id="newline"),
        pytest.param("/v1/cordon%0D%0A" + quote(FORGED), id="crlf"),
        pytest.param("/v1/cordon%E2%80%A8" + quote(FORGED), id="unicode-line-separator"),
    ],
)
def test_a_decoded_path_cannot_forge_a_log_line(
    rig: Rig, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Low item of issue 26: an unauthenticated ``%0A`` wrote a forged line into the log."""
    host, port = rig.server.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    with caplog.at_level(logging.INFO, logger="controlplane.kube.service"):
        conn.request("POST", path, body=b"{}", headers={"Content-Type": "application/json"})
        assert conn.getresponse().status == 401
    conn.close()
    lines = [r.getMessage() for r in caplog.records]
    assert [m for m in lines if "\n" in m or "\r" in m or "\u2028" in m] == []
    assert any(FORGED in m and "-> 401" in m for m in lines), lines


@pytest.mark.parametrize(
    ("text", "logged"),
    [
        pytest.param("/v1/cordon", "/v1/cordon", id="plain"),
        pytest.param("/a\nb", "/a\\nb", id="newline"),
        pytest.param("/a\x1b[31mb", "/a\\x1b[31mb", id="escape-sequence"),
        pytest.param("/a\x85b", "/a\\x85b", id="next-line"),
        pytest.param("/" + "a" * 300, "/" + "a" * 255 + "...", id="long"),
    ],
)
def test_loggable(text: str, logged: str) -> None:
    assert loggable(text) == logged


def test_from_config_gives_the_controller_the_client_and_the_service_the_api(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    kubeconfig = write_kubeconfig(api, tmp_path / "kubeconfig")
    cfg = load_config(
        None,
        [
            "kubernetes.enabled=true",
            "kubernetes.in_cluster=false",
            f"kubernetes.kubeconfig={kubeconfig}",
            "kubernetes.actuator_url=http://rcp-kube-actuator.rcp.svc:8080",
        ],
    )
    assert isinstance(from_config(cfg), RemoteKubernetesActuator)
    direct = from_config(cfg, direct=True)
    assert isinstance(direct, KubernetesActuator)
    direct.close()


@pytest.mark.parametrize(
    "url",
    ["ftp://x", "http://user:pw@x:8080", "http://x:8080/v1", "http://x?a=1", "x:8080", "http://"],
)
def test_actuator_url_must_be_a_bare_http_address(url: str) -> None:
    with pytest.raises(ConfigError, match="kubernetes.actuator_url"):
        load_config(None, [f"kubernetes.actuator_url={url}"])


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("kubernetes.service.port=0", "kubernetes.service.port"),
        ("kubernetes.service.max_node_actions=-1", "kubernetes.service.max_node_actions"),
        ("kubernetes.service.window_s=0", "kubernetes.service.window_s"),
        ("kubernetes.service.max_body_bytes=10", "kubernetes.service.max_body_bytes"),
    ],
)
def test_service_config_is_validated(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        load_config(None, [override])


def test_main_refuses_to_start_without_a_token(api: FakeKubeApi, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(api, tmp_path / "kubeconfig")
    args = [
        "kubernetes.enabled=true",
        "kubernetes.in_cluster=false",
        f"kubernetes.kubeconfig={kubeconfig}",
        f"kubernetes.actuator_token_file={tmp_path / 'missing'}",
    ]
    assert main(args) == 2
    assert main(["kubernetes.enabled=false"]) == 2


# --- scale-external with the pods a shrink takes ------------------------------------------------

EXTERNAL_GROUPS = (
    group("gpu-cluster", 2, 2, 2),
    group("gpu-external-rent-a", 2, 0, 4),
    group("gpu-external-rent-b", 1, 0, 4),
)


def _setup_names(api: FakeKubeApi) -> None:
    add_cluster(api, *EXTERNAL_GROUPS)
    for name, grp, cluster, node_type in (
        ("rent-a-w1", "gpu-external-rent-a", CLUSTER, "worker"),
        ("rent-a-w2", "gpu-external-rent-a", CLUSTER, "worker"),
        ("rent-b-w1", "gpu-external-rent-b", CLUSTER, "worker"),
        ("cluster-w1", "gpu-cluster", CLUSTER, "worker"),
        ("rcp-head-xyz", "headgroup", CLUSTER, "head"),
        ("other-rc-w1", "gpu-external-rent-a", "other", "worker"),
    ):
        labels = {**worker_labels(cluster=cluster, node_type=node_type), "ray.io/group": grp}
        add_worker(api, name, None, labels=labels)


@pytest.mark.parametrize(
    ("names", "status", "needle"),
    [
        pytest.param(["rent-a-w2", "rcp-head-xyz"], 403, "is the Ray head", id="head-pod"),
        pytest.param(
            ["rent-b-w1"],
            403,
            "is a worker of group 'gpu-external-rent-b', not of 'gpu-external-rent-a'",
            id="another-providers-pod",
        ),
        pytest.param(
            ["cluster-w1"],
            403,
            "is a worker of group 'gpu-cluster', not of 'gpu-external-rent-a'",
            id="the-cluster-groups-pod",
        ),
        pytest.param(
            ["other-rc-w1"], 403, "not a Ray pod of RayCluster", id="another-rayclusters-pod"
        ),
        pytest.param(["Rent_A"], 400, "workers_to_delete[0] must be a DNS-1123", id="bad-name"),
        pytest.param(["rent-a-w2", "rent-a-w2"], 400, "names pods twice", id="repeated"),
        pytest.param("rent-a-w2", 400, "must be a list", id="not-a-list"),
        pytest.param(["x"] * 1001, 413, "larger than", id="too-many"),
    ],
)
def test_scale_external_refuses_names_that_are_not_the_groups_workers(
    api: FakeKubeApi, tmp_path: Path, names: Any, status: int, needle: str
) -> None:
    """The names go to ``workersToDelete``, which KubeRay's operator deletes by name in the
    namespace whatever the pod is: only workers of the group being scaled pass."""
    _setup_names(api)
    for rig in make_rig(api, tmp_path, autoscaler_owns_external=False):
        body = {"replicas": 1, "provider": "rent-a", "workers_to_delete": names}
        got, answer = rig.post("/v1/scale-external", body)
        assert got == status, answer
        assert needle in answer["error"], answer
        assert rig.api.writes() == []
        assert (
            replicas_of(api, "gpu-external-rent-a"),
            replicas_of(api, "gpu-external-rent-b"),
        ) == (
            2,
            1,
        )


def test_scale_external_takes_the_named_workers_through_the_client(
    api: FakeKubeApi, tmp_path: Path
) -> None:
    _setup_names(api)
    for rig in make_rig(api, tmp_path, autoscaler_owns_external=False):
        with pytest.raises(KubeRefusedError, match="is the Ray head"):
            rig.client.scale_external(1, "rent-a", ["rcp-head-xyz"])
        result = rig.client.scale_external(1, "rent-a", ["rent-a-w2"])
        assert (result.changed, result.named, result.replicas) == (True, ("rent-a-w2",), 1)
        rc = api.get(RC_PATH)
        assert rc is not None
        external = rc["spec"]["workerGroupSpecs"][1]
        assert external["scaleStrategy"] == {"workersToDelete": ["rent-a-w2"]}
        assert rig.service.cap.admitted == []  # names choose which pods, not how many
