"""A loopback fake of the Kubernetes API server, for the Kubernetes actuator's tests.

Owns: an in-memory store of nodes, pods and KubeRay RayClusters served over real HTTP on
127.0.0.1 (a free port), with the paths, verbs, status codes and `Status` error bodies of a
real API server, so the actuator is tested through the real `kubernetes` client:

* ``GET|PATCH /api/v1/nodes/{name}``
* ``GET|DELETE /api/v1/namespaces/{ns}/pods/{name}``,
  ``GET /api/v1/namespaces/{ns}/pods?labelSelector=...`` (equality-based selectors)
* ``GET|PATCH|PUT /apis/ray.io/v1/namespaces/{ns}/rayclusters/{name}``

Semantics it implements, as a real server does:

* PATCH content types: ``application/merge-patch+json`` (RFC 7386),
  ``application/json-patch+json`` (RFC 6902: add, remove, replace, move, copy, test; a failed
  op is 422 and nothing is applied), ``application/strategic-merge-patch+json`` (built-in kinds
  only; a custom resource answers 415, as a real server does). Any other type is 415.
* Strategic merge: maps merge, ``null`` deletes, lists are replaced whole unless listed in
  `SMP_MERGE_KEYS`. ``Node.spec.taints`` is NOT listed: in Kubernetes it carries no
  ``patchStrategy``/``patchMergeKey``, so a strategic-merge patch replaces the whole taint list
  (which is why Kubernetes' own controllers send the full list with a resourceVersion).
  ``$patch``-style directives are rejected with 400 rather than silently misapplied.
* Optimistic concurrency: a write whose (patched) object carries a ``metadata.resourceVersion``
  other than the stored one is 409 Conflict; PUT without one is 422. A patch that changes
  nothing does not bump the resourceVersion. PUT on a RayCluster keeps the stored ``status``
  (status is a subresource).
* DELETE honours ``gracePeriodSeconds`` (query or body) and ``preconditions.uid`` (409 when it
  does not match); the pod is gone at once and the response is the pod with
  ``deletionTimestamp`` set.

The KubeRay operator, for a RayCluster a test hands to `operate` (off unless asked, so tests
of the API alone see only their own writes): after every write the fake accepts, and at once
when asked, each worker group is reconciled as KubeRay's ``reconcilePods`` does:

1. every pod named in the group's ``scaleStrategy.workersToDelete`` is deleted, whatever the
   group's ``replicas`` (the operator deletes by name in the namespace, as its source does;
   the name list is left in the object: KubeRay clears it only in memory);
2. the group's worker pods (labels ``ray.io/cluster``, ``ray.io/group``,
   ``ray.io/node-type=worker``) are counted against ``replicas``: missing pods are created
   (``<cluster>-<group>-worker-<n>``, unscheduled), surplus pods are deleted from the front of
   the list (the order the API lists them: by name) when ``enableInTreeAutoscaling`` is not
   true, and none are deleted when it is (the autoscaler names what goes).

`operator_deleted` and `operator_created` record the operator's own writes (not `requests`).

Test hooks: `requests` records every request (method, path, query, content type, body, status);
`interfere` makes "another writer" change an object just before our next N requests to it, so
conflicts come from the resourceVersion check itself, not from a canned answer.

Must not: be imported by product code, or accept a call it does not model (it answers 404, 405,
400 or 415 with a Status body instead).
"""

from __future__ import annotations

import copy
import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["FakeKubeApi", "PatchError", "Recorded", "json_patch", "merge_patch", "running"]

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"

SMP_MERGE_KEYS: dict[str, dict[tuple[str, ...], str]] = {
    # resource -> {path of a list: its patchMergeKey}; lists not named here are atomic.
    "nodes": {("status", "conditions"): "type", ("status", "addresses"): "type"},
    "pods": {("spec", "containers"): "name", ("status", "conditions"): "type"},
}

