"""The desired state of the serving plane and its encoding as Serve application configs.

Owns: `DesiredState` (replica target per (model, pool), route weights per model, the
generation of the route table, the serving config) and the two pure translations between it
and Serve's declarative application configs:

* `build_app_configs(state)`: one ingress app (route weights in its ``user_config``, its
  replica count the one the control loop scaled it to) and one
  backend app per (model, pool) whose target is above zero, on its own internal route prefix
  `backend_route_prefix` (``/_rcp/<model>/<pool>``), where the edge sends predicts
  straight to it (docs/serving.md, "Backend routes"). A pool at zero has no app: Serve
  refuses ``num_replicas=0`` for a static deployment, so that pool's app is removed and
  re-created later; the other pool's app keeps its config, so its replicas are untouched.
* `desired_from_app_configs(configs)`: the inverse, used to read the current desired state
  back from Serve's controller, which is the one place it is stored. A redeploy therefore
  starts from what is deployed and never resets targets or weights.

Every change keeps each app's ``import_path`` and ``args`` identical, so Serve sees the same
code version and applies it as a lightweight update (``num_replicas`` or ``user_config``)
instead of a rolling restart.

Must not: import Ray or talk to Serve (that is `serve.control.client`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from policies.snapshot import POOL_LABEL, Pool, pool_resource
from serve.config import BACKEND_ROUTE_ROOT, POOLS, ModelConfig, ServingConfig, serving_from_dict

__all__ = [
    "BACKEND_DEPLOYMENT",
    "BACKEND_ROUTE_ROOT",
    "INGRESS_APP",
    "INGRESS_DEPLOYMENT",
    "INGRESS_POOLS",
    "INGRESS_POOLS_SELECTOR",
    "APP_PREFIX",
    "AppConfig",
    "BackendArgs",
    "DesiredState",
    "IngressArgs",
    "IngressUserConfig",
    "app_name",
    "backend_route_prefix",
    "build_app_configs",
    "declarative_configs",
    "desired_from_app_configs",
    "initial_state",
    "parse_app_name",
    "pool_resource",
]

APP_PREFIX = "rcp"
INGRESS_APP = f"{APP_PREFIX}-ingress"
INGRESS_DEPLOYMENT = "Ingress"
INGRESS_POOLS = (Pool.HEAD, Pool.CLUSTER)
"""Where ingress replicas run: the head and the owned cluster nodes, spread over them, where
the proxies that take most traffic are. Serve's proxy prefers the ingress replica on its own
node, so a node that dies takes with it the requests that entered its own proxy (connections
a client retries), not requests that entered elsewhere. Never a rented node, which the
autoscaler must be free to remove."""
INGRESS_POOLS_SELECTOR = f"in({','.join(p.value for p in INGRESS_POOLS)})"
"""Ray's label selector for `INGRESS_POOLS` (on the ``pool`` label)."""
BACKEND_DEPLOYMENT = "Backend"
_BACKEND_IMPORT = "serve.app.build:build_backend"
_INGRESS_IMPORT = "serve.app.build:build_ingress"


class LoggingOptions(TypedDict):
    enable_access_log: bool


class _ActorOptionsRequired(TypedDict):
    num_cpus: float


class ActorOptions(_ActorOptionsRequired, total=False):
    num_gpus: float
    resources: dict[str, float]
    label_selector: dict[str, str]


class IngressUserConfig(TypedDict):
    """The ingress's ``user_config``: what every ingress replica routes by."""

    generation: int
    weights: dict[str, dict[str, float]]
    """Route weight per model, per pool."""
    settings: dict[str, Any]
    """`IngressConfig` as a dict."""
    serving: dict[str, Any]
    """`ServingConfig` as a dict: how `desired_from_app_configs` reads the config back."""


class _DeploymentConfigRequired(TypedDict):
    name: str
    num_replicas: int
    max_ongoing_requests: int
    ray_actor_options: ActorOptions


class DeploymentConfig(_DeploymentConfigRequired, total=False):
    """One deployment of an `AppConfig` (Serve's ``DeploymentSchema`` fields we set)."""

    graceful_shutdown_timeout_s: float
    user_config: IngressUserConfig | dict[str, Any]
    """The ingress's route table, or a backend's `ModelConfig.user_config`."""


class BackendArgs(TypedDict):
    """A backend app's ``args``, which `serve.app.build_backend` receives."""

    name: str
    import_path: str
    init_kwargs: dict[str, Any]
    pool: str


class IngressArgs(TypedDict):
    """The ingress app's ``args``: none (its route table arrives as ``user_config``)."""


