"""The control loop: observe -> decide -> act -> record, one thread (`tick.Loop`).

Where each phase lives:

* `observe` (the job runner's view of every gang, nodes, Serve) and `health` (telemetry ->
  verdicts: `health.HealthKeeper.judge`): one typed `types.Observation` per tick;
* `decide`: every pure policy in one batch (`types.Decision`): the jobs' lifecycle
  (`policies.attempts`), admission, remediation, demand, placement, ingress;
* `act/`: `act.jobs` (the job runner), `act.nodes` (through `health.HealthKeeper.act`),
  `act.serving` and `act.operations` (tracked multi-tick operations: the make-before-break
  move);
* `record`: events (`record.EventKind`), the policies' stored state, metrics
  (`tick_metrics`, and the per-job gauges of `job_metrics`);
* `tick`: the `Loop` that runs them, its thread and liveness; `guards`: the operators' pause,
  pins and cordons.

The external systems are reached only through `controlplane.adapters`.
"""

from controlplane.loop.tick import Adapters, Hooks, Loop

__all__ = ["Adapters", "Hooks", "Loop"]
