"""The controller: the detached ``rcp-controller`` actor that makes the training queue real.

Owns: the shell around the control loop: the job store (``Config.jobs_db_path``), the HTTP
API (on ``ray.node_ip:api.port``), the job runner and retention it hands the loop, the real
adapters (`controlplane.adapters`), the `controlplane.loop.Loop` itself (observe -> decide ->
act -> record in one thread), and the operator's side of the API (`Operations`).

The actor lives on the head (``num_cpus=0``), is detached and restarts forever; a restarted
actor reads everything from the store and acts idempotently. `deploy(cfg)` creates it or
finds the running one, waits for the API and returns its URL; the API token is created once
at ``<state_dir>/api-token`` (0600) and the URL written to ``<state_dir>/api-url`` for the
SDK and CLI. On Kubernetes the same class runs in-process in a Ray driver instead
(`controlplane.controller.in_process`): no actor exists there, so `get_controller` is None.

At start it also puts Ray Train's autoscaling coordinator on the head
(`controlplane.adapters.train_coordinator`): left to Train, it lands on a gang's node and
keeps that node from ever finishing a drain.

Must not: decide anything (the policies, run by the loop, do) or touch Ray beyond making the
adapters and deploying itself.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from controlplane.adapters.latency import PrometheusLatency, latency_source_url
from controlplane.adapters.nodes import RayNodes
from controlplane.adapters.prometheus import PrometheusTargets
from controlplane.adapters.ray_jobs import RayJobs
from controlplane.adapters.serve import RayServe
from controlplane.adapters.telemetry import RayTelemetry
from controlplane.adapters.train_coordinator import keep_on_head
from controlplane.api.jobs import JobService
from controlplane.api.operations import OperationRefused, Operations
from controlplane.api.routes import ApiServer
from controlplane.config import Config, from_dict, to_dict
from controlplane.loop import Adapters, Hooks, Loop
from controlplane.loop.act.jobs.runner import JobRunner
from controlplane.loop.decide import policies_of
from controlplane.loop.job_metrics import GpuHoursMeter, JobMetrics
from controlplane.loop.record import EventKind, RayMetrics
from controlplane.pools import Pool, pool_resource
from controlplane.ray_connection import connect, ray_connection_env
from controlplane.store import JobRecord, Store, StoreError, reliability
from controlplane.store.pruning import Retention
from controlplane.telemetry.manager import inject_fault, verdict_json
from controlplane.tokens import admin_token, write_url
from policies.snapshot import ClusterSnapshot
from serve.control.status import serve_status

__all__ = ["ACTOR_NAME", "NAMESPACE", "Controller", "deploy", "get_controller"]

log = logging.getLogger(__name__)

ACTOR_NAME = "rcp-controller"
NAMESPACE = "rcp"


class Controller:
    """The actor's body: the job store, the API server and the control `Loop`. Tests build
    it with ``start=False`` (nothing starts) or with fake `adapters` and drive `loop.tick`."""

    def __init__(
        self,
        cfg_data: dict[str, Any],
        token: str,
        *,
        start: bool = True,
        adapters: Adapters | None = None,
    ) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
        self.cfg: Config = from_dict(cfg_data)
        self.store_problem: str | None = None
        try:
            self.store = Store(self.cfg.jobs_db_path)
        except StoreError as exc:
            # Stay up, serve nothing and say why (`get_store_problem`, which `deploy` reports)
            # rather than die in the constructor and be restarted into the same error.
            log.error("the control plane cannot start: %s", exc)
            self.store_problem = str(exc)
            return
        self.runner = JobRunner(self.store, self.cfg, RayJobs(self.cfg))
        self.retention = Retention(self.store, self.cfg.jobs, forget_many=self.runner.forget_many)
        self.service = JobService(
            self.store,
            self.cfg,
            log_window=self.runner.read_logs,
            what_if=lambda job: self.loop.what_if(job),
        )
        self.gpu_hours = GpuHoursMeter(self.store, self.cfg)
        """Cluster-pool GPU-hours watched, for the fleet's failure record (MTBF)."""
        self._job_metrics: JobMetrics | None = None
        self.loop = Loop(
            self.cfg,
            self.store,
            adapters if adapters is not None else self._ray_adapters(),
            policies_of(self.cfg),
            hooks=Hooks(retention=self.retention.run, job_metrics=self._export_job_metrics),
        )
        self.operations = Operations(
            self.cfg,
            self.loop,
            serve_status=lambda: dict(serve_status()),
            inject_fault=inject_fault,
            uncordon_kube=_kube_uncordon(self.cfg),
        )
        self.api = ApiServer(
            self.service,
            token,
            self.cfg.ray.node_ip,
            self.cfg.api.port,
            liveness=self.liveness,
            operations=self.operations,
        )
        if start:
            self.api.start()
            if adapters is None:  # real Ray: Train's coordinator exists there
                threading.Thread(
                    target=_keep_train_coordinator_on_head, name="train-coordinator", daemon=True
                ).start()
            self.loop.start()
            self.store.record_event(
                EventKind.CONTROLLER_START.value, f"controller serving {self.api.url}"
            )

    def _ray_adapters(self) -> Adapters:
        cfg = self.cfg
        nodes = RayNodes()
        serve = None
        if cfg.serve.deploy_app:
            serve = RayServe({m.name: m.num_gpus for m in cfg.serving.models})
        prometheus = PrometheusTargets(cfg)
        latency_url = latency_source_url(cfg, os.environ) if serve is not None else None
        if serve is not None and latency_url is None:
            log.warning(
                "no Prometheus to read Serve's latency from (RAY_PROMETHEUS_HOST unset, "
                "observability.prometheus off): serving.models[].slo_p99_ms does nothing"
            )
        return Adapters(
            jobs=self.runner,
            nodes=nodes,
            node_actions=nodes,
            telemetry=RayTelemetry(cfg),
            metrics=RayMetrics(),
            serve=serve,
            latency=(
                PrometheusLatency(latency_url, cfg.serving.latency_window_s).read
                if latency_url is not None
                else None
            ),
            prometheus_targets=prometheus.refresh,
            kube_remove=_kube_remove(cfg),
            kube_scale_external=lambda: _kube_scale_external(cfg),
            count_removal=lambda now_s: reliability.record_failure(
                self.store, "node-removed-by-health", now_s
            ),
        )

    # -- actor methods -------------------------------------------------------------------------

    def url(self) -> str:
        return self.api.url

    def get_store_problem(self) -> str | None:
        """Why the job store could not be opened (the actor then serves nothing), or None."""
        return self.store_problem

    def liveness(self) -> str | None:
        """None while the tick loop is alive, else why not (what /healthz answers 503 with):
        no tick has started for a while (`tick_stalled`: a tick hung in a phase, or the loop died)."""
        return self.loop.liveness()

    def get_stats(self) -> dict[str, Any]:
        stats = self.loop.stats
        return {
            "ticks": stats.ticks,
            "failures": dict(stats.failures),
            "last_duration_s": dict(stats.last_duration_s),
            "tick_starts_s": list(self.loop.tick_starts),
        }

    def health(self) -> dict[str, Any]:
        """The policy actor's view of node health (`controller_client.controller_health`):
        verdicts (JSON) by node id, and the nodes it has cordoned (Ray drain) and replaced."""
        keeper = self.loop.health
        return {
            "verdicts": {n: verdict_json(v) for n, v in keeper.verdicts.items()},
            "cordoned": dict(keeper.remediator.cordoned),
            "replaced": dict(keeper.remediator.replaced),
        }

    def breaker_status(self) -> dict[str, Any]:
        """The removal breaker (`Operations.breaker`)."""
        return self.operations.breaker()

    def _export_job_metrics(self, snapshot: ClusterSnapshot, jobs: tuple[JobRecord, ...]) -> None:
        """The fleet record's GPU-hours (summed here, written once a minute) and the recovery
        gauges: each active job's checkpoints and restarts, and the fleet's GPU MTBF."""
        self.gpu_hours.tick(snapshot.live_gpus_total(Pool.CLUSTER), snapshot.now_s)
        if self._job_metrics is None:
            self._job_metrics = JobMetrics()
        self._job_metrics.export(list(jobs), self.gpu_hours.gpu_mtbf_hours, snapshot.now_s)

    def shutdown(self) -> None:
        if self.store_problem is not None:
            return  # nothing was started
        self.loop.stop()
        self.api.stop()


