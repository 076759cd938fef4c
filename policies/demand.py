"""Demand autoscaling: how many replicas a model needs in total, from its ongoing requests and,
when it has a latency target, its measured p99.

Owns: the pure decision `decide_replicas(load, config, state) -> (decision, state)`. The
control loop splits the total it returns between the ``cluster`` and ``external`` pools; this
module knows nothing about pools, Ray or Serve, and reads no clock: `now_s` arrives in the
input and the delay timers live in `DemandState`, which the caller stores and hands back.
The control loop passes each model's p99 as it measured it (`DemandLoad.p99_ms`, from the
snapshot's `ServeLoad`: Serve's own latency histogram over ``serving.latency_window_s``,
`controlplane.adapters.latency`), None when it has no reading: then ongoing requests alone
decide. The latency goal is the model's ``slo_p99_ms`` (``target_p99_ms`` here).

Rule:

1. ``wanted = ceil(ongoing_requests / target_ongoing_requests_per_replica)``, clamped to
   ``[min_replicas, max_replicas]``. With a latency target (``target_p99_ms``) and a measured
   p99, the latency asks for ``ceil(current * p99 / target)`` replicas when p99 is above the
   target (at least one more), holds the current count while p99 is between
   ``p99_low_fraction * target`` and the target (the hysteresis band: no scale-down on
   ongoing requests alone while latency is that close), and asks for nothing below the band;
   ``wanted`` is the larger of the two asks, clamped.
2. If the current count is outside ``[min, max]`` it is corrected at once (config changed).
3. Otherwise a change is made only after demand has pointed the same way (up or down)
   without a break for ``upscale_delay_s`` / ``downscale_delay_s``. While waiting, the count
   stays. A scale-up goes to the highest count wanted during the wait, a scale-down to the
   highest count wanted during the wait as well (the conservative choice both ways).
4. When demand matches the current count, any pending timer is dropped.

Worked example (target 2 ongoing requests per replica, min 1, max 8, upscale delay 5 s,
downscale delay 30 s, currently 2 replicas):

* t=0 s, 9 ongoing: wanted = ceil(9/2) = 5 > 2 -> start upscale timer, stay at 2.
* t=3 s, 7 ongoing: wanted = 4, still up -> keep waiting (3 s < 5 s); highest wanted 5.
* t=5 s, 7 ongoing: wanted = 4, timer ran 5 s >= 5 s -> scale to 5 (the highest wanted).
* t=6 s, 1 ongoing: wanted = 1 < 5 -> start downscale timer, stay at 5.
* t=20 s, 3 ongoing: wanted = 2 -> keep waiting (14 s < 30 s); highest wanted 2.
* t=36 s, 1 ongoing: wanted = 1, timer ran 30 s -> scale to 2.

With a latency target of 100 ms (band from 50 ms), 2 replicas, 1 ongoing request: p99 250 ms
asks for ceil(2 * 2.5) = 5 (after the upscale delay); p99 80 ms holds 2 however few requests
are ongoing; p99 30 ms lets the ongoing requests decide (1, after the downscale delay).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "DemandConfig",
    "DemandDecision",
    "DemandLoad",
    "DemandReason",
    "DelayedStep",
    "DemandState",
    "decide_replicas",
    "delayed_step",
    "ingress_replicas",
    "latency_replicas",
    "wanted_replicas",
]


class DemandReason(str, Enum):
    STEADY = "steady"
    WAITING_UPSCALE_DELAY = "waiting_upscale_delay"
    WAITING_DOWNSCALE_DELAY = "waiting_downscale_delay"
    UPSCALE = "upscale"
    DOWNSCALE = "downscale"
    BELOW_MIN = "below_min"
    ABOVE_MAX = "above_max"


class Direction(str, Enum):
    NONE = "none"
    UP = "up"
    DOWN = "down"


@dataclass(frozen=True)
class DemandConfig:
    """Per-model demand settings (from the model's serving config)."""

    target_ongoing_requests_per_replica: float
    min_replicas: int
    max_replicas: int
    upscale_delay_s: float
    downscale_delay_s: float
    target_p99_ms: float | None = None
    """The model's latency goal; None: scale on ongoing requests alone."""
    p99_low_fraction: float = 0.5
    """Below ``p99_low_fraction * target_p99_ms`` latency no longer holds replicas."""

    def __post_init__(self) -> None:
        if self.target_ongoing_requests_per_replica <= 0:
            raise ValueError(
                "target_ongoing_requests_per_replica must be > 0, got "
                f"{self.target_ongoing_requests_per_replica}"
            )
        if self.min_replicas < 0:
            raise ValueError(f"min_replicas must be >= 0, got {self.min_replicas}")
        if self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) must be >= min_replicas ({self.min_replicas})"
            )
        if self.upscale_delay_s < 0 or self.downscale_delay_s < 0:
            raise ValueError("upscale_delay_s and downscale_delay_s must be >= 0")
        if self.target_p99_ms is not None and self.target_p99_ms <= 0:
            raise ValueError(f"target_p99_ms must be > 0, got {self.target_p99_ms}")
        if not 0 <= self.p99_low_fraction < 1:
            raise ValueError(f"p99_low_fraction must be in [0, 1), got {self.p99_low_fraction}")


