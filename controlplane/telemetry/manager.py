"""Starting and asking the telemetry agents: what the policy actor and the CLI call.

Owns: the agents' names (``rcp-telemetry-<node_id>`` in namespace ``rcp``, detached), starting
one on every alive node that lacks one (`ensure_agents`, pinned with
``NodeAffinitySchedulingStrategy(node_id, soft=False)`` and ``num_cpus=0`` so it never takes a
CPU from work nor keeps an idle external node alive), and the fan-out calls: `collect_summaries`
(newest summary per node), `collect_samples` (recent history per node, for the health policy),
`inject_fault`, `agent_endpoints`, `health_report`.
Must not: decide anything (verdicts come from `policies.health` through `verdicts`) or act on
nodes. Every call here needs a connected Ray driver (`controlplane.ray_connection.connect`).

An agent that does not answer within `timeout_s` is left out of a collection (and named in the
log), so one stuck node never stalls a tick.

Trust: any Ray job may create a named actor in any namespace, and list every named actor, so a
name (or a namespace, guessable or not) proves nothing. The controller passes `trusted`, the
actor id of every agent it created (kept in its store): an actor under an agent's name with
another id is an impostor, killed and replaced (`AgentRef.impostor`), and never asked for
samples. Actor ids are assigned by Ray and cannot be chosen by a job. Without `trusted` (the
CLI) every agent is believed, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from controlplane.config import Config, HealthConfig, to_dict
from controlplane.pools import pool_of
from controlplane.telemetry.readings import TelemetryError
from controlplane.telemetry.verdicts import judge
from policies.health import HealthState, NodeVerdict

__all__ = [
    "AGENT_NAME_PREFIX",
    "NAMESPACE",
    "AgentCluster",
    "AgentRef",
    "RayAgentCluster",
    "agent_endpoints",
    "agent_name",
    "collect_samples",
    "collect_summaries",
    "ensure_agents",
    "find_agents",
    "health_report",
    "inject_fault",
    "prometheus_file_sd",
    "resolve_node_id",
    "stop_agent",
    "verdict_json",
    "vet_agents",
]

log = logging.getLogger(__name__)

AGENT_NAME_PREFIX = "rcp-telemetry-"
NAMESPACE = "rcp"


def agent_name(node_id: str) -> str:
    return f"{AGENT_NAME_PREFIX}{node_id}"


@dataclass(frozen=True)
class AgentRef:
    node_id: str
    pool: str
    started: bool
    """True when this call created the agent."""
    idle_external: bool = False
    """An idle external node: it gets no agent (one that ran there was stopped by this call if
    `stopped`), so the autoscaler can remove it."""
    stopped: bool = False
    actor_id: str | None = None
    """The agent's Ray actor id (hex) when known: the one this call created or trusted."""
    impostor: str | None = None
    """The actor id of an actor under the agent's name that `trusted` did not name: this call
    killed it; a trusted agent is started on the next call (the name frees asynchronously)."""


class AgentCluster(Protocol):
    """What `ensure_agents` needs from Ray (a fake in unit tests)."""

    def alive_nodes(self) -> list[dict[str, Any]]: ...

    def available(self) -> dict[str, dict[str, float]]:
        """Available resources by node id."""

    def agents(self) -> dict[str, tuple[str, Any]]:
        """Node id -> (actor id hex, handle) of every actor named like an agent."""

    def create(self, node_id: str, args: tuple[Any, ...], reuse: bool) -> str | None:
        """Start the agent of `node_id`; its actor id, or None when the name is taken (with
        `reuse`, the existing actor's id is returned instead)."""

    def kill(self, handle: Any) -> None: ...

    def controller_running(self) -> bool:
        """Whether the control plane's controller actor exists (it starts the agents then).
        Local mode only: on Kubernetes the controller runs in-process and no actor exists."""


CONTROLLER_ACTOR = "rcp-controller"
"""The controller's actor name in `NAMESPACE` (controlplane.controller.actor.ACTOR_NAME)."""


