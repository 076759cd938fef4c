"""``rcp-kube-actuator``: the one process that holds the control plane's Kubernetes credential.

Runs as its own Deployment (``python -m controlplane.kube.service``; infra/k8s/kube-actuator.yaml),
never in a Ray pod: Ray runs any job's code wherever the job asks (the head included), so no
Ray pod may hold a credential that can change Kubernetes. The controller in the Ray head asks
this service over HTTP (`controlplane.kube.remote`), and the service treats every request as
if user code had sent it with a stolen token. What it lets through is what the controller
itself may do to its own Ray nodes, and no more:

* ``POST /v1/remove-node`` ``{"pod_name", "reason"}``: only a *worker* pod of the configured
  RayCluster (label ``ray.io/cluster=<kubernetes.raycluster>``, ``ray.io/node-type=worker``)
  in ``kubernetes.namespace``; never the head, never another namespace (the caller cannot name
  one). Cordons and taints its node, deletes the pod (`KubernetesActuator.remove_node`).
* ``POST /v1/cordon`` ``{"node_name", "reason"}``: only a node that hosts a running worker pod
  of that RayCluster now.
* ``POST /v1/scale-external`` ``{"replicas"}`` (and optional ``"provider"``,
  ``"workers_to_delete"``): refused unless the *service's* config says the control plane
  sizes the external group (``kubernetes.autoscaler_owns_external: false``); the default
  RBAC does not even grant it. The pods a shrink names must be workers of that very group
  of the RayCluster in ``kubernetes.namespace`` (403 otherwise: the head, another group's
  or another RayCluster's pod), checked as ``remove-node`` checks a pod.
* ``POST /v1/pod-for-ip`` ``{"pod_ip"}``: the RayCluster pod with that IP (read only).
* ``GET /healthz``: liveness, no auth. Nothing else (404); no uncordon (an operator's command).

Checks, in order: bearer token (``Authorization: Bearer``, compared in constant time with
``kubernetes.actuator_token_file``, re-read per request so a rotated Secret takes effect), body
at most ``kubernetes.service.max_body_bytes`` (413), JSON object with exactly the route's keys
(400), names as DNS-1123 subdomains, a reason of printable text up to `MAX_REASON_CHARS`,
replicas in 0..`MAX_REPLICAS`; then the ownership checks above (403) and the rate cap: at most
``kubernetes.service.max_node_actions`` node actions per ``window_s`` (429; `NodeActionCap`),
beside the health breaker. Every action counts (a cordon; a removal, with the cordon of its
node, of a pod scheduled or not), and the check, the count and the action use one read of
the pod under one lock, so nothing happens between them. Every request is logged with its
id, caller, route (control characters escaped: a path is decoded, so ``%0A`` would otherwise
start a forged log line) and outcome. Actions run one at a time.

Status codes: 400 bad input, 401 token, 403 not ours, 404 not found, 409 conflicts outlasted the
retries, 413 too large, 415 not JSON, 429 rate cap, 502 the Kubernetes API failed, 500 a bug
(generic message; details in the log under the request id). Bodies: ``{"result": ...}`` or
``{"error", "request_id"}``.

Must not: decide anything (the controller's policies do), offer a call the controller does not
make, or trust the caller with a namespace, a label selector or an object it did not check.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import ipaddress
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from controlplane.background_http import BackgroundHttpServer
from controlplane.config import _DNS_SUBDOMAIN, ConfigError, load_config
from controlplane.kube.actuator import (
    KubeConflictError,
    KubeNotFoundError,
    KubeRefusedError,
    KubernetesActuator,
    KubernetesActuatorError,
)
from controlplane.kube.connect import from_config
from controlplane.kube.remote import MIN_TOKEN_CHARS, read_actuator_token
from controlplane.tokens import bearer_matches
from serve.inputs import JsonBodyError, loads_json, request_id

if TYPE_CHECKING:
    from controlplane.config import KubernetesConfig

__all__ = [
    "MAX_REASON_CHARS",
    "MAX_REPLICAS",
    "MIN_TOKEN_CHARS",
    "ActuatorServer",
    "ActuatorService",
    "NodeActionCap",
    "loggable",
    "main",
    "make_app",
]

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 1024
MAX_REPLICAS = 1000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""What `loggable` escapes: C0 and C1 controls and the Unicode line separators."""
_REQUEST_ID = web.RequestKey("request_id", str)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Refusal(Exception):
    """A request the service will not carry out: `status` and a message for the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class NodeActionCap:
    """At most `max_actions` node actions per `window_s`, each checked and recorded in one call.

    An action is the set of Kubernetes objects it changes: a cordon is ``{"node <name>"}``; a
    removal is ``{"pod <uid>"}`` plus ``"node <name>"`` when the pod was scheduled when read
    (a pod not yet scheduled counts too: deleting it is an action). An action whose objects
    were all acted on within the window is a repeat (a retry, or a cordon of a node a removal
    already cordoned) and free; any other action takes one slot, or is refused.

    Example (max_actions 2, window_s 600): cordon a at t=0 and remove pod p (uid 1, on node b)
    at t=10 are admitted; cordon b at t=15 is free (b was cordoned by the removal); remove
    unscheduled pod q (uid 2) at t=20 is refused; remove p again at t=30 is free; cordon c at
    t=601 is admitted (a's slot left the window). The memory is this process's: a restarted
    service starts with an empty window, so the health breaker stays the first limit.
    """

    max_actions: int
    window_s: float
    admitted: list[tuple[float, frozenset[str]]] = field(default_factory=list)
    """(when, the objects it changes) of each action that took a slot within the window."""

    def admit(self, objects: frozenset[str], now_s: float) -> bool:
        """Check and record in one step: True (recorded, or a repeat) or False (refused)."""
        self.admitted = [(t, o) for t, o in self.admitted if now_s - t < self.window_s]
        if objects <= frozenset[str]().union(*(o for _t, o in self.admitted)):
            return True
        if len(self.admitted) >= self.max_actions:
            return False
        self.admitted.append((now_s, objects))
        return True


# --- input checks ---------------------------------------------------------------------------


def loggable(text: str, limit: int = 256) -> str:
    """`text` safe for one log line: control characters as Python escapes (``\\n``,
    ``\\x1b``; a decoded path holds whatever ``%0A`` or ``%1B`` the caller sent), at most
    `limit` characters."""
    cut = text[:limit] + ("..." if len(text) > limit else "")
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), cut)


def _fields(body: object, *names: str) -> dict[str, object]:
    if not isinstance(body, dict):
        raise Refusal(400, "the body must be a JSON object")
    unknown = sorted(set(body) - set(names))
    missing = [n for n in names if n not in body]
    if unknown or missing:
        raise Refusal(
            400,
            f"the body must have exactly the keys {list(names)}; unknown {unknown}, "
            f"missing {missing}",
        )
    return body


def _name(what: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value):
        raise Refusal(
            400,
            f"{what} must be a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', "
            f"at most 253 characters), got {str(value)[:80]!r}",
        )
    return value


def _reason(value: object) -> str:
    if (
        not isinstance(value, str)
        or not value.strip()
        or len(value) > MAX_REASON_CHARS
        or _CONTROL.search(value)
    ):
        raise Refusal(
            400,
            f"reason must be printable text of 1..{MAX_REASON_CHARS} characters without "
            "control characters",
        )
    return value


def _pod_names(value: object) -> list[str]:
    """``workers_to_delete``: a list of distinct pod names, at most `MAX_REPLICAS`."""
    if not isinstance(value, list) or len(value) > MAX_REPLICAS:
        raise Refusal(400, f"workers_to_delete must be a list of at most {MAX_REPLICAS} pod names")
    names = [_name(f"workers_to_delete[{i}]", n) for i, n in enumerate(value)]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise Refusal(400, f"workers_to_delete names pods twice: {repeated}")
    return names


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


# --- the service ----------------------------------------------------------------------------


class ActuatorService:
    """The checks and the actions, independent of HTTP (the handlers below call these)."""

    def __init__(
        self,
        actuator: KubernetesActuator,
        config: KubernetesConfig,
        *,
        providers: Collection[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.actuator = actuator
        self.config = config
        self._providers = frozenset(providers)
        """The external providers whose worker groups callers may size."""
        self.cap = NodeActionCap(config.service.max_node_actions, config.service.window_s)
        self._clock = clock
        self._lock = threading.Lock()

    @property
    def _cluster(self) -> str:
        return f"RayCluster {self.config.namespace}/{self.config.raycluster}"

    def token(self) -> str:
        """The expected bearer token, read now from ``kubernetes.actuator_token_file``
        (`read_actuator_token`: KubernetesActuatorError when unreadable or short)."""
        return read_actuator_token(self.config.actuator_token_file)

    def authorized(self, header: str) -> bool:
        """Whether `header` is ``Bearer <the token>`` (`bearer_matches`)."""
        return bearer_matches(header, self.token())

    def _admit(self, what: str, objects: frozenset[str]) -> None:
        if not self.cap.admit(objects, self._clock()):
            s = self.config.service
            raise Refusal(
                429,
                f"{what}: the actuator service took {len(self.cap.admitted)} node actions "
                f"in the last {s.window_s:g} s, its cap (kubernetes.service.max_node_actions); "
                "try again later",
            )

    def remove_node(self, body: object) -> dict[str, Any]:
        b = _fields(body, "pod_name", "reason")
        pod, reason = _name("pod_name", b["pod_name"]), _reason(b["reason"])
        with self._lock:
            # One read of the pod: the check, the cap and the action all use it, so a pod
            # bound to a node after this read cannot get that node cordoned uncounted.
            worker = self.actuator.read_worker(pod)  # KubeRefusedError: not our worker
            if worker is not None:
                objects = {f"pod {worker.uid or worker.name}"}
                if worker.node_name is not None:
                    objects.add(f"node {worker.node_name}")
                self._admit(f"pod {pod}", frozenset(objects))
            return dataclasses.asdict(self.actuator.remove_worker(pod, worker, reason))

    def cordon(self, body: object) -> dict[str, Any]:
        b = _fields(body, "node_name", "reason")
        node, reason = _name("node_name", b["node_name"]), _reason(b["reason"])
        with self._lock:
            if not self.actuator.worker_pods_on_node(node):
                raise Refusal(
                    403,
                    f"node {node} hosts no running worker pod of {self._cluster}; "
                    "the actuator only cordons nodes of its own Ray workers",
                )
            self._admit(f"node {node}", frozenset({f"node {node}"}))
            return dataclasses.asdict(self.actuator.cordon(node, reason))

    def scale_external(self, body: object) -> dict[str, Any]:
        """``{"replicas": N}`` sizes ``kubernetes.external_group``; with ``"provider": P`` too,
        provider P's group (``<external_group>-<P>``), P one of the providers this service
        was configured with; with ``"workers_to_delete": [pod, ...]`` a shrink takes those
        pods and only those. Every name must be a worker pod of that group of the RayCluster
        in ``kubernetes.namespace`` (the actuator lists the group, and reads any other name
        as `remove_node` does): the head, another group's or another RayCluster's pod is 403,
        nothing written. A name that is gone is skipped. Not counted by the node-action cap:
        the names only choose which of the group's pods a lower ``replicas`` takes (the
        actuator lowers it by the pods named, never by more), not how many."""
        optional = ("provider", "workers_to_delete")
        given = [k for k in optional if isinstance(body, dict) and k in body]
        b = _fields(body, "replicas", *given)
        replicas = b["replicas"]
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise Refusal(400, f"replicas must be an integer, got {type(replicas).__name__}")
        if not 0 <= replicas <= MAX_REPLICAS:
            raise Refusal(400, f"replicas must be in 0..{MAX_REPLICAS}, got {replicas}")
        provider = b.get("provider")
        if provider is not None and provider not in self._providers:
            raise Refusal(
                400,
                f"provider must be one of {sorted(self._providers)}, got {str(provider)[:40]!r}",
            )
        names = _pod_names(b.get("workers_to_delete", []))
        with self._lock:
            result = self.actuator.scale_external(replicas, _str_or_none(provider), names)
            return dataclasses.asdict(result)

    def pod_for_ip(self, body: object) -> str | None:
        ip = _fields(body, "pod_ip")["pod_ip"]
        try:
            if not isinstance(ip, str) or len(ip) > 45:
                raise ValueError(ip)
            address = str(ipaddress.ip_address(ip))
        except ValueError:
            raise Refusal(400, "pod_ip must be an IPv4 or IPv6 address") from None
        with self._lock:
            return self.actuator.pod_for_ip(address)


# --- HTTP -----------------------------------------------------------------------------------

_SERVICE = web.AppKey("service", ActuatorService)

_STATUS: tuple[tuple[type[Exception], int], ...] = (
    (KubeRefusedError, 403),
    (KubeNotFoundError, 404),
    (KubeConflictError, 409),
    (KubernetesActuatorError, 502),
)


def _error(request: web.Request, status: int, message: str) -> web.Response:
    body = {"error": message, "request_id": request.get(_REQUEST_ID)}
    return web.json_response(body, status=status)


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id, auth, and one log line per request; every failure is a JSON error: an
    exception nobody expected is logged with its traceback and answered 500 with the id."""
    rid = request_id(request.headers.get("X-Request-Id"))
    request[_REQUEST_ID] = rid
    try:
        response = await _answer(request, handler)
    except web.HTTPException as exc:
        if exc.status >= 400:
            response = _error(request, exc.status, exc.reason or "request refused")
        else:
            raise
    except Exception:  # the service keeps serving whatever one request does
        log.exception("request %s: %s %s failed", rid, request.method, loggable(request.path))
        response = _error(request, 500, "internal error; see the service's log for the request id")
    response.headers["X-Request-Id"] = rid
    level = logging.INFO if response.status < 400 else logging.WARNING
    if request.path != "/healthz" or response.status != 200:
        log.log(
            level,
            "request %s from %s: %s %s -> %d",
            loggable(rid),
            request.remote,
            loggable(request.method),
            loggable(request.path),
            response.status,
        )
    return response


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    service = request.app[_SERVICE]
    if request.path != "/healthz":
        try:
            ok = service.authorized(request.headers.get("Authorization", ""))
        except KubernetesActuatorError:
            log.exception("request %s: no usable token; refusing every call", request[_REQUEST_ID])
            return _error(request, 503, "the service has no usable token; see its log")
        if not ok:
            return _error(
                request,
                401,
                "missing or wrong token: send 'Authorization: Bearer "
                "<the token of Secret rcp-kube-actuator>'",
            )
    try:
        return await handler(request)
    except Refusal as exc:
        return _error(request, exc.status, exc.message)
    except web.HTTPRequestEntityTooLarge:
        limit = service.config.service.max_body_bytes
        return _error(request, 413, f"the request body is larger than {limit} bytes")
    except KubernetesActuatorError as exc:
        status = next(code for kind, code in _STATUS if isinstance(exc, kind))
        return _error(request, status, str(exc))
    # Any other HTTPException or exception: `_guard` answers it (the same JSON error, or 500).


