"""The operator's side of the control plane, as the API's operator routes call it.

Owns: `Operations`, built by the `Controller` over its loop and store: the node inventory,
node health, hand cordons, the removal breaker, the serving plane's status, fault injection
(simulated telemetry only), and the policy actor's guard rails (`controlplane.loop.guards`).
Every method returns JSON-able data, takes the caller's name where it changes something (it
goes in the event it records), and raises `OperationRefused` for anything a caller can fix.

Must not: decide (the policies do), or know HTTP beyond the status a refusal carries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from controlplane.config import Config
from controlplane.inventory import NodeRow, attach_telemetry
from controlplane.loop import Loop
from controlplane.loop.record import EventKind
from controlplane.telemetry.manager import verdict_json
from policies.health import BreakerState, RemovalBudget
from policies.snapshot import Pool

__all__ = ["OperationRefused", "Operations", "breaker_json"]


FAULT_KINDS = ("hot-gpu", "xid", "nvlink-errors", "ib-errors", "ib-link-down", "clear")


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []


class OperationRefused(Exception):
    """A request an operator can fix: `status` (HTTP), a message, the field at fault."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


def breaker_json(state: BreakerState, budget: RemovalBudget, *, act: bool) -> dict[str, Any]:
    """The removal breaker: open (latched) and since when, its budget and window, the
    removals it admitted within the window (node, pool, time) and the nodes it holds."""
    return {
        "open": state.open,
        "opened_s": state.opened_s,
        "held": list(state.held),
        "removals": [{"node_id": n, "pool": p, "at_s": t} for n, p, t in state.removals],
        "max_nodes": budget.max_nodes,
        "max_pool_fraction": budget.max_pool_fraction,
        "window_s": budget.window_s,
        "act": act,
    }


