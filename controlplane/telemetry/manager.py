"""Starting and asking the telemetry agents: what the policy actor and the CLI call.

Owns: the agents' names (``rcp-telemetry-<node_id>`` in namespace ``rcp``, detached), starting
one on every alive node that lacks one (`ensure_agents`, pinned with
``NodeAffinitySchedulingStrategy(node_id, soft=False)`` and ``num_cpus=0`` so it never takes a
CPU from work nor keeps an idle external node alive), and the fan-out calls: `collect_summaries`
(newest summary per node), `collect_samples` (recent history per node, for the health policy),
`inject_fault`, `agent_endpoints`, `health_report`.
Must not: decide anything (verdicts come from `policies.health` through `verdicts`) or act on
nodes. Every call here needs a connected Ray driver (`controlplane.local.cluster.connect`).

An agent that does not answer within `timeout_s` is left out of a collection (and named in the
log), so one stuck node never stalls a tick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from controlplane.config import Config, HealthConfig
from controlplane.telemetry.readings import TelemetryError
from policies.health import HealthState, NodeVerdict

__all__ = [
    "AGENT_NAME_PREFIX",
    "NAMESPACE",
    "AgentRef",
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


def _alive_nodes() -> list[dict[str, Any]]:
    import ray

    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    return [n for n in nodes if n.get("Alive")]


def find_agents() -> dict[str, Any]:
    """Handles of the agents that exist now, by node id."""
    import ray

    handles: dict[str, Any] = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name, namespace = entry.get("name", ""), entry.get("namespace")
        if namespace != NAMESPACE or not name.startswith(AGENT_NAME_PREFIX):
            continue
        try:
            handles[name[len(AGENT_NAME_PREFIX) :]] = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:  # died between listing and lookup
            continue
    return handles


def _is_idle(total: dict[str, float], available: dict[str, float]) -> bool:
    """Nothing holds any of the node's GPUs or CPUs."""
    return all(available.get(k, 0.0) >= total.get(k, 0.0) for k in ("GPU", "CPU"))


def ensure_agents(cfg: Config, exclude: Collection[str] = ()) -> list[AgentRef]:
    """Start an agent on every alive node without one; cheap when all are there.

    Exception: an external node that runs nothing gets no agent, and an agent already there is
    stopped (with `telemetry.stop_agents_on_idle_external`, the default). Ray counts a node
    with a live actor as busy even when the actor holds no resources, so an agent would keep a
    rented node alive forever; without it the autoscaler removes the node after
    `pools.external.idle_timeout_s`. The agent comes back on the first call after work lands
    there. Nodes in `exclude` (ones being drained: Ray schedules nothing new there) get no new
    agent. Returns one `AgentRef` per alive node. Does not wait for new agents to start.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from controlplane.config import to_dict
    from controlplane.inventory import pool_of
    from controlplane.telemetry.agent import TelemetryAgent

    existing = find_agents()
    sections = to_dict(cfg)
    telemetry, health = sections["telemetry"], sections["health"]
    remote_agent = ray.remote(TelemetryAgent)
    available = ray._private.state.available_resources_per_node()  # type: ignore[no-untyped-call]
    refs = []
    for node in _alive_nodes():
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
            stopped = node_id in existing
            if stopped:
                ray.kill(existing[node_id], no_restart=True)
                log.info("stopped telemetry agent on idle external node %s", node_id)
            refs.append(AgentRef(node_id, pool, started=False, idle_external=True, stopped=stopped))
            continue
        if node_id in existing or node_id in exclude:
            refs.append(AgentRef(node_id, pool, started=False))
            continue
        remote_agent.options(
            name=agent_name(node_id),
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_restarts=-1,
            max_concurrency=4,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(
            node_id,
            pool,
            node["NodeManagerAddress"],
            int(resources.get("GPU", 0)),
            telemetry,
            health,
        )
        log.info("started telemetry agent on node %s (pool %s)", node_id, pool)
        refs.append(AgentRef(node_id, pool, started=True))
    return refs


def stop_agent(node_id: str) -> bool:
    """Stop the agent on `node_id` (a drained node goes once nothing runs there)."""
    import ray

    handle = find_agents().get(node_id)
    if handle is None:
        return False
    ray.kill(handle, no_restart=True)
    return True


def _gather(calls: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """ray.get each call by node id; nodes that fail or do not answer in time are left out."""
    import ray

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
) -> dict[str, list[dict[str, Any]]]:
    """Recent summaries of every agent (oldest first), by node id, for the health policy.

    `seen_until` (node id -> the newest sample time the caller has judged) makes each agent
    send only what is newer: the policy actor's steady state is one summary per node.
    """
    handles = find_agents()
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
            + (", ".join(sorted(ids)) or "none (start them with `rcp health`)")
        )
    raise TelemetryError(f"{node!r} matches several nodes: {', '.join(sorted(matches))}")


def inject_fault(node_id: str, kind: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Inject `kind` into the simulated source of `node_id`'s agent (prefix or suffix works)."""
    import ray

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
    import ray
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
    from controlplane.telemetry.verdicts import judge

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