@dataclass(frozen=True)
class DemandLoad:
    """What the control loop observed for one model this tick."""

    ongoing_requests: float
    """Requests in flight or queued across all the model's replicas."""
    current_replicas: int
    """The model's current total replica target across pools."""
    now_s: float
    """The tick's clock, seconds (any monotonic origin)."""
    p99_ms: float | None = None
    """The model's measured p99 latency over the last window; None when unknown (no
    traffic, or no measurement): then ongoing requests alone decide."""


@dataclass(frozen=True)
class DemandState:
    """The policy's memory between ticks; the caller stores it and hands it back."""

    direction: Direction = Direction.NONE
    since_s: float = 0.0
    """When demand started pointing in `direction` without a break."""
    highest_wanted: int = 0
    """Highest wanted count seen since `since_s`."""


@dataclass(frozen=True)
class DemandDecision:
    num_replicas: int
    """Total replicas the model should have after this tick."""
    wanted: int
    """What the load alone asks for now (clamped to min/max)."""
    reason: DemandReason
    message: str


def wanted_replicas(
    ongoing_requests: float,
    config: DemandConfig,
    p99_ms: float | None = None,
    current_replicas: int = 0,
) -> int:
    """``ceil(ongoing / target)``, or what the latency asks if more (the module doc), clamped
    to [min, max]; 9 ongoing at target 2 -> 5."""
    ratio = max(0.0, ongoing_requests) / config.target_ongoing_requests_per_replica
    # round first so 1.1 / 0.1 = 11.000000000000002 counts as 11, not 12
    raw = max(math.ceil(round(ratio, 9)), latency_replicas(p99_ms, current_replicas, config))
    return max(config.min_replicas, min(config.max_replicas, raw))


def latency_replicas(p99_ms: float | None, current_replicas: int, config: DemandConfig) -> int:
    """What the latency alone asks for (0: nothing). 250 ms at a 100 ms target with 2 replicas
    -> 5; 80 ms -> 2 (held); 30 ms -> 0."""
    target = config.target_p99_ms
    if target is None or p99_ms is None or p99_ms < 0:
        return 0
    current = max(1, current_replicas)
    if p99_ms > target:
        return max(current + 1, math.ceil(round(current * p99_ms / target, 9)))
    if p99_ms >= config.p99_low_fraction * target:
        return current
    return 0