def _kube_scale_external(cfg: Config) -> Any:
    """The Kubernetes actuator's external group scale (only with kubernetes.enabled)."""
    from controlplane.kube import from_config  # deferred: the Kubernetes client is heavy

    actuator = from_config(cfg)
    return None if actuator is None else actuator.scale_external


def _kube_uncordon(cfg: Config) -> Callable[[str], str] | None:
    """On Kubernetes, the operator's uncordon of a Kubernetes node (its detail), else None."""
    if not cfg.kubernetes.enabled:
        return None

    def uncordon(kube_node: str) -> str:
        # Deferred: controlplane.kube imports the Kubernetes client (heavy; production only).
        from controlplane.kube import KubernetesActuatorError, from_config

        try:
            actuator = from_config(cfg)
            if actuator is None:
                raise OperationRefused(409, "kubernetes.enabled is false", "kubernetes.enabled")
            with actuator:
                result = actuator.uncordon(kube_node)
        except KubernetesActuatorError as exc:
            raise OperationRefused(409, str(exc), "node") from None
        return str(result.detail or f"node {kube_node}: uncordoned")

    return uncordon


def _kube_remove(cfg: Config) -> Any:
    """The Kubernetes actuator's node removal when one is configured, else None (local)."""
    if not cfg.kubernetes.enabled:
        return None
    # Deferred: controlplane.kube imports the Kubernetes client (heavy; production only).
    from controlplane.kube import KubeNotFoundError, from_config

    made: list[Any] = []

    def remove(pod_name: str, reason: str) -> Any:
        # Made on first use: bad credentials then fail one removal (logged, retried next
        # tick) instead of the controller's start.
        if not made:
            made.append(from_config(cfg))
        try:
            return made[0].remove_node(pod_name, reason)
        except KubeNotFoundError as exc:
            # The pod's Kubernetes node is gone, and its pods with it: nothing left to do.
            log.warning("removing pod %s: %s; treating it as gone", pod_name, exc)
            return None

    return remove


