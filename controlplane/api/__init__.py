"""The control plane's HTTP API: its routes, who may call them, and what they do to the store.

`routes` (the aiohttp application and `ApiServer`) and `operator_routes` (the operator's
routes on the same application); `access` (roles, actions, `add_route`), `identity` (users,
tokens, authentication), `ratelimit` (per-user token buckets); `jobs` (`JobService`) and
`operations` (`Operations`): what the routes do, with no HTTP and no Ray.

Must not: decide (policies do, through the control loop `controlplane.loop`) or call Ray.
"""
