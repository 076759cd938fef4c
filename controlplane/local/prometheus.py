"""The local cluster's Prometheus server: the ``prometheus`` binary on ``ray.node_ip`` scraping
Ray's metrics agents, the telemetry agents' exporters and the edge, with the alert rules of
``infra/prometheus/rules.yml`` loaded. Opt-in (``observability.prometheus``).

Owns: the server process (start, readiness, stop), its config file and data dir under
``<state_dir>/prometheus``, a small query client for tests, and `rcp up`'s start of it
(`start_for_cluster`; `prometheus_url`, which the head's dashboard is pointed at).
Must not: bind anything but loopback, or start unless asked. The target lists and the config
it writes come from `controlplane.observability`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.config import Config
from controlplane.local.ports import port_in_use
from controlplane.observability import (
    PROMETHEUS_DIR,
    TELEMETRY_SD_FILE,
    local_prometheus_config,
    prometheus_dir,
    ray_metrics_sd_file,
    write_file_sd,
)

__all__ = ["LocalPrometheus", "PrometheusError", "prometheus_url", "start_for_cluster"]


class PrometheusError(RuntimeError):
    """The local Prometheus could not start or answer; the message says what to do."""


@dataclass
class LocalPrometheus:
    """The ``prometheus`` binary on 127.0.0.1, with its config, targets and data in `work_dir`."""

    work_dir: Path
    ray_sd_file: Path
    port: int = 9090
    scrape_interval_s: float = 5.0
    rule_files: tuple[Path, ...] = (PROMETHEUS_DIR / "rules.yml",)
    binary: str | None = None
    host: str = "127.0.0.1"
    edge_target: str | None = None
    """``host:port`` of the edge's admin listener (``serve.edge_admin_port``), scraped as the
    ``rcp-edge`` job at two paths (HAProxy's exporter, the route-table gauges); None: not
    scraped."""
    env: Mapping[str, str] | None = None
    """The server's environment (default: this process's); `rcp up` adds its cluster marker
    so `rcp down` stops the server with the rest."""
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @classmethod
    def for_cluster(cls, cfg: Config, port: int = 9090, **kwargs: Any) -> LocalPrometheus:
        """One for the local cluster of `cfg`: files under ``<state_dir>/prometheus``."""
        return cls(
            work_dir=prometheus_dir(cfg),
            ray_sd_file=ray_metrics_sd_file(cfg),
            port=port,
            host=cfg.ray.node_ip,
            edge_target=f"{cfg.ray.node_ip}:{cfg.serve.edge_admin_port}",
            **kwargs,
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs (it outlives this object: stop it by pid)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def telemetry_sd_file(self) -> Path:
        return self.work_dir / TELEMETRY_SD_FILE

    @property
    def log_file(self) -> Path:
        return self.work_dir / "prometheus.log"

    def write_config(self) -> Path:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if not self.telemetry_sd_file.exists():
            write_file_sd(self.telemetry_sd_file, [])
        config = local_prometheus_config(
            ray_sd_file=self.ray_sd_file,
            telemetry_sd_file=self.telemetry_sd_file,
            rule_files=self.rule_files,
            scrape_interval_s=self.scrape_interval_s,
            edge_target=self.edge_target,
        )
        path = self.work_dir / "prometheus.yml"
        path.write_text(json.dumps(config, indent=2))  # JSON is YAML
        return path

    def start(self, ready_timeout_s: float = 60.0) -> None:
        """Start the server and wait until it answers; raises PrometheusError otherwise."""
        binary = self.binary or shutil.which("prometheus")
        if binary is None:
            raise PrometheusError(
                "the prometheus binary is not installed (Debian: apt-get install prometheus; "
                "or pass binary=...)"
            )
        config = self.write_config()
        log = self.log_file.open("ab")
        try:
            self._proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.work_dir / 'data'}",
                    f"--web.listen-address={self.host}:{self.port}",
                    "--web.enable-lifecycle",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=None if self.env is None else dict(self.env),
            )
        finally:
            log.close()
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise PrometheusError(
            f"prometheus did not become ready on {self.url} within {ready_timeout_s:.0f}s; "
            f"see {self.log_file}"
        )

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            tail = self.log_file.read_text(errors="replace")[-2000:]
            raise PrometheusError(f"prometheus exited with {self._proc.returncode}:\n{tail}")

    def stop(self, timeout_s: float = 30.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)

    def api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """GET ``/api/v1/<path>``; the ``data`` of a successful answer."""
        self._check_alive()
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
            raise PrometheusError(f"{url}: {exc.code} {body.get('error', '')}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{url}: {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector (empty when there is no data)."""
        data = self.api("query", {"query": promql})
        result: list[dict[str, Any]] = data["result"] if data["resultType"] == "vector" else []
        if data["resultType"] == "scalar":
            result = [{"metric": {}, "value": data["result"]}]
        return result

    def __enter__(self) -> LocalPrometheus:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def prometheus_url(cfg: Config) -> str:
    """Where the local cluster's Prometheus answers (``observability.prometheus_port``)."""
    return f"http://{cfg.ray.node_ip}:{cfg.observability.prometheus_port}"


def start_for_cluster(
    cfg: Config, env: Mapping[str, str], echo: Callable[[str], None]
) -> str | None:
    """The local Prometheus (observability.prometheus): its URL; None, with a note, if it
    cannot run."""
    host, port = cfg.ray.node_ip, cfg.observability.prometheus_port
    if port_in_use(host, port):
        echo(
            f"prometheus: not started, {host}:{port} is in use (choose another with "
            "observability.prometheus_port=..., or observability.prometheus=false)"
        )
        return None
    prom = LocalPrometheus.for_cluster(
        cfg,
        port=port,
        env=env,
        scrape_interval_s=cfg.observability.scrape_interval_s,
    )
    try:
        prom.start()
    except PrometheusError as exc:
        echo(f"prometheus: not started ({str(exc).splitlines()[0]})")
        return None
    return prom.url
