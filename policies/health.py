"""Node health: a verdict per node (healthy, degraded, unhealthy) from its telemetry history.

Owns: the pure decision `evaluate(samples, thresholds, state, now_s) -> (verdicts, state)`,
its input types (`NodeSample`, `GpuSample`, `PortSample`), its thresholds and the memory it
needs between ticks (`HealthState`: hot streaks, held verdicts, lemon records), which the
caller stores and hands back. `clear_lemon` is the operator's way to let a lemon back in.

Also owns the pure step from verdicts to a plan: `limit_removals` (the breaker: at most
`RemovalBudget` new nodes out per window; past it, verdicts are shown but held, not acted on),
`with_verdicts` (the snapshot with unhealthy nodes marked, so capacity shrinks at once) and
`remediate` (cordon, checkpoint-and-requeue gangs, move replicas make-before-break, drain once
empty), with the `CordonNode` action.

Must not: read telemetry, a clock or the network, or act. The telemetry agents produce the
samples; the policy actor applies the plan. Time arrives as `now_s` (the caller's clock);
sample times are only used to order samples and to skip the ones already seen.

Rules, per node, for every sample newer than the last one seen:

1. Unhealthy causes (any one is enough):
   - a GPU above ``gpu_temp_c`` for ``hot_samples`` samples in a row (GPU_OVERHEATED);
   - a new XID in ``fatal_xids`` (XID_FATAL);
   - an uncorrectable ECC error since the last GPU reset (ECC_UNCORRECTABLE);
   - a failed row remap (ROW_REMAP_FAILURE);
   - fewer GPUs visible than the node advertises for ``missing_samples`` samples in a row
     (GPU_MISSING; fewer samples than that: degraded, same reason);
   - an NVLink link down (NVLINK_DOWN), or NVLink errors above ``nvlink_errors_per_s``
     (NVLINK_ERRORS);
   - an InfiniBand port not ACTIVE/LinkUp or a ``link_downed`` increase (IB_LINK_DOWN), or IB
     error counters above ``ib_errors_per_s`` (IB_ERRORS).
2. Degraded causes (shown, the node keeps working): a GPU above ``gpu_temp_c`` fewer than
   ``hot_samples`` times in a row (GPU_TEMP_HIGH), a hardware thermal slowdown
   (GPU_THERMAL_THROTTLE), a new XID not in the fatal class (XID_NONFATAL), a row remap
   pending a GPU reset (ROW_REMAP_PENDING), an IB port narrower than ``ib_expected_width``
   lanes or slower than ``ib_min_rate_gbps`` (IB_LINK_DEGRADED), no new sample for
   ``stale_after_s`` of the caller's time (NO_TELEMETRY).
3. Hysteresis: once unhealthy, a node stays unhealthy (with the reasons that made it so)
   until ``recover_after_samples`` clean samples in a row.
4. Lemons: every turn into unhealthy is recorded at `now_s`; a node that turned unhealthy
   ``lemon_count`` times within ``lemon_window_s`` is a lemon and stays unhealthy (LEMON)
   whatever its samples say, until `clear_lemon` is called for it.

Worked example (gpu_temp_c 78, hot_samples 2, recover_after_samples 3, lemon_count 2,
lemon_window_s 3600), node ``n1``, one sample per tick:

* t=10 s, GPU 0 at 80 C: streak 1 < 2 -> DEGRADED (gpu_temp_high).
* t=11 s, GPU 0 at 81 C: streak 2 >= 2 -> UNHEALTHY (gpu_overheated); turn #1 recorded.
* t=12..13 s, 60 C: clean 1, 2 < 3 -> still UNHEALTHY (gpu_overheated, held).
* t=14 s, 60 C: clean 3 >= 3 -> HEALTHY.
* t=100 s, new XID 79 (fatal): UNHEALTHY (xid_fatal); turn #2 within 3600 s of t=11 s ->
  2 >= lemon_count -> lemon: UNHEALTHY (lemon, xid_fatal) from now on, even at t=200 s with
  clean samples, until `clear_lemon(state, "n1")`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from types import MappingProxyType
from typing import Any

from policies.plan import DrainNode, MoveServeReplicas, PreemptJob
from policies.snapshot import ClusterSnapshot, Pool, ReplicaState

__all__ = [
    "DEFAULT_FATAL_XIDS",
    "DRAINED_BY_OTHERS",
    "BreakerState",
    "CordonNode",
    "RemediationAction",
    "GpuSample",
    "HealthReason",
    "HealthState",
    "HealthThresholds",
    "NodeHealthState",
    "NodeSample",
    "NodeVerdict",
    "PortSample",
    "RemovalBudget",
    "Verdict",
    "acting_verdicts",
    "clear_lemon",
    "keep_nodes",
    "evaluate",
    "limit_removals",
    "reset_breaker",
    "remediate",
    "with_verdicts",
]

DEFAULT_FATAL_XIDS: tuple[int, ...] = (48, 61, 62, 64, 74, 79, 95, 119, 120, 140)
"""XIDs that mean the GPU (not the application) is broken: 48 double-bit ECC, 61/62
micro-controller halt, 64 row-remap failure, 74 NVLink error, 79 GPU fell off the bus,
95 uncontained ECC, 119/120 GSP errors, 140 unrecovered ECC. Application faults such as 13,
31, 43 or 45 are not in it."""


class Verdict(str, Enum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    """Keeps working; an operator should look. Placement may prefer other nodes."""
    UNHEALTHY = "unhealthy"
    """Out of service: nothing new lands, work moves away, the node is drained."""


class HealthReason(str, Enum):
    GPU_OVERHEATED = "gpu_overheated"
    GPU_TEMP_HIGH = "gpu_temp_high"
    GPU_THERMAL_THROTTLE = "gpu_thermal_throttle"
    GPU_MISSING = "gpu_missing"
    XID_FATAL = "xid_fatal"
    XID_NONFATAL = "xid_nonfatal"
    ECC_UNCORRECTABLE = "ecc_uncorrectable"
    ROW_REMAP_FAILURE = "row_remap_failure"
    ROW_REMAP_PENDING = "row_remap_pending"
    NVLINK_DOWN = "nvlink_down"
    NVLINK_ERRORS = "nvlink_errors"
    IB_LINK_DOWN = "ib_link_down"
    IB_LINK_DEGRADED = "ib_link_degraded"
    IB_ERRORS = "ib_errors"
    NO_TELEMETRY = "no_telemetry"
    LEMON = "lemon"


@dataclass
class HealthThresholds:
    """What counts as bad. The ``health`` config section is this class plus what the control
    plane does with verdicts (`controlplane.config.HealthConfig`), so each threshold and its
    default is defined here only (not frozen for that reason, like `RemovalBudget`; the
    policy never changes it)."""

    gpu_temp_c: float = 78.0
    """A GPU hotter than this is removed (after `hot_samples` samples)."""
    hot_samples: int = 2
    """Consecutive samples above gpu_temp_c before the node is unhealthy."""
    missing_samples: int = 3
    """Consecutive samples with fewer GPUs than the node advertises before it is unhealthy:
    one short read (a driver hiccup, an exporter restarting) is not a lost GPU."""
    fatal_xids: tuple[int, ...] = DEFAULT_FATAL_XIDS
    """XIDs that mean broken hardware; any other XID only marks the node degraded."""
    nvlink_errors_per_s: float = 1.0
    """NVLink CRC, replay and recovery errors per second on one GPU (all links) above which
    it is unhealthy."""
    ib_errors_per_s: float = 1.0
    """InfiniBand error counter increase per second on one port (all error counters) above
    which it is unhealthy."""
    ib_expected_width: int = 4
    """Lanes a healthy IB port runs at (4X); fewer marks the node degraded (0: no check)."""
    ib_min_rate_gbps: float = 0.0
    """A port slower than this marks the node degraded (0: no check)."""
    recover_after_samples: int = 3
    """Clean samples in a row before an unhealthy node is healthy again."""
    stale_after_s: float = 10.0
    """No new sample from a node's agent for this long (the caller's clock) marks it
    degraded (no_telemetry)."""
    lemon_count: int = 3
    """A node that turns unhealthy this many times within lemon_window_s is a lemon: it stays
    out until an operator clears it."""
    lemon_window_s: float = 86400.0
    """The lemon window."""

    def __post_init__(self) -> None:
        if self.hot_samples < 1:
            raise ValueError(f"hot_samples must be >= 1, got {self.hot_samples}")
        if self.missing_samples < 1:
            raise ValueError(f"missing_samples must be >= 1, got {self.missing_samples}")
        if self.recover_after_samples < 1:
            raise ValueError(
                f"recover_after_samples must be >= 1, got {self.recover_after_samples}"
            )
        if self.lemon_count < 1:
            raise ValueError(f"lemon_count must be >= 1, got {self.lemon_count}")
        self.fatal_xids = tuple(self.fatal_xids)


@dataclass(frozen=True)
class GpuSample:
    """One GPU in one sample. None means the source could not read it (not counted as bad)."""

    gpu: int
    temp_c: float | None = None
    thermal_throttle: bool = False
    """The GPU reports a hardware or software thermal slowdown."""
    new_xids: tuple[int, ...] = ()
    """XIDs that occurred since the previous sample."""
    ecc_uncorrectable_total: int | None = None
    """Volatile uncorrectable ECC errors since the last GPU reset."""
    row_remap_failure: bool = False
    row_remap_pending: bool = False
    nvlink_links_total: int | None = None
    nvlink_links_up: int | None = None
    nvlink_errors_per_s: float | None = None


@dataclass(frozen=True)
class PortSample:
    """One InfiniBand port in one sample."""

    port: str
    """``<device>/<port number>``, e.g. ``mlx5_0/1``."""
    up: bool = True
    """State ACTIVE and physical state LinkUp."""
    width: int | None = None
    """Active lanes (4 for 4X)."""
    rate_gbps: float | None = None
    errors_per_s: float | None = None
    link_downed_delta: int = 0
    """Increase of the ``link_downed`` counter since the previous sample."""


@dataclass(frozen=True)
class NodeSample:
    """What a node's telemetry agent saw at `sampled_s` (the agent's clock)."""

    node_id: str
    sampled_s: float
    gpus: tuple[GpuSample, ...] = ()
    ports: tuple[PortSample, ...] = ()
    gpus_expected: int | None = None
    """GPUs the node advertises; more than `len(gpus)` means some are unreachable."""


@dataclass(frozen=True)
class NodeHealthState:
    """One node's memory between ticks."""

    last_sampled_s: float | None = None
    """Agent time of the newest sample already evaluated."""
    last_new_sample_now_s: float | None = None
    """Caller time at which a new sample was last seen (for staleness)."""
    hot_streaks: tuple[tuple[int, int], ...] = ()
    """(gpu, consecutive hot samples) for GPUs currently hot."""
    missing_streak: int = 0
    """Consecutive samples with fewer GPUs than expected."""
    unhealthy: bool = False
    held_reasons: tuple[HealthReason, ...] = ()
    """Reasons that made the node unhealthy, kept until it recovers."""
    clean_samples: int = 0
    """Clean samples in a row since the node last had an unhealthy cause."""
    degraded_reasons: tuple[HealthReason, ...] = ()
    """Degraded reasons of the newest sample."""
    details: tuple[str, ...] = ()
    unhealthy_turns_s: tuple[float, ...] = ()
    """Caller times at which the node turned unhealthy, within the lemon window."""
    lemon: bool = False


