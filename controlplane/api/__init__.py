"""The control plane's HTTP API: its routes, who may call them, and what they do to the store.

Modules:

* `routes` - the aiohttp application (routes, token auth, JSON errors, the audit in its
  guard) and `ApiServer`, which serves it from a background thread.
* `operator_routes` - the operator's routes (nodes, health, the breaker, serving, faults, the
  policy actor), registered on the same application.
* `access` - roles, actions and `add_route`: who may call which route.
* `identity` - users, their tokens by hash, authenticating one request.
* `ratelimit` - per-user token buckets.
* `jobs` - `JobService`: what the job routes do to the store (validate and submit, list, get,
  cancel, events, logs); no HTTP, no Ray.
* `operations` - `Operations`: the operator's side of the control plane over the loop and
  the store, as the operator routes call it.

Must not: decide (policies do, through the control loop `controlplane.loop`) or call Ray.
"""
