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

Checks, in order: the bearer token (``Authorization: Bearer``, compared in constant time with
``kubernetes.actuator_token_file``, re-read per request so a rotated Secret takes effect), the
body's size (``kubernetes.service.max_body_bytes``, 413), then those of
`controlplane.kube.gate.ActuatorService`: the body (400), ownership (403) and the node-action
cap (429), one action at a time. Every request is logged with its id, caller, route (control
characters escaped: a path is decoded, so ``%0A`` would otherwise start a forged log line)
and outcome.

Status codes: 400 bad input, 401 token, 403 not ours, 404 not found, 409 conflicts outlasted the
retries, 413 too large, 415 not JSON, 429 rate cap, 502 the Kubernetes API failed, 500 a bug
(generic message; details in the log under the request id). Bodies: ``{"result": ...}`` or
``{"error", "request_id"}``.

Owns: the HTTP face of the service (routes, the request id, the JSON errors and their status
codes, one log line per request) and its entry point (`main`). The checks themselves and the
actions are `controlplane.kube.gate.ActuatorService`'s.

Must not: decide anything (the controller's policies do), offer a call the controller does not
make, or trust the caller with a namespace, a label selector or an object it did not check.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable

from aiohttp import web

from controlplane.background_http import BackgroundHttpServer
from controlplane.config import ConfigError, load_config
from controlplane.kube.actuator import KubernetesActuator
from controlplane.kube.connect import from_config
from controlplane.kube.errors import (
    KubeConflictError,
    KubeNotFoundError,
    KubeRefusedError,
    KubernetesActuatorError,
)
from controlplane.kube.gate import ActuatorService, Refusal
from serve.inputs import JsonBodyError, loads_json, request_id

__all__ = ["ActuatorServer", "loggable", "main", "make_app"]

log = logging.getLogger(__name__)

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""What `loggable` escapes: C0 and C1 controls and the Unicode line separators."""
_REQUEST_ID = web.RequestKey("request_id", str)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# --- log lines ------------------------------------------------------------------------------


def loggable(text: str, limit: int = 256) -> str:
    """`text` safe for one log line: control characters as Python escapes (``\\n``,
    ``\\x1b``; a decoded path holds whatever ``%0A`` or ``%1B`` the caller sent), at most
    `limit` characters."""
    cut = text[:limit] + ("..." if len(text) > limit else "")
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), cut)


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
