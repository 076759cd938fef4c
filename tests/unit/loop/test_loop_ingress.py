"""The ingress's replica count through the loop: the load board's traffic -> decide
(`policies.ingress`) -> `ScaleIngress` -> the Serve actuator, on the loop's fakes; the view
reading the ingress target from Serve's status; the downscale timer surviving the store."""

from __future__ import annotations

from pathlib import Path

from controlplane.adapters.serve import view_from_status
from controlplane.loop.types import ServingPolicyState
from policies.demand import DemandState, Direction
from policies.ingress import IngressTraffic
from policies.snapshot import Pool
from tests.unit.loop_fakes import World, make_world

CONFIG = (
    "serving:\n"
    "  ingress:\n"
    "    num_replicas: 2\n"
    "    max_replicas: 6\n"
    "    downscale_delay_s: 10\n"
    "  models:\n"
    "    - name: sample\n"
    "      min_replicas: 1\n"
    "      max_replicas: 1\n"
)


def world(tmp_path: Path) -> World:
    w = make_world(tmp_path, "serve.deploy_app=true", config_text=CONFIG)
    w.cluster.add("c1", Pool.CLUSTER, gpus=2)
    w.serve.deploy("sample", cluster=1)
    w.serve.ingress_target = 2
    return w


def test_the_ingress_follows_the_request_rate_up_at_once_and_down_after_the_delay(
    tmp_path: Path,
) -> None:
    w = world(tmp_path)
    w.tick(3)
    assert w.serve.ingress_scales == []  # idle: the floor of 2 fits
    # 500 requests/s at 4 CPU ms each: 2 cores, at half a core per replica -> 4 replicas.
    w.serve.ingress = IngressTraffic(500.0, 4.0)
    w.tick()
    assert w.serve.ingress_scales == [4]
    assert any("2 -> 4" in m for m in w.events("serve.app.ingress.scale"))
    # Far more than max_replicas can carry: capped at 6.
    w.serve.ingress = IngressTraffic(5000.0, 4.0)
    w.tick()
    assert w.serve.ingress_scales == [4, 6]
    # Traffic gone: nothing moves before the 10 s delay, then back to the floor.
    w.serve.ingress = IngressTraffic()
    w.tick(9)
    assert w.serve.ingress_scales == [4, 6]
    w.tick(3)
    assert w.serve.ingress_scales == [4, 6, 2]


def test_an_ingress_serve_does_not_report_is_left_alone(tmp_path: Path) -> None:
    w = world(tmp_path)
    w.serve.ingress_target = 0  # Serve shows no ingress target: nothing to scale
    w.serve.ingress = IngressTraffic(500.0, 4.0)
    w.tick(3)
    assert w.serve.ingress_scales == []


def test_the_view_reads_the_ingress_target_and_the_timer_round_trips() -> None:
    status = {"deployed": True, "models": {}, "ingress": {"target": 3, "running": 3}}
    assert view_from_status(status, {}).ingress_target == 3
    assert view_from_status({"deployed": True, "models": {}}, {}).ingress_target == 0
    state = ServingPolicyState(ingress=DemandState(Direction.DOWN, 12.5, 3))
    assert ServingPolicyState.from_dict(state.to_dict()) == state
    assert ServingPolicyState.from_dict({"demand": {}}).ingress == DemandState()
