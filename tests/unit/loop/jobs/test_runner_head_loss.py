"""What the runner reads from Ray while the head comes back (issue 26): only Ray's own
"does not exist" makes a Ray Job MISSING (which re-queues a RUNNING gang); any other answer
is an error the tick retries. No Ray is started: the Job Submission client is a fake."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.adapters.ray_jobs import RayJobs, RayJobStatus
from controlplane.config import load_config


class AnsweringClient:
    """A Job Submission client whose every status request fails as Ray's client raises it."""

    def __init__(self, status_code: int, body: str) -> None:
        self.error = RuntimeError(f"Request failed with status code {status_code}: {body}.")

    def get_job_status(self, submission_id: str) -> str:
        raise self.error


@pytest.mark.parametrize(
    "status_code, body, missing",
    [
        (404, "Job job-1-1 does not exist", True),
        (404, "404: Not Found", False),
        (503, "the dashboard is starting", False),
    ],
    ids=[
        "ray says the job does not exist: missing",
        "a 404 of a dashboard or proxy coming back: an error, not missing",
        "any other failure: an error",
    ],
)
def test_only_rays_own_not_found_makes_a_ray_job_missing(
    tmp_path: Path, status_code: int, body: str, missing: bool
) -> None:
    jobs = RayJobs(load_config(None, [f"state_dir={tmp_path}"]))
    jobs._client = AnsweringClient(status_code, body)  # type: ignore[assignment]
    if missing:
        assert jobs.status("job-1-1") is RayJobStatus.MISSING
    else:
        with pytest.raises(RuntimeError, match=str(status_code)):
            jobs.status("job-1-1")
