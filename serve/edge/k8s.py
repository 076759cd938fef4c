"""The edge's files for Kubernetes: the ConfigMap ``rcp-edge-config`` the rcp-edge pods mount.

Owns: the Kubernetes choices of the edge's settings (`k8s_settings`: listen on every address
of the pod on the serve port, the admin listener on its own port, the files read from the
ConfigMap's read-only mount, the Serve proxies found by the headless Service
``rcp-serve-proxies``'s DNS name, the log to stdout, no runtime API socket), the ConfigMap
built from `serve.edge.config.render` (`config_map`), its digest (`config_digest`: the
Deployment's pod template carries it, so a changed configuration rolls the pods; HAProxy
reads its files only when it starts), and the command that prints the checked-in
``infra/k8s/edge-config.yaml``::

    python -m serve.edge.k8s --rcp-configmap infra/k8s/configmap-rcp.yaml \\
        --http-port 8000 --admin-port 8404 > infra/k8s/edge-config.yaml

The ports are flags, not read here: their defaults belong to the control plane's config
(``serve.http_port``, ``serve.edge_admin_port``), which this package may not import. The
``serving`` section (route prefix, ingress limits) is read from the ConfigMap's ``rcp.yaml``
with `serve.config.serving_from_dict`, whose defaults are the control plane's too (it embeds
`ServingConfig`). tests/unit/kube/test_k8s_manifests.py renders the file again from the config
``controlplane.config.load_config`` reads and fails when the checked-in file differs.

Must not: import `controlplane` or Ray, talk to a Kubernetes API server, or write files (the
command prints; the caller redirects).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from serve.config import IngressConfig, serving_from_dict
from serve.edge.config import DnsProxies, EdgeSettings, render

__all__ = [
    "CONFIG_MAP_NAME",
    "DIGEST_ANNOTATION",
    "MOUNT_DIR",
    "NAMESPACE",
    "PROXIES_SERVICE",
    "config_digest",
    "config_map",
    "k8s_settings",
    "main",
    "manifest_text",
]

NAMESPACE = "rcp"
CONFIG_MAP_NAME = "rcp-edge-config"
MOUNT_DIR = "/usr/local/etc/haproxy"
"""Where the pod mounts the ConfigMap (read-only): the official HAProxy image's config dir."""
PROXIES_SERVICE = "rcp-serve-proxies"
"""The headless Service over the worker pods' Serve proxies (infra/k8s/services.yaml)."""
DIGEST_ANNOTATION = "rcp.dev/edge-config-sha256"
"""The pod template annotation in infra/k8s/edge.yaml that holds `config_digest`."""
THREADS = 2


def k8s_settings(
    http_port: int,
    admin_port: int,
    route_prefix: str,
    ingress: IngressConfig,
    work_dir: str = MOUNT_DIR,
) -> EdgeSettings:
    """The edge's settings in a pod of the rcp-edge Deployment. `work_dir` is the mount; a
    check outside a pod (``haproxy -c``) renders with a directory of its own instead."""
    return EdgeSettings(
        listen_host="0.0.0.0",
        listen_port=http_port,
        admin_host="0.0.0.0",
        admin_port=admin_port,
        work_dir=work_dir,
        proxies=DnsProxies(f"{PROXIES_SERVICE}.{NAMESPACE}.svc.cluster.local", http_port),
        route_prefix=route_prefix,
        ingress=ingress,
        threads=THREADS,
        log_target="stdout",
    )


def config_digest(files: Mapping[str, str]) -> str:
    """sha256 over the files' names and texts, in name order (hex)."""
    h = hashlib.sha256()
    for name in sorted(files):
        for part in (name, files[name]):
            data = part.encode()
            h.update(len(data).to_bytes(8, "big"))
            h.update(data)
    return h.hexdigest()


def config_map(files: Mapping[str, str]) -> dict[str, Any]:
    """The ConfigMap ``rcp-edge-config`` holding `files` (`serve.edge.config.render`'s)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": CONFIG_MAP_NAME,
            "namespace": NAMESPACE,
            "labels": {
                "app.kubernetes.io/name": "rcp-edge",
                "app.kubernetes.io/part-of": "ray-controlplane",
            },
            "annotations": {DIGEST_ANNOTATION: config_digest(files)},
        },
        "data": {name: files[name] for name in sorted(files)},
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line texts as literal blocks, so the checked-in file reads like the config."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def manifest_text(manifest: Mapping[str, Any], command: str) -> str:
    """The ConfigMap as YAML, under a header naming the `command` that printed it."""
    header = (
        "# The rcp-edge pods' HAProxy configuration (edge.yaml mounts it read-only at\n"
        f"# {MOUNT_DIR}). Generated; do not edit. After changing serving.* in\n"
        "# configmap-rcp.yaml or serve/edge/, print it again with\n"
        f"#   {command} > infra/k8s/edge-config.yaml\n"
        f"# and copy metadata.annotations {DIGEST_ANNOTATION} into edge.yaml's pod template\n"
        "# (tests/unit/kube/test_k8s_manifests.py checks both).\n"
    )
    body = yaml.dump(dict(manifest), Dumper=_Dumper, sort_keys=False, width=100)
    return header + body


def _serving_section(configmap_path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(configmap_path.read_text())
    try:
        rcp = yaml.safe_load(doc["data"]["rcp.yaml"]) or {}
    except (KeyError, TypeError) as exc:
        raise SystemExit(f"{configmap_path}: not a ConfigMap with data rcp.yaml") from exc
    serving = rcp.get("serving") or {}
    if not isinstance(serving, dict):
        raise SystemExit(f"{configmap_path}: rcp.yaml serving: a mapping, got {serving!r}")
    return serving


def main(argv: Sequence[str] | None = None) -> str:
    """Print the ConfigMap for the ports given and the ConfigMap's ``serving`` section;
    returns the text printed."""
    parser = argparse.ArgumentParser(
        prog="python -m serve.edge.k8s",
        description="Print the rcp-edge HAProxy ConfigMap (infra/k8s/edge-config.yaml).",
    )
    parser.add_argument(
        "--rcp-configmap",
        type=Path,
        required=True,
        help="the control plane's ConfigMap (infra/k8s/configmap-rcp.yaml): its serving section",
    )
    parser.add_argument("--http-port", type=int, required=True, help="serve.http_port")
    parser.add_argument("--admin-port", type=int, required=True, help="serve.edge_admin_port")
    args = parser.parse_args(argv)
    try:
        serving = serving_from_dict(_serving_section(args.rcp_configmap))
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"{args.rcp_configmap}: {exc}") from exc
    try:
        files = render(
            k8s_settings(args.http_port, args.admin_port, serving.route_prefix, serving.ingress)
        )
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    command = (
        f"python -m serve.edge.k8s --rcp-configmap {args.rcp_configmap} "
        f"--http-port {args.http_port} --admin-port {args.admin_port}"
    )
    text = manifest_text(config_map(files), command)
    sys.stdout.write(text)
    return text


if __name__ == "__main__":
    main()