_ROUTES: list[tuple[re.Pattern[str], str, frozenset[str]]] = [
    (re.compile(r"/api/v1/nodes/(?P<name>[^/]+)"), "nodes", frozenset({"GET", "PATCH"})),
    (
        re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<name>[^/]+)"),
        "pods",
        frozenset({"GET", "DELETE"}),
    ),
    (re.compile(r"/api/v1/namespaces/(?P<ns>[^/]+)/pods"), "pods", frozenset({"GET"})),
    (
        re.compile(r"/apis/ray\.io/v1/namespaces/(?P<ns>[^/]+)/rayclusters/(?P<name>[^/]+)"),
        "rayclusters.ray.io",
        frozenset({"GET", "PATCH", "PUT"}),
    ),
]
_CUSTOM = {"rayclusters.ray.io"}


class PatchError(Exception):
    """A patch that cannot be applied: `code` is the HTTP status a real server answers."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str | None
    body: Any
    status: int


@dataclass
class _Hook:
    method: str
    path: str
    action: Callable[[FakeKubeApi], None]
    times: int


# --- RFC 7386 JSON merge patch ----------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes a member, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- strategic merge patch (the subset Kubernetes defines for built-in kinds) -----------------


def strategic_merge_patch(
    target: Any, patch: Any, merge_keys: dict[tuple[str, ...], str], path: tuple[str, ...] = ()
) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            raise PatchError(400, f"strategic merge directive {key!r} is not modelled by the fake")
        here = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and here in merge_keys:
            result[key] = _merge_list(result.get(key), value, merge_keys, here)
        else:
            result[key] = strategic_merge_patch(result.get(key), value, merge_keys, here)
    return result


def _merge_list(
    target: Any, items: list[Any], merge_keys: dict[tuple[str, ...], str], path: tuple[str, ...]
) -> list[Any]:
    mkey = merge_keys[path]
    merged = copy.deepcopy(target) if isinstance(target, list) else []
    for item in items:
        if not isinstance(item, dict) or mkey not in item:
            raise PatchError(400, f"{'.'.join(path)}: every item needs its merge key {mkey!r}")
        for i, old in enumerate(merged):
            if isinstance(old, dict) and old.get(mkey) == item[mkey]:
                merged[i] = strategic_merge_patch(old, item, merge_keys, path)
                break
        else:
            merged.append(strategic_merge_patch({}, item, merge_keys, path))
    return merged


# --- RFC 6902 JSON patch with RFC 6901 pointers -----------------------------------------------


def _tokens(pointer: Any) -> list[str]:
    if not isinstance(pointer, str) or (pointer and not pointer.startswith("/")):
        raise PatchError(422, f"invalid JSON pointer {pointer!r}")
    if pointer == "":
        return []
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _index(token: str, size: int, *, append_ok: bool) -> int:
    if append_ok and token == "-":
        return size
    if not re.fullmatch(r"0|[1-9][0-9]*", token):
        raise PatchError(422, f"array index {token!r} is not a number")
    i = int(token)
    if i > size or (i == size and not append_ok):
        raise PatchError(422, f"array index {i} out of range (length {size})")
    return i


def _parent(doc: Any, tokens: list[str]) -> Any:
    node = doc
    for t in tokens[:-1]:
        if isinstance(node, dict) and t in node:
            node = node[t]
        elif isinstance(node, list):
            node = node[_index(t, len(node), append_ok=False)]
        else:
            raise PatchError(422, f"path component {t!r} does not exist")
    return node


def _get(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        return doc
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise PatchError(422, f"member {last!r} does not exist")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(last, len(parent), append_ok=False)]
    raise PatchError(422, f"cannot index a {type(parent).__name__} with {last!r}")


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(last, len(parent), append_ok=True), value)
    else:
        raise PatchError(422, f"cannot add {last!r} to a {type(parent).__name__}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise PatchError(422, "cannot remove the whole document")
    _get(doc, tokens)  # must exist
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        del parent[last]
    else:
        del parent[_index(last, len(parent), append_ok=False)]
    return doc


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 on a copy of `doc`: all ops or none (PatchError 422 on the first that fails)."""
    if not isinstance(ops, list):
        raise PatchError(400, "a JSON patch must be a JSON array of operations")
    out = copy.deepcopy(doc)
    for n, op in enumerate(ops):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(400, f"operation {n} needs 'op' and 'path'")
        kind, tokens = op["op"], _tokens(op["path"])
        try:
            if kind in ("add", "replace", "test") and "value" not in op:
                raise PatchError(400, f"operation {n} ({kind}) needs 'value'")
            if kind == "add":
                out = _add(out, tokens, copy.deepcopy(op["value"]))
            elif kind == "remove":
                out = _remove(out, tokens)
            elif kind == "replace":
                _get(out, tokens)  # must exist
                out = _add(
                    _remove(out, tokens) if tokens else out, tokens, copy.deepcopy(op["value"])
                )
            elif kind in ("move", "copy"):
                src = _tokens(op.get("from"))
                if kind == "move" and tokens[: len(src)] == src and tokens != src:
                    raise PatchError(422, "cannot move a value into one of its own children")
                value = copy.deepcopy(_get(out, src))
                if kind == "move":
                    out = _remove(out, src)
                out = _add(out, tokens, value)
            elif kind == "test":
                if not _json_equal(_get(out, tokens), op["value"]):
                    raise PatchError(422, f"test failed: {op['path']} is not {op['value']!r}")
            else:
                raise PatchError(400, f"unknown JSON patch operation {kind!r}")
        except PatchError as exc:
            raise PatchError(
                exc.code, f"operation {n} ({kind} {op['path']}): {exc.message}"
            ) from exc
    return out


