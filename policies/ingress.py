"""Ingress scaling: how many ingress replicas the request rate needs, so that the ingress is
never the bottleneck.

Owns: the pure decision `decide_ingress(load, config, state) -> (decision, state)`. The load
is what the ingress replicas report (requests per second and the CPU milliseconds each
request cost them, `IngressTraffic`); the count is `policies.demand.ingress_replicas` of
them, clamped to ``[min_replicas, max_replicas]``. This module reads no clock (`now_s`
arrives in the load) and knows nothing of Serve: the control loop turns a changed count into
a `policies.plan.ScaleIngress`.

Rule:

1. ``wanted = ingress_replicas(rate, cpu_ms, target_utilization)``, clamped to [min, max]:
   the cores the traffic uses, each replica given `target_utilization` of a core.
2. Up at once: a count below ``wanted`` (or below min) is raised this tick. An ingress
   replica is CPU only and starts in seconds; a late one is a bottleneck for every model.
   A count above max (the config changed) is lowered to max at once.
3. Down after a delay: a count above ``wanted`` is lowered only after the traffic asked for
   fewer without a break for `downscale_delay_s`, to the highest count asked for during that
   wait (so a gap between bursts does not stop a replica a burst needs again).

Worked example (min 2, max 8, target utilization 0.5, downscale delay 60 s, currently 2):

* t=0 s, 300 requests/s at 4 ms each: 1.2 cores / 0.5 = 2.4 -> wanted 3 > 2 -> scale to 3.
* t=10 s, 100 requests/s at 4 ms: 0.4 cores -> 0.8 -> wanted 2 (the floor) < 3 -> wait.
* t=40 s, 200 requests/s at 4 ms: 0.8 cores -> wanted 2 -> still waiting (30 s < 60 s).
* t=70 s, 100 requests/s: wanted 2, asked for fewer for 60 s -> scale to 2.
* Idle (0 requests/s) -> wanted is min_replicas: the floor that keeps an ingress replica on
  every node taking traffic (docs/serving.md).

Must not: import Ray or Serve, read a clock or do I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from policies.demand import DemandState, delayed_step, ingress_replicas

__all__ = [
    "IngressDecision",
    "IngressLoad",
    "IngressScaling",
    "IngressTraffic",
    "decide_ingress",
]


@dataclass(frozen=True)
class IngressScaling:
    """The ingress's scaling settings (from ``serving.ingress``)."""

    min_replicas: int
    max_replicas: int
    target_utilization: float
    """Share of one core each ingress replica is sized for (headroom for bursts)."""
    downscale_delay_s: float

    def __post_init__(self) -> None:
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(
                f"need 1 <= min_replicas ({self.min_replicas}) <= max_replicas "
                f"({self.max_replicas})"
            )
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"target_utilization must be in (0, 1], got {self.target_utilization}")
        if self.downscale_delay_s < 0:
            raise ValueError(f"downscale_delay_s must be >= 0, got {self.downscale_delay_s}")


@dataclass(frozen=True)
class IngressTraffic:
    """What the ingress replicas reported, summed over the fresh reports."""

    request_rate_rps: float = 0.0
    """Requests per second all ingress replicas answered."""
    cpu_ms_per_request: float = 0.0
    """CPU milliseconds the ingress replicas' processes spent per request (0: no requests)."""


@dataclass(frozen=True)
class IngressLoad:
    traffic: IngressTraffic
    current_replicas: int
    """The ingress deployment's replica target now."""
    now_s: float


@dataclass(frozen=True)
class IngressDecision:
    num_replicas: int
    """Ingress replicas after this tick."""
    wanted: int
    """What the traffic alone asks for now (clamped to min/max)."""
    message: str


def _finite(value: float) -> float:
    """Reported telemetry: a non-finite or negative figure counts as nothing."""
    return value if math.isfinite(value) and value > 0 else 0.0


def decide_ingress(
    load: IngressLoad, config: IngressScaling, state: DemandState
) -> tuple[IngressDecision, DemandState]:
    """The ingress replica count for `load` (see the module doc) and the state to hand back."""
    rate = _finite(load.traffic.request_rate_rps)
    cpu_ms = _finite(load.traffic.cpu_ms_per_request)
    wanted = ingress_replicas(
        rate,
        cpu_ms,
        target_utilization=config.target_utilization,
        min_replicas=config.min_replicas,
        max_replicas=config.max_replicas,
    )
    current = load.current_replicas
    seen = (
        f"{rate:.1f} requests/s at {cpu_ms:.2f} CPU ms each "
        f"({rate * cpu_ms / 1000.0:.2f} cores, {config.target_utilization:g} per replica)"
    )
    if wanted == current:
        return IngressDecision(current, wanted, f"{seen} fit {current} replicas"), DemandState()
    if current > config.max_replicas:
        top = config.max_replicas
        message = f"{current} replicas is above max_replicas {top}: {current} -> {top}"
        return IngressDecision(top, wanted, message), DemandState()
    # Up at once (the ingress must never be the bottleneck), down after the delay.
    step = delayed_step(current, wanted, load.now_s, state, 0.0, config.downscale_delay_s)
    if step.taken and wanted > current:
        message = f"{seen} ask for {wanted}: {current} -> {wanted}"
    elif step.taken:
        message = (
            f"{seen} asked for at most {step.num_replicas} for {step.waited_s:g}s "
            f"(delay {step.delay_s:g}s): {current} -> {step.num_replicas}"
        )
    else:
        message = f"{seen} ask for {wanted}; waited {step.waited_s:g}s of {step.delay_s:g}s"
    return IngressDecision(step.num_replicas, wanted, message), step.state
