"""One tick of the job runner as the control loop runs it, for the runner's unit tests.

`reconcile(runner)`: the runner's `observe`, `policies.attempts.decide_all` (the decide phase's
lifecycle plan, `controlplane.loop.decide`), then the runner's `apply`: what the loop's
observe, decide and act phases do with a job's gang, without the rest of the loop.
"""

from __future__ import annotations

from controlplane.loop.act.jobs.runner import JobRunner
from controlplane.policy_config import attempt_config
from policies.attempts import JobAction, decide_all

__all__ = ["reconcile"]


def reconcile(runner: JobRunner) -> tuple[JobAction, ...]:
    """One observe -> decide -> act pass over `runner`'s jobs; the plan it applied."""
    plan = decide_all(runner.observe(), attempt_config(runner.cfg))
    runner.apply(plan, lambda: None)
    return plan