class AppConfig(TypedDict):
    """One application config we deploy (Serve's ``ServeApplicationSchema`` fields we set)."""

    name: str
    route_prefix: str | None
    import_path: str
    args: BackendArgs | IngressArgs
    logging_config: LoggingOptions
    deployments: list[DeploymentConfig]


def app_name(model: str, pool: str) -> str:
    """Serve application name of the backend of `model` in `pool`, e.g. ``rcp-sample-cluster``."""
    return f"{APP_PREFIX}-{model}-{pool}"


def backend_route_prefix(model: str, pool: str) -> str:
    """Serve route prefix of the backend app of `model` in `pool`, e.g. ``/_rcp/sample/cluster``:
    ``POST <it>/v1/models/<model>/predict`` reaches that app's replicas without the ingress.
    Fixed by (model, pool), so a target or weight change never changes an app's config."""
    return f"{BACKEND_ROUTE_ROOT}/{model}/{pool}"


def parse_app_name(name: str) -> tuple[str, str] | None:
    """(model, pool) of a backend app name, or None for any other app."""
    prefix = f"{APP_PREFIX}-"
    if not name.startswith(prefix) or name == INGRESS_APP:
        return None
    model, _, pool = name[len(prefix) :].rpartition("-")
    if not model or pool not in POOLS:
        return None
    return model, pool


@dataclass(frozen=True)
class DesiredState:
    """What the control plane wants deployed. Stored inside Serve's own config."""

    serving: ServingConfig
    targets: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """Replica target per (model, pool); a missing key means 0."""
    weights: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Route weight per model per pool; a pool with no ready replicas has weight 0."""
    generation: int = 0
    """Increases with every route-table change, so a caller can see that ingress replicas
    applied it."""
    ingress_replicas: int | None = None
    """The ingress deployment's replica count, as the control loop scaled it with the
    request rate; None: ``serving.ingress.num_replicas``."""

    @property
    def ingress_target(self) -> int:
        """The ingress replicas to run: the scaled count, never below the configured floor."""
        floor = self.serving.ingress.num_replicas
        return max(floor, self.ingress_replicas if self.ingress_replicas is not None else floor)

    def with_ingress_replicas(self, num_replicas: int) -> DesiredState:
        if num_replicas < 1:
            raise ValueError(f"the ingress needs at least 1 replica, got {num_replicas}")
        return dataclasses.replace(self, ingress_replicas=num_replicas)

    def target(self, model: str, pool: str) -> int:
        return int(self.targets.get((model, pool), 0))

    def model(self, name: str) -> ModelConfig:
        for m in self.serving.models:
            if m.name == name:
                return m
        known = ", ".join(m.name for m in self.serving.models)
        raise KeyError(f"unknown model {name!r}; declared models: {known}")

    def with_target(self, model: str, pool: str, num_replicas: int) -> DesiredState:
        if pool not in POOLS:
            raise ValueError(f"unknown pool {pool!r}; pools are {list(POOLS)}")
        if num_replicas < 0:
            raise ValueError(f"num_replicas must be >= 0, got {num_replicas}")
        self.model(model)
        targets = dict(self.targets)
        targets[(model, pool)] = num_replicas
        return dataclasses.replace(self, targets=targets)

    def with_weights(self, model: str, weights: Mapping[str, float]) -> DesiredState:
        self.model(model)
        for pool, w in weights.items():
            if pool not in POOLS:
                raise ValueError(f"unknown pool {pool!r}; pools are {list(POOLS)}")
            if w < 0:
                raise ValueError(f"route weight for {model}/{pool} must be >= 0, got {w}")
        all_weights = {m: dict(ws) for m, ws in self.weights.items()}
        all_weights[model] = {p: float(weights.get(p, 0.0)) for p in POOLS}
        return dataclasses.replace(self, weights=all_weights, generation=self.generation + 1)

    def weight(self, model: str, pool: str) -> float:
        return float(self.weights.get(model, {}).get(pool, 0.0))


def initial_state(serving: ServingConfig) -> DesiredState:
    """`min_replicas` of each model in its `initial_pool`, weights not yet set (all 0)."""
    targets = {(m.name, m.initial_pool): m.min_replicas for m in serving.models}
    weights = {m.name: {p: 0.0 for p in POOLS} for m in serving.models}
    return DesiredState(serving=serving, targets=targets, weights=weights, generation=0)


def ingress_user_config(state: DesiredState) -> IngressUserConfig:
    """The ingress's user_config: route table, request limits and the serving config."""
    names = [m.name for m in state.serving.models]
    return {
        "generation": state.generation,
        "weights": {m: {p: state.weight(m, p) for p in POOLS} for m in names},
        "settings": dataclasses.asdict(state.serving.ingress),
        "serving": dataclasses.asdict(state.serving),
    }