def vet_agents(
    found: Mapping[str, str], trusted: Mapping[str, str] | None
) -> tuple[set[str], dict[str, str]]:
    """(nodes whose agent is trusted, node -> actor id of impostors) for `found` (node -> actor
    id of the actor under the agent's name). Without `trusted`, every agent is believed."""
    if trusted is None:
        return set(found), {}
    ok = {n for n, actor_id in found.items() if trusted.get(n) == actor_id}
    return ok, {n: a for n, a in found.items() if n not in ok}


def _named_agents() -> dict[str, tuple[str, Any]]:
    import ray  # deferred: ray is heavy and optional here

    handles: dict[str, tuple[str, Any]] = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name, namespace = entry.get("name", ""), entry.get("namespace")
        if namespace != NAMESPACE or not name.startswith(AGENT_NAME_PREFIX):
            continue
        try:
            handle = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:  # died between listing and lookup
            continue
        handles[name[len(AGENT_NAME_PREFIX) :]] = (handle._actor_id.hex(), handle)
    return handles


def find_agents(trusted: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Handles of the agents that exist now, by node id; with `trusted` (node -> actor id),
    only the actors it names (see the module docstring)."""
    found = _named_agents()
    ok, _impostors = vet_agents({n: a for n, (a, _h) in found.items()}, trusted)
    return {n: h for n, (_a, h) in found.items() if n in ok}


class RayAgentCluster:
    """`AgentCluster` through the connected driver."""

    def alive_nodes(self) -> list[dict[str, Any]]:
        import ray  # deferred: ray is heavy and optional here

        nodes: list[dict[str, Any]] = ray.nodes()
        return [n for n in nodes if n.get("Alive")]

    def available(self) -> dict[str, dict[str, float]]:
        import ray  # deferred: ray is heavy and optional here

        return dict(ray._private.state.available_resources_per_node())

    def agents(self) -> dict[str, tuple[str, Any]]:
        return _named_agents()

    def create(self, node_id: str, args: tuple[Any, ...], reuse: bool) -> str | None:
        import ray  # deferred: ray is heavy and optional here
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # Deferred: the agent imports prometheus_client (heavy); only starting one needs it.
        from controlplane.telemetry.agent import TelemetryAgent

        try:
            handle: Any = (
                ray.remote(TelemetryAgent)
                .options(
                    name=agent_name(node_id),
                    namespace=NAMESPACE,
                    lifetime="detached",
                    get_if_exists=reuse,
                    num_cpus=0,
                    max_restarts=-1,
                    max_concurrency=4,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                )
                .remote(*args)
            )
        except ValueError as exc:  # the name is taken (a racing creator); seen next call
            log.warning("telemetry agent name for node %s is taken: %s", node_id, exc)
            return None
        return str(handle._actor_id.hex())

    def kill(self, handle: Any) -> None:
        import ray  # deferred: ray is heavy and optional here

        ray.kill(handle, no_restart=True)

    def controller_running(self) -> bool:
        import ray  # deferred: ray is heavy and optional here

        try:
            ray.get_actor(CONTROLLER_ACTOR, namespace=NAMESPACE)
        except ValueError:
            return False
        return True


def _is_idle(total: dict[str, float], available: dict[str, float]) -> bool:
    """Nothing holds any of the node's GPUs or CPUs."""
    return all(available.get(k, 0.0) >= total.get(k, 0.0) for k in ("GPU", "CPU"))


def ensure_agents(
    cfg: Config,
    exclude: Collection[str] = (),
    trusted: Mapping[str, str] | None = None,
    cluster: AgentCluster | None = None,
) -> list[AgentRef]:
    """Start an agent on every alive node without one; cheap when all are there.

    Exception: an external node that runs nothing gets no agent, and an agent already there is
    stopped (with `telemetry.stop_agents_on_idle_external`, the default). Ray counts a node
    with a live actor as busy even when the actor holds no resources, so an agent would keep a
    rented node alive forever; without it the autoscaler removes the node after
    `pools.external.idle_timeout_s`. The agent comes back on the first call after work lands
    there. Nodes in `exclude` (ones being drained: Ray schedules nothing new there) get no new
    agent. Returns one `AgentRef` per alive node. Does not wait for new agents to start.

    With `trusted` (see the module doc) impostors are killed and reported, and new agents are
    created without reusing an existing actor of that name; the caller records the `actor_id`
    of every ref it gets back. Without `trusted`, no agent is started while the controller
    runs (it kills agents it did not create, so a second creator would only race it).
    """
    ray_agents = cluster or RayAgentCluster()
    found = ray_agents.agents()
    ok, impostors = vet_agents({n: a for n, (a, _h) in found.items()}, trusted)
    sections = to_dict(cfg)
    telemetry, health = sections["telemetry"], sections["health"]
    available = ray_agents.available()
    # On Kubernetes the controller runs in-process (no actor to find): only it starts agents.
    may_create = trusted is not None or (
        not cfg.kubernetes.enabled and not ray_agents.controller_running()
    )
    refs = []
    for node in ray_agents.alive_nodes():
        node_id = node["NodeID"]
        labels = {
            k: v for k, v in (node.get("Labels") or {}).items() if not k.startswith("ray.io/")
        }
        resources = node.get("Resources") or {}
        pool = pool_of(labels, resources)
        if (
            cfg.telemetry.stop_agents_on_idle_external
            and pool == "external"
            and _is_idle(resources, available.get(node_id, {}))
        ):
            stopped = node_id in found
            if stopped:
                ray_agents.kill(found[node_id][1])
                log.info("stopped telemetry agent on idle external node %s", node_id)
            refs.append(AgentRef(node_id, pool, started=False, idle_external=True, stopped=stopped))
            continue
        if node_id in impostors:
            ray_agents.kill(found[node_id][1])
            log.warning(
                "actor %s under the telemetry agent name of node %s was not started by the "
                "control plane: killed; a trusted agent starts next tick",
                impostors[node_id],
                node_id,
            )
            refs.append(AgentRef(node_id, pool, started=False, impostor=impostors[node_id]))
            continue
        if node_id in ok or node_id in exclude or not may_create:
            actor_id = found[node_id][0] if node_id in ok else None
            refs.append(AgentRef(node_id, pool, started=False, actor_id=actor_id))
            continue
        args = (node_id, pool, node["NodeManagerAddress"], int(resources.get("GPU", 0)))
        actor_id = ray_agents.create(node_id, (*args, telemetry, health), reuse=trusted is None)
        if actor_id is not None:
            log.info("started telemetry agent on node %s (pool %s)", node_id, pool)
        refs.append(AgentRef(node_id, pool, started=actor_id is not None, actor_id=actor_id))
    return refs


def stop_agent(node_id: str) -> bool:
    """Stop the agent on `node_id` (a drained node goes once nothing runs there)."""
    import ray  # deferred: ray is heavy and optional here

    handle = find_agents().get(node_id)
    if handle is None:
        return False
    ray.kill(handle, no_restart=True)
    return True


def _gather(calls: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """ray.get each call by node id; nodes that fail or do not answer in time are left out."""
    import ray  # deferred: ray is heavy and optional here

    if not calls:
        return {}
    by_ref = {ref: node_id for node_id, ref in calls.items()}
    ready, not_ready = ray.wait(list(by_ref), num_returns=len(by_ref), timeout=timeout_s)
    results: dict[str, Any] = {}
    for ref in ready:
        try:
            results[by_ref[ref]] = ray.get(ref)
        except Exception as exc:  # an agent that died or raised: skip it this time
            log.warning("telemetry agent on %s failed: %s", by_ref[ref], exc)
    for ref in not_ready:
        log.warning("telemetry agent on %s did not answer in %.1f s", by_ref[ref], timeout_s)
    return results


def collect_summaries(timeout_s: float = 5.0) -> dict[str, dict[str, Any]]:
    """The newest summary of every agent that has sampled at least once, by node id."""
    handles = find_agents()
    results = _gather({n: h.latest.remote() for n, h in handles.items()}, timeout_s)
    return {n: s for n, s in results.items() if s is not None}


def collect_samples(
    max_samples: int | None = None,
    timeout_s: float = 5.0,
    seen_until: Mapping[str, float | None] | None = None,
    trusted: Mapping[str, str] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Recent summaries of every agent (oldest first), by node id, for the health policy.

    `seen_until` (node id -> the newest sample time the caller has judged) makes each agent
    send only what is newer: the policy actor's steady state is one summary per node. With
    `trusted`, only agents with the recorded actor ids are asked.
    """
    handles = find_agents(trusted)
    seen = seen_until or {}
    return _gather(
        {n: h.recent.remote(max_samples, seen.get(n)) for n, h in handles.items()}, timeout_s
    )


def agent_endpoints(timeout_s: float = 30.0) -> dict[str, dict[str, Any]]:
    """`info()` of every agent (exporter URL, host, port, samples), by node id."""
    handles = find_agents()
    return _gather({n: h.info.remote() for n, h in handles.items()}, timeout_s)


def prometheus_file_sd(infos: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A Prometheus ``file_sd_configs`` target list for the agents' `info()` by node id.

    Write it as JSON to a file Prometheus watches; node and pool are also on every sample.
    """
    return [
        {
            "targets": [f"{info['exporter_host']}:{info['exporter_port']}"],
            "labels": {"rcp_node": node_id, "rcp_pool": str(info["pool"])},
        }
        for node_id, info in sorted(infos.items())
    ]


def resolve_node_id(node: str, node_ids: Iterable[str]) -> str:
    """The one node id that equals, starts with or ends with `node` (as `rcp nodes` shows it)."""
    ids = list(node_ids)
    if node in ids:
        return node
    matches = [i for i in ids if i.startswith(node) or i.endswith(node)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise TelemetryError(
            f"no telemetry agent on a node matching {node!r}; nodes with agents: "
            + (", ".join(sorted(ids)) or "none (the controller starts one on every node each tick)")
        )
    raise TelemetryError(f"{node!r} matches several nodes: {', '.join(sorted(matches))}")


def inject_fault(node_id: str, kind: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Inject `kind` into the simulated source of `node_id`'s agent (prefix or suffix works)."""
    import ray  # deferred: ray is heavy and optional here

    handles = find_agents()
    node_id = resolve_node_id(node_id, handles)
    try:
        result: dict[str, Any] = ray.get(
            handles[node_id].inject_fault.remote(kind), timeout=timeout_s
        )
    except ray.exceptions.RayTaskError as exc:
        raise TelemetryError(str(getattr(exc, "cause", None) or exc)) from exc
    return result


def _running_health_config(timeout_s: float) -> HealthConfig:
    """The `health` section the agents were started with (defaults if none says)."""
    import ray  # deferred: ray is heavy and optional here
    from omegaconf import OmegaConf

    for handle in find_agents().values():  # any one agent will do
        try:
            info = ray.get(handle.info.remote(), timeout=timeout_s)
        except Exception:
            continue
        if info.get("health"):
            merged = OmegaConf.merge(OmegaConf.structured(HealthConfig), info["health"])
            cfg = OmegaConf.to_object(merged)
            assert isinstance(cfg, HealthConfig)
            return cfg
    return HealthConfig()


def health_report(
    health: HealthConfig | None = None,
    state: HealthState | None = None,
    now_s: float | None = None,
    max_samples: int | None = None,
    timeout_s: float = 5.0,
) -> tuple[dict[str, NodeVerdict], HealthState, dict[str, dict[str, Any]]]:
    """Verdicts from every agent's recent history: (verdicts, new state, latest summaries).

    `health` defaults to the section the agents were started with. Without a stored `state`
    (the CLI) the verdict reflects the last `max_samples` samples the agents keep (all when
    None); lemon records and staleness need the policy actor's stored state.
    """
    if health is None:
        health = _running_health_config(timeout_s)
    samples = collect_samples(max_samples=max_samples, timeout_s=timeout_s)
    verdicts, new_state = judge(samples, health, state, time.time() if now_s is None else now_s)
    latest = {n: s[-1] for n, s in samples.items() if s}
    return verdicts, new_state, latest


def verdict_json(v: NodeVerdict) -> dict[str, Any]:
    out = asdict(v)
    out["verdict"] = v.verdict.value
    out["reasons"] = [r.value for r in v.reasons]
    return out
