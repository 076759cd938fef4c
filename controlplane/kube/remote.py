"""The controller's side of ``rcp-kube-actuator``: the Kubernetes actuator's interface, over HTTP.

Owns: `RemoteKubernetesActuator`, which the controller gets from
`controlplane.kube.connect.from_config` when ``kubernetes.actuator_url`` is set (the shipped
install). It offers the calls of `KubernetesActuator` that the controller makes
(`remove_node`, `cordon`, `scale_external`, `pod_for_ip`) with the same results and errors,
so `Remediator` and the control loop do not know which one they hold. Each call is one POST
with ``Authorization: Bearer <token>``; the token is re-read from
``kubernetes.actuator_token_file`` on every call, so a rotated Secret is picked up.

The service's error statuses map back to the actuator's errors (`_ERRORS`; anything else,
and an unreachable service, is KubernetesActuatorError with the service's message).

Must not: hold or load a Kubernetes credential, or decide anything. `uncordon` is an
operator's command and the service does not offer it to the head (see its error).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from controlplane.kube.errors import (
    KubeConflictError,
    KubeNotFoundError,
    KubeRateLimitedError,
    KubeRefusedError,
    KubernetesActuatorError,
)
from controlplane.kube.results import CordonResult, RemoveNodeResult, ScaleResult, UncordonResult

if TYPE_CHECKING:
    from controlplane.config import KubernetesConfig

__all__ = [
    "MIN_TOKEN_CHARS",
    "RemoteKubernetesActuator",
    "cordon_from_json",
    "read_actuator_token",
    "remove_from_json",
    "scale_from_json",
]

MIN_TOKEN_CHARS = 32
"""A shorter token file is a setup mistake (an empty or placeholder Secret): refused."""

_ERRORS: dict[int, type[KubernetesActuatorError]] = {
    403: KubeRefusedError,
    404: KubeNotFoundError,
    409: KubeConflictError,
    429: KubeRateLimitedError,
}


def read_actuator_token(path: str) -> str:
    """The bearer token in `path` (``kubernetes.actuator_token_file``), read now, so a rotated
    Secret takes effect; both the service and its client read it here. Unreadable or shorter
    than `MIN_TOKEN_CHARS`: KubernetesActuatorError."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as exc:
        raise KubernetesActuatorError(
            f"cannot read the actuator service's token from {path} "
            f"(kubernetes.actuator_token_file; the Secret rcp-kube-actuator): {exc}"
        ) from exc
    if len(token) < MIN_TOKEN_CHARS:
        raise KubernetesActuatorError(
            f"the actuator service's token file {path} holds {len(token)} characters, fewer "
            f"than {MIN_TOKEN_CHARS}: create the Secret rcp-kube-actuator with a random token "
            "(docs/kubernetes-actuator.md)"
        )
    return token


def cordon_from_json(d: dict[str, Any]) -> CordonResult:
    return CordonResult(
        str(d["node_name"]), str(d["taint"]), bool(d["changed"]), int(d["attempts"])
    )


def remove_from_json(d: dict[str, Any]) -> RemoveNodeResult:
    cordon = d.get("cordon")
    return RemoveNodeResult(
        str(d["pod_name"]),
        None if d.get("node_name") is None else str(d["node_name"]),
        cordon_from_json(cordon) if cordon else None,
        bool(d["pod_deleted"]),
        str(d["detail"]),
    )


def scale_from_json(d: dict[str, Any]) -> ScaleResult:
    def opt(key: str) -> int | None:
        return None if d.get(key) is None else int(d[key])

    return ScaleResult(
        str(d["group"]),
        int(d["requested"]),
        opt("replicas"),
        opt("previous"),
        bool(d["changed"]),
        bool(d["clamped"]),
        None if d.get("refused") is None else str(d["refused"]),
        int(d["attempts"]),
        str(d["detail"]),
        tuple(str(n) for n in d.get("named") or ()),
        tuple(str(n) for n in d.get("cleared") or ()),
    )


class RemoteKubernetesActuator:
    """`KubernetesActuator`'s calls, made by the ``rcp-kube-actuator`` service."""

    def __init__(self, config: KubernetesConfig) -> None:
        if not config.actuator_url:
            raise KubernetesActuatorError("kubernetes.actuator_url is not set")
        self.config = config
        self.url = config.actuator_url.rstrip("/")
        # One call may cordon with retries and delete a pod: several Kubernetes requests.
        self.timeout_s = config.request_timeout_s * (config.conflict_retries + 3)

    def close(self) -> None:
        """Nothing to release: every call opens its own connection."""

    def __enter__(self) -> RemoteKubernetesActuator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _token(self) -> str:
        return read_actuator_token(self.config.actuator_token_file)

    def _post(self, route: str, body: dict[str, Any]) -> Any:
        data = json.dumps(body, allow_nan=False).encode()
        request = urllib.request.Request(
            f"{self.url}{route}",
            data=data,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self._token()}",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())["result"]
        except urllib.error.HTTPError as exc:
            try:
                answer = json.loads(exc.read() or b"{}")
                message = str(answer.get("error") or exc.reason)
                rid = answer.get("request_id")
            except (ValueError, AttributeError):
                message, rid = f"HTTP {exc.code} {exc.reason}", None
            where = f" (request {rid})" if rid else ""
            error = _ERRORS.get(exc.code, KubernetesActuatorError)
            raise error(f"actuator service {route}: {message}{where}") from None
        except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
            raise KubernetesActuatorError(
                f"cannot reach the actuator service at {self.url} (kubernetes.actuator_url, "
                f"timeout {self.timeout_s:g} s): {exc}"
            ) from exc

    def remove_node(self, pod_name: str, reason: str) -> RemoveNodeResult:
        result = self._post("/v1/remove-node", {"pod_name": pod_name, "reason": reason})
        return remove_from_json(result)

    def cordon(self, node_name: str, reason: str) -> CordonResult:
        result = self._post("/v1/cordon", {"node_name": node_name, "reason": reason})
        return cordon_from_json(result)

    def scale_external(
        self, replicas: int, provider: str | None = None, workers_to_delete: Sequence[str] = ()
    ) -> ScaleResult:
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        body: dict[str, Any] = {"replicas": replicas}
        if provider:
            body["provider"] = provider
        if workers_to_delete:
            body["workers_to_delete"] = list(workers_to_delete)
        return scale_from_json(self._post("/v1/scale-external", body))

    def pod_for_ip(self, pod_ip: str) -> str | None:
        result = self._post("/v1/pod-for-ip", {"pod_ip": pod_ip})
        return None if result is None else str(result)

    def uncordon(self, node_name: str) -> UncordonResult:
        key = self.config.taint_key
        raise KubernetesActuatorError(
            f"uncordon is an operator's command; the actuator service does not offer it to the "
            f"Ray head. With your own kubeconfig run `rcp uncordon {node_name} "
            "kubernetes.actuator_url=null kubernetes.in_cluster=false`, or "
            f"`kubectl uncordon {node_name} && kubectl taint node {node_name} {key}-`"
        )