def _route(action: str) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        if request.content_type != "application/json":
            raise Refusal(415, "send Content-Type: application/json")
        raw = await request.read()  # aiohttp stops at client_max_size (413)
        try:
            body = loads_json(raw)
        except JsonBodyError as exc:
            raise Refusal(400, f"the body is not acceptable JSON: {exc.message}") from None
        service = request.app[_SERVICE]
        method = getattr(service, action)
        result = await asyncio.get_running_loop().run_in_executor(None, method, body)
        log.info("request %s: %s %s", request[_REQUEST_ID], action, _summary(body, result))
        return web.json_response({"result": result})

    return handle


def _summary(body: object, result: object) -> str:
    detail = result.get("detail") if isinstance(result, dict) else None
    return f"{json.dumps(body)} -> {detail or json.dumps(result)}"


async def _healthz(_request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def _not_found(_request: web.Request) -> web.Response:
    raise Refusal(404, "no such route")


def make_app(service: ActuatorService) -> web.Application:
    app = web.Application(
        middlewares=[_guard], client_max_size=service.config.service.max_body_bytes
    )
    app[_SERVICE] = service
    for path, action in (
        ("/v1/remove-node", "remove_node"),
        ("/v1/cordon", "cordon"),
        ("/v1/scale-external", "scale_external"),
        ("/v1/pod-for-ip", "pod_for_ip"),
    ):
        app.router.add_post(path, _route(action))
    app.router.add_get("/healthz", _healthz)
    app.router.add_route("*", "/{tail:.*}", _not_found)
    return app


class ActuatorServer(BackgroundHttpServer):
    """Serves `make_app(service)` on host:port from a daemon thread (tests; `main` uses
    aiohttp's own runner)."""

    def __init__(self, service: ActuatorService, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(make_app(service), host, port, thread_name="rcp-kube-actuator")

    def start(self, timeout_s: float = 30.0) -> ActuatorServer:
        self._start(timeout_s)
        return self


def main(argv: list[str] | None = None) -> int:
    """``python -m controlplane.kube.service [--config FILE] [KEY=VALUE ...]``."""
    parser = argparse.ArgumentParser(
        prog="python -m controlplane.kube.service", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", default=os.environ.get("RCP_CONFIG"))
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    kc = cfg.kubernetes
    if not kc.enabled:
        log.error("kubernetes.enabled is false: the actuator service has nothing to do")
        return 2
    try:
        actuator = from_config(cfg, direct=True)
        assert isinstance(actuator, KubernetesActuator)
        service = ActuatorService(
            actuator, kc, providers=[p.name for p in cfg.pools.external.providers]
        )
        service.token()  # a missing or short token fails the start, not the first request
    except (KubernetesActuatorError, RuntimeError) as exc:
        log.error("%s", exc)
        return 2
    log.info(
        "rcp-kube-actuator for %s on %s:%d (at most %d node actions per %g s)",
        service._cluster,
        kc.service.host,
        kc.service.port,
        kc.service.max_node_actions,
        kc.service.window_s,
    )
    web.run_app(
        make_app(service), host=kc.service.host, port=kc.service.port, access_log=None, print=None
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
