"""Adapters: the only modules of the control loop that touch an external system.

Owns: one module per system the loop changes or reads, each behind a small Protocol so the
loop's unit tests swap in a fake (tests/unit/loop_fakes.py):

* `serve` - Ray Serve (status, load, replica targets, route weights, the step-by-step move
  primitives of `serve.control.operations`) and the Ray autoscaler's `request_resources`;
* `nodes` - the Ray node inventory and Ray node drain/stop (`RayNodeControl`);
* `telemetry` - the telemetry agents on every node (start, trust, read samples, stop);
* `prometheus` - local mode's Prometheus target file for the agents;
* `ray_jobs` - Ray Jobs and Ray Train (`RayJobs`: submission, status, stop, stacks, the job
  signals actor), driven by the job runner (`controlplane.loop.act.jobs.runner.JobRunner`);
  `driver_logs` and `job_logs` - attempts' driver logs by byte range;
* `checkpoints` - committed checkpoints read from object storage.

Kubernetes is reached through `controlplane.kube`.

Must not: decide anything (policies do) or keep loop state (the loop does).
"""