def decide_replicas(
    load: DemandLoad, config: DemandConfig, state: DemandState
) -> tuple[DemandDecision, DemandState]:
    """The total replicas `load` calls for now, and the state to hand back next tick."""
    current = load.current_replicas
    wanted = wanted_replicas(load.ongoing_requests, config, load.p99_ms, current)
    if current < config.min_replicas:
        message = f"{current} replicas is below min_replicas {config.min_replicas}"
        clamp = DemandDecision(config.min_replicas, wanted, DemandReason.BELOW_MIN, message)
        return clamp, DemandState()
    if current > config.max_replicas:
        message = f"{current} replicas is above max_replicas {config.max_replicas}"
        clamp = DemandDecision(config.max_replicas, wanted, DemandReason.ABOVE_MAX, message)
        return clamp, DemandState()
    seen = f"{load.ongoing_requests:g} ongoing requests"
    if config.target_p99_ms is not None and load.p99_ms is not None:
        seen += f" and p99 {load.p99_ms:g} ms (target {config.target_p99_ms:g} ms)"
    if wanted == current:
        message = f"{seen} fit {current} replicas"
        return DemandDecision(current, wanted, DemandReason.STEADY, message), DemandState()
    step = delayed_step(
        current, wanted, load.now_s, state, config.upscale_delay_s, config.downscale_delay_s
    )
    up = wanted > current
    if step.taken:
        reason = DemandReason.UPSCALE if up else DemandReason.DOWNSCALE
        message = (
            f"{seen}, at {config.target_ongoing_requests_per_replica:g} requests per replica, "
            f"asked for {step.num_replicas} replicas for {step.waited_s:g}s "
            f"(delay {step.delay_s:g}s): {current} -> {step.num_replicas}"
        )
        return DemandDecision(step.num_replicas, wanted, reason, message), step.state
    reason = DemandReason.WAITING_UPSCALE_DELAY if up else DemandReason.WAITING_DOWNSCALE_DELAY
    message = f"load asks for {wanted} replicas; waited {step.waited_s:g}s of {step.delay_s:g}s"
    return DemandDecision(current, wanted, reason, message), step.state


@dataclass(frozen=True)
class DelayedStep:
    """One tick of a replica count that follows what is asked only once it has been asked for
    a delay without a break (`delayed_step`)."""

    num_replicas: int
    """The count after this tick: the step's target once `taken`, else the current count."""
    taken: bool
    waited_s: float
    """How long the count has pointed this way without a break."""
    delay_s: float
    """The delay for this direction."""
    state: DemandState
    """What to hand back next tick (reset once the step is taken)."""


def delayed_step(
    current: int,
    wanted: int,
    now_s: float,
    state: DemandState,
    upscale_delay_s: float,
    downscale_delay_s: float,
) -> DelayedStep:
    """The hysteresis both the models' demand and the ingress's scaling use: a count moves
    toward `wanted` (which differs from `current`) only after it has pointed the same way for
    the direction's delay; it then moves to the highest count asked for during the wait (a
    scale-down keeps the most any tick asked for). A change of direction restarts the wait."""
    direction = Direction.UP if wanted > current else Direction.DOWN
    if state.direction == direction:
        since_s, highest = state.since_s, max(state.highest_wanted, wanted)
    else:
        since_s, highest = now_s, wanted
    delay_s = upscale_delay_s if direction is Direction.UP else downscale_delay_s
    waited_s = now_s - since_s
    if waited_s >= delay_s:
        return DelayedStep(highest, True, waited_s, delay_s, DemandState())
    waiting = DemandState(direction=direction, since_s=since_s, highest_wanted=highest)
    return DelayedStep(current, False, waited_s, delay_s, waiting)


def ingress_replicas(
    request_rate_rps: float,
    cpu_ms_per_request: float,
    *,
    target_utilization: float = 0.5,
    min_replicas: int = 1,
    max_replicas: int = 16,
) -> int:
    """Ingress replicas for a request rate, so that the ingress is never the bottleneck.

    An ingress replica is one Python process: it can use at most one core. The load needs
    ``request_rate_rps * cpu_ms_per_request / 1000`` cores; each replica is given
    `target_utilization` of a core (headroom for bursts and for the moments it waits on the
    GIL), so ``ceil(cores / target_utilization)`` replicas, clamped to [min, max].

    Example: 300 requests/s at 2.0 ms of CPU each need 0.6 cores; at 50% per replica that is
    ceil(1.2) = 2 replicas. At 1.0 ms the same rate needs ceil(0.6) = 1.
    """
    if cpu_ms_per_request < 0 or request_rate_rps < 0:
        raise ValueError("request_rate_rps and cpu_ms_per_request must be >= 0")
    if not 0 < target_utilization <= 1:
        raise ValueError(f"target_utilization must be in (0, 1], got {target_utilization}")
    if not 1 <= min_replicas <= max_replicas:
        raise ValueError(
            f"need 1 <= min_replicas ({min_replicas}) <= max_replicas ({max_replicas})"
        )
    cores = request_rate_rps * cpu_ms_per_request / 1000.0
    # round first so 0.6 / 0.5 = 1.2000000000000002 stays 2, and 1.0 / 0.5 stays 2
    raw = math.ceil(round(cores / target_utilization, 9))
    return max(min_replicas, min(max_replicas, raw))
