"""Pools: the names every layer uses for where a node and a replica live.

Owns: the pool names, the node label that carries a node's pool, and the custom resource
that pins work to a pool. Placement relies on the custom resource (see docs/architecture.md:
the autoscaler's demand scheduler sees resources, so asking for `pool_external` is what makes
it launch an external node); the label is for selection, display and parity with KubeRay.
"""

from __future__ import annotations

from policies.snapshot import POOL_LABEL, Pool, pool_of, pool_resource

__all__ = ["POOL_LABEL", "Pool", "pool_of", "pool_resource"]
