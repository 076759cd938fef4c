"""The controller: the shell that runs the control loop with its store, API and adapters.

Modules:

* `actor` - the detached ``rcp-controller`` actor, a shell around the control loop
  (`controlplane.loop`): store, API, the adapters, the loop, and `deploy(cfg)` which
  `rcp up` calls (local mode).
* `in_process` - `run_in_process(cfg)`: the same controller in the calling Ray driver, no
  actor (Kubernetes: the head pod's ``rcp-controller`` container, via the bootstrap).

Must not: decide (the loop's policies do); it wires, starts and stops.
"""
