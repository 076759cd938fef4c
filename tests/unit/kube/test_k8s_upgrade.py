"""infra/k8s/upgrade.sh, the scripted zero-downtime control-plane upgrade, run against a fake
`kubectl` (no Kubernetes API server runs here: the test stops at kubectl's command line).

The fake keeps a small cluster in a JSON file: the RayCluster of infra/k8s/raycluster.yaml,
gpu-cluster pods, the head pod, and the rcp-serve endpoints. A deleted pod is replaced by a
new one that turns Ready after a few polls (and only then is an endpoint of rcp-serve again,
like a pod whose proxy's readiness probe passes). Every call is recorded, so the test checks
the order: images first, cluster pods one at a time, each replaced and serving before the
next is deleted, the head last.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "infra" / "k8s" / "upgrade.sh"
IMAGE = "registry.example.com/rcp/ray-controlplane:0.2.0"

FAKE_KUBECTL = r"""
import json, sys
STATE = sys.argv[0] + ".state.json"
s = json.load(open(STATE))
args = sys.argv[1:]
s["calls"].append(args)
assert args[:2] == ["-n", "rcp"], args
a = args[2:]

def save():
    json.dump(s, open(STATE, "w"))

def matches(pod, selector):
    return all(pod["labels"].get(k) == v for k, v in (kv.split("=") for kv in selector.split(",")))

def tick():
    for pod in s["pods"]:
        if not pod["ready"]:
            pod["polls"] += 1
            pod["ready"] = pod["polls"] >= s["polls_to_ready"]

if a[:2] == ["get", "raycluster"]:
    print(json.dumps(s["raycluster"]))
elif a[:2] == ["patch", "raycluster"]:
    s["patched"] = json.loads(a[a.index("-p") + 1])
elif a[:2] == ["set", "image"] or a[:2] == ["rollout", "status"]:
    pass
elif a[:2] == ["get", "pods"]:
    tick()
    for pod in s["pods"]:
        if matches(pod, a[a.index("-l") + 1]):
            print(f"{pod['name']}  {'True' if pod['ready'] else 'False'}")
elif a[:2] == ["get", "endpoints"]:
    for pod in s["pods"]:
        if pod["ready"] and pod["labels"].get("rcp.dev/serve-proxy") == "true":
            print(pod["ip"])
elif a[:2] == ["delete", "pod"]:
    if "-l" in a:
        victims = [p for p in s["pods"] if matches(p, a[a.index("-l") + 1])]
    else:
        victims = [p for p in s["pods"] if p["name"] == a[2]]
    for pod in victims:
        s["pods"].remove(pod)
        s["counter"] += 1
        if s["replace"]:
            s["pods"].append(dict(pod, name=f"{pod['name']}-r{s['counter']}", ready=False,
                                  polls=0, ip=f"10.0.9.{s['counter']}"))
else:
    sys.exit(f"fake kubectl: unexpected {a}")
save()
"""


def _pod(name: str, node_type: str, group: str, ip: str) -> dict[str, Any]:
    labels = {"ray.io/cluster": "rcp", "ray.io/node-type": node_type, "ray.io/group": group}
    labels["rcp.dev/serve-proxy"] = "true"
    return {"name": name, "labels": labels, "ready": True, "polls": 0, "ip": ip}


def run_upgrade(
    tmp_path: Path, replace: bool = True
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(f"#!{sys.executable}\n{FAKE_KUBECTL}")
    kubectl.chmod(0o755)
    raycluster = yaml.safe_load((ROOT / "infra" / "k8s" / "raycluster.yaml").read_text())
    state = {
        "raycluster": raycluster,
        "pods": [
            _pod("rcp-head-x", "head", "headgroup", "10.0.0.1"),
            _pod("rcp-gpu-cluster-a", "worker", "gpu-cluster", "10.0.0.2"),
            _pod("rcp-gpu-cluster-b", "worker", "gpu-cluster", "10.0.0.3"),
            _pod("rcp-gpu-external-c", "worker", "gpu-external", "10.0.0.4"),
        ],
        "calls": [],
        "counter": 0,
        "polls_to_ready": 3,
        "replace": replace,
    }
    state_file = Path(str(kubectl) + ".state.json")
    state_file.write_text(json.dumps(state))
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "UPGRADE_POLL_S": "0",
        "UPGRADE_TIMEOUT_S": "5" if replace else "0",
    }
    done = subprocess.run(
        ["bash", str(SCRIPT), IMAGE], env=env, capture_output=True, text=True, timeout=120
    )
    return done, json.loads(state_file.read_text())


def _deletes(calls: list[list[str]]) -> list[tuple[int, list[str]]]:
    return [(i, c[2:]) for i, c in enumerate(calls) if c[2:4] == ["delete", "pod"]]


def test_upgrade_sets_every_image_then_replaces_cluster_pods_one_by_one_and_the_head_last(
    tmp_path: Path,
) -> None:
    done, state = run_upgrade(tmp_path)
    assert done.returncode == 0, done.stderr
    calls = state["calls"]
    # Every container of the RayCluster gets the new image, before any pod is deleted.
    rc = state["raycluster"]["spec"]
    n_containers = len(rc["headGroupSpec"]["template"]["spec"]["containers"]) + sum(
        len(g["template"]["spec"]["containers"]) for g in rc["workerGroupSpecs"]
    )
    assert len(state["patched"]) == n_containers
    assert {op["value"] for op in state["patched"]} == {IMAGE}
    deletes = _deletes(calls)
    first_delete = deletes[0][0]
    patch_at = next(i for i, c in enumerate(calls) if c[2:4] == ["patch", "raycluster"])
    set_images = [i for i, c in enumerate(calls) if c[2:4] == ["set", "image"]]
    assert patch_at < first_delete and all(i < first_delete for i in set_images)
    assert [calls[i][4:] for i in set_images] == [
        ["deployment/rcp-kube-actuator", f"kube-actuator={IMAGE}"],
    ]
    # The edge runs HAProxy's image (infra/k8s/edge.yaml), never the control plane's.
    assert not any("rcp-edge" in " ".join(c) for c in calls)
    # The cluster pods one at a time, the head last; the external pod is left alone.
    assert [d[2] for _, d in deletes[:2]] == ["rcp-gpu-cluster-a", "rcp-gpu-cluster-b"]
    assert "ray.io/node-type=head" in deletes[2][1][deletes[2][1].index("-l") + 1]
    assert len(deletes) == 3
    # Between two deletions, the script waited for the replacement to serve again.
    between = calls[deletes[0][0] + 1 : deletes[1][0]]
    assert any(c[2:4] == ["get", "endpoints"] for c in between)
    assert sum(c[2:4] == ["get", "pods"] for c in between) >= 3  # polled until Ready
    names = {p["name"] for p in state["pods"]}
    assert "rcp-gpu-external-c" in names and not names & {"rcp-gpu-cluster-a", "rcp-head-x"}


def test_a_replacement_that_never_comes_stops_the_upgrade_before_the_head(
    tmp_path: Path,
) -> None:
    done, state = run_upgrade(tmp_path, replace=False)
    assert done.returncode != 0
    assert "timed out" in done.stderr
    deleted = [d for _, d in _deletes(state["calls"])]
    assert deleted == [["delete", "pod", "rcp-gpu-cluster-a", "--wait=true"]]


@pytest.mark.parametrize("args", [[], ["", "extra"]], ids=["no-image", "empty-image"])
def test_upgrade_needs_an_image(tmp_path: Path, args: list[str]) -> None:
    done = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "usage: upgrade.sh IMAGE" in done.stderr
