"""The control-plane service: the job queue's API, its controller actor and its runner.

Modules:

* `queueing` - `JobService`: what the HTTP API does to the store (validate and submit,
  list, get, cancel, events, logs); no HTTP, no Ray.
* `api` - the aiohttp application (routes, token auth, JSON errors) and `ApiServer`, which
  serves it from a background thread.
* `tokens` - the API token file and the URL file under the state dir.
* `runner` - the only code here that starts and stops Ray Jobs (the actuator for AdmitJob
  and PreemptJob) and reads the job signals actor.
* `controller` - the detached ``rcp-controller`` actor, a shell around the control loop
  (`controlplane.loop`): store, API, the adapters, the loop, and `deploy(cfg)` which
  `rcp up` calls (local mode).
* `run` - `run_in_process(cfg)`: the same controller in the calling Ray driver, no actor
  (Kubernetes: the head pod's ``rcp-controller`` container, via the bootstrap).
"""
