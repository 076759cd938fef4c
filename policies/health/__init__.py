"""Node health: verdicts from telemetry, the breaker on removals, and the plan that follows.

A package of pure steps, called in this order each tick:

- `evaluate` (`policies.health.evaluation`): ``evaluate(samples, thresholds, state, now_s)
  -> (verdicts, state)``, a verdict per node (healthy, degraded, unhealthy) from its
  telemetry history; the rules and a worked example are in that module's docstring.
- `acting_verdicts` (`policies.health.remediation`): the verdicts the controller acts on
  (cordoned nodes stay unhealthy; a node Ray drains for someone else, while a gang holds GPUs
  there, turns unhealthy).
- `limit_removals` (`policies.health.breaker`): at most `RemovalBudget` new nodes out per
  window; past it, verdicts are shown but held, not acted on.
- `with_verdicts` and `remediate` (`policies.health.remediation`): the snapshot with unhealthy
  nodes marked, so capacity shrinks at once, and serving-only nodes marked so admission
  leaves them out; then cordon, checkpoint-and-requeue gangs, move replicas
  make-before-break, drain once empty (serving-only nodes: only their gangs go).

The rooms: `thresholds` (what counts as bad, `HealthThresholds`: the ``health`` config section
embeds it), `samples` (the input types), `verdicts` (the output types), `state` (the memory
between ticks, `HealthState`, with `keep_nodes` and `clear_lemon`), `evaluation`, `breaker` and
`remediation`. Every public name is re-exported here, so callers import from `policies.health`.

Owns: the pure decisions above, their inputs, thresholds and memory (which the caller
stores and hands back).
Must not: read telemetry, a clock or the network, or act. The telemetry agents produce the
samples; the policy actor applies the plan. Time arrives as `now_s` (the caller's clock).
"""

from __future__ import annotations

from policies.health.breaker import BreakerState, RemovalBudget, limit_removals, reset_breaker
from policies.health.evaluation import evaluate
from policies.health.remediation import (
    DRAINED_BY_OTHERS,
    CordonNode,
    RemediationAction,
    acting_verdicts,
    remediate,
    with_verdicts,
)
from policies.health.samples import GpuSample, NodeSample, PortSample
from policies.health.state import HealthState, NodeHealthState, clear_lemon, keep_nodes
from policies.health.thresholds import DEFAULT_FATAL_XIDS, HealthThresholds
from policies.health.verdicts import FABRIC_REASONS, HealthReason, NodeVerdict, Verdict

__all__ = [
    "DEFAULT_FATAL_XIDS",
    "DRAINED_BY_OTHERS",
    "FABRIC_REASONS",
    "BreakerState",
    "CordonNode",
    "GpuSample",
    "HealthReason",
    "HealthState",
    "HealthThresholds",
    "NodeHealthState",
    "NodeSample",
    "NodeVerdict",
    "PortSample",
    "RemediationAction",
    "RemovalBudget",
    "Verdict",
    "acting_verdicts",
    "clear_lemon",
    "evaluate",
    "keep_nodes",
    "limit_removals",
    "remediate",
    "reset_breaker",
    "with_verdicts",
]
