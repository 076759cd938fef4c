"""The control loop: observe -> decide -> act -> record, one thread (`tick.Loop`).

Where each phase lives:

* `observe` (and `health.HealthKeeper.judge`): one typed `types.Observation` per tick;
* `decide`: every pure policy in one batch (`types.Decision`);
* `act/`: `act.jobs`, `health.HealthKeeper.act`, `act.serving` and `act.operations` (tracked
  multi-tick operations: the make-before-break move);
* `record`: events (`record.EventKind`), metrics, the policies' stored state;
* `tick`: the `Loop` that runs them, its thread, stats and liveness.

The external systems are reached only through `controlplane.adapters`.
"""

from controlplane.loop.tick import Adapters, Hooks, Loop, TickStats, tick_stalled

__all__ = ["Adapters", "Hooks", "Loop", "TickStats", "tick_stalled"]