def get_controller() -> Any:
    """The running controller actor's handle, or None (always None on Kubernetes, where the
    controller runs in-process, not as an actor: `controlplane.controller.in_process`)."""
    import ray

    try:
        return ray.get_actor(ACTOR_NAME, namespace=NAMESPACE)
    except ValueError:
        return None


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def deploy(cfg: Config, timeout_s: float = 120.0) -> str:
    """Create (or find) the controller actor, wait until its API answers, return the API URL.

    The caller is a connected Ray driver. StoreError when the actor cannot open the job
    store; the actor is then removed, so the next deploy opens it again."""
    import ray

    if not ray.is_initialized():
        connect(cfg)
    token = admin_token(cfg)
    actor_cls: Any = ray.remote(Controller)
    handle: Any = actor_cls.options(
        name=ACTOR_NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        resources={pool_resource(Pool.HEAD): 1},
        max_restarts=-1,
        max_task_retries=-1,
        runtime_env={"env_vars": ray_connection_env()},
    ).remote(to_dict(cfg), token)
    url = f"http://{cfg.ray.node_ip}:{cfg.api.port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            problem = ray.get(handle.get_store_problem.remote(), timeout=10)
        except Exception as exc:  # still starting (or restarting)
            log.debug("controller not ready yet: %s", exc)
            problem = None
        if problem:
            ray.kill(handle, no_restart=True)
            raise StoreError(str(problem))
        try:
            url = str(ray.get(handle.url.remote(), timeout=10))
            if _healthy(url):
                write_url(cfg.state_path, url)
                return url
        except Exception as exc:  # still starting (or restarting)
            log.debug("controller not ready yet: %s", exc)
        time.sleep(0.5)
    raise RuntimeError(
        f"the control-plane API did not answer at {url} within {timeout_s:.0f}s; see the "
        f"actor {ACTOR_NAME!r} in the dashboard's Actors tab"
    )


def _keep_train_coordinator_on_head() -> None:
    """Ray Train's coordinator on the head, not on a worker it would keep from draining
    (`controlplane.adapters.train_coordinator`); a failure is logged, never fatal."""
    try:
        log.info("%s", keep_on_head())
    except Exception:  # the control plane runs regardless
        log.exception("could not place Ray Train's autoscaling coordinator on the head")
