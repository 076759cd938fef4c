"""The act phase: each plan item applied through the adapter of the system it changes.

Owns: `jobs` (the job runner), `nodes` (health's node actions and the breaker's
bookkeeping), `serving` (the Serve actuator and the Kubernetes external group) and
`operations` (tracked multi-tick operations: the make-before-break move).

Must not: decide; every item is applied as the policy returned it.
"""
