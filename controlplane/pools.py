"""Pools: the names every layer uses for where a node and a replica live.

Owns: the pool names, the node label that carries a node's pool, and the custom resource
that pins work to a pool. Placement relies on the custom resource (see docs/architecture.md:
the autoscaler's demand scheduler sees resources, so asking for `pool_external` is what makes
it launch an external node); the label is for selection, display and parity with KubeRay.
"""

from __future__ import annotations

from policies.snapshot import POOL_LABEL, Pool, pool_of, pool_resource

# Every Ray Job entrypoint asks for one unit of this resource. Only the `cluster` pool's worker
# nodes offer it (the head and the external pool do not), so user drivers never run on the head,
# where the control plane's credentials live (issue 12).
JOB_DRIVER_RESOURCE = "rcp_job_driver"

__all__ = ["JOB_DRIVER_RESOURCE", "POOL_LABEL", "Pool", "pool_of", "pool_resource"]