def _logging(serving: ServingConfig) -> LoggingOptions:
    return {"enable_access_log": serving.access_log}


def _backend_app(
    serving: ServingConfig, model: ModelConfig, pool: str, num_replicas: int
) -> AppConfig:
    return {
        "name": app_name(model.name, pool),
        "route_prefix": backend_route_prefix(model.name, pool),
        "logging_config": _logging(serving),
        "import_path": _BACKEND_IMPORT,
        # Only what the replica's code depends on: a change here is a real code change.
        "args": {
            "name": model.name,
            "import_path": model.import_path,
            "init_kwargs": dict(model.init_kwargs),
            "pool": pool,
        },
        "deployments": [
            {
                "name": BACKEND_DEPLOYMENT,
                "num_replicas": num_replicas,
                "max_ongoing_requests": model.max_ongoing_requests,
                "graceful_shutdown_timeout_s": model.graceful_shutdown_timeout_s,
                # Not in args: a change reconfigures the running replicas, no restart.
                "user_config": dict(model.user_config),
                "ray_actor_options": {
                    "num_cpus": model.num_cpus,
                    "num_gpus": model.num_gpus,
                    "resources": {pool_resource(pool): 1},
                },
            }
        ],
    }


def build_app_configs(state: DesiredState) -> list[AppConfig]:
    """Serve application configs (dicts for ``ServeApplicationSchema``) for `state`."""
    ing = state.serving.ingress
    apps: list[AppConfig] = [
        {
            "name": INGRESS_APP,
            "route_prefix": state.serving.route_prefix,
            "import_path": _INGRESS_IMPORT,
            "args": IngressArgs(),
            "logging_config": _logging(state.serving),
            "deployments": [
                {
                    "name": INGRESS_DEPLOYMENT,
                    "num_replicas": state.ingress_target,
                    "max_ongoing_requests": ing.max_ongoing_requests,
                    # On the head and the owned cluster nodes (INGRESS_POOLS), spread over
                    # them by Serve's default SPREAD scheduling (docs/serving.md).
                    "ray_actor_options": {
                        "num_cpus": ing.num_cpus,
                        "label_selector": {POOL_LABEL: INGRESS_POOLS_SELECTOR},
                    },
                    "user_config": ingress_user_config(state),
                }
            ],
        }
    ]
    for model in state.serving.models:
        for pool in POOLS:
            n = state.target(model.name, pool)
            if n > 0:
                apps.append(_backend_app(state.serving, model, pool, n))
    return apps


def desired_from_app_configs(configs: Mapping[str, Mapping[str, Any]]) -> DesiredState | None:
    """Read the desired state back from deployed app configs (name -> config dict).

    Returns None when the ingress app is not deployed (the serving plane is not up).
    """
    ingress = configs.get(INGRESS_APP)
    if ingress is None:
        return None
    deployments = ingress.get("deployments") or []
    user_config: Mapping[str, Any] = {}
    ingress_replicas: int | None = None
    for d in deployments:
        if d.get("name") == INGRESS_DEPLOYMENT:
            user_config = d.get("user_config") or {}
            if "num_replicas" in d:
                ingress_replicas = int(d["num_replicas"])
    if "serving" not in user_config:
        return None
    serving = serving_from_dict(dict(user_config["serving"]))
    targets: dict[tuple[str, str], int] = {}
    for name, cfg in configs.items():
        parsed = parse_app_name(name)
        if parsed is None:
            continue
        for d in cfg.get("deployments") or []:
            if d.get("name") == BACKEND_DEPLOYMENT:
                targets[parsed] = int(d.get("num_replicas", 1))
    weights = {
        m: {p: float(w) for p, w in ws.items()}
        for m, ws in (user_config.get("weights") or {}).items()
    }
    return DesiredState(
        serving=serving,
        targets=targets,
        weights=weights,
        generation=int(user_config.get("generation", 0)),
        ingress_replicas=ingress_replicas,
    )


def declarative_configs(details: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Deployed config per application that was deployed from a config and is not deleting."""
    out: dict[str, dict[str, Any]] = {}
    for name, app in (details.get("applications") or {}).items():
        cfg = app.get("deployed_app_config")
        if cfg and str(app.get("status", "")).upper() != "DELETING":
            out[name] = dict(cfg)
    return out
