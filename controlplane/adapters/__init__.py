"""Adapters: the only modules of the control loop that touch an external system.

Owns: one module per system the loop changes or reads, each behind a small Protocol so the
loop's unit tests swap in a fake (tests/unit/loop_fakes.py):

* `serve` - Ray Serve (status, load, replica targets, route weights, the step-by-step move
  primitives of `serve.control.operations`) and the Ray autoscaler's `request_resources`;
* `nodes` - the Ray node inventory and Ray node drain/stop (`RayNodeControl`);
* `telemetry` - the telemetry agents on every node (start, trust, read samples, stop);
* `prometheus` - local mode's Prometheus target file for the agents.

Ray Jobs and Ray Train are reached through `controlplane.service.runner.JobRunner` (its
`RayJobs`), Kubernetes through `controlplane.kube`.

Must not: decide anything (policies do) or keep loop state (the loop does).
"""
