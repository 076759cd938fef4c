"""Node health: a verdict per node (healthy, degraded, serving_only, unhealthy) from its
telemetry history.

Owns: the pure decision `evaluate(samples, thresholds, state, now_s) -> (verdicts, state)`.
Must not: read telemetry, a clock or the network, or act. Time arrives as `now_s` (the caller's
clock); sample times are only used to order samples and to skip the ones already seen.

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

   What the node is still fit for: when every reason it is unhealthy for is a fabric one
   (NVLink, InfiniBand: `FABRIC_REASONS`) its GPUs are fine, so the verdict is SERVING_ONLY
   (no gang, replicas yes); any GPU reason (heat, XID, ECC, row remap, a missing GPU), alone
   or beside a fabric one, makes it UNHEALTHY (out of everything).
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
   whatever its samples say, until `clear_lemon` is called for it. Turns into SERVING_ONLY
   count too: a node whose fabric keeps failing ends up out of everything.

Worked example (gpu_temp_c 78, hot_samples 2, recover_after_samples 3, lemon_count 2,
lemon_window_s 3600), node ``n1``, one sample per tick:

* t=10 s, GPU 0 at 80 C: streak 1 < 2 -> DEGRADED (gpu_temp_high).
* t=11 s, GPU 0 at 81 C: streak 2 >= 2 -> UNHEALTHY (gpu_overheated); turn #1 recorded.
* t=12..13 s, 60 C: clean 1, 2 < 3 -> still UNHEALTHY (gpu_overheated, held).
* t=14 s, 60 C: clean 3 >= 3 -> HEALTHY.
* t=100 s, new XID 79 (fatal): UNHEALTHY (xid_fatal); turn #2 within 3600 s of t=11 s ->
  2 >= lemon_count -> lemon: UNHEALTHY (lemon, xid_fatal) from now on, even at t=200 s with
  clean samples, until `clear_lemon(state, "n1")`.

Fabric only (same thresholds, ib_errors_per_s 1), node ``n2``: t=10 s, port mlx5_0/1 at
5 errors/s -> SERVING_ONLY (ib_errors). t=11 s, GPU 1 at 85 C (streak 1), IB still bad ->
SERVING_ONLY, degraded details shown. t=12 s, GPU 1 at 86 C: streak 2 -> UNHEALTHY
(ib_errors, gpu_overheated): a hot GPU takes a serving-only node out of everything.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from policies.health.samples import NodeSample
from policies.health.state import HealthState, NodeHealthState
from policies.health.thresholds import HealthThresholds
from policies.health.verdicts import FABRIC_REASONS, HealthReason, NodeVerdict, Verdict

__all__ = [
    "evaluate",
]


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
            hot = n >= t.hot_samples
            reason = HealthReason.GPU_OVERHEATED if hot else HealthReason.GPU_TEMP_HIGH
            _add(bad if hot else warn, reason, text)
        if g.thermal_throttle:
            _add(warn, HealthReason.GPU_THERMAL_THROTTLE, f"gpu {g.gpu} thermal slowdown")
        for xid in g.new_xids:
            if xid in t.fatal_xids:
                _add(bad, HealthReason.XID_FATAL, f"gpu {g.gpu} XID {xid}")
            else:
                _add(warn, HealthReason.XID_NONFATAL, f"gpu {g.gpu} XID {xid}")
        if g.ecc_uncorrectable_total:
            text = f"gpu {g.gpu} {g.ecc_uncorrectable_total} uncorrectable ECC errors"
            _add(bad, HealthReason.ECC_UNCORRECTABLE, text)
        if g.row_remap_failure:
            _add(bad, HealthReason.ROW_REMAP_FAILURE, f"gpu {g.gpu} row remap failed")
        elif g.row_remap_pending:
            _add(warn, HealthReason.ROW_REMAP_PENDING, f"gpu {g.gpu} row remap pending reset")
        if (
            g.nvlink_links_total is not None
            and g.nvlink_links_up is not None
            and g.nvlink_links_up < g.nvlink_links_total
        ):
            text = f"gpu {g.gpu} {g.nvlink_links_up}/{g.nvlink_links_total} NVLinks up"
            _add(bad, HealthReason.NVLINK_DOWN, text)
        if g.nvlink_errors_per_s is not None and g.nvlink_errors_per_s > t.nvlink_errors_per_s:
            text = f"gpu {g.gpu} {g.nvlink_errors_per_s:.3g} NVLink errors/s > {t.nvlink_errors_per_s:g}"
            _add(bad, HealthReason.NVLINK_ERRORS, text)
    return new_streaks


def _check_missing(
    sample: NodeSample, t: HealthThresholds, streak: int, bad: _Causes, warn: _Causes
) -> int:
    """The new missing-GPU streak; GPU_MISSING is unhealthy once it reaches `missing_samples`."""
    if sample.gpus_expected is None or len(sample.gpus) >= sample.gpus_expected:
        return 0
    n = streak + 1
    text = f"{len(sample.gpus)} of {sample.gpus_expected} GPUs visible for {n} of {t.missing_samples} samples"
    _add(bad if n >= t.missing_samples else warn, HealthReason.GPU_MISSING, text)
    return n


def _check_ports(sample: NodeSample, t: HealthThresholds, bad: _Causes, warn: _Causes) -> None:
    for p in sample.ports:
        if not p.up:
            _add(bad, HealthReason.IB_LINK_DOWN, f"{p.port} down")
        elif p.link_downed_delta > 0:
            _add(bad, HealthReason.IB_LINK_DOWN, f"{p.port} went down {p.link_downed_delta} times")
        if p.errors_per_s is not None and p.errors_per_s > t.ib_errors_per_s:
            text = f"{p.port} {p.errors_per_s:.3g} errors/s > {t.ib_errors_per_s:g}"
            _add(bad, HealthReason.IB_ERRORS, text)
        if not p.up:
            continue
        if t.ib_expected_width and p.width is not None and p.width < t.ib_expected_width:
            _add(
                warn,
                HealthReason.IB_LINK_DEGRADED,
                f"{p.port} width {p.width}X < {t.ib_expected_width}X",
            )
        if t.ib_min_rate_gbps and p.rate_gbps is not None and p.rate_gbps < t.ib_min_rate_gbps:
            text = f"{p.port} {p.rate_gbps:g} Gb/s < {t.ib_min_rate_gbps:g} Gb/s"
            _add(warn, HealthReason.IB_LINK_DEGRADED, text)


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
        fabric_only = bool(node.held_reasons) and set(node.held_reasons) <= FABRIC_REASONS
        verdict = Verdict.SERVING_ONLY if fabric_only else Verdict.UNHEALTHY
        return NodeVerdict(node_id, verdict, node.held_reasons, details)
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