# --- the server ---------------------------------------------------------------------------------


def status_body(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


_REASONS = {
    400: "BadRequest",
    404: "NotFound",
    403: "Forbidden",
    405: "MethodNotAllowed",
    409: "Conflict",
    415: "UnsupportedMediaType",
    422: "Invalid",
}


class _HttpError(Exception):
    def __init__(self, code: int, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.body = status_body(code, _REASONS.get(code, "InternalError"), message, details)
        self.code = code


@dataclass
class FakeKubeApi:
    """The store and its HTTP server. Use `running()` (a context manager) in tests."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    _rv: int = 100
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _hooks: list[_Hook] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _uid: int = 0
    operated: set[str] = field(default_factory=set)
    """Paths of the RayClusters the modelled KubeRay operator reconciles (`operate`)."""
    operator_deleted: list[str] = field(default_factory=list)
    """Names of the pods the operator deleted, in order."""
    operator_created: list[str] = field(default_factory=list)
    """Names of the pods the operator created, in order."""
    _pods_made: int = 0

    # -- building objects --------------------------------------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _meta(self, name: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
        self._uid += 1
        meta: dict[str, Any] = {"name": name, "uid": f"uid-{self._uid:04d}"}
        if namespace is not None:
            meta["namespace"] = namespace
        meta["resourceVersion"] = self._next_rv()
        meta.update({k: v for k, v in extra.items() if v is not None})
        return meta

    def add_node(
        self, name: str, *, taints: list[dict[str, Any]] | None = None, unschedulable: bool = False
    ) -> dict[str, Any]:
        with self._lock:
            spec: dict[str, Any] = {}
            if taints:
                spec["taints"] = copy.deepcopy(taints)
            if unschedulable:
                spec["unschedulable"] = True
            obj = {"kind": "Node", "apiVersion": "v1", "metadata": self._meta(name), "spec": spec}
            self.objects[f"/api/v1/nodes/{name}"] = obj
            return copy.deepcopy(obj)

    def add_pod(
        self,
        name: str,
        *,
        namespace: str,
        node_name: str | None,
        labels: dict[str, str] | None = None,
        pod_ip: str | None = None,
    ) -> dict[str, Any]:
        with self._lock:
            spec: dict[str, Any] = {
                "containers": [{"name": "ray-worker", "image": "rayproject/ray"}]
            }
            if node_name:
                spec["nodeName"] = node_name
            obj: dict[str, Any] = {
                "kind": "Pod",
                "apiVersion": "v1",
                "metadata": self._meta(name, namespace, labels=labels),
                "spec": spec,
                "status": {"phase": "Running", **({"podIP": pod_ip} if pod_ip else {})},
            }
            self.objects[f"/api/v1/namespaces/{namespace}/pods/{name}"] = obj
            return copy.deepcopy(obj)

    def add_raycluster(self, name: str, *, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            obj = {
                "apiVersion": "ray.io/v1",
                "kind": "RayCluster",
                "metadata": self._meta(name, namespace, generation=1),
                "spec": copy.deepcopy(spec),
                "status": {"state": "ready"},
            }
            self.objects[f"/apis/ray.io/v1/namespaces/{namespace}/rayclusters/{name}"] = obj
            return copy.deepcopy(obj)

    # -- the KubeRay operator (see the module docstring) ----------------------------------------

    def operate(self, name: str, *, namespace: str) -> None:
        """Reconcile RayCluster `namespace`/`name` now and after every accepted write."""
        with self._lock:
            self.operated.add(f"/apis/ray.io/v1/namespaces/{namespace}/rayclusters/{name}")
            self.reconcile()

    def reconcile(self) -> None:
        """One pass of the operator over every RayCluster it operates."""
        with self._lock:
            for path in sorted(self.operated):
                rc = self.objects.get(path)
                if rc is not None:
                    self._reconcile(rc)

    def _reconcile(self, rc: dict[str, Any]) -> None:
        meta, spec = rc["metadata"], rc.get("spec") or {}
        ns, cluster = meta["namespace"], meta["name"]
        prefix = f"/api/v1/namespaces/{ns}/pods/"
        for g in spec.get("workerGroupSpecs") or []:
            group = g["groupName"]
            for name in (g.get("scaleStrategy") or {}).get("workersToDelete") or []:
                if self.objects.pop(prefix + name, None) is not None:
                    self.operator_deleted.append(name)
            labels = {
                "ray.io/cluster": cluster,
                "ray.io/group": group,
                "ray.io/node-type": "worker",
            }
            pods = [
                path
                for path, obj in sorted(self.objects.items())
                if path.startswith(prefix)
                and all(
                    (obj["metadata"].get("labels") or {}).get(k) == v for k, v in labels.items()
                )
            ]
            diff = int(g.get("replicas") or 0) - len(pods)
            for _ in range(max(0, diff)):
                self._pods_made += 1
                name = f"{cluster}-{group}-worker-{self._pods_made:05d}"
                self.add_pod(name, namespace=ns, node_name=None, labels=labels)
                self.operator_created.append(name)
            if diff < 0 and not spec.get("enableInTreeAutoscaling"):
                for path in pods[:-diff]:
                    del self.objects[path]
                    self.operator_deleted.append(path.rsplit("/", 1)[1])

    def get(self, path: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self.objects.get(path)
            return copy.deepcopy(obj) if obj is not None else None

    def before(
        self, method: str, path: str, action: Callable[[FakeKubeApi], None], times: int = 1
    ) -> None:
        """Run `action(self)` before each of the next `times` `method` requests to `path`
        (e.g. delete the pod just before our DELETE arrives)."""
        with self._lock:
            self._hooks.append(_Hook(method, path, action, times))

    def fail(self, method: str, path: str, code: int, message: str, times: int = 1) -> None:
        """Answer the next `times` `method` requests to `path` with `code` and a Status body
        (e.g. 403 from RBAC, 500), before touching the object."""

        def answer(api: FakeKubeApi) -> None:
            raise _HttpError(code, message)

        self.before(method, path, answer, times)

    def interfere(
        self, method: str, path: str, mutate: Callable[[dict[str, Any]], None], times: int = 1
    ) -> None:
        """Before each of the next `times` `method` requests to `path`, another writer applies
        `mutate` to the stored object and its resourceVersion advances (a real write)."""

        def write(api: FakeKubeApi) -> None:
            obj = api.objects.get(path)
            if obj is not None:
                changed = copy.deepcopy(obj)
                mutate(changed)
                changed["metadata"]["resourceVersion"] = api._next_rv()
                api.objects[path] = changed

        self.before(method, path, write, times)

    def writes(self) -> list[Recorded]:
        return [r for r in self.requests if r.method in ("PATCH", "PUT", "DELETE", "POST")]

    # -- the HTTP side -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._server is not None, "the fake API server is not running"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                code, body = api.handle(
                    self.command, self.path, self.headers.get("Content-Type"), raw
                )
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PATCH = do_PUT = do_DELETE = do_POST = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-kube-api", daemon=True
        ).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def handle(
        self, method: str, target: str, content_type: str | None, raw: bytes
    ) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(target)
        query = parse_qs(parts.query)
        body: Any = None
        with self._lock:
            try:
                if raw:
                    try:
                        body = json.loads(raw)
                    except ValueError as exc:
                        raise _HttpError(400, f"request body is not JSON: {exc}") from exc
                code, out = self._dispatch(method, parts.path, query, content_type, body)
            except _HttpError as err:
                code, out = err.code, err.body
            self.requests.append(Recorded(method, parts.path, query, content_type, body, code))
            if code < 400 and method in ("PATCH", "PUT", "DELETE"):
                self.reconcile()
            return code, out

    def _dispatch(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        content_type: str | None,
        body: Any,
    ) -> tuple[int, dict[str, Any]]:
        for pattern, resource, verbs in _ROUTES:
            m = pattern.fullmatch(path)
            if m is None:
                continue
            if method not in verbs:
                raise _HttpError(405, f"{method} is not supported on {path} by this fake")
            self._run_hooks(method, path)
            if "name" not in m.groupdict():
                return 200, self._list(m["ns"], query)
            name = m["name"]
            details = {"name": name, "kind": resource.split(".")[0]}
            if resource in _CUSTOM:
                details["group"] = resource.partition(".")[2]
            current = self.objects.get(path)
            if current is None:
                raise _HttpError(404, f'{resource} "{name}" not found', details)
            if method == "GET":
                return 200, copy.deepcopy(current)
            media = (content_type or "").split(";")[0].strip().lower()
            if (
                method in ("PUT", "DELETE")
                and body is not None
                and media not in ("", "application/json")
            ):
                raise _HttpError(415, f"{method} takes application/json, got {content_type!r}")
            if method == "DELETE":
                return self._delete(path, current, query, body, resource, details)
            if method == "PATCH":
                new = self._patched(current, resource, content_type, body)
            else:
                new = self._replacement(current, resource, name, body)
            return 200, self._store(path, current, new, resource, details)
        raise _HttpError(404, "the server could not find the requested resource")

    def _run_hooks(self, method: str, path: str) -> None:
        for hook in self._hooks:
            if hook.times > 0 and hook.method == method and hook.path == path:
                hook.times -= 1
                hook.action(self)

    def _patched(
        self, current: dict[str, Any], resource: str, content_type: str | None, body: Any
    ) -> dict[str, Any]:
        media = (content_type or "").split(";")[0].strip().lower()
        accepted = [JSON_PATCH, MERGE] + ([] if resource in _CUSTOM else [STRATEGIC])
        if media not in accepted:
            raise _HttpError(
                415,
                f"the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(accepted)}",
            )
        try:
            if media == JSON_PATCH:
                return json_patch(current, body)  # type: ignore[no-any-return]
            if not isinstance(body, dict):
                raise PatchError(400, "a merge patch must be a JSON object")
            if media == MERGE:
                return merge_patch(current, body)  # type: ignore[no-any-return]
            keys = SMP_MERGE_KEYS.get(resource, {})
            return strategic_merge_patch(current, body, keys)  # type: ignore[no-any-return]
        except PatchError as exc:
            raise _HttpError(exc.code, exc.message) from exc

    def _replacement(
        self, current: dict[str, Any], resource: str, name: str, body: Any
    ) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise _HttpError(400, "PUT needs the whole object")
        if body["metadata"].get("name") != name:
            raise _HttpError(400, "the name of the object does not match the name on the URL")
        if not body["metadata"].get("resourceVersion"):
            raise _HttpError(
                422,
                f'{resource} "{name}" is invalid: metadata.resourceVersion: Invalid value: 0x0: '
                "must be specified for an update",
            )
        new = copy.deepcopy(body)
        if "status" in current:
            new["status"] = copy.deepcopy(current["status"])  # status is a subresource
        return new

    def _store(
        self,
        path: str,
        current: dict[str, Any],
        new: dict[str, Any],
        resource: str,
        details: dict[str, Any],
    ) -> dict[str, Any]:
        meta, old_meta = new.get("metadata") or {}, current["metadata"]
        for immutable in ("name", "namespace", "uid"):
            if meta.get(immutable) != old_meta.get(immutable):
                raise _HttpError(422, f"metadata.{immutable}: field is immutable")
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv and wanted_rv != old_meta["resourceVersion"]:
            raise _HttpError(
                409,
                f'Operation cannot be fulfilled on {resource} "{old_meta["name"]}": the object '
                "has been modified; please apply your changes to the latest version and try again",
                details,
            )
        new["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        if new == current:
            return copy.deepcopy(current)  # a no-op write does not bump the resourceVersion
        new["metadata"]["resourceVersion"] = self._next_rv()
        if resource in _CUSTOM and new.get("spec") != current.get("spec"):
            new["metadata"]["generation"] = int(old_meta.get("generation", 1)) + 1
        self.objects[path] = new
        return copy.deepcopy(new)

    def _delete(
        self,
        path: str,
        current: dict[str, Any],
        query: dict[str, list[str]],
        body: Any,
        resource: str,
        details: dict[str, Any],
    ) -> tuple[int, dict[str, Any]]:
        options = body if isinstance(body, dict) else {}
        pre = options.get("preconditions") or {}
        meta = current["metadata"]
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            raise _HttpError(
                409,
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: "
                f"{meta['uid']}",
                details,
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise _HttpError(409, "Precondition failed: resourceVersion mismatch", details)
        grace = options.get("gracePeriodSeconds")
        if "gracePeriodSeconds" in query:
            grace = int(query["gracePeriodSeconds"][0])
        gone = copy.deepcopy(current)
        gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        gone["metadata"]["deletionGracePeriodSeconds"] = 30 if grace is None else grace
        del self.objects[path]
        return 200, gone

    def _list(self, namespace: str, query: dict[str, list[str]]) -> dict[str, Any]:
        match = _selector(query.get("labelSelector", [""])[0])
        prefix = f"/api/v1/namespaces/{namespace}/pods/"
        items = [
            copy.deepcopy(obj)
            for path, obj in sorted(self.objects.items())
            if path.startswith(prefix) and match(obj["metadata"].get("labels") or {})
        ]
        return {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }


def _selector(text: str) -> Callable[[dict[str, str]], bool]:
    """Equality-based label selectors (k=v, k==v, k!=v, k, !k), comma-separated (AND)."""
    terms: list[tuple[str, str, str]] = []  # (operator, key, value)
    for term in filter(None, (t.strip() for t in text.split(","))):
        if " in " in term or " notin " in term or "(" in term:
            raise _HttpError(400, f"set-based selector {term!r} is not modelled by the fake")
        if "!=" in term:
            k, v = term.split("!=", 1)
            terms.append(("!=", k.strip(), v.strip()))
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            terms.append(("=", k.strip(), v.strip()))
        elif term.startswith("!"):
            terms.append(("!", term[1:].strip(), ""))
        else:
            terms.append(("exists", term, ""))

    def matches(labels: dict[str, str]) -> bool:
        for op, k, v in terms:
            ok = {
                "!=": labels.get(k) != v,
                "=": labels.get(k) == v,
                "!": k not in labels,
                "exists": k in labels,
            }[op]
            if not ok:
                return False
        return True

    return matches


@contextmanager
def running() -> Iterator[FakeKubeApi]:
    """A started fake API server, stopped on exit."""
    api = FakeKubeApi()
    api.start()
    try:
        yield api
    finally:
        api.stop()


def write_kubeconfig(api: FakeKubeApi, path: Path) -> Path:
    """A kubeconfig file whose current context is `api` (token auth; the fake accepts any)."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                "users": [{"name": "me", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
                "current-context": "fake",
            }
        )
    )
    return path
