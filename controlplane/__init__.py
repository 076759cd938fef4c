"""The control plane for one Ray cluster that runs research training and production serving.

The public entry points (the SDK's client and the job spec; neither imports Ray)::

    from controlplane import Client, JobSpec
"""

from __future__ import annotations

from controlplane.sdk import Client, Job
from jobs.spec import JobSpec

__all__ = ["Client", "Job", "JobSpec"]