class Operations:
    """See the module doc. `serve_status` and `inject_fault` are the Ray-facing reads and
    writes (`serve.control.status.serve_status`, `telemetry.manager.inject_fault` in the controller;
    fakes in tests)."""

    def __init__(
        self,
        cfg: Config,
        loop: Loop,
        *,
        serve_status: Callable[[], Mapping[str, Any]],
        inject_fault: Callable[[str, str], Mapping[str, Any]],
        uncordon_kube: Callable[[str], str] | None = None,
    ) -> None:
        self.cfg = cfg
        self.loop = loop
        self._serve_status = serve_status
        self._inject_fault = inject_fault
        self._uncordon_kube = uncordon_kube

    # -- nodes and health ----------------------------------------------------------------------

    def _rows(self) -> list[NodeRow]:
        keeper = self.loop.health
        verdicts = {
            n: (v.verdict.value, [r.value for r in v.reasons]) for n, v in keeper.verdicts.items()
        }
        rows = list(self.loop.adapters.nodes.list_nodes())
        latest = {n: dict(s) for n, s in keeper.latest.items()}
        return sorted(attach_telemetry(rows, latest, verdicts), key=lambda r: r.node_id)

    def nodes(self) -> list[dict[str, Any]]:
        """Every node (by id): pool, state, GPUs and CPUs, labels, health, and who took it
        out: ``taken_out_s`` (health drained it), ``cordon`` (an operator cordoned it),
        ``serving_only`` (health keeps it for replicas only: ``since_s`` and ``reason``)."""
        guards = self.loop.guard_store.load()
        taken_out = self.loop.health.cordoned()
        serving_only = dict(self.loop.health.serving_only)
        out = []
        for row in self._rows():
            data = row.to_json()
            cordon = guards.cordons.get(row.node_id)
            data["cordon"] = None if cordon is None else cordon.to_json()
            data["taken_out_s"] = taken_out.get(row.node_id)
            data["serving_only"] = serving_only.get(row.node_id)
            out.append(data)
        return out

    def resolve(self, node: str) -> str:
        """The one known node id equal to `node` or starting or ending with it."""
        ids = [r.node_id for r in self.loop.adapters.nodes.list_nodes()]
        ids += [n for n in self.loop.guard_store.load().cordons if n not in ids]
        if node in ids:
            return node
        matches = sorted(i for i in ids if i.startswith(node) or i.endswith(node))
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise OperationRefused(404, f"no node matches {node!r}; see `rcp nodes`", "node")
        raise OperationRefused(
            400, f"{node!r} matches {len(matches)} nodes; give more of the id", "node"
        )

    def health(self) -> dict[str, Any]:
        """One row per node with a verdict (the verdicts the loop acts on, lemon records
        included; ``taken_out`` when health drained it, ``cordon`` when an operator did),
        and the nodes health drained and replaced, with when."""
        keeper = self.loop.health
        pools = {r.node_id: r.pool for r in self.loop.adapters.nodes.list_nodes()}
        cordons = self.loop.guard_store.load().cordons
        taken_out = keeper.cordoned()
        rows = []
        for node_id, verdict in sorted(keeper.verdicts.items()):
            sample = keeper.latest.get(node_id, {})
            temps = [
                float(g["temp_c"])
                for g in _list(sample.get("gpus"))
                if isinstance(g, Mapping) and isinstance(g.get("temp_c"), int | float)
            ]
            cordon = cordons.get(node_id)
            rows.append(
                {
                    **verdict_json(verdict),
                    "pool": pools.get(node_id, "unknown"),
                    "gpu_temp_max_c": max(temps) if temps else None,
                    "faults": [str(f) for f in _list(sample.get("faults"))],
                    "taken_out": node_id in taken_out,
                    "cordon": None if cordon is None else cordon.to_json(),
                }
            )
        return {"nodes": rows, "taken_out": dict(taken_out), "replaced": keeper.replaced()}

    def clear_node(self, node: str, by: str) -> dict[str, Any]:
        """Forget `node`'s lemon record and held verdict (id, prefix or suffix). A node health
        already drained is not brought back (Ray cannot undo a drain)."""
        try:
            node_id, taken_out = self.loop.health.clear_node(node, by=by)
        except ValueError as exc:
            raise OperationRefused(404, str(exc), "node") from None
        return {"node_id": node_id, "cleared": True, "taken_out": taken_out, "by": by}

    def cordon(self, node: str, by: str, reason: str) -> dict[str, Any]:
        """Cordon a node by hand: it counts for no capacity (nothing new lands there; serving
        replicas move off make-before-break); gangs on it keep running."""
        node_id = self.resolve(node)
        cordon, changed = self.loop.guard_store.cordon(node_id, by, reason)
        if changed:
            self.loop.record_event(
                EventKind.NODE_CORDON, f"node {node_id}: cordoned by {by}: {reason}"
            )
        return {"node_id": node_id, "cordon": cordon.to_json(), "changed": changed}

    def uncordon(self, node: str, by: str, reason: str) -> dict[str, Any]:
        """Give a hand-cordoned node back. On Kubernetes, a node name that no Ray node has is
        a Kubernetes node: its taint and cordon (put there when health removed it) go."""
        try:
            node_id = self.resolve(node)
        except OperationRefused:
            if self._uncordon_kube is None:
                raise
            detail = self._uncordon_kube(node)
            self.loop.record_event(
                EventKind.NODE_UNCORDON, f"kubernetes node {node}: uncordoned by {by}: {detail}"
            )
            return {"node_id": node, "was": None, "kubernetes": detail, "by": by}
        was = self.loop.guard_store.uncordon(node_id)
        if was is None:
            raise OperationRefused(
                409, f"node {node_id} is not cordoned by hand; nothing to uncordon", "node"
            )
        why = f": {reason}" if reason else ""
        self.loop.record_event(EventKind.NODE_UNCORDON, f"node {node_id}: uncordoned by {by}{why}")
        return {"node_id": node_id, "was": was.to_json(), "kubernetes": None, "by": by}

    def breaker(self) -> dict[str, Any]:
        state = self.loop.health.breaker_state()
        return breaker_json(state, self.cfg.health.breaker, act=self.cfg.health.act)

    def reset_breaker(self, by: str, reason: str) -> dict[str, Any]:
        """Close the breaker (removals in the window still count); the state it had."""
        before = self.loop.health.reset_breaker(by=by, reason=reason)
        was = breaker_json(before, self.cfg.health.breaker, act=self.cfg.health.act)
        return {"reset": True, "was": was, "by": by, "reason": reason}

    # -- faults --------------------------------------------------------------------------------

    def inject_fault(self, node: str, kind: str, by: str) -> dict[str, Any]:
        """Make `node`'s simulated telemetry report `kind` (``clear`` ends all faults)."""
        if self.cfg.telemetry.source != "simulated":
            raise OperationRefused(
                409,
                f"fault injection needs simulated telemetry; telemetry.source is "
                f"{self.cfg.telemetry.source!r}",
                "telemetry.source",
            )
        if kind not in FAULT_KINDS:
            raise OperationRefused(400, f"kind must be one of {', '.join(FAULT_KINDS)}", "kind")
        node_id = self.resolve(node)
        result = dict(self._inject_fault(node_id, kind))
        self.loop.record_event(EventKind.FAULT_INJECT, f"node {node_id}: {kind} injected by {by}")
        return result

    # -- serving and the policy actor ----------------------------------------------------------

    def policy(self) -> dict[str, Any]:
        """The guards in force: the pause (who, why, since), pins, hand cordons."""
        g = self.loop.guard_store.load()
        return {
            "paused": g.paused,
            "pause": None if g.pause is None else g.pause.to_json(),
            "pins": {m: p.to_json() for m, p in sorted(g.pins.items())},
            "cordons": {n: c.to_json() for n, c in sorted(g.cordons.items())},
        }

    def serve_status(self) -> dict[str, Any]:
        """The serving plane per model and pool, with the policy actor's guards and each
        model's p99 and latency goal as the loop last measured them (``latency``)."""
        loads = {load.model: load for load in self.loop.serve_load}
        latency = {
            model: {
                "p99_ms": loads[model].p99_ms if model in loads else None,
                "slo_p99_ms": demand.target_p99_ms,
            }
            for model, demand in sorted(self.loop.policies.demand.items())
        }
        return {
            **self._serve_status(),
            "policy": self.policy(),
            "latency": latency,
            "providers": list(self.loop.tick_metrics.provider_rows),
            "forecast": dict(self.loop.tick_metrics.forecast_rows),
        }

    def pause(self, by: str, reason: str) -> dict[str, Any]:
        pause, changed = self.loop.guard_store.pause(by, reason)
        if changed:
            self.loop.record_event(EventKind.POLICY_PAUSE, f"policy actor paused by {by}: {reason}")
        return {"paused": True, "pause": pause.to_json(), "changed": changed}

    def resume(self, by: str, reason: str) -> dict[str, Any]:
        was = self.loop.guard_store.resume()
        if was is not None:
            why = f": {reason}" if reason else ""
            self.loop.record_event(
                EventKind.POLICY_RESUME,
                f"policy actor resumed by {by}{why} (paused by {was.by}: {was.reason})",
            )
        return {
            "paused": False,
            "was": None if was is None else was.to_json(),
            "by": by,
            "reason": reason,
        }

    def _model(self, model: str) -> str:
        names = sorted(m.name for m in self.cfg.serving.models) if self.cfg.serve.deploy_app else []
        if model not in names:
            raise OperationRefused(
                404, f"no served model {model!r}; models: {', '.join(names) or 'none'}", "model"
            )
        return model

    def pin(self, model: str, pool: str, by: str) -> dict[str, Any]:
        model = self._model(model)
        pools = [p.value for p in (Pool.CLUSTER, Pool.EXTERNAL)]
        if pool not in pools:
            raise OperationRefused(400, f"pool must be one of {', '.join(pools)}", "pool")
        pin, was = self.loop.guard_store.pin(model, Pool(pool), by)
        self.loop.record_event(EventKind.SERVE_PIN, f"{model}: pinned to {pool} by {by}")
        return {"model": model, "pin": pin.to_json(), "was": None if was is None else was.to_json()}

    def unpin(self, model: str, by: str) -> dict[str, Any]:
        model = self._model(model)
        was = self.loop.guard_store.unpin(model)
        if was is None:
            raise OperationRefused(404, f"{model} is not pinned", "model")
        self.loop.record_event(
            EventKind.SERVE_UNPIN, f"{model}: unpinned from {was.pool.value} by {by}"
        )
        return {"model": model, "was": was.to_json(), "by": by}