@dataclass(frozen=True)
class HealthState:
    """The policy's memory: per node, by node id. Store it and pass it back next tick."""

    nodes: Mapping[str, NodeHealthState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", MappingProxyType(dict(self.nodes)))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values, for the caller's store; `from_dict` reads them back."""
        return {
            node_id: {
                "last_sampled_s": n.last_sampled_s,
                "last_new_sample_now_s": n.last_new_sample_now_s,
                "hot_streaks": [[g, c] for g, c in n.hot_streaks],
                "missing_streak": n.missing_streak,
                "unhealthy": n.unhealthy,
                "held_reasons": [r.value for r in n.held_reasons],
                "clean_samples": n.clean_samples,
                "degraded_reasons": [r.value for r in n.degraded_reasons],
                "details": list(n.details),
                "unhealthy_turns_s": list(n.unhealthy_turns_s),
                "lemon": n.lemon,
            }
            for node_id, n in self.nodes.items()
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HealthState:
        def opt(v: Any) -> float | None:
            return None if v is None else float(v)

        return cls(
            {
                str(node_id): NodeHealthState(
                    last_sampled_s=opt(n.get("last_sampled_s")),
                    last_new_sample_now_s=opt(n.get("last_new_sample_now_s")),
                    hot_streaks=tuple((int(g), int(c)) for g, c in n.get("hot_streaks", ())),
                    missing_streak=int(n.get("missing_streak", 0)),
                    unhealthy=bool(n.get("unhealthy", False)),
                    held_reasons=tuple(HealthReason(r) for r in n.get("held_reasons", ())),
                    clean_samples=int(n.get("clean_samples", 0)),
                    degraded_reasons=tuple(HealthReason(r) for r in n.get("degraded_reasons", ())),
                    details=tuple(str(d) for d in n.get("details", ())),
                    unhealthy_turns_s=tuple(float(t) for t in n.get("unhealthy_turns_s", ())),
                    lemon=bool(n.get("lemon", False)),
                )
                for node_id, n in data.items()
            }
        )


@dataclass(frozen=True)
class NodeVerdict:
    node_id: str
    verdict: Verdict
    reasons: tuple[HealthReason, ...] = ()
    details: tuple[str, ...] = ()
    """Human-readable specifics, e.g. ``gpu 0 at 91.5 C > 78 C for 2 samples``."""
    lemon: bool = False
    held: bool = False
    """UNHEALTHY, but the breaker (`limit_removals`) holds it: shown and alerted on, not acted
    on (the node stays in capacity, nothing is cordoned, preempted or moved)."""

    @property
    def reason(self) -> str:
        """One line for an action's `reason` and the event log."""
        if not self.reasons:
            details = f" ({'; '.join(self.details)})" if self.details else ""
            return f"{self.verdict.value}{details}"
        text = f"{self.verdict.value}: {', '.join(r.value for r in self.reasons)}"
        return f"{text} ({'; '.join(self.details)})" if self.details else text


_Causes = dict[HealthReason, list[str]]


def _add(causes: _Causes, reason: HealthReason, detail: str) -> None:
    causes.setdefault(reason, []).append(detail)


def _check_gpus(
    sample: NodeSample,
    t: HealthThresholds,
    streaks: dict[int, int],
    bad: _Causes,
    warn: _Causes,
) -> dict[int, int]:
    new_streaks: dict[int, int] = {}
    for g in sample.gpus:
        if g.temp_c is not None and g.temp_c > t.gpu_temp_c:
            n = streaks.get(g.gpu, 0) + 1
            new_streaks[g.gpu] = n
            text = f"gpu {g.gpu} at {g.temp_c:g} C > {t.gpu_temp_c:g} C for {n} samples"
            _add(
                bad if n >= t.hot_samples else warn,
                HealthReason.GPU_OVERHEATED if n >= t.hot_samples else HealthReason.GPU_TEMP_HIGH,
                text,
            )
        if g.thermal_throttle:
            _add(warn, HealthReason.GPU_THERMAL_THROTTLE, f"gpu {g.gpu} thermal slowdown")
        for xid in g.new_xids:
            if xid in t.fatal_xids:
                _add(bad, HealthReason.XID_FATAL, f"gpu {g.gpu} XID {xid}")
            else:
                _add(warn, HealthReason.XID_NONFATAL, f"gpu {g.gpu} XID {xid}")
        if g.ecc_uncorrectable_total:
            _add(
                bad,
                HealthReason.ECC_UNCORRECTABLE,
                f"gpu {g.gpu} {g.ecc_uncorrectable_total} uncorrectable ECC errors",
            )
        if g.row_remap_failure:
            _add(bad, HealthReason.ROW_REMAP_FAILURE, f"gpu {g.gpu} row remap failed")
        elif g.row_remap_pending:
            _add(warn, HealthReason.ROW_REMAP_PENDING, f"gpu {g.gpu} row remap pending reset")
        if (
            g.nvlink_links_total is not None
            and g.nvlink_links_up is not None
            and g.nvlink_links_up < g.nvlink_links_total
        ):
            _add(
                bad,
                HealthReason.NVLINK_DOWN,
                f"gpu {g.gpu} {g.nvlink_links_up}/{g.nvlink_links_total} NVLinks up",
            )
        if g.nvlink_errors_per_s is not None and g.nvlink_errors_per_s > t.nvlink_errors_per_s:
            _add(
                bad,
                HealthReason.NVLINK_ERRORS,
                f"gpu {g.gpu} {g.nvlink_errors_per_s:.3g} NVLink errors/s "
                f"> {t.nvlink_errors_per_s:g}",
            )
    return new_streaks


def _check_missing(
    sample: NodeSample, t: HealthThresholds, streak: int, bad: _Causes, warn: _Causes
) -> int:
    """The new missing-GPU streak; GPU_MISSING is unhealthy once it reaches `missing_samples`."""
    if sample.gpus_expected is None or len(sample.gpus) >= sample.gpus_expected:
        return 0
    n = streak + 1
    _add(
        bad if n >= t.missing_samples else warn,
        HealthReason.GPU_MISSING,
        f"{len(sample.gpus)} of {sample.gpus_expected} GPUs visible "
        f"for {n} of {t.missing_samples} samples",
    )
    return n


def _check_ports(sample: NodeSample, t: HealthThresholds, bad: _Causes, warn: _Causes) -> None:
    for p in sample.ports:
        if not p.up:
            _add(bad, HealthReason.IB_LINK_DOWN, f"{p.port} down")
        elif p.link_downed_delta > 0:
            _add(bad, HealthReason.IB_LINK_DOWN, f"{p.port} went down {p.link_downed_delta} times")
        if p.errors_per_s is not None and p.errors_per_s > t.ib_errors_per_s:
            _add(
                bad,
                HealthReason.IB_ERRORS,
                f"{p.port} {p.errors_per_s:.3g} errors/s > {t.ib_errors_per_s:g}",
            )
        if not p.up:
            continue
        if t.ib_expected_width and p.width is not None and p.width < t.ib_expected_width:
            _add(
                warn,
                HealthReason.IB_LINK_DEGRADED,
                f"{p.port} width {p.width}X < {t.ib_expected_width}X",
            )
        if t.ib_min_rate_gbps and p.rate_gbps is not None and p.rate_gbps < t.ib_min_rate_gbps:
            _add(
                warn,
                HealthReason.IB_LINK_DEGRADED,
                f"{p.port} {p.rate_gbps:g} Gb/s < {t.ib_min_rate_gbps:g} Gb/s",
            )


def _details(causes: _Causes) -> tuple[str, ...]:
    return tuple(d for ds in causes.values() for d in ds)


def _step(
    node: NodeHealthState, sample: NodeSample, t: HealthThresholds, now_s: float
) -> NodeHealthState:
    """Fold one new sample into the node's state."""
    bad: _Causes = {}
    warn: _Causes = {}
    streaks = _check_gpus(sample, t, dict(node.hot_streaks), bad, warn)
    missing = _check_missing(sample, t, node.missing_streak, bad, warn)
    _check_ports(sample, t, bad, warn)
    turns = tuple(s for s in node.unhealthy_turns_s if now_s - s <= t.lemon_window_s)
    if bad:
        unhealthy = True
        held = tuple(dict.fromkeys((*node.held_reasons, *bad))) if node.unhealthy else tuple(bad)
        clean = 0
        if not node.unhealthy:
            turns = (*turns, now_s)
        details = _details(bad)
    elif node.unhealthy:
        clean = node.clean_samples + 1
        unhealthy = clean < t.recover_after_samples
        held = node.held_reasons if unhealthy else ()
        details = (
            (f"recovering: {clean}/{t.recover_after_samples} clean samples",) if unhealthy else ()
        )
    else:
        unhealthy, held, clean, details = False, (), node.clean_samples + 1, ()
    return NodeHealthState(
        last_sampled_s=sample.sampled_s,
        last_new_sample_now_s=now_s,
        hot_streaks=tuple(sorted(streaks.items())),
        missing_streak=missing,
        unhealthy=unhealthy,
        held_reasons=held,
        clean_samples=clean,
        degraded_reasons=tuple(warn),
        details=details + _details(warn),
        unhealthy_turns_s=turns,
        lemon=node.lemon or len(turns) >= t.lemon_count,
    )


def _verdict(node_id: str, node: NodeHealthState, t: HealthThresholds, now_s: float) -> NodeVerdict:
    stale = (
        node.last_new_sample_now_s is None or now_s - node.last_new_sample_now_s > t.stale_after_s
    )
    degraded = node.degraded_reasons
    details = node.details
    if stale:
        degraded = (*degraded, HealthReason.NO_TELEMETRY)
        seen = (
            "never"
            if node.last_new_sample_now_s is None
            else f"{now_s - node.last_new_sample_now_s:.0f} s ago"
        )
        details = (*details, f"last new sample: {seen}")
    if node.lemon:
        reasons = (HealthReason.LEMON, *node.held_reasons)
        lemon_detail = (
            f"turned unhealthy {len(node.unhealthy_turns_s)} times within "
            f"{t.lemon_window_s:g} s; stays out until an operator clears it"
        )
        return NodeVerdict(
            node_id, Verdict.UNHEALTHY, reasons, (lemon_detail, *details), lemon=True
        )
    if node.unhealthy:
        return NodeVerdict(node_id, Verdict.UNHEALTHY, node.held_reasons, details)
    if degraded:
        return NodeVerdict(node_id, Verdict.DEGRADED, tuple(degraded), details)
    return NodeVerdict(node_id, Verdict.HEALTHY)


def evaluate(
    samples: Mapping[str, Sequence[NodeSample]],
    thresholds: HealthThresholds,
    state: HealthState,
    now_s: float,
) -> tuple[dict[str, NodeVerdict], HealthState]:
    """Verdicts for every node in `samples` and the state to hand back next time.

    `samples` maps node id to that node's recent samples in any order (an empty sequence is a
    node with nothing new); samples at or before the node's last evaluated one are skipped,
    so passing overlapping windows every tick is safe. Nodes in `state` but not in `samples`
    keep their state (a lemon stays a lemon if its node id comes back) and get no verdict.
    """
    nodes = dict(state.nodes)
    verdicts: dict[str, NodeVerdict] = {}
    for node_id, node_samples in samples.items():
        node = nodes.get(node_id, NodeHealthState())
        for sample in sorted(node_samples, key=lambda s: s.sampled_s):
            if sample.node_id != node_id:
                raise ValueError(
                    f"sample of node {sample.node_id!r} was passed under node {node_id!r}"
                )
            if node.last_sampled_s is not None and sample.sampled_s <= node.last_sampled_s:
                continue
            node = _step(node, sample, thresholds, now_s)
        nodes[node_id] = node
        verdicts[node_id] = _verdict(node_id, node, thresholds, now_s)
    return verdicts, HealthState(nodes)


def keep_nodes(state: HealthState, node_ids: Iterable[str]) -> HealthState:
    """`state` with only the records of `node_ids` (the nodes that still exist).

    Ray never reuses a node id, so the record of a node that is gone can never matter again;
    without this, every node an autoscaler ever added would stay in the stored state.
    """
    keep = set(node_ids)
    return HealthState({n: v for n, v in state.nodes.items() if n in keep})


def clear_lemon(state: HealthState, node_ids: Iterable[str]) -> HealthState:
    """The operator's clear: forget the lemon record and held verdict of `node_ids`."""
    nodes = dict(state.nodes)
    for node_id in node_ids:
        if node_id in nodes:
            nodes[node_id] = replace(
                nodes[node_id],
                lemon=False,
                unhealthy=False,
                held_reasons=(),
                unhealthy_turns_s=(),
            )
    return HealthState(nodes)


@dataclass(frozen=True)
class CordonNode:
    """Place nothing new on `node_id` (Ray: exclude it from placement; Kubernetes: cordon).

    Level-triggered like every action: repeated each tick while the node is unhealthy.
    """

    node_id: str
    reason: str


RemediationAction = CordonNode | PreemptJob | MoveServeReplicas | DrainNode
"""What `remediate` may ask for."""


def with_verdicts(
    snapshot: ClusterSnapshot, verdicts: Mapping[str, NodeVerdict]
) -> ClusterSnapshot:
    """`snapshot` with every UNHEALTHY node marked ``healthy=False``; degraded nodes stay in,
    and so do nodes whose verdict the breaker holds (`NodeVerdict.held`).

    Every policy that counts live capacity then leaves the node out on this very tick.
    """
    nodes = tuple(
        replace(n, healthy=False)
        if n.healthy and _acts(verdicts.get(n.node_id, _NO_VERDICT))
        else n
        for n in snapshot.nodes
    )
    return replace(snapshot, nodes=nodes)


_NO_VERDICT = NodeVerdict("", Verdict.HEALTHY)


def _acts(v: NodeVerdict) -> bool:
    return v.verdict is Verdict.UNHEALTHY and not v.held


DRAINED_BY_OTHERS = "Ray is draining it"
"""The detail of a verdict `acting_verdicts` adds for a node someone else drains."""


def acting_verdicts(
    judged: Mapping[str, NodeVerdict],
    previous: Mapping[str, NodeVerdict],
    cordoned: Iterable[str],
    draining: Iterable[str],
    snapshot: ClusterSnapshot,
) -> tuple[dict[str, NodeVerdict], frozenset[str]]:
    """The verdicts the controller acts on, and the nodes drained by someone else.

    From the telemetry verdicts (`judged`), two rules:

    1. A node the controller has cordoned (`cordoned`: it asked Ray to drain it) stays
       UNHEALTHY even if its samples recover: a Ray drain cannot be undone, so the node goes
       on to be replaced. It keeps its last unhealthy verdict (from `previous`), or gets a
       bare one ("cordoned").
    2. A node Ray drains for someone else (in `draining`, not cordoned: Kubernetes deleting
       the pod, a spot preemption notice, an operator) while a gang holds GPUs there is
       UNHEALTHY (`DRAINED_BY_OTHERS`), so the gang checkpoints and restarts elsewhere before
       the node goes. Such nodes are returned in the second value: the caller does not remove
       them (whoever drains them does) and does not blame their host. Idle draining nodes are
       left to whoever drains them.
    """
    out = dict(judged)
    for node_id in cordoned:
        if out.get(node_id, _NO_VERDICT).verdict is not Verdict.UNHEALTHY:
            before = previous.get(node_id, _NO_VERDICT)
            out[node_id] = (
                before
                if before.verdict is Verdict.UNHEALTHY
                else NodeVerdict(node_id, Verdict.UNHEALTHY, details=("cordoned",))
            )
    ours = set(cordoned)
    by_others = set()
    for node_id in sorted(set(draining) - ours):
        held = any(g.gpus_by_node.get(node_id, 0) > 0 for g in snapshot.running)
        if held and out.get(node_id, _NO_VERDICT).verdict is not Verdict.UNHEALTHY:
            out[node_id] = NodeVerdict(node_id, Verdict.UNHEALTHY, details=(DRAINED_BY_OTHERS,))
            by_others.add(node_id)
    return out, frozenset(by_others)


def remediate(
    snapshot: ClusterSnapshot, verdicts: Mapping[str, NodeVerdict]
) -> tuple[RemediationAction, ...]:
    """The plan that takes unhealthy GPU nodes out of service without breaking anything.

    Per UNHEALTHY node of the cluster or external pool (never the head) that the breaker does
    not hold (`limit_removals`), in node id order:

    1. `CordonNode`: nothing new lands there.
    2. `PreemptJob(checkpoint_first=True)` for each gang holding GPUs there that is not already
       being preempted: it checkpoints, is re-queued and restarts on healthy nodes.
    3. `MoveServeReplicas` per (model, pool) for replicas there that are not already stopping,
       make-before-break. Cluster replicas stay in the cluster when its other healthy nodes have
       enough free GPUs for all of them, else go to the external pool; external replicas stay
       external (the autoscaler adds a node).
    4. `DrainNode` only once no gang holds GPUs there and no replica of ours is left on it.

    Worked example: cluster nodes ``a`` (unhealthy, gang ``j1`` holds 4 GPUs, one 1-GPU replica
    of model ``m``) and ``b`` (healthy, 0 GPUs free). Plan: CordonNode(a), PreemptJob(j1),
    MoveServeReplicas(m, cluster -> external, 1 replica, node a). Next ticks, while ``j1``
    checkpoints and the replica is replaced: the same cordon, no second preemption (``j1`` is
    now preempting), the move repeated (level-triggered). Once ``a`` holds nothing:
    CordonNode(a), DrainNode(a).
    """
    actions: list[RemediationAction] = []
    unhealthy = {
        n.node_id: verdicts[n.node_id]
        for n in snapshot.nodes
        if n.pool is not Pool.HEAD and n.node_id in verdicts and _acts(verdicts[n.node_id])
    }
    cluster_free_elsewhere = sum(
        n.gpus_free
        for n in snapshot.nodes
        if n.pool is Pool.CLUSTER and n.healthy and n.node_id not in unhealthy
    )
    for node_id in sorted(unhealthy):
        why = f"node {node_id} {unhealthy[node_id].reason}"
        actions.append(CordonNode(node_id, why))
        gangs = [g for g in snapshot.running if g.gpus_by_node.get(node_id, 0) > 0]
        for g in sorted(gangs, key=lambda g: g.job_id):
            if not g.preempting:
                actions.append(PreemptJob(g.job_id, f"checkpoint and restart elsewhere: {why}"))
        replicas = [r for r in snapshot.serve_replicas if r.node_id == node_id]
        moving: dict[tuple[str, Pool], list[int]] = {}
        for r in replicas:
            if r.state is not ReplicaState.STOPPING:
                moving.setdefault((r.model, r.pool), []).append(r.gpus)
        for (model, pool), gpus in sorted(
            moving.items(), key=lambda kv: (kv[0][0], kv[0][1].value)
        ):
            to_pool = pool
            if pool is Pool.CLUSTER:
                if sum(gpus) <= cluster_free_elsewhere:
                    cluster_free_elsewhere -= sum(gpus)
                else:
                    to_pool = Pool.EXTERNAL
            actions.append(
                MoveServeReplicas(
                    model=model,
                    from_pool=pool,
                    to_pool=to_pool,
                    num_replicas=len(gpus),
                    node_ids=(node_id,),
                    reason=f"make-before-break off {why}",
                )
            )
        if not gangs and not replicas:
            actions.append(DrainNode(node_id, why))
    return tuple(actions)


@dataclass
class RemovalBudget:
    """The breaker: how many nodes health may newly take out of service per window.

    Both limits apply: at most `max_nodes` across the fleet, and at most
    ``max(1, floor(max_pool_fraction * nodes in the pool))`` from one pool, per `window_s`.
    The count bounds what a systematic fault (an exporter rollout answering empty, a driver
    bug, a policy bug) can take, whatever the fleet's size; the fraction keeps a small pool
    from losing a large share of its capacity; the floor of 1 lets a pool of one still have
    its broken node replaced. Config: the ``health.breaker`` section embeds this class (not
    frozen for that reason: omegaconf makes frozen dataclasses read-only nodes).
    """

    max_nodes: int = 2
    """New removals across all pools per window; 0 holds every removal (report only)."""
    max_pool_fraction: float = 0.1
    """New removals from one pool per window, as a fraction of the pool's nodes (at least 1)."""
    window_s: float = 600.0
    """The window (default: one drain deadline, the time a removal takes)."""


@dataclass(frozen=True)
class BreakerState:
    """The breaker's memory: removals admitted within the window, whether it is open (latched)
    and since when, and what it holds now."""

    removals: tuple[tuple[str, str, float], ...] = ()
    """(node id, pool, caller time) of each removal admitted within the window. Kept after the
    node is gone: a replaced node still counts until its window ends."""
    held: tuple[str, ...] = ()
    """Nodes judged UNHEALTHY whose removal the breaker holds now."""
    opened_s: float | None = None
    """Caller time the breaker opened (a removal was held because the budget was spent); None
    while closed. Once open it stays open, holding every new removal, until `reset_breaker`."""

    @property
    def open(self) -> bool:
        return self.opened_s is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "removals": [list(r) for r in self.removals],
            "held": list(self.held),
            "opened_s": self.opened_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BreakerState:
        removals = tuple((str(n), str(p), float(t)) for n, p, t in data.get("removals", ()))
        held = tuple(str(n) for n in data.get("held", ()))
        opened = data.get("opened_s")
        return cls(removals, held, None if opened is None else float(opened))


def reset_breaker(state: BreakerState) -> BreakerState:
    """The operator's reset: the breaker closes and forgets what it held. The removals within
    the window still count (a reset lifts the latch, not the rate limit): if nodes are still
    unhealthy past the budget, the next `limit_removals` opens it again."""
    return BreakerState(removals=state.removals)


def _pool_cap(budget: RemovalBudget, pool_nodes: int) -> int:
    return max(1, int(budget.max_pool_fraction * pool_nodes))


def limit_removals(
    verdicts: Mapping[str, NodeVerdict],
    snapshot: ClusterSnapshot,
    budget: RemovalBudget,
    state: BreakerState,
    out: Iterable[str],
    now_s: float,
) -> tuple[dict[str, NodeVerdict], BreakerState]:
    """The verdicts to act on, with new removals past the budget held; the breaker's state.

    A new removal is an UNHEALTHY verdict for a cluster or external node of `snapshot` that is
    not in `out` (nodes already cordoned or drained) nor admitted earlier in the window. New
    removals are admitted in node id order while the fleet and pool budgets allow; the rest
    keep their verdict, marked `held`, with a detail saying why: `with_verdicts` and
    `remediate` leave them alone, while the verdict is still shown and exported (so both the
    node's and the breaker's alerts fire). Nodes already out are never held.

    The breaker latches: the first held removal opens it, and while it is open every new
    removal is held, whatever the budget, until an operator resets it (`reset_breaker`).
    A budget that refilled with time would only slow a fleet-wide fault, never stop it: 30
    nodes at 2 per 10 minutes are all gone in 2.5 hours. Removals admitted before it opened
    (and nodes already out) go on.

    Worked example (max_nodes 2, max_pool_fraction 0.1, window_s 600): a cluster pool of 30
    nodes (pool cap max(1, floor(3.0)) = 3) where an empty dcgm answer makes all 30 UNHEALTHY
    at t=1000 s. Nodes ``n00`` and ``n01`` are admitted (fleet cap 2 reached), ``n02``..``n29``
    are held; the breaker opens (opened_s 1000). At t=1601 s the window has passed, but the
    breaker is open: nothing is admitted, at t=10000 s neither. If an operator fixes the
    exporter, the verdicts clear and nothing is held, but the breaker stays open (a new
    fault on one node is held too) until the reset; after it, one unhealthy node is admitted.
    """
    out_set = set(out)
    removals = tuple(r for r in state.removals if now_s - r[2] < budget.window_s)
    admitted = {r[0] for r in removals}
    pools: dict[str, int] = {}
    for n in snapshot.nodes:
        pools[n.pool.value] = pools.get(n.pool.value, 0) + 1
    held: list[str] = []
    opened_s = state.opened_s
    acting = dict(verdicts)
    for n in sorted(snapshot.nodes, key=lambda n: n.node_id):
        v = verdicts.get(n.node_id)
        if (
            v is None
            or v.verdict is not Verdict.UNHEALTHY
            or n.pool is Pool.HEAD
            or n.node_id in out_set
            or n.node_id in admitted
        ):
            continue
        pool = n.pool.value
        in_pool = sum(1 for r in removals if r[1] == pool)
        cap = _pool_cap(budget, pools[pool])
        if state.opened_s is None and len(removals) < budget.max_nodes and in_pool < cap:
            removals = (*removals, (n.node_id, pool, now_s))
            admitted.add(n.node_id)
            continue
        held.append(n.node_id)
        if state.opened_s is None:
            opened_s = now_s
            why = (
                f"not acted on: health breaker open ({len(removals)} of {budget.max_nodes} "
                f"removals in the fleet, {in_pool} of {cap} in pool {pool}, "
                f"in the last {budget.window_s:g} s)"
            )
        else:
            why = (
                f"not acted on: health breaker open since t={state.opened_s:.0f} s; it holds "
                "every removal until an operator resets it"
            )
        acting[n.node_id] = replace(v, held=True, details=(*v.details, why))
    return acting, BreakerState(removals, tuple(held), opened_s)
