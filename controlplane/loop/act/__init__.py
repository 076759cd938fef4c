"""The act phase: each plan item applied through the adapter of the system it changes.

Owns: `jobs` (the jobs' lifecycle plan and admission's and remediation's job actions through
the Ray Jobs adapter: the job runner), `nodes` (health's node actions: cordon through a Ray
drain, replace a drained node; the breaker's bookkeeping), `serving` (the Serve actuator and
the Kubernetes external group) and `operations` (tracked multi-tick operations: the
make-before-break move).

Must not: decide; every item is applied as the policy returned it.
"""
