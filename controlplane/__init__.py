"""The control plane for one Ray cluster that runs research training and production serving.

The public entry points are loaded lazily so ``import controlplane`` stays cheap::

    from controlplane import Client, JobSpec
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Client", "Job", "JobSpec"]

if TYPE_CHECKING:
    from controlplane.sdk import Client, Job
    from jobs.spec import JobSpec


def __getattr__(name: str) -> Any:
    if name in ("Client", "Job"):
        from controlplane import sdk

        return getattr(sdk, name)
    if name == "JobSpec":
        from jobs.spec import JobSpec

        return JobSpec
    raise AttributeError(f"module 'controlplane' has no attribute {name!r}")
