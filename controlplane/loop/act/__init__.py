"""The act phase: each plan item applied through the adapter of the system it changes.

Owns: `jobs` (admission's and remediation's job actions through the Ray Jobs adapter, the
job runner), `serving` (the Serve actuator and the Kubernetes external group) and
`operations` (tracked multi-tick operations: the make-before-break move). Health's node
actions go through `controlplane.loop.health`.

Must not: decide; every item is applied as the policy returned it.
"""
