#!/usr/bin/env bash
# Zero-downtime upgrade of the control plane on KubeRay: a new image with the SAME Ray version.
#
#   infra/k8s/upgrade.sh IMAGE            (NAMESPACE=rcp, RAYCLUSTER=rcp by default)
#
# KubeRay does not replace running pods when the RayCluster's template changes, so this script
# changes the images and then replaces the pods itself, in the order that keeps traffic up
# (docs/operations.md, "Upgrade"):
#   1. the images: every container of the RayCluster (head, rcp-controller, both worker
#      groups) and the rcp-kube-actuator Deployment (a rolling update of one pod); the
#      rcp-edge Deployment runs HAProxy's own image, not this one, so it is not touched here
#      (its configuration changes with `kubectl apply -k`: docs/operations.md);
#   2. the gpu-cluster pods, one at a time: delete one (Ray drains it on SIGTERM: Serve moves
#      its replicas make-before-break and its proxy leaves rcp-serve's endpoints first), wait
#      until KubeRay's replacement is Ready and rcp-serve has as many endpoints as before,
#      then the next;
#   3. the head pod last: the workers keep serving through their proxies while it is away
#      (GCS fault tolerance, rcp-redis); wait until the new head is Ready.
# gpu-external pods are not touched: they turn over as the autoscaler scales them.
# Needs kubectl with rights to patch the RayCluster, the Deployment, and delete pods in the
# namespace (an operator's, not the control plane's). tests/unit/kube/test_k8s_upgrade.py runs it
# against a recording fake kubectl.
set -euo pipefail

IMAGE="${1:?usage: upgrade.sh IMAGE}"
NS="${NAMESPACE:-rcp}"
RC="${RAYCLUSTER:-rcp}"
TIMEOUT_S="${UPGRADE_TIMEOUT_S:-1800}"
POLL_S="${UPGRADE_POLL_S:-5}"
k() { kubectl -n "$NS" "$@"; }

wait_until() {  # wait_until DESCRIPTION COMMAND...: poll until COMMAND succeeds
  local what="$1"; shift
  local waited=0
  until "$@"; do
    if [ "$waited" -ge "$TIMEOUT_S" ]; then
      echo "upgrade: timed out after ${TIMEOUT_S}s waiting for $what" >&2
      exit 1
    fi
    sleep "$POLL_S"; waited=$((waited + POLL_S))
  done
}

serve_endpoints() {  # how many addresses rcp-serve routes to now
  k get endpoints rcp-serve -o jsonpath='{range .subsets[*].addresses[*]}{.ip}{"\n"}{end}' | grep -c . || true
}

serve_endpoints_at_least() { [ "$(serve_endpoints)" -ge "$1" ]; }

pod_lines() {  # pod_lines SELECTOR: "NAME READY" per pod, "NAME DELETING READY" if terminating
  k get pods -l "$1" -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.metadata.deletionTimestamp}{" "}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}'
}

pods_ready() {  # pods_ready SELECTOR COUNT: exactly COUNT pods, all Ready, none terminating
  local lines total ready
  lines=$(pod_lines "$1")
  total=$(printf '%s\n' "$lines" | grep -c . || true)
  ready=$(printf '%s\n' "$lines" | awk 'NF == 2 && $2 == "True"' | grep -c . || true)
  [ "$total" -eq "$2" ] && [ "$ready" -eq "$2" ]
}

echo "upgrade: images -> $IMAGE"
patch=$(k get raycluster "$RC" -o json | IMAGE="$IMAGE" python3 -c '
import json, os, sys
rc, image, ops = json.load(sys.stdin), os.environ["IMAGE"], []
head = rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
for i, _ in enumerate(head):
    ops.append({"op": "replace", "path": f"/spec/headGroupSpec/template/spec/containers/{i}/image", "value": image})
for g, group in enumerate(rc["spec"]["workerGroupSpecs"]):
    for i, _ in enumerate(group["template"]["spec"]["containers"]):
        ops.append({"op": "replace", "path": f"/spec/workerGroupSpecs/{g}/template/spec/containers/{i}/image", "value": image})
print(json.dumps(ops))')
k patch raycluster "$RC" --type=json -p "$patch"
k set image deployment/rcp-kube-actuator "kube-actuator=$IMAGE"
k rollout status deployment/rcp-kube-actuator --timeout="${TIMEOUT_S}s"

CLUSTER_PODS="ray.io/cluster=$RC,ray.io/group=gpu-cluster"
pods=$(pod_lines "$CLUSTER_PODS" | awk '{print $1}')
want=$(printf '%s\n' "$pods" | grep -c . || true)
for pod in $pods; do
  before=$(serve_endpoints)
  echo "upgrade: replacing $pod ($before serve endpoints)"
  k delete pod "$pod" --wait=true
  wait_until "gpu-cluster back at $want Ready pods" pods_ready "$CLUSTER_PODS" "$want"
  wait_until "rcp-serve back at $before endpoints" serve_endpoints_at_least "$before"
done

HEAD_POD="ray.io/cluster=$RC,ray.io/node-type=head"
echo "upgrade: replacing the head (traffic goes on through the workers)"
k delete pod -l "$HEAD_POD" --wait=true
wait_until "the new head Ready" pods_ready "$HEAD_POD" 1
echo "upgrade: done"
